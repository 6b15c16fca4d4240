"""SparseAsync's state and its pure step: STEP 1 and STEP 2 (:mod:`.glm` or :mod:`.dense`),
the warmup adaptation of the MALA step size (:func:`~.updates.robbins_monro`), and the
divergence guard shared by every kernel (:func:`~numpyro_sg.kernels.guard.guarded_update`,
once per iteration)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax, random
from jax.flatten_util import ravel_pytree

from numpyro_sg.kernels.guard import all_finite, freeze, guarded_update, init_guard
from numpyro_sg.kernels.sparse_async.dense import dense_iteration
from numpyro_sg.kernels.sparse_async.glm import glm_iteration
from numpyro_sg.kernels.sparse_async.setup import SPIKE_KEY
from numpyro_sg.kernels.sparse_async.updates import robbins_monro


class SparseAsyncHyper(NamedTuple):
    """Hyperparameters of :class:`~numpyro_sg.SparseAsync` held in its state: ``step_size`` the
    base ε of the MALA / SGLD step (the user's or the tuner's value; warmup adaptation starts
    from it)."""

    step_size: Any


class SparseAsyncState(NamedTuple):
    """State of :class:`~numpyro_sg.SparseAsync`.

    ``i`` iteration counter (warmup included); ``z`` a dict of the unconstrained continuous
    sites (θ included; excluded θ_j hold stale values, see :mod:`numpyro_sg.kernels.sparse_async`),
    the indicator δ (int32) and the key of the output's spike draws; ``step_size`` the current
    MALA / SGLD ε (Robbins–Monro-adapted during warmup); ``accept_prob`` the MALA acceptance
    probability min(1, ratio) of this iteration (1 for an exact draw or SGLD); ``model_size``
    size(δ); ``active`` the padded list of active coordinates (fast path; a dummy otherwise);
    ``aux`` per-chain constants of the fast path (prior parameters, offset, observations,
    transposed design); ``hyper`` the :class:`SparseAsyncHyper`; ``guard`` the
    :class:`~numpyro_sg.kernels.guard.DivergenceGuard`; ``diverging`` True from the first
    blow-up on (the chain is frozen at its last safe point); ``overflow`` True once size(δ)
    would exceed ``max_active`` (the guard then freezes the chain as a blow-up).
    """

    i: Any
    z: Any
    step_size: Any
    accept_prob: Any
    model_size: Any
    active: Any
    aux: Any
    hyper: Any
    guard: Any
    diverging: Any
    overflow: Any
    batch_state: Any
    rng_key: Any


def chain_point(ss, z):
    """The flat point the guard keeps: the continuous sites (ravelled), then δ as floats."""
    flat = ravel_pytree({k: v for k, v in z.items() if k not in (ss.indicator, SPIKE_KEY)})[0]
    return jnp.concatenate([flat, z[ss.indicator].astype(flat.dtype)])


def initial_state(plan, mb, params, delta, key, constants, model_args, model_kwargs):
    """The state of one chain at (params, δ) (pure; jitted with the data as arguments)."""
    ss = plan.ss
    p = ss.num_coefficients
    key, key_batch, key_out = random.split(key, 3)
    dtype = ravel_pytree(params)[0].dtype
    if plan.fast:
        active = jnp.nonzero(delta, size=plan.max_active, fill_value=p)[0].astype(jnp.int32)
        aux = constants
    else:
        active, aux = jnp.zeros((1,), jnp.int32), None
    z = {**params, ss.indicator: delta, SPIKE_KEY: key_out}
    return SparseAsyncState(
        i=jnp.int32(0),
        z=z,
        step_size=jnp.asarray(plan.step_size, dtype),
        accept_prob=jnp.ones((), dtype),
        model_size=jnp.sum(delta).astype(jnp.int32),
        active=active,
        aux=aux,
        hyper=SparseAsyncHyper(jnp.asarray(plan.step_size, jnp.result_type(float))),
        guard=init_guard(chain_point(ss, z), jnp.ones((), dtype)),  # the guard norm's floor
        diverging=jnp.array(False),
        overflow=jnp.array(False),
        batch_state=mb.init_batch_state(key_batch) if mb is not None else None,
        rng_key=key,
    )


def adapted_step_size(plan, state, accept_prob, num_warmup):
    """Robbins–Monro adaptation of the MALA ε toward ``plan.target``, during warmup only."""
    if not plan.adapt:
        return state.step_size
    new = robbins_monro(state.step_size, accept_prob, state.i, plan.target)
    return jnp.where(state.i < num_warmup, new, state.step_size)


def kept_active(plan, delta, state, new, frozen, newly):
    """``(active list, size(δ))`` of the point kept: recomputed from δ at a new blow-up (the
    chain goes back to its last safe point), else the frozen or the new state's."""
    if not plan.fast:
        return new.active, jnp.sum(delta).astype(jnp.int32)

    def recount():
        p = delta.shape[0]
        active = jnp.nonzero(delta, size=plan.max_active, fill_value=p)[0].astype(jnp.int32)
        return active, jnp.sum(delta).astype(jnp.int32)

    def keep():
        return freeze(frozen, (state.active, state.model_size), (new.active, new.model_size))

    return lax.cond(newly, recount, keep)


def guard_chain(plan, unravel, state, new, grad_norm, finite):
    """The shared guard on the whole point (continuous sites and δ): ``new`` unless the chain
    blows up (non-finite, ``grad_norm`` far above its reference, or an overflow of the active
    list); then the chain is frozen at its last safe point and ``diverging`` stays True."""
    ss, p = plan.ss, plan.ss.num_coefficients
    new_flat = chain_point(ss, new.z)
    kept = guarded_update(state.guard, state.diverging, chain_point(ss, state.z), new_flat,
                          grad_norm, finite & all_finite(new_flat) & ~new.overflow)
    delta = kept.flat[-p:].astype(jnp.int32)
    frozen, newly = kept.diverging, kept.diverging & ~state.diverging
    key = freeze(frozen, state.z[SPIKE_KEY], new.z[SPIKE_KEY])
    z = {**unravel(kept.flat[:-p]), ss.indicator: delta, SPIKE_KEY: key}
    active, size = kept_active(plan, delta, state, new, frozen, newly)
    return new._replace(z=z, active=active, model_size=size, guard=kept.guard, diverging=frozen)


def sparse_async_step(plan, mb, unravel, num_warmup, state, model_args, model_kwargs):
    """One iteration of one chain (pure): STEP 1, STEP 2, the MALA ε adapted during warmup,
    then the divergence guard."""
    if plan.fast:
        new, norm, finite = glm_iteration(plan, mb, state, model_args, model_kwargs)
    else:
        new, norm, finite = dense_iteration(plan, mb, unravel, state, model_args, model_kwargs)
    new = new._replace(step_size=adapted_step_size(plan, state, new.accept_prob, num_warmup))
    return guard_chain(plan, unravel, state, new, norm, finite)
