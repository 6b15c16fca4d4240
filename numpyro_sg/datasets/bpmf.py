r"""Hierarchical BPMF, and the best test RMSE a ratings matrix allows.

* :func:`hierarchical_bpmf_model` — Bayesian probabilistic matrix factorisation with the
  hyperpriors of Salakhutdinov & Mnih (2008), 'Bayesian probabilistic matrix factorization
  using Markov chain Monte Carlo' (Normal–Gamma per latent dimension in place of their
  Gaussian–Wishart), and an unknown noise precision: nothing about the scales needs to be
  known, unlike :func:`~numpyro_sg.datasets.ratings.bpmf_model`'s fixed noise precision;
* :func:`oracle_rmse` — the information limit of the test RMSE,
  σ·√(1 + k/n̄_user + k/n̄_item);
* :func:`known_factors_rmse` — that limit checked on a simulated matrix by the oracle itself:
  each user's factors estimated knowing every item's true factors, and vice versa.

**The oracle limit.**  Predicting a test rating R_ui = U_uᵀV_i + ε (noise sd σ) with factors
estimated from the training ratings, the error has three independent parts: the noise (σ²),
the error of Û_u, and that of V̂_i.  An oracle that knew every item's true factors would
estimate U_u by regression of the user's n_u ratings on k known covariates, with error
variance σ²·k/n_u on the prediction (the average of the leverage); symmetrically σ²·k/n_i for
V̂_i.  At the average counts n̄_user = N/U and n̄_item = N/M this gives

.. math:: \text{RMSE}_\text{oracle} \approx \sigma\,\sqrt{1 + k/\bar n_\text{user} + k/\bar n_\text{item}},

0.573 for the 2,000 × 3,000 rank-10 matrix with 160,000 training ratings and σ = 0.5.  No
estimator that sees only the ratings does better (it knows less than the oracle), so it is the
target for a posterior-mean prediction.  :func:`known_factors_rmse` computes the oracle's
actual test RMSE (Gaussian posterior means given the other side's true factors): 0.581 there,
1.5% above the formula (users and items with fewer ratings than the average weigh more,
k/n being convex in n; the prior's shrinkage gives back less).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_sg.datasets.ratings import Ratings, observed_ratings


def hierarchical_bpmf_model(users, items, ratings=None, *, num_users: int, num_items: int,
                            rank: int = 10, subsample_size: int = 1000, mu0: float = 0.0,
                            beta0: float = 2.0, a0: float = 1.0, b0: float = 1.0,
                            noise_a: float = 1.0, noise_b: float = 1.0, offset: float = 0.0):
    r"""BPMF with Normal–Gamma hyperpriors on the factors' means and precisions and a Gamma
    noise precision (Salakhutdinov & Mnih 2008, with a diagonal Λ):

    .. math::

        R_{ui} &\sim \mathcal N(o + U_u^\top V_i,\ \alpha^{-1}), \quad
        \alpha \sim \Gamma(a_\alpha, b_\alpha), \\
        U_u &\sim \mathcal N_k(\mu_U, Λ_U^{-1}), \quad
        \mu_U \mid Λ_U \sim \mathcal N_k(\mu_0, (\beta_0 Λ_U)^{-1}), \quad
        Λ_{U,j} \sim \Gamma(a_0, b_0), \ j = 1..k,

    the same for V; Gamma(shape, rate), defaults a₀ = b₀ = 1 and β₀ = 2 (their Wishart's
    ν₀ = k, W₀ = I, β₀ = 2 on the diagonal), a_α = b_α = 1.  The likelihood sits in the
    subsample plate ``ratings``.  Sites: ``noise_prec`` (scalar), ``prec_u``, ``prec_v``,
    ``mu_u``, ``mu_v`` (k,), ``U`` (U, k), ``V`` (M, k): d = (U + M + 4)·k + 1.

    **Example:**

    >>> import jax
    >>> from functools import partial
    >>> from numpyro.infer import MCMC
    >>> import numpyro_sg as nsg
    >>> from numpyro_sg import datasets as ds
    >>> data = ds.simulate_ratings(40, 60, 2, 1500, noise_sd=0.5, seed=0)
    >>> model = partial(ds.hierarchical_bpmf_model, **data.model_kwargs(rank=2, subsample_size=200))
    >>> mcmc = MCMC(nsg.SGLD(model), num_warmup=100, num_samples=200, progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), *data.model_args())
    >>> mcmc.get_samples()["U"].shape
    (200, 40, 2)
    """
    noise_prec = numpyro.sample("noise_prec", dist.Gamma(noise_a, noise_b))
    factors = []
    for side, size in (("u", num_users), ("v", num_items)):
        prec = numpyro.sample(f"prec_{side}", dist.Gamma(a0, b0).expand([rank]).to_event(1))
        sd = 1.0 / jnp.sqrt(prec)
        mu = numpyro.sample(f"mu_{side}", dist.Normal(mu0, sd / np.sqrt(beta0)).to_event(1))
        factors.append((mu, sd, size))
    (mu_u, sd_u, _), (mu_v, sd_v, _) = factors
    U = numpyro.sample("U", dist.Normal(mu_u, sd_u).expand([num_users, rank]).to_event(2))
    V = numpyro.sample("V", dist.Normal(mu_v, sd_v).expand([num_items, rank]).to_event(2))
    plate, u, i, r = observed_ratings(users, items, ratings, subsample_size)
    with plate:
        mean = offset + jnp.sum(U[u] * V[i], axis=-1)
        numpyro.sample("r", dist.Normal(mean, 1.0 / jnp.sqrt(noise_prec)), obs=r)


def oracle_rmse(data: Ratings, rank: int | None = None, noise_sd: float | None = None) -> float:
    """σ·√(1 + k/n̄_user + k/n̄_item), n̄ = training ratings per user / per item (module
    docstring).  ``rank`` and ``noise_sd`` default to the simulation's."""
    if noise_sd is None:
        noise_sd = data.noise_sd
    if rank is None:
        rank = None if data.user_factors is None else np.shape(data.user_factors)[1]
    if noise_sd is None or rank is None:
        raise ValueError("give rank and noise_sd: the data carry no simulation truth.")
    n = data.num_train
    return float(noise_sd * np.sqrt(1.0 + rank * data.num_users / n + rank * data.num_items / n))


