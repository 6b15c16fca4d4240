r"""STEP 1 of SparseAsync: the move of the active block [θ]_δ given δ.

An exact draw from its Gaussian conditional (:func:`gaussian_block_draw`), or one gradient
step built from the shared moves of :mod:`numpyro_sg.kernels.moves` (:func:`block_move`: one
MALA step, :func:`~numpyro_sg.kernels.moves.mala_step`, or one SGLD step,
:func:`~numpyro_sg.kernels.moves.langevin_move`), with the scale-free gradient norm the
divergence guard compares (:func:`guard_norm`) and the warmup adaptation of the MALA step
size (:func:`robbins_monro`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import random

from numpyro_sg.kernels.guard import all_finite
from numpyro_sg.kernels.moves import langevin_move, langevin_noise_variance, mala_step


def gaussian_block_draw(key, X, weights, residual, prior_loc, prior_scale, mask=None, total=None):
    r"""Exact draw of a block u ∈ ℝ^m from its Gaussian conditional (STEP 1, ``inner="gaussian"``).

    The target is a Normal prior per coordinate times a Gaussian likelihood in X·u,

    .. math::

       p(u) \propto \exp\Big(-\sum_k \frac{(u_k-\mu_k)^2}{2 s_k^2}
                             - \sum_i \frac{w_i}{2}\,(r_i - x_i^\top u)^2\Big)
       = \mathcal N(P^{-1}b,\; P^{-1}),\quad P = \operatorname{diag}(s^{-2}) + X^\top W X,\;
       b = \mu/s^2 + X^\top W r,

    drawn as u = P⁻¹b + L⁻ᵀξ with P = L·Lᵀ (Cholesky) and ξ ~ N(0, I).  For the active block of
    a linear model with noise sd σ: X the active columns, w = 1/σ², r = y − offset, (μ, s) the
    slab.  ``mask`` (m,) marks the real coordinates of a padded block: the others are 0 on
    return and do not affect the real ones (their columns and prior are ignored).

    :param key: PRNG key.
    :param X: (n, m) design columns of the block.
    :param weights: (n,) likelihood precisions w_i.
    :param residual: (n,) residuals r_i (observations minus the offset).
    :param prior_loc: (m,) prior means μ.
    :param prior_scale: (m,) prior sds s.
    :param mask: optional (m,) bool, True for the real coordinates.
    :param total: optional function summing (XᵀWX, XᵀWr) over the data shards when the rows
        are this device's share (one ``psum``); ``None`` when X holds all the rows.
    :return: u, shape (m,).

    **Example:**

    .. code-block:: python

        u = gaussian_block_draw(key, X[:, active], jnp.full(N, 1 / sigma**2), y,
                                jnp.zeros(k), jnp.ones(k))
    """
    m = X.shape[1]
    mask = jnp.ones((m,), bool) if mask is None else jnp.asarray(mask, bool)
    X = jnp.where(mask[None, :], X, 0.0)
    sd = jnp.where(mask, prior_scale, 1.0)
    gram, score = (X * weights[:, None]).T @ X, X.T @ (weights * residual)
    if total is not None:
        gram, score = total((gram, score))
    precision = jnp.diag(1.0 / sd**2) + gram
    b = jnp.where(mask, prior_loc / sd**2, 0.0) + score
    L = jnp.linalg.cholesky(precision)
    mean = jax.scipy.linalg.cho_solve((L, True), b)
    xi = random.normal(key, (m,), X.dtype)
    u = mean + jax.scipy.linalg.solve_triangular(L.T, xi, lower=False)
    return jnp.where(mask, u, 0.0)


def guard_norm(step_size, grad, mask):
    r"""The gradient norm the divergence guard compares: 1 + √(ε·mean_j g_j²) over the moved
    coordinates (``mask`` > 0).

    √ε·g_j is twice the drift (ε/2)·g_j of coordinate j in units of the step's noise sd √ε, so
    the norm is scale-free; the 1 is its value for an empty active block (size(δ) = 0, the
    default start), which keeps the guard's reference away from 0.  A step size past the
    stability limit makes it grow geometrically; a non-finite gradient makes it NaN (the
    finite flag then catches the blow-up).

    >>> import jax.numpy as jnp
    >>> round(float(guard_norm(0.04, jnp.array([30.0, 40.0, 7.0]), jnp.array([1.0, 1.0, 0.0]))), 3)
    8.071
    >>> float(guard_norm(0.04, jnp.zeros(3), jnp.zeros(3)))
    1.0
    """
    on = jnp.asarray(mask) > 0
    count = jnp.maximum(jnp.sum(on), 1)
    return 1.0 + jnp.sqrt(step_size * jnp.sum(jnp.where(on, jnp.square(grad), 0.0)) / count)


class BlockMove(NamedTuple):
    """One STEP 1 move: the new block ``x``, the MALA acceptance probability ``accept_prob``
    (1 for SGLD and the exact draw), the :func:`guard_norm` of the gradient and whether the
    log density and gradient were ``finite``."""

    x: Any
    accept_prob: Any
    grad_norm: Any
    finite: Any


def block_move(kind, key, x, logp_grad_fn: Callable, step_size, mask) -> BlockMove:
    r"""STEP 1's gradient move of the coordinates where ``mask`` is 1 (the others stay put).

    ``kind="mala"``: one MALA step, x* = x + (ε/2)·∇log π(x) + √ε·ξ accepted with the
    Metropolis–Hastings probability (:func:`~numpyro_sg.kernels.moves.mala_step`); the guard
    reads the gradient at the point kept.  ``kind="sgld"``: one Langevin step
    x' = x + (ε/2)·ĝ(x) + √ε·ξ (:func:`~numpyro_sg.kernels.moves.langevin_move`), ĝ the
    mini-batch gradient; the guard reads ĝ(x), the only gradient the step computes.
    ``logp_grad_fn(x) -> (log π(x), ∇ log π(x))``.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: (-0.5 * jnp.sum(x**2), -x)
    >>> move = block_move("mala", jax.random.PRNGKey(0), jnp.ones(3), f, 0.5, jnp.ones(3))
    >>> move.x.shape, bool(0 <= move.accept_prob <= 1), bool(move.finite)
    ((3,), True, True)
    """
    log_density, grad = logp_grad_fn(x)
    if kind == "mala":
        res = mala_step(key, x, log_density, grad, logp_grad_fn, step_size, mask)
        finite = jnp.isfinite(res.log_density) & all_finite(jnp.where(mask > 0, res.grad, 0.0))
        return BlockMove(res.x, res.accept_prob, guard_norm(step_size, res.grad, mask), finite)
    noise = random.normal(random.split(key)[0], jnp.shape(x), x.dtype) * mask
    new = langevin_move(x, grad * mask, step_size, noise, langevin_noise_variance(step_size))
    finite = jnp.isfinite(log_density) & all_finite(jnp.where(mask > 0, grad, 0.0))
    return BlockMove(new, jnp.ones((), x.dtype), guard_norm(step_size, grad, mask), finite)


def norm_logpdf(x, loc, scale):
    """Log density of N(loc, scale²) at x, elementwise."""
    return -0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi)


def robbins_monro(step_size, accept_prob, iteration, target=0.5, rate=0.55):
    """log ε ← log ε + (k+1)^(−rate)·(α_k − target) (the authors' MALA adaptation).

    >>> round(float(robbins_monro(0.1, 0.9, 0)), 4)   # accepted often: a larger step
    0.1492
    """
    gain = (iteration + 1.0) ** (-rate)
    return jnp.exp(jnp.log(step_size) + gain * (accept_prob - target))
