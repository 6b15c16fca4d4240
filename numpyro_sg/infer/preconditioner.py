r"""The preconditioner of the gradient-based kernels: an affine change of coordinates.

The kernels move a *working* vector u related to the flat unconstrained parameters θ by
θ = θ₀ + L·u, with the preconditioner M = L·Lᵀ.  A Langevin step in u with step size ε,

.. math:: u' = u + \tfrac{\varepsilon}{2}\,L^\top \hat g(\theta) + \sqrt{\varepsilon\tau}\,\xi,

is the preconditioned step θ' = θ + (ε/2)·M·ĝ(θ) + N(0, ε·τ·M) on θ.  With M the posterior
covariance (the Laplace covariance at the mode, ``preconditioner="laplace"``), ε is
dimensionless: ε = 1 moves about one posterior sd per iteration along every direction.

:class:`Preconditioner` is a pytree with exactly one of three forms: identity (both fields
``None``), diagonal (``scale``: L = diag(scale)) or dense (``chol``: a (d, d) square root L).
The form is static structure (it decides the shapes), the values are data, so a state holding
a preconditioner can be ``vmap``-ed over chains or tuning arms.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random


class Preconditioner(NamedTuple):
    """M = L·Lᵀ with L = diag(``scale``) (diagonal), ``chol`` (dense) or I (both ``None``).

    ``kind`` is ``"identity"``, ``"diagonal"`` or ``"dense"``.

    **Example:**

    .. code-block:: python

        P = Preconditioner(scale=jnp.array([0.1, 2.0]))
        to_working(P, jnp.array([1.0, 1.0]))   # Lᵀ g = [0.1, 2.0]
    """

    scale: Any = None
    chol: Any = None

    @property
    def kind(self) -> str:
        if self.chol is not None:
            return "dense"
        return "identity" if self.scale is None else "diagonal"


def identity_preconditioner() -> Preconditioner:
    """M = I: the kernels' plain, unpreconditioned form."""
    return Preconditioner()


def to_working(P: Preconditioner, g):
    """Lᵀ·g: a gradient with respect to θ as a gradient with respect to u (θ = θ₀ + L·u)."""
    if P.chol is not None:
        return P.chol.T @ g
    return g if P.scale is None else P.scale * g


def from_working(P: Preconditioner, du):
    """L·du: an increment of u as an increment of θ."""
    if P.chol is not None:
        return P.chol @ du
    return du if P.scale is None else P.scale * du


def rows_to_working(P: Preconditioner, G):
    """Each row g_i of G (n, d) mapped to Lᵀ·g_i (per-datum gradients into the working frame)."""
    if P.chol is not None:
        return G @ P.chol
    return G if P.scale is None else G * P.scale


class Moments(NamedTuple):
    """Running (Welford) moments of a chain's flat parameters: ``count``, ``mean`` (d,) and the
    sum of squared deviations ``m2`` — (d, d) for a dense preconditioner, (d,) otherwise — and
    the smallest and largest value of each coordinate, ``low`` and ``high`` (d,): a chain's
    excursions, which a mean and variance average away."""

    count: Any
    mean: Any
    m2: Any
    low: Any = None
    high: Any = None


def given_preconditioner(P, dim: int, dtype) -> Preconditioner:
    """A preconditioner given as an array: ``None`` (M = I), scales (d,) or a covariance (d, d)."""
    if P is None:
        return Preconditioner()
    if np.shape(P) not in ((dim,), (dim, dim)):
        kind = "scales have" if np.ndim(P) == 1 else "covariance has"
        raise ValueError(f"preconditioner {kind} shape {np.shape(P)}; the model has {dim} unconstrained coordinates.")
    if np.ndim(P) == 1:
        return Preconditioner(scale=jnp.asarray(P, dtype))
    return Preconditioner(chol=jnp.asarray(np.linalg.cholesky(P), dtype))


def init_moments(dim: int, dense: bool, dtype=jnp.float32) -> Moments:
    """Empty moments (dense: a (d, d) ``m2``)."""
    m2 = jnp.zeros((dim, dim) if dense else (dim,), dtype)
    return Moments(jnp.zeros((), dtype), jnp.zeros((dim,), dtype), m2, jnp.zeros((dim,), dtype),
                   jnp.zeros((dim,), dtype))


