r"""The functional core of the gradient kernels: a pure ``init`` and ``step``, in BlackJAX's shape.

Each gradient kernel (SGLD, SGBD, SGHMC, SGNHT, pSGLD, BAOAB, cyclical SGLD) is a *move* in
the working frame of a preconditioner M = L·Lᵀ (θ = θ₀ + L·u, :mod:`numpyro_sg.infer.preconditioner`)::

    move(state, grad_w, noise_sd_w, step_size, key) -> (du, fields)

with ``grad_w`` = Lᵀĝ the stochastic gradient and ``noise_sd_w`` the gradient-noise sd τ̂ in
that frame, ``step_size`` ε_t, and ``fields`` the kernel's own updated state fields.
:func:`gradient_step` does everything else, the same way for every kernel:

1. ε_t = the state's step size (``state.hyper.step_size``: a constant, one entry per
   coordinate, or a schedule) at its iteration ``state.i`` — computed here, once per
   iteration, and stored in ``state.step_size`` (a move that adapts it returns its own);
2. the move, mapped back: θ' = θ + L·du;
3. the gradient estimate at θ' on ``minibatch``, kept in the state for the next move;
4. the exponential moving average of τ̂, and the divergence guard
   (:func:`~numpyro_sg.kernels.guard.guarded_update` on the
   :func:`~numpyro_sg.kernels.guard.guard_norm` of Lᵀĝ at the step taken): a blow-up freezes
   the chain, its kernel fields included, and flags it ``diverging``.

A gradient estimator is ``estimate(position, minibatch)``; it returns a
:class:`~numpyro_sg.infer.minibatch.GradientEstimate` (value, ĝ, τ̂), or just the gradient
(a pytree like ``position``, or flat) as a BlackJAX gradient estimator does.  Each kernel
module has ``init(position, estimate, minibatch, step_size, …)`` and
``step(rng_key, state, estimate, minibatch, …)`` built on :func:`gradient_init` and
:func:`gradient_step`; its ``MCMCKernel`` class calls the same two functions with the
estimator it builds from the NumPyro model (:mod:`numpyro_sg.kernels.gradient`), so a loop
written by hand and ``numpyro.infer.MCMC`` give the same draws for the same keys.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from numpyro_sg.infer.minibatch import GradientEstimate
from numpyro_sg.infer.preconditioner import Preconditioner, from_working, to_working
from numpyro_sg.kernels.guard import all_finite, freeze, guard_norm, guarded_update, init_guard
from numpyro_sg.kernels.moves import ema
from numpyro_sg.kernels.step_size import step_size_at

__all__ = ["gradient_init", "gradient_step", "gradient_state"]


#: the state fields of every gradient kernel; a kernel adds its own (:func:`gradient_state`).
#: ``precond``, ``anchor``, ``moments``, ``batch_state`` and ``rng_key`` are the NumPyro
#: shell's (``None`` in a state made by :func:`gradient_init`, ``precond`` apart)
GRADIENT_STATE_FIELDS = ("i", "z", "log_density_grad", "grad_noise_sd", "step_size", "hyper", "precond",
                         "anchor", "moments", "guard", "diverging", "batch_state", "rng_key")


def gradient_state(name: str, extra: tuple = (), doc: str = ""):
    """A state ``NamedTuple`` class with :data:`GRADIENT_STATE_FIELDS` and the kernel's ``extra``
    fields (inserted after ``step_size``)."""
    at = GRADIENT_STATE_FIELDS.index("step_size") + 1
    fields = GRADIENT_STATE_FIELDS[:at] + tuple(extra) + GRADIENT_STATE_FIELDS[at:]
    cls = NamedTuple(name, [(f, Any) for f in fields])
    cls.__doc__ = doc
    return cls


def as_estimate(result, flat) -> GradientEstimate:
    """An estimator's result as a :class:`GradientEstimate` with a flat ĝ: a bare gradient
    (pytree or flat) gets the value 0 and τ̂ = NaN (not estimated)."""
    if isinstance(result, GradientEstimate):
        return result._replace(grad=ravel_pytree(result.grad)[0])
    grad = ravel_pytree(result)[0].astype(flat.dtype)
    return GradientEstimate(jnp.zeros((), flat.dtype), grad, jnp.full_like(flat, jnp.nan))


def step_norm(grad_w, step_size, step_variance: Callable | None = None):
    """The guard's :func:`~numpyro_sg.kernels.guard.guard_norm` of the working-frame gradient
    at the step size actually taken; ``step_variance`` maps a step size that is a length (SGBD's
    σ) to its Langevin ε (σ²), ``None`` when the step size is ε."""
    step_size = step_size if step_variance is None else step_variance(step_size)
    return guard_norm(grad_w, step_size)


def gradient_init(state_class, position, estimate: Callable, minibatch, hyper, init_fields: Callable,
                  precond: Preconditioner | None = None, step_variance: Callable | None = None):
    """A gradient kernel's state at ``position`` (a pytree), with ĝ on ``minibatch``.

    :param state_class: the kernel's state class (:func:`gradient_state`).
    :param estimate: the gradient estimator ``estimate(position, minibatch)``.
    :param hyper: the kernel's hyperparameters ``NamedTuple`` (``step_size`` first).
    :param init_fields: ``(noise_sd, hyper, dim, dtype) -> dict`` of the kernel's own fields.
    :param precond: the preconditioner M = L·Lᵀ (default the identity: ε in the units of ``position``).
    :param step_variance: for the guard, ε of a step size that is a length (SGBD: ``jnp.square``).
    """
    precond = Preconditioner() if precond is None else precond
    flat, _ = ravel_pytree(position)
    est = as_estimate(estimate(position, minibatch), flat)
    fields = init_fields(est.noise_sd, hyper, flat.shape[0], flat.dtype)
    step_size = fields.get("step_size", step_size_at(hyper.step_size, 0, flat.dtype))
    norm = step_norm(to_working(precond, est.grad), step_size, step_variance)
    return state_class(
        i=jnp.int32(0), z=position, log_density_grad=est.grad, grad_noise_sd=est.noise_sd, hyper=hyper,
        precond=precond, anchor=None, moments=None, guard=init_guard(flat, norm),
        diverging=jnp.array(False), batch_state=None, rng_key=None, **fields,
    )


def gradient_step(rng_key, state, estimate: Callable, minibatch, move: Callable, noise_ema_weight=0.1,
                  step_variance: Callable | None = None):
    """One iteration of a gradient kernel (pure; the module docstring lists its four parts).

    :param rng_key: the move's key.
    :param state: the chain's state (:func:`gradient_init`).
    :param estimate: the gradient estimator ``estimate(position, minibatch)``.
    :param minibatch: the mini-batch on which ĝ is evaluated at the new point.
    :param move: the kernel's ``move(state, grad_w, noise_sd_w, step_size, key) -> (du, fields)``.
    :param float noise_ema_weight: β of the EMA τ̂ ← (1 − β)·τ̂ + β·τ̂_new.
    :param step_variance: for the guard, ε of a step size that is a length (SGBD: ``jnp.square``).
    """
    flat, unravel = ravel_pytree(state.z)
    P = state.precond
    eps = step_size_at(state.hyper.step_size, state.i, flat.dtype)
    du, fields = move(state, to_working(P, state.log_density_grad), state.grad_noise_sd, eps, rng_key)
    new_flat = flat + from_working(P, du)
    est = as_estimate(estimate(unravel(new_flat), minibatch), new_flat)
    fields = {"step_size": eps, **fields}
    finite = all_finite(new_flat) & jnp.isfinite(est.value) & all_finite(est.grad)
    norm = step_norm(to_working(P, est.grad), fields["step_size"], step_variance)
    kept = guarded_update(state.guard, state.diverging, flat, new_flat, norm, finite)
    diverging = kept.diverging
    return state._replace(
        i=state.i + 1,
        z=unravel(kept.flat),
        log_density_grad=freeze(diverging, state.log_density_grad, est.grad),
        grad_noise_sd=freeze(diverging, state.grad_noise_sd, ema(state.grad_noise_sd, est.noise_sd, noise_ema_weight)),
        guard=kept.guard,
        diverging=diverging,
        **freeze(diverging, {k: getattr(state, k) for k in fields}, fields),
    )
