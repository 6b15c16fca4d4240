"""Log densities over all the data (in chunks), the prior alone, and per-datum likelihood terms.

What the warmup and the diagnostics need beyond a mini-batch estimate, each in memory O(chunk·d)
or O(n·d), never O(N·d): the exact full-data log density and its gradient
(:func:`full_value_and_grad_fn`), the prior's (:func:`prior_log_density_fn`), the diagonal of
the likelihood's Fisher information (:func:`fisher_diagonal`) and per-datum log-likelihood
gradients (:func:`per_datum_loglik_grads`).  :class:`~numpyro_sg.infer.minibatch.Minibatcher`
exposes each as a method.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from numpyro.infer.util import potential_energy

from numpyro_sg.infer.handlers import mask_plate_rows, with_indices, without_plate_sites


def prior_log_density_fn(model: Callable, plates, model_args=(), model_kwargs=None) -> Callable:
    """``params -> log p(θ)`` (+ log-Jacobian): ``model`` with every site inside its subsample
    ``plates`` given weight 0 (the plates run on one datum)."""
    model_kwargs = model_kwargs or {}
    names = {p.name for p in plates}
    one = {p.name: jnp.arange(1, dtype=jnp.int32) for p in plates}

    def prior_log_density(params):
        return -potential_energy(without_plate_sites(with_indices(model, one), names),
                                 model_args, model_kwargs, params)

    return prior_log_density


def fisher_groups(rows: int, group_size: int = 8, block: int = 64) -> tuple[int, int, int]:
    """``(c, B, nb)`` of :func:`fisher_diagonal` for ``rows`` index rows: c rows per group, groups
    visited B at a time in nb blocks (G = nb·B groups; all rows when fewer than c·B)."""
    c = int(max(1, min(group_size, rows // 2)))
    B = int(min(block, rows // c))
    return c, B, (rows // c) // B


def fisher_sums(plate, log_density, prior_log_density, x, indices, group_size: int = 8, block: int = 64):
    """``(Σ_g L_g, Σ_g L_g²)`` over the groups of :func:`fisher_diagonal` (its sufficient
    statistics: sums over the strata of sharded data add up)."""
    N = plate.size
    idx = indices[plate.name]
    c, B, nb = fisher_groups(idx.shape[0], group_size, block)
    groups = idx[: nb * B * c].reshape(nb, B, c)
    g_prior = jax.grad(prior_log_density)(x)

    def body(carry, blk):
        s1, s2 = carry
        g = jax.vmap(lambda i: jax.grad(log_density)(x, {plate.name: i}))(blk)
        L = (g - g_prior) * (c / N)
        return (s1 + L.sum(0), s2 + (L**2).sum(0)), None

    zeros = jnp.zeros_like(x)
    (s1, s2), _ = jax.lax.scan(body, (zeros, zeros), groups)
    return s1, s2


def fisher_from_sums(s1, s2, n_groups: int, N: int, c: int):
    """N·Var_g(L_g)/c from the sums of :func:`fisher_sums` over ``n_groups`` groups of c rows."""
    var = (s2 - s1**2 / n_groups) / max(n_groups - 1, 1)
    return N * jnp.maximum(var, 0.0) / c


def fisher_diagonal(plate, log_density, prior_log_density, x, indices, group_size: int = 8,
                    block: int = 64):
    """Diagonal of the (centred) Fisher information N·Var_i(∇ log f(x_i | θ)) of the
    likelihood at the flat point ``x``, from the rows ``indices`` of the subsample ``plate``.

    The rows are split into G groups of c = ``group_size``; each group's gradient gives
    its likelihood sum L_g = (c/N)·(ĝ_g − ∇ log p) and Var_g(L_g) = c·Var_i(∇ log f_i)
    (rows drawn at random: cross terms between two rows of a group average out in the
    centred variance), so the estimate is N·Var_g(L_g)/c per coordinate.  Unlike a
    Hutchinson estimate of diag(H) it has no cross-coordinate noise (a coordinate's
    estimate involves only the rows that touch it), so it stays positive and accurate
    for coupled coordinates (matrix factorisation).  Groups are visited ``block`` at a
    time in a ``lax.scan``: memory O(block·d), never O(N·d).  G is rounded down to a
    multiple of ``block`` (all rows when there are fewer than c·block of them).

    ``log_density(x, indices)`` and ``prior_log_density(x)`` take the flat point.
    """
    c, B, nb = fisher_groups(indices[plate.name].shape[0], group_size, block)
    s1, s2 = fisher_sums(plate, log_density, prior_log_density, x, indices, group_size, block)
    return fisher_from_sums(s1, s2, nb * B, plate.size, c)


def full_value_and_grad_fn(model: Callable, plates, unravel, model_args=(), model_kwargs=None,
                           chunk_size: int = 65536) -> Callable:
    """``x -> (log π(x), ∇ log π(x))`` over all the data, for a flat point x.

    With one subsample plate the data are visited in chunks of ``chunk_size`` rows inside
    a ``lax.scan`` (memory O(chunk·d), never O(N·d)); the last chunk is padded and its
    padding masked out.  The prior is evaluated once, as an extra chunk with every row
    masked, and Σ_chunks (C/N)·(chunk log density − prior) + prior is the exact full-data
    log density.  With several plates all data are used at once.
    """
    model_kwargs = model_kwargs or {}
    if len(plates) != 1:
        full = {p.name: jnp.arange(p.size, dtype=jnp.int32) for p in plates}
        return jax.value_and_grad(
            lambda x: -potential_energy(with_indices(model, full), model_args, model_kwargs, unravel(x)))
    (plate,) = plates
    N = plate.size
    C = int(min(chunk_size, N))
    K = -(-N // C)
    starts = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.arange(K, dtype=jnp.int32) * C])
    include = jnp.arange(K + 1) > 0  # chunk 0: the prior alone (every row masked)

    def chunk_log_density(x, start, inc):
        idx = start + jnp.arange(C, dtype=jnp.int32)
        mask = (idx < N) & inc
        chunk_model = mask_plate_rows(with_indices(model, {plate.name: jnp.minimum(idx, N - 1)}),
                                      plate.name, mask)
        return -potential_energy(chunk_model, model_args, model_kwargs, unravel(x))

    def value_and_grad(x):
        def body(_, chunk):
            return None, jax.value_and_grad(chunk_log_density)(x, *chunk)

        _, (values, grads) = jax.lax.scan(body, None, (starts, include))
        value = values[0] + (C / N) * jnp.sum(values[1:] - values[0])
        grad = grads[0] + (C / N) * jnp.sum(grads[1:] - grads[0], axis=0)
        return value, grad

    return value_and_grad


def per_datum_loglik_grads(model: Callable, plate, params, indices, model_args=(), model_kwargs=None):
    """Gradients ∇_θ log f(x_i | θ) of each datum's log-likelihood, shape (n, …) per site, for
    the rows ``indices`` of the subsample ``plate``.

    O(n·d): the per-datum model gradient g_i = ∇ log p(θ) + N ∇ log f(x_i|θ) is computed by
    ``vmap`` over one-datum index sets, and the prior part removed.
    """
    model_kwargs = model_kwargs or {}
    idx = indices[plate.name]
    names = {plate.name}

    def log_density(p, i):
        return -potential_energy(with_indices(model, i), model_args, model_kwargs, p)

    def log_prior(p):  # the same density with every site inside the plate given weight 0
        return -potential_energy(
            without_plate_sites(with_indices(model, {plate.name: idx[:1]}), names),
            model_args,
            model_kwargs,
            p,
        )

    g_prior = jax.grad(log_prior)(params)

    def one(i):
        return jax.grad(log_density)(params, {plate.name: i[None]})

    g = jax.vmap(one)(idx)
    return jax.tree.map(lambda gi, gp: (gi - gp) / plate.size, g, g_prior)
