"""The gradient-noise sd τ̂ of a mini-batch estimate from k group estimators: how many groups
(:func:`noise_groups`) and the O(d)-memory Welford pass over them (:func:`group_noise_sd`)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

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
