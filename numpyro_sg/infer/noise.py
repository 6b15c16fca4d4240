"""The gradient-noise sd τ̂ of a mini-batch estimate from k group estimators: how many groups
(:func:`noise_groups`) and the O(d)-memory Welford pass over them (:func:`group_noise_sd`); the
control-variate noise of single rows the warmup measures (:func:`row_noise_covariance`,
:func:`row_noise_in_laplace_units`)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sg.infer.lapack_guard import map_in_batches

#: the group-mean noise estimate uses at most this many groups (largest divisor of n up to it)
MAX_GROUPS = 16
#: per-datum gradients (exact small-d behaviour) while n·d is at most this (4 MB of float32)
PER_DATUM_MAX = 1_000_000


def noise_groups(n: int, d: int, groups: int | None = None) -> int:
    """Number k of groups the batch of n indices is split into for the gradient-noise sd τ̂.

    ``groups`` forces k (it must divide n).  By default k = n (per-datum gradients, exact)
    while n·d ≤ :data:`PER_DATUM_MAX`; above, the largest divisor of n in [4, MAX_GROUPS]
    (memory O(k·d) instead of O(n·d)); when n has none (e.g. n prime) k = n with a warning-free
    fall-back to per-datum gradients — choose n with a small divisor (any multiple of 4 works).

    >>> noise_groups(1000, 10), noise_groups(1000, 50_000), noise_groups(800, 10**5, 10)
    (1000, 10, 10)
    """
    if groups is not None:
        groups = int(groups)
        if groups < 2 or n % groups:
            raise ValueError(f"noise groups must be ≥ 2 and divide the batch size n={n}; got {groups}.")
        return groups
    if n * d <= PER_DATUM_MAX:
        return n
    for k in range(min(MAX_GROUPS, n), 3, -1):
        if n % k == 0:
            return k
    return n


def group_noise_sd(likelihood, flat, idx, groups: int, anchor=None, to_working: Callable | None = None,
                   *, name: str, fraction_unsampled: float = 1.0):
    """τ̂ from k = ``groups`` group estimators, in memory O(d) and time O(n + k·d).

    The batch's n indices ``idx`` of plate ``name`` are split into k contiguous groups S_g of
    m = n/k and τ̂ = sd_g(g_g)/√k (× √(1 − n/N) without replacement: ``fraction_unsampled``
    = 1 − n/N).  The prior's gradient is the same in every g_g and drops out of their sd, so
    only the likelihood's group gradients h_g = (N/m)·Σ_{i∈S_g} ∇ log f(x_i|θ) are evaluated
    (``likelihood(flat, {name: indices})``, as from
    :meth:`~numpyro_sg.infer.minibatch.Minibatcher.likelihood_fn`; with an ``anchor``,
    h_g(θ) − h_g(θ̂)), one group at a time in a ``lax.scan`` with Welford's running moments:
    never the prior over all d in every group, nor a (k, d) matrix.  ``to_working`` maps rows
    of gradients into the working frame.
    """
    n, k = idx.shape[0], int(groups)
    if k < 2 or n % k:
        raise ValueError(f"noise groups k={k} must be ≥ 2 and divide the batch size n={n}.")
    grad = jax.grad(likelihood)

    def group_gradient(i):
        h = grad(flat, {name: i})
        if anchor is not None:
            h = h - grad(anchor.point, {name: i})
        return h if to_working is None else to_working(h[None])[0]

    def body(carry, i):
        count, mean, m2 = carry
        h = group_gradient(i)
        count = count + 1.0
        delta = h - mean
        mean = mean + delta / count
        return (count, mean, m2 + delta * (h - mean)), None

    zeros = jnp.zeros_like(flat)
    (_, _, m2), _ = jax.lax.scan(body, (jnp.zeros((), flat.dtype), zeros, zeros),
                                 idx.reshape(k, n // k))
    return jnp.sqrt(m2 / (k - 1) / k * fraction_unsampled)


def row_noise_covariance(log_density, plate_name: str, rows, x, anchor, frame, batch_size: int = 1024):
    """Cov_i(g_i(x) − g_i(x̂)) over the row indices ``rows``, g_i = ∇ log p + N·∇ log f(x_i | ·)
    the gradient of ``log_density(x, {plate_name: [i]})`` and x̂ = ``anchor``: n times the
    covariance of the control-variate gradient on n rows drawn with replacement (the prior's
    part cancels), (d, d); and the largest single row's deviation in the frame S = ``frame`` (d, d),
    t_j = max_i |(S·(δ_i − δ̄))_j| / √S_jj with δ_i = g_i(x) − g_i(x̂): a mini-batch of n rows moves
    a chain preconditioned by S by t_j/n Laplace sds per unit of drift when it holds row i (d,).
    Also the rows' mean deviation δ̄ (d,): on all rows (or a uniform subsample) the full-data
    gradient's change ∇ log π(x) − ∇ log π(x̂).  Traceable; ``batch_size`` rows at a time."""
    both = jnp.stack([x, anchor])   # one trace of the model for both points

    def delta(i):
        g = jax.vmap(lambda z: jax.grad(log_density)(z, {plate_name: i[None]}))(both)
        return g[0] - g[1]
    deltas = map_in_batches(delta, rows, batch_size)
    mean = jnp.mean(deltas, axis=0)
    centred = deltas - mean
    largest = jnp.max(jnp.abs(centred @ frame), axis=0) / jnp.sqrt(jnp.diag(frame))
    return centred.T @ centred / deltas.shape[0], largest, mean


