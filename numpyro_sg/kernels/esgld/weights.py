"""Proposal weights w ∈ (0, 1)^p of the paper's birth / death / exchange moves (Song, Sun, Ye &
Liang (2020), "Extended stochastic gradient MCMC for large-scale Bayesian variable
selection", supplement §3): correlation-based for a linear model, deviance-based for other
GLMs, uniform, or given.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from numpyro_sg.spike_slab import GLMBatch

_W_MIN = 1e-6


def correlation_weights(X, y):
    """w_j = exp(abs(corr(y, x_j)) − 1) (the paper's supplement §3, linear models); constant columns get exp(−1).

    **Example:**

    .. code-block:: python

        correlation_weights(X[:20_000], y[:20_000])      # (p,) in (0, 1)
    """
    X = jnp.asarray(X)
    y = jnp.asarray(y, X.dtype)
    n = X.shape[0]
    xm = jnp.mean(X, 0)
    ym = jnp.mean(y)
    cov = (X.T @ (y - ym)) / n
    xs = jnp.sqrt(jnp.maximum(jnp.mean(X * X, 0) - xm * xm, 0.0))
    ys = jnp.std(y)
    corr = jnp.where(xs > 1e-12, jnp.abs(cov) / jnp.maximum(xs * ys, 1e-30), 0.0)
    return jnp.clip(jnp.exp(jnp.clip(corr, 0.0, 1.0) - 1.0), _W_MIN, 1 - _W_MIN)


def deviance_weights(X, y, family, params=None, newton_steps=8):
    """w_j = exp(−(d_j − min d)/(5·sd(d)) − 0.1) (the paper's supplement §3, GLMs).

    d_j is the deviance (−2 × maximised log-likelihood) of the model with an intercept and x_j
    only, fitted by ``newton_steps`` Newton steps for all j at once; constant columns (an
    intercept) get the largest weight exp(−0.1), as in the paper.

    **Example:**

    .. code-block:: python

        deviance_weights(X, y, GLM_FAMILIES["bernoulli"])      # (p,) in (0, 1)
    """
    X = jnp.asarray(X)
    y = jnp.asarray(y, X.dtype)
    params = params or {}
    p = X.shape[1]
    a = jnp.zeros((p,), X.dtype)
    b = jnp.zeros((p,), X.dtype)

    def step(_, ab):
        a, b = ab
        eta = a[None, :] + X * b[None, :]
        d1 = family.dloglik(eta, y[:, None], params)
        d2 = family.d2loglik(eta, y[:, None], params)
        ga, gb = d1.sum(0), (d1 * X).sum(0)
        haa, hab, hbb = d2.sum(0), (d2 * X).sum(0), (d2 * X * X).sum(0)
        haa, hbb = haa - 1e-6, hbb - 1e-6
        det = haa * hbb - hab * hab
        da = -(hbb * ga - hab * gb) / det
        db = -(-hab * ga + haa * gb) / det
        return a + jnp.clip(da, -5, 5), b + jnp.clip(db, -5, 5)

    a, b = lax.fori_loop(0, newton_steps, step, (a, b))
    eta = a[None, :] + X * b[None, :]
    d = -2.0 * family.loglik(eta, y[:, None], params).sum(0)
    const = jnp.std(X, 0) < 1e-12
    dv = jnp.where(const, jnp.nan, d)
    dmin = jnp.nanmin(dv)
    sd = jnp.maximum(jnp.nanstd(dv), 1e-12)
    w = jnp.exp(-(d - dmin) / (5.0 * sd) - 0.1)
    w = jnp.where(const, jnp.exp(-0.1), w)
    return jnp.clip(jnp.where(jnp.isfinite(w), w, _W_MIN), _W_MIN, 1 - _W_MIN)


def resolve_proposal_weights(kind, glm, num_coefficients):
    """The proposal-weight kind of a model: ``"auto"`` becomes ``"correlation"`` for a Gaussian
    GLM likelihood, ``"deviance"`` for another GLM and ``"uniform"`` otherwise; an array is
    checked to have p entries.  Raises ``ValueError`` for data-based weights without a GLM
    likelihood (``glm`` is the model's :class:`~numpyro_sg.spike_slab.GLMInfo` or ``None``).

    **Example:**

    .. code-block:: python

        resolve_proposal_weights("auto", ss.glm, ss.num_coefficients)     # 'correlation'
    """
    if not isinstance(kind, str):
        w = np.asarray(kind, dtype=float)
        if w.shape != (num_coefficients,):
            raise ValueError(
                f"proposal_weights has shape {w.shape}; the model has p = {num_coefficients} coefficients."
            )
        return w
    if kind == "auto":
        if glm is None:
            return "uniform"
        return "correlation" if glm.family_name == "gaussian" else "deviance"
    if kind in ("correlation", "deviance") and glm is None:
        raise ValueError(
            f"proposal_weights={kind!r} needs a GLM likelihood (linear predictor X·β), "
            "which was not detected for this model; use 'uniform' or an array."
        )
    return kind


def proposal_weights(kind, num_coefficients, glm_rows: GLMBatch | None = None, family=None):
    """The proposal weights w (p,) in (0, 1) of a resolved ``kind``
    (:func:`resolve_proposal_weights`): an array as given (clipped to [1e-6, 1 − 1e-6]),
    ``"uniform"`` w_j = ½, ``"correlation"`` :func:`correlation_weights` or ``"deviance"``
    :func:`deviance_weights` of the data rows ``glm_rows`` (a
    :class:`~numpyro_sg.spike_slab.GLMBatch`, e.g. ``start_fn(..., rows=…)``'s) of the GLM
    ``family``.

    **Example:**

    .. code-block:: python

        start = start_fn(ss, (X, y), rows=20_000)(key)
        w = proposal_weights("correlation", ss.num_coefficients, start.glm_rows)
    """
    dtype = jnp.result_type(float)
    if not isinstance(kind, str):
        return jnp.clip(jnp.asarray(kind, dtype), _W_MIN, 1 - _W_MIN)
    if kind == "uniform":
        return jnp.full((num_coefficients,), 0.5, dtype)
    if kind == "correlation":
        return correlation_weights(glm_rows.X, glm_rows.y)
    params = {k: v[:, None] for k, v in glm_rows.params.items()}
    return deviance_weights(glm_rows.X, glm_rows.y, family, params)
