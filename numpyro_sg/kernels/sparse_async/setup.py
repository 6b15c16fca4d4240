"""SparseAsync's set-up, once per data set: the static :class:`~.options.Plan`, the GLM fast
path's constants (:func:`fast_constants`, or why the path does not apply:
:func:`fast_path_reason`), and the chain's starting values (:func:`initial_values`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax import random

from numpyro_sg.infer.minibatch import Minibatcher, check_data_finite
from numpyro_sg.infer.model_info import base_distribution, trace_model
from numpyro_sg.kernels.sparse_async.options import (
    Plan,
    SparseAsyncSettings,
    bucket_sizes,
    check_step_options,
    resolve_inner,
    step_options,
)
from numpyro_sg.spike_slab import (
    CoordinateNormal,
    SpikeSlabError,
    effective_site_name,
    init_to_spike,
    strategy_indicator,
)
from numpyro_sg.spike_slab.glm import design_array, family_of, per_element_log_prob

#: the entry of ``state.z`` holding the key of the output's spike draws
SPIKE_KEY = "_spike_key"


class GLMConstants(NamedTuple):
    """Per-chain constants of the fast path: the Normal spike and slab (``prior``), the offset
    η(β = 0), the observations, the family's other parameters and the transposed design ``Xt``
    (exact and async only)."""

    prior: Any  # the CoordinateNormal spike and slab
    offset: Any
    y: Any
    params: Any
    Xt: Any = None


def fast_path_reason(ss, fast_path, model_args, model_kwargs):
    """``(why the GLM fast path does not apply, or None; its constants or None)``."""
    if fast_path == "generic":
        return "fast_path='generic'", None
    if ss.glm is None:
        return "no GLM likelihood (linear predictor X·β) was detected", None
    if not ss.per_coordinate_prior:
        return "the prior of the coefficients is not a product over coordinates given the indicator", None
    if tuple(ss.continuous_sites) != (ss.coefficient,):
        return (f"the model has continuous sites {list(ss.continuous_sites)} besides the "
                f"coefficient {ss.coefficient!r}"), None
    try:
        return None, fast_constants(ss, model_args, model_kwargs)
    except SpikeSlabError as err:
        return str(err), None


def fast_constants(ss, model_args, model_kwargs) -> GLMConstants:
    """The fast path's constants from ONE vectorised trace of the model at θ = 0 over all N
    data, with δ = 0 and δ = 1: the Normal spike and slab (:class:`CoordinateNormal`), the
    prior log-odds of inclusion, and the GLM's offset η(β = 0), observations and parameters
    (without ``Xt``)."""
    p = ss.num_coefficients
    zeros, ones = jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)
    values = {ss.coefficient: jnp.zeros((p,))}

    def one(gamma):
        tr, data = ss.trace_at(model_args, model_kwargs, values, gamma, ss.full_indices())
        base = base_distribution(tr[ss.coefficient]["fn"])
        if not isinstance(base, dist.Normal):
            raise SpikeSlabError(
                f"coefficient site {ss.coefficient!r} has distribution {type(base).__name__}; "
                "a per-coordinate Normal spike/slab is needed here."
            )
        ind = tr[ss.indicator]["fn"]
        logit = per_element_log_prob(ind, ones) - per_element_log_prob(ind, zeros)
        fam = family_of(tr[ss.glm.site]["fn"])
        n = jnp.shape(tr[ss.glm.site]["value"])[0]
        return (jnp.broadcast_to(base.loc, (p,)), jnp.broadcast_to(base.scale, (p,)), logit,
                jnp.broadcast_to(fam[1], (n,)), tr[ss.glm.site]["value"],
                {k: jnp.broadcast_to(v, (n,)) for k, v in fam[2].items()})

    loc, scale, logit, eta, y, params = jax.vmap(one)(jnp.stack([zeros, ones]))
    dtype = jnp.result_type(float)
    prior = CoordinateNormal(logit[0], loc[0], scale[0], loc[1], scale[1])
    return GLMConstants(
        prior=jax.tree.map(lambda a: jnp.asarray(a, dtype), prior),
        offset=jnp.asarray(eta[0], dtype), y=jnp.asarray(y[0], dtype),
        params={k: jnp.asarray(v[0], dtype) for k, v in params.items()},
    )


def check_plan_inputs(o: SparseAsyncSettings, ss, p):
    """``J`` (checked against p); raise when ``"sgld"`` has no subsample plate."""
    J = min(100, p) if o.update_size is None else int(o.update_size)
    if not 1 <= J <= p:
        raise ValueError(f"update_size must lie in [1, p] = [1, {p}], got {J}.")
    if o.variant == "sgld" and ss.plate is None:
        raise ValueError(
            "variant='sgld' needs a subsample plate (numpyro.plate('data', N, "
            "subsample_size=B)); the model has none. Use variant='async' or 'exact'."
        )
    return J


def make_plan(o: SparseAsyncSettings, ss, info, model, model_args, model_kwargs, *, check_data, replace,
              effective_name=None):
    """``(plan, fast-path constants or None, Minibatcher or None)`` for one data set."""
    p, sgld = ss.num_coefficients, o.variant == "sgld"
    J = check_plan_inputs(o, ss, p)
    if check_data and ss.plate is not None:
        check_data_finite(info, (ss.plate,), model_args, model_kwargs)
    mb = Minibatcher(model, (ss.plate,), replace=replace) if sgld else None
    why, constants = fast_path_reason(ss, o.fast_path, model_args, model_kwargs)
    if o.fast_path == "glm" and why is not None:
        raise ValueError(f"fast_path='glm' but the GLM fast path does not apply: {why}.")
    family = ss.glm.family_name if ss.glm is not None else None
    inner = resolve_inner(o.variant, o.inner, why is None and family == "gaussian", why, family)
    if o.inner == "auto":
        check_step_options(inner, step_options(o), why=", chosen by inner='auto'")
    if o.max_active is not None and why is not None:
        raise ValueError(f"max_active applies to the GLM fast path, which does not apply here: {why}.")
    m = min(p, 256) if o.max_active is None else min(int(o.max_active), p)
    taylor = o.taylor or "second"
    plan = Plan(
        ss=ss, variant=o.variant, inner=inner, taylor=None if o.variant == "exact" else taylor,
        point=o.async_point or "current", update_size=J, max_active=m, buckets=bucket_sizes(m),
        fast=why is None, adapt=inner == "mala" and o.adapt_step_size is not False,
        target=0.5 if o.target_accept_prob is None else float(o.target_accept_prob),
        step_size=float(o.step_size if o.step_size is not None else (0.01 if sgld else 0.02)),
        effective_name=effective_site_name(ss, info.site_types, effective_name),
    )
    if constants is not None and not sgld:
        # exact/async gather whole columns of X: keep a (p, N) copy so that a column is one
        # contiguous read (gathering J columns of a row-major (N, p) array is N·J cache misses)
        X = design_array(ss.glm.source, info.subsample_data, model_args, model_kwargs)
        constants = constants._replace(Xt=jnp.asarray(X, jnp.result_type(float)).T.copy())
    return plan, constants, mb


def split_init_params(ss, init_params):
    """``(continuous unconstrained values or {}, indicator or None)`` of the user's init_params."""
    if init_params is None:
        return {}, None
    params = {k: v for k, v in dict(init_params).items() if k not in (ss.indicator, SPIKE_KEY)}
    return params, dict(init_params).get(ss.indicator)


