r"""One ESGLD iteration as a pure function of the state and the data (:func:`esgld_step`).

1. draw the mini-batch S;
2. m = ``num_models`` moves on γ at θ: the paper's reversible-jump chain
   (:func:`~numpyro_sg.kernels.esgld.paper.rjmh_indicator_chain`) or the informed chain
   (:func:`~numpyro_sg.kernels.esgld.informed.informed_indicator_chain`), accepted sign flips
   carried into θ;
3. the Langevin move θ' = θ + (ε/2)⊙ĝ + N(0, ε·τ) (:func:`~numpyro_sg.kernels.moves.langevin_move`)
   with the paper's model-averaged gradient or the control-variate gradient at γ_m, ε = ε_t
   (``preconditioner=None``) or ε_j = h·v_j (``"laplace"``);
4. the divergence guard (:func:`~numpyro_sg.kernels.guard.guarded_update`) on the whole state
   ``z`` (continuous sites, indicator and inclusion outputs, flattened): a non-finite point,
   log density or gradient, or a gradient norm (:func:`~numpyro_sg.kernels.guard.guard_norm`,
   the drift in units of the injected noise, scale-free) that explodes past the reference
   learnt from the first steps freezes the chain at its last safe point and sets
   ``diverging`` from then on.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax, random
from jax.flatten_util import ravel_pytree

from numpyro_sg.infer.minibatch import Anchor
from numpyro_sg.kernels.esgld.informed import informed_indicator_chain
from numpyro_sg.kernels.esgld.options import ESGLDHyper, ESGLDSetup
from numpyro_sg.kernels.esgld.paper import rjmh_indicator_chain
from numpyro_sg.kernels.esgld.targets import (
    coordinate_prior_table,
    cv_batch,
    cv_loglik_gradient,
    glm_anchor,
    hess_matvec,
    indicator_target,
    laplace_step_scale,
    model_averaged_gradient,
)
from numpyro_sg.kernels.esgld.warmup import LaplaceScales, laplace_scales, prior_curvature, warmup_step_scale
from numpyro_sg.kernels.guard import all_finite, guard_norm, guarded_update, init_guard
from numpyro_sg.kernels.moves import langevin_move, langevin_noise_variance
from numpyro_sg.kernels.step_size import step_size_at


class ESGLDState(NamedTuple):
    """State of :class:`~numpyro_sg.ESGLD`.

    ``i`` iteration counter (warmup included); ``z`` a dict of the unconstrained continuous
    sites, the indicator (int32, the last model γ_m of the inner chain) and the inclusion
    frequency (1/m)·Σ_k γ_k; ``step_size`` the step size that produced ``z``; ``hyper`` the
    :class:`~numpyro_sg.kernels.esgld.options.ESGLDHyper`; ``accept_prob`` the mean over the m
    indicator moves of the Metropolis–Hastings acceptance probability min(1, ratio) (NumPyro's
    name; not the accepted fraction); ``model_size`` size(γ_m); ``weights`` the proposal
    weights w; ``guard`` the :class:`~numpyro_sg.kernels.guard.DivergenceGuard` (its safe point
    is the flattened ``z``); ``diverging`` True from the first blow-up on (the chain is then
    frozen); ``batch_state`` the index-drawing state; ``rng_key`` the chain's key; ``anchor``
    the control-variate :class:`~numpyro_sg.infer.minibatch.Anchor`
    (``None`` for the paper's algorithm).
    """

    i: Any
    z: Any
    step_size: Any
    hyper: Any
    accept_prob: Any
    model_size: Any
    weights: Any
    guard: Any
    diverging: Any
    batch_state: Any
    rng_key: Any
    anchor: Any = None


class LangevinInput(NamedTuple):
    """What the Langevin move and the guard read after the chain on γ: the flat point ``flat``
    (after accepted sign flips), ``value`` and ``grad`` of the log density there, the
    per-coordinate step ``eps`` of the move, the reported ``step_size``, the chain (an
    ``IndicatorChain`` or ``InformedChain``), the Rao-Blackwellised inclusion ``rb`` (or
    ``None``) and the (possibly refreshed) ``anchor``."""

    flat: Any
    value: Any
    grad: Any
    eps: Any
    step_size: Any
    chain: Any
    rb: Any = None
    anchor: Any = None


def esgld_initial_state(setup: ESGLDSetup, params, gamma, weights, hyper: ESGLDHyper, key) -> ESGLDState:
    """The state at the start ``(params, γ)``: no chain has run (``accept_prob`` 0, inclusion
    frequency γ), the guard at the start (no gradient yet: its reference is the first step's).

    **Example:**

    .. code-block:: python

        state = esgld_initial_state(setup, {"theta": theta0}, jnp.zeros(p, jnp.int32), w, hyper, key)
    """
    flat = ravel_pytree(params)[0].astype(jnp.result_type(float))
    key, key_batch = random.split(key)
    gamma = jnp.asarray(gamma).astype(jnp.int32)
    z = setup.pack(flat, gamma[None])
    p = setup.spike_slab.num_coefficients
    return ESGLDState(
        i=jnp.int32(0),
        z=z,
        step_size=step_size_at(hyper.step_size, 0, flat.dtype),
        hyper=hyper,
        accept_prob=jnp.zeros((), flat.dtype),
        model_size=jnp.sum(gamma).astype(jnp.int32),
        weights=weights,
        guard=init_guard(ravel_pytree(z)[0], jnp.full((), jnp.nan, flat.dtype)),
        diverging=jnp.array(False),
        batch_state=setup.minibatcher.init_batch_state(key_batch),
        rng_key=key,
        anchor=_initial_anchor(setup, p, flat.shape[0], flat.dtype),
    )


def _initial_anchor(setup: ESGLDSetup, p: int, d: int, dtype):
    """A placeholder of the state's anchor, computed at iteration 0: the control-variate
    ``Anchor``, the :class:`~numpyro_sg.kernels.esgld.warmup.LaplaceScales` of the Laplace
    step, or ``None``."""
    if setup.anchored:
        return Anchor(jnp.zeros((p,), dtype), jnp.zeros((p,), dtype), jnp.zeros((p, p), dtype))
    if setup.laplace_index is not None:
        return LaplaceScales(jnp.zeros((p,), dtype), jnp.ones((d,), dtype))
    return None


def esgld_step(setup: ESGLDSetup, state: ESGLDState, model_args, model_kwargs) -> ESGLDState:
    r"""One ESGLD iteration of one chain (pure; the module docstring lists the steps).

    Paper's algorithm: θ' = θ + (ε/2)·(1/m)·Σ_k ∇ log π(θ | γ_k, X_S) + N(0, ε·τ·I)
    (:func:`~numpyro_sg.kernels.esgld.targets.model_averaged_gradient`).  With a
    control-variate anchor (``setup.anchored``: informed proposals, ``gradient="cv"`` or the
    Laplace step): re-anchor at the iterations ``setup.anchor_steps``; θ' = θ + (ε/2)⊙ĝ +
    N(0, ε·τ) at the last model γ_m with ĝ = ∇_θ log π(θ|γ_m) + γ_m⊙∇_β L̂ and ε_j = h·v_j
    (:func:`~numpyro_sg.kernels.esgld.targets.laplace_step_scale`).

    **Example:**

    .. code-block:: python

        state = jax.jit(lambda s: esgld_step(kernel.setup, s, (X, y), {}))(state)
    """
    key, key_batch, key_rj, key_noise = random.split(state.rng_key, 4)
    params, gamma = setup.unpack(state.z)
    indices, batch_state = setup.draw(key_batch, state.batch_state)
    move = _anchored_input if setup.anchored else _paper_input
    li = move(setup, state, params, gamma, indices, key_rj, model_args, model_kwargs)
    noise = random.normal(key_noise, li.flat.shape, li.flat.dtype)
    new_flat = langevin_move(li.flat, li.grad, li.eps, noise, langevin_noise_variance(li.eps, state.hyper.temperature))
    finite = all_finite(new_flat) & jnp.isfinite(li.value) & all_finite(li.grad)
    old_z, unravel_z = ravel_pytree(state.z)
    new_z = ravel_pytree(setup.pack(new_flat, li.chain.gammas, li.rb))[0]
    kept = guarded_update(state.guard, state.diverging, old_z, new_z, guard_norm(li.grad, li.eps), finite)
    z = unravel_z(kept.flat)
    return state._replace(
        i=state.i + 1,
        z=z,
        step_size=li.step_size,
        accept_prob=li.chain.accept_prob,
        model_size=jnp.sum(z[setup.spike_slab.indicator]).astype(jnp.int32),
        guard=kept.guard,
        diverging=kept.diverging,
        batch_state=batch_state,
        rng_key=key,
        anchor=state.anchor if li.anchor is None else li.anchor,  # not frozen: a copy of H costs more
    )


def penalty_now(setup: ESGLDSetup, i):
    """The penalty's finite-population correction at iteration ``i``, or ``None`` without a
    penalty.  The automatic rule: no penalty during the warmup (the search, when the anchor
    is still moving and the estimate's sd can be hundreds of nats), the full penalty after."""
    if setup.penalty_fpc is None:
        return None
    return jnp.where(i >= setup.num_warmup, setup.penalty_fpc, 0.0)


def _paper_chain(setup, state, values, gamma, indices, key, model_args, model_kwargs, penalty_fpc):
    ss = setup.spike_slab
    return rjmh_indicator_chain(
        key, gamma, values[ss.coefficient], state.weights,
        indicator_target(ss, values, gamma, indices, model_args, model_kwargs),
        num_steps=setup.num_models, max_size=setup.max_model_size, flip_sign=setup.flip_sign,
        penalty_fpc=penalty_fpc,
    )


def _paper_input(setup, state, params, gamma, indices, key, model_args, model_kwargs) -> LangevinInput:
    """The paper's algorithm: the reversible-jump chain, then the model-averaged gradient."""
    ss = setup.spike_slab
    values = ss.constrain_fn(model_args, model_kwargs)(params, gamma)
    chain = _paper_chain(setup, state, values, gamma, indices, key, model_args, model_kwargs,
                         penalty_now(setup, state.i))
    # θ is real-valued: its unconstrained value is itself
    params = {**params, ss.coefficient: chain.theta.astype(jnp.asarray(params[ss.coefficient]).dtype)}
    flat = ravel_pytree(params)[0]
    value, grad = model_averaged_gradient(ss.log_density_fn(model_args, model_kwargs), setup.unravel,
                                          flat, chain.gammas, indices)
    h = step_size_at(state.hyper.step_size, state.i, flat.dtype)
    if setup.laplace_index is None:
        return LangevinInput(flat, value, grad, h, h, chain)
    # the Laplace step: curvatures at the current point at the anchor iterations
    index = setup.laplace_index
    due = jnp.any(state.i == jnp.asarray(setup.anchor_steps))
    scales = lax.cond(due, lambda: laplace_scales(ss, setup.unravel, index, flat, chain.gamma, model_args,
                                                  model_kwargs),
                      lambda: state.anchor)
    scales = jax.tree.map(lambda a: a.astype(flat.dtype), scales)
    curvature = jax.vmap(lambda g: prior_curvature(ss, values, chain.theta, g, model_args, model_kwargs))
    eps = h * warmup_step_scale(scales, index, chain.gammas, -curvature(chain.gammas), flat.dtype)
    return LangevinInput(flat, value, grad, eps, h, chain, anchor=scales)


def _current_anchor(setup, state, values, glm_batch, dtype):
    """The anchor, moved to the current β = θ·γ (g and H on the full data, O(N·p²)) at the
    iterations ``setup.anchor_steps``."""
    anchor = state.anchor
    if not setup.anchor_steps:
        return anchor
    ss = setup.spike_slab
    _, gamma = setup.unpack(state.z)
    beta_now = values[ss.coefficient] * gamma.astype(dtype)
    due = jnp.any(state.i == jnp.asarray(setup.anchor_steps))
    anchor = lax.cond(due, lambda: glm_anchor(glm_batch(values, beta_now), ss.glm.family, beta_now, setup.total),
                      lambda: anchor)
    return jax.tree.map(lambda a: a.astype(dtype), anchor)


def _anchored_input(setup, state, params, gamma, indices, key, model_args, model_kwargs) -> LangevinInput:
    r"""With the control-variate anchor (θ the only continuous site, GLM likelihood): the
    informed chain (``proposal="informed"``) or the paper's; the control-variate gradient at
    γ_m (``gradient="cv"``) or the paper's model-averaged one; ε_j = h·v_j
    (``preconditioner="laplace"``) or ε = h."""
    ss = setup.spike_slab
    coef, family = ss.coefficient, ss.glm.family
    values = ss.constrain_fn(model_args, model_kwargs)(params, gamma)
    theta = values[coef]
    dtype = theta.dtype
    glm_batch = ss.glm_batch_fn(model_args, model_kwargs)
    anchor = _current_anchor(setup, state, values, glm_batch, dtype)
    cvb = cv_batch(glm_batch(values, anchor.point, indices), family)
    prior_fn = ss.prior_fn(model_args, model_kwargs)

    def log_prior(th, g):
        return prior_fn({**values, coef: th}, g)

    penalty_fpc = penalty_now(setup, state.i)
    if setup.proposal == "informed":
        table = coordinate_prior_table(ss, values, theta, model_args, model_kwargs)
        chain = informed_indicator_chain(
            key, gamma, theta, anchor, cvb, family, table,
            None if ss.per_coordinate_prior else log_prior, num_steps=setup.num_models,
            max_size=setup.max_model_size, flip_sign=setup.flip_sign, penalty_fpc=penalty_fpc,
            max_nonzero=2 * setup.max_model_size, total=setup.total)
    else:
        chain = _paper_chain(setup, state, values, gamma, indices, key, model_args, model_kwargs, penalty_fpc)
    th = chain.theta.astype(dtype)
    prior_at = functools.partial(log_prior, g=chain.gamma)
    if setup.gradient == "cv":
        value, grad = _cv_value_and_grad(setup, chain, th, anchor, cvb, prior_at)
    else:
        value, grad = model_averaged_gradient(ss.log_density_fn(model_args, model_kwargs), setup.unravel,
                                              th, chain.gammas, indices)
    h = step_size_at(state.hyper.step_size, state.i, dtype)
    eps = h
    if setup.preconditioner == "laplace":
        curvature = jax.jvp(jax.grad(prior_at), (th,), (jnp.ones_like(th),))[1]
        eps = h * laplace_step_scale(chain.gamma, jnp.diagonal(anchor.hess), curvature)
    rb = chain.rao_blackwell if setup.proposal == "informed" else None
    return LangevinInput(th, value, grad, eps, h, chain, rb, anchor)


def _cv_value_and_grad(setup, chain, th, anchor, cvb, prior_at):
    """(log prior, ∇_θ log π(θ|γ_m) + γ_m⊙∇_β L̂) at the last model γ_m, the control-variate
    gradient (the informed chain carries G and η at θ·γ_m; the paper's chain does not)."""
    family = setup.spike_slab.glm.family
    gm = chain.gamma.astype(th.dtype)
    if setup.proposal == "informed":
        G, eta = chain.surrogate_grad, chain.eta
    else:
        delta = th * gm - anchor.point
        G = anchor.grad + hess_matvec(anchor.hess, delta, 2 * setup.max_model_size)
        eta = cvb.eta_hat + cvb.Xt.T @ delta
    prior_value, prior_grad = jax.value_and_grad(prior_at)(th)
    return prior_value, prior_grad + gm * cv_loglik_gradient(G, cvb, family, eta, setup.total)
