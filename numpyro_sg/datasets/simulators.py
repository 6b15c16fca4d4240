"""Simulators for the papers' experiments and the matching NumPyro models.

The matrix-factorisation models, ratings simulator and loaders (the BPMF experiments of Mauri &
Zanella (2024), 'Robust approximate sampling via stochastic gradient Barker dynamics') live in
:mod:`numpyro_sg.datasets.ratings` (hierarchical BPMF and the oracle RMSE in
:mod:`numpyro_sg.datasets.bpmf`) and are re-exported here.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_sg.datasets.ratings import (
    Ratings,
    bpmf_model,
    bpmf_predict,
    load_movielens,
    ppmf_model,
    ratings_from_dataframe,
    rmse_trace,
    simulate_ratings,
    split_ratings,
)
from numpyro_sg.datasets.bpmf import hierarchical_bpmf_model, known_factors_rmse, oracle_rmse

__all__ = [
    "simulate_logistic_regression",
    "logistic_regression_model",
    "simulate_linear_regression",
    "linear_regression_model",
    "linear_regression_posterior",
    "simulate_esgld_linear",
    "simulate_esgld_logistic",
    "esgld_linear_model",
    "esgld_logistic_model",
    "simulate_sparse_linear",
    "simulate_sparse_logistic",
    "sparse_async_linear_model",
    "sparse_async_logistic_model",
    # matrix factorisation (numpyro_sg.datasets.ratings)
    "Ratings",
    "split_ratings",
    "ratings_from_dataframe",
    "load_movielens",
    "simulate_ratings",
    "bpmf_model",
    "ppmf_model",
    "bpmf_predict",
    "rmse_trace",
    "hierarchical_bpmf_model",
    "oracle_rmse",
    "known_factors_rmse",
]


def _data_plate(X, y, subsample_size, observation):
    """The likelihood in a subsample plate: y_i ~ ``observation``(rows of X) on a mini-batch."""
    N = X.shape[0]
    with numpyro.plate("data", N, subsample_size=min(subsample_size, N)):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", observation(Xb), obs=yb)


def simulate_logistic_regression(num_data: int = 100_000, dim: int = 10, seed: int = 0):
    """Logistic-regression data: X ~ N(0, I) (float32), θ* ~ N(0, I), y ~ Bernoulli(σ(X·θ*)).

    Returns ``(X, y, theta_true)`` as NumPy arrays.
    """
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((num_data, dim)).astype(np.float32)
    theta = rng.standard_normal(dim)
    p = 1.0 / (1.0 + np.exp(-(X @ theta)))
    y = (rng.random(num_data) < p).astype(np.float32)
    return X, y, theta.astype(np.float32)


def logistic_regression_model(X, y=None, subsample_size: int = 1000, prior_scale: float = 10.0):
    """Bayesian logistic regression, θ ~ N(0, prior_scale²·I), with a subsample plate."""
    N, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0.0, prior_scale).expand([d]).to_event(1))
    _data_plate(X, y, subsample_size, lambda Xb: dist.Bernoulli(logits=Xb @ theta))


def simulate_linear_regression(num_data: int = 100_000, dim: int = 10, seed: int = 0, noise_scale: float = 1.0):
    """Linear-regression data: X ~ N(0, I) (float32), θ* ~ N(0, I), y = X·θ* + N(0, noise_scale²).

    Returns ``(X, y, theta_true)`` as NumPy arrays; :func:`linear_regression_posterior` gives the
    exact posterior of :func:`linear_regression_model` on them.
    """
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((num_data, dim)).astype(np.float32)
    theta = rng.standard_normal(dim)
    y = (X @ theta + noise_scale * rng.standard_normal(num_data)).astype(np.float32)
    return X, y, theta.astype(np.float32)


def linear_regression_model(X, y=None, subsample_size: int = 1000, prior_scale: float = 10.0,
                            noise_scale: float = 1.0):
    """Bayesian linear regression with a known noise sd, θ ~ N(0, prior_scale²·I),
    y_i ~ N(x_iᵀθ, noise_scale²), with a subsample plate: a conjugate model whose posterior is
    known exactly (:func:`linear_regression_posterior`)."""
    N, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0.0, prior_scale).expand([d]).to_event(1))
    _data_plate(X, y, subsample_size, lambda Xb: dist.Normal(Xb @ theta, noise_scale))


def linear_regression_posterior(X, y, prior_scale: float = 10.0, noise_scale: float = 1.0):
    """The exact posterior N(m, Σ) of :func:`linear_regression_model`, float64 NumPy:
    Σ = (XᵀX/σ² + I/s²)⁻¹ and m = Σ·Xᵀy/σ² (σ = ``noise_scale``, s = ``prior_scale``).

    >>> X = np.array([[1.0], [1.0]]); y = np.array([1.0, 3.0])
    >>> mean, cov = linear_regression_posterior(X, y, prior_scale=1.0)
    >>> float(mean[0]), float(cov[0, 0])     # (1 + 3)/(2 + 1), 1/(2 + 1)
    (1.3333333333333333, 0.3333333333333333)
    """
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    precision = X.T @ X / noise_scale**2 + np.eye(X.shape[1]) / prior_scale**2
    cov = np.linalg.inv(precision)
    return cov @ (X.T @ y) / noise_scale**2, cov


# -------------------------------------------------------------------------------------------
# ESGLD (Song, Sun, Ye & Liang 2020): linear (their Table 1) and logistic (Table S1) selection
# -------------------------------------------------------------------------------------------
def _equicorrelated_design(rng, num_data, num_features, correlation, dtype=np.float32):
    """Rows z ~ N(0, Σ), Σ_jj = 1 and Σ_jk = ``correlation`` (a shared factor), built in chunks."""
    X = np.empty((num_data, num_features), dtype=dtype)
    a, b = np.sqrt(correlation), np.sqrt(1.0 - correlation)
    chunk = max(1, 2_000_000 // max(num_features, 1))
    for start in range(0, num_data, chunk):
        stop = min(start + chunk, num_data)
        e = rng.standard_normal((stop - start, 1))
        X[start:stop] = (a * e + b * rng.standard_normal((stop - start, num_features))).astype(dtype)
    return X


def _esgld_true_beta(num_features, intercept):
    beta = np.zeros(num_features + int(intercept), dtype=np.float32)
    off = int(intercept)
    beta[off : off + 5] = 1.0
    beta[off + 5 : off + 8] = -1.0
    return beta


def simulate_esgld_linear(
    num_data: int = 50_000,
    num_features: int = 2000,
    correlation: float = 0.5,
    noise_sd: float = 1.0,
    intercept: bool = True,
    seed: int = 0,
):
    r"""Song, Sun, Ye & Liang's (2020) linear example (Table 1, supp. §4.1, eq. S9).

    y = z_1 + … + z_5 − z_6 − z_7 − z_8 + ε, ε ~ N(0, σ²) (σ = ``noise_sd``), the p
    explanatory variables z ~ N(0, Σ) with all pairwise correlations ``correlation``.  With
    ``intercept=True`` (the paper's set-up: the intercept is a candidate variable, true value
    0) the first column of X is ones, so X has p + 1 columns.

    Returns ``(X, y, beta_true)`` as float32 NumPy arrays (``beta_true`` has X's columns).
    """
    rng = np.random.default_rng(seed)
    Z = _equicorrelated_design(rng, num_data, num_features, correlation)
    beta = _esgld_true_beta(num_features, intercept)
    if intercept:
        X = np.empty((num_data, num_features + 1), np.float32)
        X[:, 0] = 1.0
        X[:, 1:] = Z
        del Z
    else:
        X = Z
    y = (X @ beta + noise_sd * rng.standard_normal(num_data)).astype(np.float32)
    return X, y, beta


def simulate_esgld_logistic(
    num_data: int = 50_000,
    num_features: int = 2000,
    correlation: float = 0.5,
    intercept: bool = True,
    seed: int = 0,
):
    r"""Song, Sun, Ye & Liang's (2020) logistic example (Table S1, supp. §4.2, eq. S12).

    logit P(y = 1) = z_1 + … + z_5 − z_6 − z_7 − z_8, z as in :func:`simulate_esgld_linear`;
    "half of the responses 1": cases (y = 1) and controls (y = 0) are drawn from the model
    until there are N/2 of each (case-control sampling, which keeps the slopes of the
    logistic model).  With ``intercept=True`` the first column of X is ones (true value 0).

    Returns ``(X, y, beta_true)`` as float32 NumPy arrays.
    """
    rng = np.random.default_rng(seed)
    beta = _esgld_true_beta(num_features, False)
    half = num_data // 2
    need = {1: half, 0: num_data - half}
    parts = {0: [], 1: []}
    while need[0] > 0 or need[1] > 0:
        Z = _equicorrelated_design(rng, max(num_data // 2, 1000), num_features, correlation)
        prob = 1.0 / (1.0 + np.exp(-(Z @ beta)))
        yy = (rng.random(Z.shape[0]) < prob).astype(np.int8)
        for label in (0, 1):
            if need[label] > 0:
                rows = Z[yy == label][: need[label]]
                parts[label].append(rows)
                need[label] -= rows.shape[0]
    Z = np.concatenate(parts[1] + parts[0])
    y = np.concatenate([np.ones(half, np.float32), np.zeros(num_data - half, np.float32)])
    perm = rng.permutation(num_data)
    Z, y = Z[perm], y[perm]
    if intercept:
        X = np.empty((num_data, num_features + 1), np.float32)
        X[:, 0] = 1.0
        X[:, 1:] = Z
        del Z
        beta = np.concatenate([np.zeros(1, np.float32), beta])
    else:
        X = Z
    return X, y, beta


def esgld_linear_model(
    X,
    y=None,
    subsample_size: int = 200,
    noise_sd: float = 1.0,
    slab_var: float = 25.0,
    spike_var: float = 0.025,
    prior_inclusion: float | None = None,
):
    r"""Spike-and-slab linear regression with the priors of Song, Sun, Ye & Liang (2020),
    'Extended stochastic gradient Markov chain Monte Carlo for large-scale Bayesian variable
    selection' (supplement §4.1, S10–S11).

    γ_j ~ Bernoulli(λ) independently, λ = 1/P^1.1 by default (P = number of columns of X,
    the intercept included: the paper's 1/(p+1)^1.1); θ_j | γ_j ~ N(0, σ1²) (slab,
    ``slab_var`` = 25) or N(0, σ0²) (spike, ``spike_var`` = 0.025); β = θ·γ (deterministic
    site ``beta``); y ~ N(X·β, σ²) with σ = ``noise_sd`` known.  The paper's truncation
    size(γ) ≤ q is :class:`~numpyro_sg.ESGLD`'s ``max_model_size`` (q = 50).
    """
    N, P = X.shape
    lam = 1.0 / P**1.1 if prior_inclusion is None else prior_inclusion
    gamma = numpyro.sample("gamma", dist.Bernoulli(lam).expand([P]).to_event(1))
    scale = jnp.where(gamma == 1, jnp.sqrt(slab_var), jnp.sqrt(spike_var))
    theta = numpyro.sample("theta", dist.Normal(0.0, scale).to_event(1))
    beta = numpyro.deterministic("beta", theta * gamma)
    _data_plate(X, y, subsample_size, lambda Xb: dist.Normal(Xb @ beta, noise_sd))


def esgld_logistic_model(
    X,
    y=None,
    subsample_size: int = 300,
    c0: float = 10.0,
    spike_var: float = 0.025,
    prior_inclusion: float | None = None,
):
    r"""Spike-and-slab logistic regression with the priors of Song, Sun, Ye & Liang (2020),
    'Extended stochastic gradient Markov chain Monte Carlo for large-scale Bayesian variable
    selection' (supplement §4.2, S13–S14).

    γ_j ~ Bernoulli(λ), λ = 1/(1 + P^0.5·√(2π)) by default (P columns of X, intercept
    included: the paper's ζ = 0.5); θ_j | γ ~ N(0, σ_S²) on the model S = {j: γ_j = 1} with
    σ_S² = exp(C0/size(S))/(2π) (C0 = ``c0`` = 10; size(S) ≥ 1 used for the empty model), and
    N(0, σ0²) off it (``spike_var`` = 0.025); β = θ·γ (deterministic site ``beta``);
    y ~ Bernoulli(logit = X·β).  The paper's truncation size(γ) ≤ q = 500 is
    :class:`~numpyro_sg.ESGLD`'s ``max_model_size``.
    """
    N, P = X.shape
    lam = 1.0 / (1.0 + np.sqrt(P) * np.sqrt(2 * np.pi)) if prior_inclusion is None else prior_inclusion
    gamma = numpyro.sample("gamma", dist.Bernoulli(lam).expand([P]).to_event(1))
    size = jnp.maximum(jnp.sum(gamma), 1)
    slab_sd = jnp.sqrt(jnp.exp(c0 / size) / (2 * jnp.pi))
    scale = jnp.where(gamma == 1, slab_sd, jnp.sqrt(spike_var))
    theta = numpyro.sample("theta", dist.Normal(0.0, scale).to_event(1))
    beta = numpyro.deterministic("beta", theta * gamma)
    _data_plate(X, y, subsample_size, lambda Xb: dist.Bernoulli(logits=Xb @ beta))



# -------------------------------------------------------------------------------------------
# SparseAsync (Atchadé & Wang 2023, §4.1 linear and §4.2 logistic)
# -------------------------------------------------------------------------------------------
def _ar1_design(rng, num_data, num_features, correlation, dtype=np.float32):
    """Rows x ~ N(0, Σ), Σ_ij = ϱ^|i−j| (an AR(1) recursion along the columns)."""
    X = np.empty((num_data, num_features), dtype=dtype)
    prev = rng.standard_normal(num_data)
    X[:, 0] = prev
    s = np.sqrt(1.0 - correlation**2)
    for j in range(1, num_features):
        prev = correlation * prev + s * rng.standard_normal(num_data)
        X[:, j] = prev
    return X


def _sparse_truth(rng, num_features, num_nonzero):
    theta = np.zeros(num_features, np.float32)
    k = min(num_nonzero, num_features)
    theta[:k] = rng.choice([-1.0, 1.0], size=k) * rng.uniform(2.0, 3.0, size=k)
    return theta


def _sparse_design(num_features, num_data, correlation, num_nonzero, seed):
    """(rng, X, θ*) of the experiments of Atchadé & Wang (2023), 'A fast asynchronous MCMC sampler for sparse Bayesian inference';
    N = p/2 unless ``num_data`` is given."""
    N = num_features // 2 if num_data is None else int(num_data)
    rng = np.random.default_rng(seed)
    X = _ar1_design(rng, N, num_features, correlation)
    return rng, X, _sparse_truth(rng, num_features, num_nonzero)


def simulate_sparse_linear(num_features: int = 1000, num_data: int | None = None,
                           correlation: float = 0.0, num_nonzero: int = 10,
                           noise_sd: float = 1.0, seed: int = 0):
    r"""Atchadé & Wang's (2023) linear example (§4.1).

    Rows of X ~ N(0, Σ) with Σ_ij = ϱ^|i−j| (ϱ = ``correlation``, 0 or 0.9 in the paper);
    θ* has its first ``num_nonzero`` = 10 entries drawn uniformly from (−3, −2) ∪ (2, 3) and
    the rest 0; y ~ N(X·θ*, σ²) with σ = ``noise_sd`` = 1; N = ``num_data`` = p/2 by default.

    Returns ``(X, y, theta_true)`` as float32 NumPy arrays.
    """
    rng, X, theta = _sparse_design(num_features, num_data, correlation, num_nonzero, seed)
    y = (X @ theta + noise_sd * rng.standard_normal(X.shape[0])).astype(np.float32)
    return X, y, theta


def simulate_sparse_logistic(num_features: int = 1000, num_data: int | None = None,
                             correlation: float = 0.0, num_nonzero: int = 10, seed: int = 0):
    r"""Atchadé & Wang's (2023) logistic example (§4.2): X and θ* as in :func:`simulate_sparse_linear`,
    y_i ~ Bernoulli(1/(1 + exp(−⟨x_i, θ*⟩))), N = p/2 by default.

    Returns ``(X, y, theta_true)`` as float32 NumPy arrays.
    """
    rng, X, theta = _sparse_design(num_features, num_data, correlation, num_nonzero, seed)
    prob = 1.0 / (1.0 + np.exp(-(X @ theta)))
    y = (rng.random(X.shape[0]) < prob).astype(np.float32)
    return X, y, theta


def _sparse_async_prior(N, p, rho0, rho1, u):
    rho0 = float(N) if rho0 is None else rho0
    delta = numpyro.sample("delta", dist.Bernoulli(logits=-u * np.log(p)).expand([p]).to_event(1))
    scale = jnp.where(delta == 1, 1.0 / np.sqrt(rho1), 1.0 / np.sqrt(rho0))
    theta = numpyro.sample("theta", dist.Normal(0.0, scale).to_event(1))
    return theta * delta


def sparse_async_linear_model(
    X,
    y=None,
    rho0: float | None = None,
    rho1: float = 1.0,
    u: float = 1.5,
    noise_sd: float = 1.0,
    subsample_size: int | None = None,
):
    r"""Atchadé & Wang's (2023) spike-and-slab linear regression, eq. (2), with its defaults.

    π(δ) ∝ p^(−u·size(δ)) (δ_j ~ Bernoulli with logit −u·log p; u = 1.5),
    θ_j | δ_j ~ N(0, 1/ρ_{δ_j}) with ρ0 = N (``rho0=None``) and ρ1 = 1, β = θ·δ and
    y ~ N(X·β, σ²) with σ = ``noise_sd`` known.  The likelihood sits in a plate of size N
    (``subsample_size``: the mini-batch B of SA-SGLD; ``None`` = N).
    """
    N, p = X.shape
    beta = _sparse_async_prior(N, p, rho0, rho1, u)
    _data_plate(X, y, subsample_size or N, lambda Xb: dist.Normal(Xb @ beta, noise_sd))


def sparse_async_logistic_model(
    X,
    y=None,
    rho0: float | None = None,
    rho1: float = 1.0,
    u: float = 1.5,
    subsample_size: int | None = None,
):
    r"""Atchadé & Wang's (2023) spike-and-slab logistic regression (§4.2): the prior of
    :func:`sparse_async_linear_model` (ρ0 = N, ρ1 = 1, u = 1.5) and
    y ~ Bernoulli(logits = X·(θ·δ)), in a plate of size N (``subsample_size`` = B or N).
    """
    N, p = X.shape
    beta = _sparse_async_prior(N, p, rho0, rho1, u)
    _data_plate(X, y, subsample_size or N, lambda Xb: dist.Bernoulli(logits=Xb @ beta))