def row_noise_in_laplace_units(covariance, chol) -> np.ndarray:
    """r_j = (Σ̂·C·Σ̂)_jj / Σ̂_jj, Σ̂ = L·Lᵀ (``chol`` L): the variance a row's gradient noise C
    adds per unit of drift to coordinate j of a Langevin chain preconditioned by Σ̂, in units of
    Σ̂_jj (:mod:`numpyro_sg.kernels.noise_plan`).

    >>> row_noise_in_laplace_units(np.eye(2) * 4.0, np.diag([0.5, 1.0])).tolist()
    [1.0, 4.0]
    """
    L = np.asarray(chol, np.float64)
    S = L @ L.T
    return np.einsum("ij,jk,ki->i", S, np.asarray(covariance, np.float64), S) / np.diag(S)


def laplace_row_noise(covariance, gradients, x, precond, key, points: int) -> tuple:
    """``(r, t, λ̂)``: r (d,) of :func:`row_noise_in_laplace_units` for the mean of the covariance
    returned by ``covariance(y, x, S)`` (:func:`row_noise_covariance` with anchor x and frame
    S = L·Lᵀ) at ``points`` draws y = x + L·ξ of the Laplace approximation N(x, L·Lᵀ) (``precond``:
    dense or diagonal), t (d,) the largest single row's deviation over those draws, and
    λ̂ = :func:`drift_ratio` at those draws and their mirror images x − L·ξ, whose gradients
    ``gradients(ys)`` (on the same rows, x first) gives."""
    L = np.asarray(precond.chol if precond.chol is not None else jnp.diag(precond.scale), np.float64)
    S = jnp.asarray(L @ L.T, x.dtype)
    xi = np.asarray(jax.random.normal(key, (points, x.shape[0])), np.float64)
    centre = np.asarray(x, np.float64)
    found = [covariance(jnp.asarray(y, x.dtype), x, S) for y in centre + xi @ L.T]
    C = np.mean([np.asarray(c, np.float64) for c, _, _ in found], axis=0)
    t = np.max([np.asarray(largest, np.float64) for _, largest, _ in found], axis=0)
    mirrored = np.asarray(gradients(jnp.asarray(np.vstack([centre, centre - xi @ L.T]), x.dtype)), np.float64)
    changes = np.vstack([np.stack([np.asarray(m, np.float64) for _, _, m in found]), mirrored[1:] - mirrored[0]])
    return (tuple(float(r) for r in row_noise_in_laplace_units(C, L)), tuple(float(v) for v in t),
            drift_ratio(changes, np.vstack([xi, -xi]), L))


def drift_ratio(gradient_changes, xi, chol) -> float:
    """λ̂ = max_k ‖Lᵀ·Δg_k‖/‖ξ_k‖, Δg_k = ∇ log π(x̂ + L·ξ_k) − ∇ log π(x̂) (``gradient_changes``,
    (k, d)): 1 on a Gaussian posterior N(x̂, L·Lᵀ) (Lᵀ·Δg = −ξ), above 1 where the curvature a
    Langevin chain meets a few Laplace sds out exceeds the mode's (a saturating link whose few
    rows tens of sds out are fitted at the mode), as a whitened Gaussian target of curvature λ̂.
    Probes whose gradient is not finite (outside the support, or overflowing) do not count; with
    none left, 1.

    >>> drift_ratio(np.array([[-2.0, 0.0], [0.0, -1.0]]), np.array([[1.0, 0.0], [0.0, 1.0]]), np.eye(2))
    2.0
    """
    changes = np.asarray(gradient_changes, np.float64)
    finite = np.all(np.isfinite(changes), axis=1)
    if not finite.any():
        return 1.0
    whitened = changes[finite] @ np.asarray(chol, np.float64)
    return float(np.max(np.linalg.norm(whitened, axis=1) / np.linalg.norm(np.asarray(xi)[finite], axis=1)))
