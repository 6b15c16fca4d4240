"""Mixed-effects models with local latent variables (random effects) and their simulators.

Each model puts the per-group random effects inside a subsample plate over the groups, with the
groups' rows padded into (G, R) arrays and a mask (:func:`numpyro_sg.locals.pad_groups`); the
gradient kernels integrate the random effects out (:mod:`numpyro_sg.locals`).
:func:`linear_mixed_marginal_model` is the same linear mixed model with the random effects
integrated out in closed form (a reference for NUTS and for the exact-gradient check).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = [
    "linear_mixed_model",
    "linear_mixed_marginal_model",
    "simulate_linear_mixed",
    "glmm_random_intercept_model",
    "simulate_glmm_random_intercept",
]


def _ragged(rng, G, mean_rows, max_rows):
    rows = np.clip(rng.poisson(mean_rows, G), 1, max_rows)
    return rows, np.arange(max_rows)[None, :] < rows[:, None]


def simulate_linear_mixed(G=200, mean_rows=5, max_rows=10, beta=(1.0, 0.5), tau=(0.7, 0.3),
                          sigma=0.5, seed=0):
    """``(X, Y, M)`` (G, R) arrays of a random intercept + slope model, rows per group Poisson."""
    rng = np.random.default_rng(seed)
    _, M = _ragged(rng, G, mean_rows, max_rows)
    X = rng.normal(size=(G, max_rows)) * M
    b = rng.normal(size=(G, 2)) * np.asarray(tau)
    Y = (beta[0] + b[:, :1] + (beta[1] + b[:, 1:]) * X + sigma * rng.normal(size=X.shape)) * M
    return X.astype(np.float32), Y.astype(np.float32), M


def linear_mixed_model(X, Y, M, subsample_size=None):
    """y_gr = β₀ + b_g0 + (β₁ + b_g1) x_gr + ε, b_g ~ N(0, diag τ²), ε ~ N(0, σ²); priors
    β ~ N(0, 10²), σ, τ ~ HalfNormal(1).  The random effects ``b`` are local latents of plate
    ``"groups"``."""
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0).expand([2]).to_event(1))
    G = X.shape[0]
    with numpyro.plate("groups", G, subsample_size=subsample_size or G):
        b = numpyro.sample("b", dist.Normal(0, tau).to_event(1))
        x, y, m = (numpyro.subsample(a, event_dim=1) for a in (X, Y, M))
        mu = beta[0] + b[:, :1] + (beta[1] + b[:, 1:]) * x
        numpyro.sample("y", dist.Normal(mu, sigma).mask(m).to_event(1), obs=y)


def linear_mixed_marginal_model(X, Y, M, subsample_size=None):
    """:func:`linear_mixed_model` with b integrated out in closed form: y_g ~ N(X_g β,
    Z_g diag(τ²) Z_gᵀ + σ² I) over each group's observed rows (full data, no subsampling)."""
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0).expand([2]).to_event(1))
    m = jnp.asarray(M, X.dtype)
    R = X.shape[1]
    Z = jnp.stack([jnp.ones_like(X), X], -1) * m[..., None]
    eye = jnp.eye(R, dtype=X.dtype)
    cov = (jnp.einsum("gri,i,gsi->grs", Z, tau**2, Z) + sigma**2 * eye * m[:, None, :]
           + eye * (1 - m)[:, None, :])
    mean = (beta[0] + beta[1] * X) * m
    padded = jnp.sum(1 - m) * -0.5 * jnp.log(2 * jnp.pi)   # the padding rows' N(0, 1) at 0
    numpyro.factor("y", jnp.sum(dist.MultivariateNormal(mean, cov).log_prob(Y * m)) - padded)


def simulate_glmm_random_intercept(G=400, rows=5, family="poisson", alpha=0.5, beta=0.3, tau=1.0,
                                   seed=0):
    """``(x, y, mask)`` (G, R) arrays of a random-intercept GLMM (``family`` ``"poisson"`` or
    ``"logistic"``), every group with ``rows`` rows (mask all True)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(G, rows))
    eta = alpha + beta * x + tau * rng.normal(size=(G, 1))
    if family == "poisson":
        y = rng.poisson(np.exp(eta))
    else:
        y = rng.random(size=eta.shape) < 1 / (1 + np.exp(-eta))
    return x.astype(np.float32), y.astype(np.float32), np.ones((G, rows), bool)


def glmm_random_intercept_model(x, y, mask, subsample_size=None, family="poisson"):
    """y_gr ~ Poisson(exp(α + β x_gr + b_g)) (or Bernoulli(logit⁻¹(…))), b_g ~ N(0, τ²); priors
    α, β ~ N(0, 5²), τ ~ HalfNormal(2).  ``b`` is a local latent of plate ``"groups"``."""
    alpha = numpyro.sample("alpha", dist.Normal(0, 5))
    beta = numpyro.sample("beta", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    G = x.shape[0]
    with numpyro.plate("groups", G, subsample_size=subsample_size or G):
        b = numpyro.sample("b", dist.Normal(0, tau))
        xb, yb, mb = (numpyro.subsample(a, event_dim=1) for a in (x, y, mask))
        eta = alpha + beta * xb + b[:, None]
        like = dist.Poisson(jnp.exp(eta)) if family == "poisson" else dist.Bernoulli(logits=eta)
        numpyro.sample("y", like.mask(mb).to_event(1), obs=yb)
