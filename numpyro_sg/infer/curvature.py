r"""Curvature of a log density from Hessian-vector products, and the Laplace preconditioner.

* :func:`hutchinson_diagonal`: the Hutchinson estimate of diag(A) from products A·r with
  Rademacher probes r (one probe, or the mean over a stack of them) — the one estimator the
  warmup's diagonal Newton steps and preconditioner and pSGLD's curvature term share;
* :func:`whitened_top_eigenvalue`: the stiffness λ of a diagonal preconditioner, by power
  iteration;
* :func:`noise_heat_of`: how hot gradient noise makes a unit Langevin step;
* :func:`laplace_preconditioner`, :func:`dense_or_fallback`, :func:`positive_curvature`: the
  preconditioner of a (negative) Hessian.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import random

from numpyro_sg.infer.preconditioner import Preconditioner


def hutchinson_diagonal(hvp, probes):
    """Hutchinson's estimate of diag(A): r ⊙ (A·r) for a Rademacher probe r, averaged over the
    probes when ``probes`` is a stack (k, d) of them.

    Unbiased; one probe's variance for coordinate j is Σ_{l≠j} A_jl² (divided by k for the
    mean of k).  ``hvp(v)`` returns A·v (a Hessian-vector product, never a d×d matrix).

    **Example:**

    >>> import jax.numpy as jnp
    >>> from jax import random
    >>> A = jnp.array([[2.0, 0.0], [0.0, 3.0]])
    >>> hutchinson_diagonal(lambda v: A @ v, random.rademacher(random.PRNGKey(0), (4, 2), float)).tolist()
    [2.0, 3.0]
    """
    if jnp.ndim(probes) == 1:
        return probes * hvp(probes)
    return jnp.mean(jax.vmap(lambda v: v * hvp(v))(probes), axis=0)


def whitened_top_eigenvalue(neg_hvp, scale, key, num_iterations: int = 60) -> float:
    """Largest eigenvalue of S·(−H)·S, S = diag(``scale``), by power iteration on
    Hessian-vector products ``neg_hvp(v) = −H·v`` (d-vectors only, never a d×d matrix).

    With S the diagonal Laplace scales (−H)_jj^(−1/2) the whitened matrix has unit diagonal, so
    its top eigenvalue λ ≥ 1; λ ≫ 1 means strongly coupled coordinates (the conditional sds
    are much wider than the posterior along some direction), where a step size in units of
    the diagonal scales is unstable.
    """
    v = random.normal(key, scale.shape, scale.dtype)
    v = v / jnp.linalg.norm(v)
    lam = 1.0
    for _ in range(num_iterations):
        w = scale * neg_hvp(scale * v)
        lam = float(jnp.vdot(v, w))
        norm = jnp.linalg.norm(w)
        if not np.isfinite(float(norm)) or float(norm) == 0.0:
            return 1.0
        v = w / norm
    return max(lam, 1.0)


#: bytes of temporaries one block of Hessian-vector products may take (dense Hessians)
HESSIAN_MEMORY = 2**31


def columns_within_memory(bytes_per_column: int, d: int, budget: int | None = None) -> int:
    """How many Hessian columns (Hessian-vector products) to compute at once, 1 to d, when one
    takes ``bytes_per_column`` bytes of temporaries (``budget``: default ``HESSIAN_MEMORY``)."""
    budget = HESSIAN_MEMORY if budget is None else budget
    return int(np.clip(budget // max(int(bytes_per_column), 1), 1, d))


def hessian_diagonals(log_density, xs, max_products: int = 64):
    """diag H(x) at each row x of ``xs`` (S, d), exact: d Hessian-vector products e_jᵀ·H·e_j per
    point, at most ``max_products`` at once (``lax.map`` over blocks of points); call in ``jit``."""
    d = xs.shape[1]
    eye = jnp.eye(d, dtype=xs.dtype)

    def one(x):
        return jnp.sum(eye * jax.vmap(lambda v: jax.jvp(jax.grad(log_density), (x,), (v,))[1])(eye), axis=1)

    return jax.lax.map(one, xs, batch_size=max(1, max_products // d))


def hessian_from_products(products, d: int, block: int, dtype) -> np.ndarray:
    """H (d, d) float64 from ``products(V)`` = (H·v for the rows v of V), ``block`` columns at
    a time (the last block padded with zero rows)."""
    eye = np.eye(-(-d // block) * block, d, dtype=dtype)
    return np.concatenate([np.asarray(products(eye[i:i + block]), np.float64)
                           for i in range(0, d, block)])[:d]


def predicted_ascent(grad, neg_h) -> float:
    """How far log π would climb from a point with gradient g by a Newton step.

    With the full curvature −H (d, d): the Newton decrement ½·gᵀ(−H)⁻¹g where −H is positive
    definite, ``inf`` where it is not (a saddle, a ridge, a slope still climbing: no local
    maximum there; so too where −H is not finite).  With its diagonal (d,) only (large models):
    ½·Σ g_j²/|h_jj| (magnitudes, so that any point has an answer).  ``inf`` where the result is not finite.  Small at a
    local maximum; large on a slope that is still climbing.

    >>> round(predicted_ascent([1.0, 0.0], [[2.0, 0.0], [0.0, 1.0]]), 12)
    0.25
    >>> predicted_ascent([1.0, 0.0], [[1.0, 0.0], [0.0, -1.0]])   # −H not positive definite
    inf
    >>> predicted_ascent([1.0, 0.0], [[np.inf, 0.0], [0.0, 1.0]])   # −H overflowed
    inf
    """
    g, h = np.asarray(grad, np.float64), np.asarray(neg_h, np.float64)
    if not np.all(np.isfinite(h)):   # overflowed (an exponential link far out): shows no maximum
        return np.inf
    if h.ndim == 2:
        try:
            chol = np.linalg.cholesky(0.5 * (h + h.T))
        except np.linalg.LinAlgError:
            return np.inf
        value = 0.5 * float(np.sum(np.linalg.solve(chol, g) ** 2))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            value = 0.5 * float(np.sum(g**2 / np.abs(h)))
    return value if np.isfinite(value) else np.inf


def local_modes_below(best: float, values, ascents, gap: float) -> np.ndarray:
    """Which end points, of log densities ``values`` and predicted further ascents ``ascents``
    (:func:`predicted_ascent`), sit in a local mode more than ``gap`` nats below ``best``: those
    that have about stopped climbing (a ≤ ``gap``) and stop well below it (Δ − a > ``gap``,
    Δ = ``best`` − value).  An end still climbing (a large a: unconverged, or on a slope
    towards a scale's boundary) is no evidence of another mode.

    >>> local_modes_below(0.0, [-100.0, -100.0, -5.0], [3.0, 90.0, 0.0], 20.0).tolist()
    [True, False, False]
    """
    values, ascents = np.asarray(values, np.float64), np.asarray(ascents, np.float64)
    finite = np.isfinite(values) & np.isfinite(ascents)
    below = np.where(finite, best - values - np.where(finite, ascents, 0.0), -np.inf)
    return finite & (ascents <= gap) & (below > gap)


def noise_heat_of(tau_working) -> float:
    """h = 90% quantile over coordinates of τ_w²/4: the variance a Langevin step of unit size
    (ε = 1 in the working frame) gets from gradient noise of sd τ_w, (ε/2)²·τ_w², relative to
    its injected variance ε."""
    return float(np.quantile(np.asarray(tau_working, np.float64) ** 2 / 4.0, 0.9))


def positive_curvature(curvature):
    """Curvatures made positive: non-positive or non-finite entries get the median positive one
    (1 when there is none)."""
    good = np.isfinite(curvature) & (curvature > 0)
    fill = float(np.median(curvature[good])) if good.any() else 1.0
    return np.where(good, curvature, fill)


def laplace_preconditioner(neg_hessian: np.ndarray, dtype=jnp.float32) -> Preconditioner:
    """Dense Laplace preconditioner L with L·Lᵀ = (−H)⁻¹ (−H positive definite, float64 in)."""
    R = np.linalg.cholesky(neg_hessian)  # −H = R·Rᵀ  ⇒  (−H)⁻¹ = R⁻ᵀ·R⁻¹
    L = np.linalg.inv(R).T
    return Preconditioner(chol=jnp.asarray(L, dtype))


def dense_or_fallback(neg_hessian: np.ndarray, dtype) -> Preconditioner:
    """Dense Laplace preconditioner, or (−H not positive definite) a diagonal one from the
    diagonal of −H (:func:`positive_curvature`)."""
    try:
        return laplace_preconditioner(neg_hessian, dtype)
    except np.linalg.LinAlgError:
        diag = positive_curvature(np.diag(neg_hessian))
        return Preconditioner(scale=jnp.asarray(1.0 / np.sqrt(diag), dtype))
