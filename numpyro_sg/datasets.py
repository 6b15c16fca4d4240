"""Simulators for the papers' experiments and the matching NumPyro models."""

from __future__ import annotations

import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = ["simulate_logistic_regression", "logistic_regression_model"]


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
    with numpyro.plate("data", N, subsample_size=min(subsample_size, N)):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=yb)