def spike_draws(prior: CoordinateNormal, coefficient, key, num_chains):
    """θ drawn from the Normal spike (δ = 0), per chain: the default start of the fast path."""
    def one(k):
        return {coefficient: prior.spike_loc + prior.spike_scale * random.normal(k, prior.spike_loc.shape)}

    return one(key) if num_chains is None else jax.vmap(one)(key)


def initial_values(plan, constants, key_init, init_params, init_strategy, num_chains, model_args,
                   model_kwargs):
    """``(continuous unconstrained params, δ)`` of the start: the user's ``init_params``, else
    θ from the spike (without a trace on the fast path) and δ from ``init_to_value``, else 0."""
    ss = plan.ss
    params, delta = split_init_params(ss, init_params)
    if not params and plan.fast and init_strategy is None:
        params = spike_draws(constants.prior, ss.coefficient, key_init, num_chains)
    elif not params:
        strategy = init_strategy or init_to_spike(coefficient=ss.coefficient)
        zeros = jnp.zeros((ss.num_coefficients,), jnp.int32)
        params = trace_model(ss.conditioned(zeros), model_args, model_kwargs,
                             init_strategy=strategy, rng_key=key_init).init_values
    if delta is None:
        delta = strategy_indicator(init_strategy, ss.indicator, num_chains)
    if delta is None:
        shape = (ss.num_coefficients,) if num_chains is None else (num_chains, ss.num_coefficients)
        delta = jnp.zeros(shape, jnp.int32)
    return params, jnp.asarray(delta)
