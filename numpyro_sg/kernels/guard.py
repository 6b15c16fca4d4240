r"""Divergence guard shared by every kernel: detect a blow-up, freeze the chain, flag it.

A chain *blows up* when its state, log density or gradient becomes non-finite, or when the
norm of its gradient (:func:`guard_norm`, the same for every kernel) grows past
:data:`BLOWUP_FACTOR` times a reference norm learnt from the chain's first steps.  From then on
the chain is *frozen* at its last safe point, its ``diverging`` flag stays ``True`` and the
guard records the iteration (``guard.diverged_at``).  Nothing is reported from inside the compiled step (a host callback
there would keep the sampling loop out of JAX's persistent compilation cache): NumPyro collects
``diverging`` by default, and :func:`numpyro_sg.check_convergence`,
:func:`numpyro_sg.to_inference_data` and :func:`numpyro_sg.posterior_summary` warn after the run
(:class:`~numpyro_sg.DivergenceWarning`) naming the chains and iterations.

Every kernel calls :func:`guarded_update` once per iteration with the proposed point::

    kept = guarded_update(state.guard, state.diverging, flat, new_flat,
                          guard_norm(grad_w, step_size), finite)
    # kept.flat: the point the chain keeps; kept.diverging; kept.guard: the new guard state
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sg.kernels.moves import ema

__all__ = ["init_guard", "guarded_update", "guard_norm", "all_finite"]


# -------------------------------------------------------------------------------------------
class DivergenceGuard(NamedTuple):
    """Blow-up detection state of a chain.

    ``safe`` the last point (flat) whose working-frame gradient norm stayed within
    :data:`SAFE_FACTOR` of the reference; ``reference`` the reference norm (``inf`` before the
    first step); ``level`` a moving average of the norm; ``count`` the number of steps seen;
    ``diverged_at`` the step (1-based, i.e. the iteration, warmup included) at which the chain
    blew up, −1 while it has not.
    """

    safe: Any
    reference: Any
    level: Any
    count: Any
    diverged_at: Any


#: a gradient norm above this multiple of the reference is a blow-up (divergence)
BLOWUP_FACTOR = 1e3
#: points whose gradient norm stays below this multiple of the reference are safe fall-backs
SAFE_FACTOR = 10.0
#: steps after which the reference follows the lowest moving average of the norm
GUARD_BURN_IN = 10
_LEVEL_WEIGHT = 0.05


def init_guard(flat, grad_norm) -> DivergenceGuard:
    """Guard at the initial point."""
    norm = jnp.where(jnp.isfinite(grad_norm), grad_norm, 0.0)
    return DivergenceGuard(flat, jnp.full_like(norm, jnp.inf), norm, jnp.zeros((), jnp.int32),
                           jnp.full((), -1, jnp.int32))


def guard_step(guard: DivergenceGuard, flat, grad_norm, finite):
    r"""Update the guard with a new point; return ``(blown_up, new_guard)``.

    A chain has *blown up* when its state, log density or gradient is not finite
    (``finite`` False), or when its :func:`guard_norm` exceeds
    :data:`BLOWUP_FACTOR` (1000) × the reference r.  r is the larger of the norms at the
    start and after the first step (a chain may start at the mode, where the gradient is 0),
    and after :data:`GUARD_BURN_IN` steps the lowest moving average of the norm seen so far
    (a running mean over the first 20 steps, then weight 0.05).  An exploding chain (a step
    size past the stability limit) has a gradient norm that grows geometrically and is caught
    long before it overflows; a chain that starts far in the tail and moves in has a
    decreasing norm and is not.  Points whose norm stays below :data:`SAFE_FACTOR` · r become
    the new ``safe`` point, the state a frozen chain keeps: its last state before the blow-up.
    """
    count = guard.count + 1
    level = ema(guard.level, grad_norm, jnp.maximum(1.0 / (count + 1.0), _LEVEL_WEIGHT))
    reference = jnp.where(count == 1, jnp.maximum(guard.level, grad_norm), guard.reference)
    reference = jnp.where(count >= GUARD_BURN_IN, jnp.minimum(reference, level), reference)
    blown = (~finite) | (grad_norm > BLOWUP_FACTOR * reference)
    safe_now = finite & (grad_norm <= SAFE_FACTOR * reference)
    keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    new = DivergenceGuard(
        jnp.where(safe_now, flat, guard.safe), keep(reference, guard.reference),
        keep(level, guard.level), count, guard.diverged_at,
    )
    return blown, new


def freeze(diverging, old, new):
    """``old`` where ``diverging`` else ``new`` (pytrees of the same structure)."""
    return jax.tree.map(lambda a, b: jnp.where(diverging, a, b), old, new)


class GuardedPoint(NamedTuple):
    """The result of :func:`guarded_update`: the point the chain keeps (flat), its
    ``diverging`` flag and the updated :class:`DivergenceGuard`."""

    flat: Any
    diverging: Any
    guard: DivergenceGuard


def guarded_update(guard: DivergenceGuard, diverging, flat, new_flat, grad_norm, finite) -> GuardedPoint:
    """One iteration of the guard: accept ``new_flat`` unless the chain blows up.

    :param guard: the chain's :class:`DivergenceGuard`.
    :param diverging: the chain's flag before this iteration.
    :param flat: the chain's current point (flat); kept if it was already diverging.
    :param new_flat: the proposed point.
    :param grad_norm: the :func:`guard_norm` of the gradient at ``new_flat``, compared with the
        guard's reference.
    :param finite: whether the state, log density and gradient at ``new_flat`` are finite.
    :return: :class:`GuardedPoint` — ``new_flat`` when nothing blew up; otherwise the last safe
        point (the chain's last state before the blow-up), with ``diverging`` True from now on
        and the iteration recorded in ``guard.diverged_at``.
    """
    blown, guard = guard_step(guard, new_flat, grad_norm, finite)
    now = diverging | blown
    guard = guard._replace(diverged_at=jnp.where(now & ~diverging, guard.count, guard.diverged_at))
    frozen_at = jnp.where(diverging, flat, guard.safe)
    return GuardedPoint(jnp.where(now, frozen_at, new_flat), now, guard)


def all_finite(x):
    """True when every entry of ``x`` is finite."""
    return jnp.all(jnp.isfinite(x))


def guard_norm(grad, step_size, mask=None):
    r"""The gradient norm the divergence guard compares, the same for every kernel:

    .. math::

       \max\Big(1,\ \sqrt{\operatorname{mean}_j\, \varepsilon_j\,\hat g_j^2}\Big)

    over the coordinates the step moves (``mask`` > 0; all without a mask), with ĝ the
    gradient in the step's frame (the preconditioner's working frame, Lᵀĝ) and ε_j the
    Langevin step variance of coordinate j there (a scalar or one entry per coordinate).
    √ε_j·ĝ_j is twice the drift (ε_j/2)·ĝ_j in units of the step's noise sd √ε_j, so the norm
    is scale-free: the same in any units of θ.  The floor 1, the level at which drift and
    noise match, keeps a legitimate jump from a blow-up (a chain at the mode or an empty
    spike-and-slab model has a gradient near 0, and any later gradient would otherwise exceed
    it a thousandfold); a step past the stability limit makes the norm grow geometrically past
    any floor.  A non-finite gradient makes it NaN.

    >>> import jax.numpy as jnp
    >>> float(guard_norm(jnp.array([1.0, 2.0]), jnp.array([4.0, 1.0])))   # √ε·ĝ = (2, 2)
    2.0
    >>> float(guard_norm(jnp.ones(3), 1e-6)), float(guard_norm(jnp.array([3.0, 9.0]), 1.0, jnp.array([1, 0])))
    (1.0, 3.0)
    """
    terms = jnp.asarray(step_size) * jnp.square(grad)
    if mask is None:
        mean = jnp.mean(terms)
    else:
        on = jnp.asarray(mask) > 0
        mean = jnp.sum(jnp.where(on, terms, 0.0)) / jnp.maximum(jnp.sum(on), 1)
    return jnp.maximum(jnp.sqrt(mean), 1.0)


def diverged_iterations(state) -> dict:
    """``{chain: iteration}`` of the chains a run's final ``state`` flags ``diverging``: the
    1-based iteration (warmup included) at which each blew up (``guard.diverged_at``), or
    ``None`` where the state does not record it.  Chains are positions along the leading axis
    of a batched state (``chain_method="vectorized"`` or several chains), else ``0``."""
    flags = np.asarray(getattr(state, "diverging", False), bool)
    guard = getattr(state, "guard", None)
    at = np.asarray(getattr(guard, "diverged_at", np.full(flags.shape, -1)), np.int64)
    flags, at = flags.reshape(-1), np.broadcast_to(at, flags.shape).reshape(-1)
    return {int(c): (int(at[c]) if at[c] > 0 else None) for c in np.nonzero(flags)[0]}