def update_moments(m: Moments, x, active=True) -> Moments:
    """Welford's update with the point ``x`` where ``active`` (else ``m`` unchanged); ``low`` and
    ``high`` start at the first point counted (moments reset to zeros start afresh)."""
    count = m.count + 1.0
    delta = x - m.mean
    mean = m.mean + delta / count
    after = x - mean
    m2 = m.m2 + (jnp.outer(delta, after) if m.m2.ndim == 2 else delta * after)
    first = m.count == 0
    low = jnp.where(first, x, jnp.minimum(m.low, x))
    high = jnp.where(first, x, jnp.maximum(m.high, x))
    return Moments(*(jnp.where(active, new, old) for new, old in zip((count, mean, m2, low, high), m)))


def pool_moments(counts, means, m2s):
    """Moments of several chains pooled (numpy arrays with a leading chain axis):
    ``(count, mean, covariance)``; the covariance is (d, d) or (d,) like ``m2``."""
    counts = np.asarray(counts, np.float64)
    means = np.asarray(means, np.float64)
    m2s = np.asarray(m2s, np.float64)
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    dev = means - mean
    between = np.einsum("c,ci,cj->ij", counts, dev, dev) if m2s.ndim == 3 else (counts[:, None] * dev**2).sum(0)
    return n, mean, (m2s.sum(0) + between) / max(n - 1.0, 1.0)


def adapted_preconditioner(P: Preconditioner, m: Moments, shrinkage: float = 5.0) -> Preconditioner:
    """P re-estimated from the moments of warmup draws (as NUTS adapts its mass matrix).

    The sample covariance S of n draws is shrunk towards the current M = L·Lᵀ,
    (n/(n + 5))·S + (5/(n + 5))·M, and factorised (Cholesky, or square roots of the diagonal);
    a factorisation that fails (non-finite) keeps P.
    """
    n = m.count
    S = m.m2 / jnp.maximum(n - 1.0, 1.0)
    w = n / (n + shrinkage)
    if P.chol is not None:
        cov = w * S + (1.0 - w) * (P.chol @ P.chol.T)
        L = jnp.linalg.cholesky(0.5 * (cov + cov.T))
        return Preconditioner(chol=jnp.where(jnp.all(jnp.isfinite(L)), L, P.chol))
    current = jnp.ones_like(m.mean) if P.scale is None else P.scale
    var = w * S + (1.0 - w) * current**2
    scale = jnp.sqrt(var)
    return Preconditioner(scale=jnp.where(jnp.all(jnp.isfinite(scale) & (scale > 0)), scale, current))


def laplace_misfit(P: Preconditioner, mode, mean, cov):
    """How far draws (pooled ``mean`` and ``cov``, numpy) are from the Gaussian N(mode, L·Lᵀ):
    ``(max abs(whitened mean offset), smallest and largest eigenvalue of the whitened
    covariance)``; for a diagonal P the whitened covariance's diagonal stands in for its
    eigenvalues."""
    mean, mode, cov = (np.asarray(a, np.float64) for a in (mean, mode, cov))
    if P.chol is not None:
        Linv = np.linalg.inv(np.asarray(P.chol, np.float64))
        offset = Linv @ (mean - mode)
        C = cov if cov.ndim == 2 else np.diag(cov)
        eig = np.linalg.eigvalsh(Linv @ C @ Linv.T)
    else:
        scale = np.ones_like(mean) if P.scale is None else np.asarray(P.scale, np.float64)
        offset = (mean - mode) / scale
        eig = (np.diag(cov) if cov.ndim == 2 else cov) / scale**2
    return float(np.max(np.abs(offset))), float(np.min(eig)), float(np.max(eig))


def laplace_draw(mode, preconditioner: Preconditioner, key, jitter: float = 1.0):
    """One chain's flat start θ̂ + ``jitter``·L·ξ, ξ ~ N(0, I) from the chain's ``key``, for the
    warmup's mode θ̂ and ``preconditioner`` L (a draw from the Laplace approximation N(θ̂, Σ̂)
    for ``jitter=1``; traceable: the kernels draw it inside their ``init`` program)."""
    xi = random.normal(random.fold_in(key, 7), mode.shape, mode.dtype)
    return mode + jitter * from_working(preconditioner, xi)


def starting_points(init_params, fit, rng_key, batched, unravel, jitter: float = 1.0):
    """The chains' starts: ``init_params`` (given or drawn) win, else :func:`laplace_draw` per key of
    ``rng_key`` (``batched``: one per chain) from the warmup's ``fit`` (a ``ModeFit``)."""
    if init_params is not None:
        return init_params
    if fit is None:
        raise ValueError("no starting point: give init_params or init_strategy, or run the warmup.")
    one = lambda key: unravel(laplace_draw(fit.mode, fit.preconditioner, key, jitter))
    return jax.jit(jax.vmap(one))(rng_key) if batched else one(rng_key)   # one program, not one per operation