def _posterior_means(rows, other, ratings, num_rows, noise_sd, prior_sd):
    """Gaussian posterior means of each row's factors given the other side's true factors
    ``other`` (one row per rating), prior N(0, prior_sd²·I)."""
    k = other.shape[1]
    gram = np.zeros((num_rows, k, k))
    np.add.at(gram, rows, np.einsum("nk,nl->nkl", other, other))
    rhs = np.zeros((num_rows, k))
    np.add.at(rhs, rows, other * ratings[:, None])
    precision = gram / noise_sd**2 + np.eye(k) / prior_sd**2
    return np.linalg.solve(precision, rhs[..., None] / noise_sd**2)[..., 0]


def known_factors_rmse(data: Ratings) -> dict:
    """Test RMSEs of the oracle on a simulated matrix (:func:`simulate_ratings`' truth).

    ``users_given_items``: Û_u the posterior mean given the true V (and the true prior), V true;
    ``items_given_users``: symmetrically; ``oracle``: Û_uᵀV̂_i with both so estimated (each
    side knowing the other's truth) — the realised value of :func:`oracle_rmse`'s formula;
    ``true_factors``: U_uᵀV_i itself (the noise floor σ).
    """
    if data.user_factors is None:
        raise ValueError("known_factors_rmse needs a simulated matrix (its true factors).")
    U, V = np.asarray(data.user_factors, np.float64), np.asarray(data.item_factors, np.float64)
    u, i, r = (np.asarray(a) for a in (data.users, data.items, data.ratings))
    prior_sd = U.shape[1] ** -0.25  # simulate_ratings' factor sd
    U_hat = _posterior_means(u, V[i], r, data.num_users, data.noise_sd, prior_sd)
    V_hat = _posterior_means(i, U[u], r, data.num_items, data.noise_sd, prior_sd)
    tu, ti, tr = (np.asarray(a) for a in (data.test_users, data.test_items, data.test_ratings))

    def rmse(A, B):
        return float(np.sqrt(np.mean((np.einsum("nk,nk->n", A[tu], B[ti]) - tr) ** 2)))

    return dict(users_given_items=rmse(U_hat, V), items_given_users=rmse(U, V_hat),
                oracle=rmse(U_hat, V_hat), true_factors=rmse(U, V))
