"""One iteration of SparseAsync on the generic (dense) path: any model of the spike-and-slab
form, evaluated on the full data (a mini-batch for ``variant="sgld"``), O(N·p) per iteration.

The asynchronous update's one gradient is taken by automatic differentiation
(:func:`dense_async_gradient`); the primitives shared with the GLM path are in :mod:`.updates`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import random
from jax.flatten_util import ravel_pytree

from numpyro_sg.kernels.sparse_async.setup import SPIKE_KEY
from numpyro_sg.kernels.sparse_async.updates import (
    async_update,
    block_move,
    draw_subset,
    evaluation_shift,
    sequential_sweep,
)


def dense_block_move(plan, unravel, params, delta, indices, step_size, keys, model_args, model_kwargs):
    """STEP 1: excluded θ from the spike, then one MALA / SGLD step of the other coordinates
    (:func:`~numpyro_sg.kernels.sparse_async.block_move`).  Returns ``(params, BlockMove)``."""
    ss = plan.ss
    k_spike, k_inner = keys
    values = ss.constrain_fn(model_args, model_kwargs)(params, delta)
    spike = ss.spike_sample_fn(model_args, model_kwargs)(k_spike, values)
    params = dict(params)
    theta = params[ss.coefficient]
    params[ss.coefficient] = jnp.where(delta == 1, theta, spike.astype(theta.dtype))
    flat = ravel_pytree(params)[0]
    mask = {k: jnp.ones_like(v) for k, v in params.items()}
    mask[ss.coefficient] = delta.astype(flat.dtype)
    log_density = ss.log_density_fn(model_args, model_kwargs)

    def logp_grad(x):
        return jax.value_and_grad(lambda x_: log_density(unravel(x_), delta, indices))(x)

    move = block_move(plan.inner, k_inner, flat, logp_grad, step_size, ravel_pytree(mask)[0])
    return unravel(move.x), move


def prior_logodds_fn(ss, values, theta, model_args, model_kwargs):
    """(j, δ) ↦ log p(δ_j = 1, θ_j | δ_−j) − log p(δ_j = 0, θ_j | δ_−j) from the model's prior."""
    if ss.per_coordinate_prior:
        cp = ss.coordinate_prior_fn(model_args, model_kwargs)(values, theta)
        table = cp.indicator1 - cp.indicator0 + cp.coefficient1 - cp.coefficient0
        return lambda j, d: table[j]
    prior = ss.prior_fn(model_args, model_kwargs)
    return lambda j, d: prior(values, d.at[j].set(1)) - prior(values, d.at[j].set(0))


def dense_async_gradient(loglik: Callable, theta, delta, chosen, second=False, point="current"):
    r"""G_j = ∂ℓ/∂β_j (and H_j = ∂²ℓ/∂β_j²) for the chosen coordinates, for any likelihood.

    ℓ = ``loglik`` (β ↦ ℓ(β), e.g. the model's log-likelihood in the effective coefficients)
    is differentiated at β = θ·(δ ∨ 1_J) (``point="current"``) or β = θ·δ·(1 − 1_J)
    (``"excluded"``); H by one Hessian-vector product per chosen coordinate.

    :param loglik: β (p,) ↦ ℓ(β), a scalar.
    :param theta: (p,) coefficients.
    :param delta: (p,) current indicators.
    :param chosen: (J,) chosen coordinates (distinct).
    :param bool second: also return H.
    :param str point: ``"current"`` or ``"excluded"``.
    :return: ``(G, H)`` of shape (J,), H ``None`` unless ``second``.

    >>> import jax.numpy as jnp
    >>> G, _ = dense_async_gradient(lambda b: -0.5 * jnp.sum(b**2), jnp.array([1.0, 2.0]),
    ...                             jnp.array([0, 0]), jnp.array([1]))
    >>> G.tolist()
    [-2.0]
    """
    shift = evaluation_shift(theta[chosen], delta[chosen], point)
    beta = (theta * delta).at[chosen].add(shift)
    grad_fn = jax.grad(loglik)
    G = grad_fn(beta)[chosen]
    H = None
    if second:
        def diagonal(j):
            e = jnp.zeros_like(beta).at[j].set(1.0)
            return jax.jvp(grad_fn, (beta,), (e,))[1][j]

        H = jax.vmap(diagonal)(chosen)
    return G, H


def dense_indicator_update(plan, values, delta, indices, keys, model_args, model_kwargs):
    """STEP 2 on the dense path: the new δ (sequential for ``"exact"``, else asynchronous)."""
    ss = plan.ss
    k_sub, k_ber = keys
    theta = values[ss.coefficient]
    chosen = draw_subset(k_sub, ss.num_coefficients, plan.update_size)
    terms = ss.effective_loglik_terms_fn(model_args, model_kwargs)

    def loglik(beta):
        return jnp.sum(terms(values, beta, indices))

    prior_logodds = prior_logodds_fn(ss, values, theta, model_args, model_kwargs)
    if plan.variant == "exact":
        def conditional(d, t):
            j = chosen[t]
            on, off = d.at[j].set(1), d.at[j].set(0)
            return prior_logodds(j, d) + loglik(theta * on) - loglik(theta * off), on, off

        return sequential_sweep(k_ber, delta, conditional, plan.update_size)[0]
    G, H = dense_async_gradient(loglik, theta, delta, chosen, plan.taylor == "second", plan.point)
    lo = jax.vmap(lambda j: prior_logodds(j, delta))(chosen)
    V = async_update(k_ber, lo, theta[chosen], G, H, plan.taylor, plan.point)
    return delta.at[chosen].set(V.astype(delta.dtype))


def dense_iteration(plan, mb, unravel, state, model_args, model_kwargs):
    """STEP 1 and STEP 2 on the dense path: ``(new state, guard norm, finite)``."""
    ss = plan.ss
    key, k_sub, k_inner, k_spike, k_ber, k_batch, k_out = random.split(state.rng_key, 7)
    params = {k: v for k, v in state.z.items() if k not in (ss.indicator, SPIKE_KEY)}
    delta = state.z[ss.indicator]
    if plan.variant == "sgld":
        indices, batch_state = mb.draw(k_batch, state.batch_state)
    else:
        indices, batch_state = ss.full_indices(), state.batch_state
    params, move = dense_block_move(plan, unravel, params, delta, indices, state.step_size,
                                    (k_spike, k_inner), model_args, model_kwargs)
    values = ss.constrain_fn(model_args, model_kwargs)(params, delta)
    delta = dense_indicator_update(plan, values, delta, indices, (k_sub, k_ber), model_args,
                                   model_kwargs).astype(jnp.int32)
    new = state._replace(
        i=state.i + 1, z={**params, ss.indicator: delta, SPIKE_KEY: k_out}, accept_prob=move.accept_prob,
        model_size=jnp.sum(delta).astype(jnp.int32), batch_state=batch_state, rng_key=key,
    )
    return new, move.grad_norm, move.finite
