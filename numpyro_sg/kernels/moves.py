r"""Pure building blocks shared by the kernels, each written once and tested alone.

Step-size convention of the whole package (SPEC §2): the Langevin move with step size ε and
temperature τ is θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·τ·I) (paper 002's h is ε; paper 003's γ is ε/2),
applied to the working coordinates of the preconditioner
(:mod:`numpyro_sg.infer.preconditioner`).

* step-size schedules as pytrees (:class:`PolynomialSchedule`) and :func:`step_size_at`;
* the Langevin move :func:`langevin_move` and its injected-noise variance
  :func:`langevin_noise_variance` (noise correction of c-SGLD, discretisation correction);
* one Metropolis-adjusted Langevin step :func:`mala_step`;
* the exponential moving average :func:`ema` of the gradient-noise estimate;
* divergence handling: :class:`DivergenceGuard`, :func:`guard_step` and :func:`freeze`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import random

__all__ = [
    "resolve_step_size",
    "PolynomialSchedule",
    "CallableSchedule",
    "polynomial_schedule",
    "step_size_at",
    "langevin_move",
    "langevin_noise_variance",
    "mala_step",
    "MALAResult",
    "ema",
    "DivergenceGuard",
    "init_guard",
    "guard_step",
    "freeze",
]


# -------------------------------------------------------------------------------------------
# step sizes
# -------------------------------------------------------------------------------------------
class PolynomialSchedule(NamedTuple):
    """Decaying step sizes ε_t = a·(b + t)^(−κ) (a pytree: it can live in a kernel state).

    **Example:**

    .. code-block:: python

        schedule = PolynomialSchedule(1e-2, 1.0, 0.55)
        schedule(10)   # 1e-2 · 11^(−0.55)
    """

    a: Any
    b: Any
    kappa: Any

    def __call__(self, t):
        return self.a * (self.b + t) ** (-self.kappa)


@jax.tree_util.register_pytree_node_class
class CallableSchedule:
    """A user's callable t ↦ ε_t, times a ``scale`` held as data (so a tuner can vary it).

    The callable itself is static (it cannot be traced as state); ε_t = scale·fn(t).
    """

    def __init__(self, fn: Callable, scale=1.0):
        self.fn = fn
        self.scale = scale

    def __call__(self, t):
        return self.scale * self.fn(t)

    def tree_flatten(self):
        return (self.scale,), self.fn

    @classmethod
    def tree_unflatten(cls, fn, children):
        return cls(fn, children[0])


def polynomial_schedule(a: float, b: float = 1.0, kappa: float = 0.55) -> PolynomialSchedule:
    """Decaying step sizes ε_t = a·(b + t)^(−κ), κ ∈ (0, 1] (t = 0, 1, … counts warmup too).

    :param float a: scale a > 0.
    :param float b: offset b > 0.
    :param float kappa: decay exponent κ ∈ (0, 1].
    :return: a :class:`PolynomialSchedule` (callable, and a pytree).

    **Example:**

    .. code-block:: python

        kernel = nsg.SGLD(model, nsg.polynomial_schedule(1e-2, 1.0, 0.55),
                          preconditioner=None, gradient="plain")
    """
    if not 0.0 < kappa <= 1.0:
        raise ValueError(f"kappa must lie in (0, 1], got {kappa}.")
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be positive, got a={a}, b={b}.")
    return PolynomialSchedule(float(a), float(b), float(kappa))


def step_size_at(step_size, t, dtype=None):
    """ε_t: a schedule evaluated at iteration ``t``, or the constant (scalar or per coordinate)."""
    value = step_size(t) if callable(step_size) else step_size
    return jnp.asarray(value, dtype=dtype or jnp.result_type(float))


# -------------------------------------------------------------------------------------------
# Langevin
# -------------------------------------------------------------------------------------------
def langevin_noise_variance(step_size, temperature=1.0, noise_sd=None, correct_discretisation=False):
    r"""Variance of the Gaussian noise injected by a Langevin step, per coordinate.

    v = ε·τ (plain).  ``correct_discretisation=True`` multiplies by (1 − ε/4): for a standard
    Gaussian target in the working frame the Euler chain u' = (1 − ε/2)·u + √v·ξ is then
    stationary at exactly N(0, 1) (SPEC §12).  With a gradient-noise sd τ̂ (``noise_sd``),
    the stochastic gradient already contributes (ε/2)²·τ̂², which is subtracted (c-SGLD,
    paper 001 Alg. 7): v = max(ε·τ·c − ε²·τ̂²/4, 0), c = 1 or 1 − ε/4.
    """
    v = step_size * temperature
    if correct_discretisation:
        v = v * jnp.maximum(1.0 - step_size / 4.0, 0.0)
    if noise_sd is not None:
        v = jnp.maximum(v - step_size**2 * noise_sd**2 / 4.0, 0.0)
    return v


def langevin_move(x, grad, step_size, noise, noise_variance):
    """x + (ε/2)·ĝ + √v·ξ with ξ = ``noise`` ~ N(0, I) and v = ``noise_variance``."""
    return x + 0.5 * step_size * grad + jnp.sqrt(noise_variance) * noise


class MALAResult(NamedTuple):
    """One MALA step: the new point, its log density and gradient, the acceptance probability."""

    x: Any
    log_density: Any
    grad: Any
    accept_prob: Any


def mala_step(key, x, log_density, grad, logp_grad_fn: Callable, step_size, mask=None) -> MALAResult:
    r"""One Metropolis-adjusted Langevin step targeting exp(log π).

    Proposal x* = x + (ε/2)·∇log π(x) + √ε·ξ (coordinates where ``mask`` is 0 stay put),
    accepted with probability min(1, π(x*)q(x | x*) / (π(x)q(x* | x))), q the Gaussian
    proposal density.  ``log_density`` and ``grad`` are log π and its gradient at x;
    ``logp_grad_fn(x) -> (log π, ∇ log π)``.
    """
    k_noise, k_acc = random.split(key)
    noise = random.normal(k_noise, jnp.shape(x), jnp.result_type(x))
    if mask is not None:
        noise, grad = noise * mask, grad * mask
    prop = x + 0.5 * step_size * grad + jnp.sqrt(step_size) * noise
    lp1, g1 = logp_grad_fn(prop)
    if mask is not None:
        g1 = g1 * mask
    fwd = -jnp.sum((prop - x - 0.5 * step_size * grad) ** 2) / (2 * step_size)
    bwd = -jnp.sum((x - prop - 0.5 * step_size * g1) ** 2) / (2 * step_size)
    log_a = lp1 - log_density + bwd - fwd
    log_a = jnp.where(jnp.isfinite(log_a), log_a, -jnp.inf)
    accept_prob = jnp.exp(jnp.minimum(log_a, 0.0))
    take = random.uniform(k_acc, (), jnp.result_type(x)) < accept_prob
    pick = lambda a, b: jnp.where(take, a, b)  # noqa: E731
    return MALAResult(pick(prop, x), pick(lp1, log_density), pick(g1, grad), accept_prob)


def ema(previous, current, weight):
    """Exponential moving average (1 − β)·previous + β·current, β = ``weight``."""
    return (1.0 - weight) * previous + weight * current


# -------------------------------------------------------------------------------------------
# divergence
# -------------------------------------------------------------------------------------------
class DivergenceGuard(NamedTuple):
    """Blow-up detection state of a chain.

    ``safe`` the last point (flat) whose working-frame gradient norm stayed within
    :data:`SAFE_FACTOR` of the reference; ``reference`` the reference norm (``inf`` before the
    first step); ``level`` a moving average of the norm; ``count`` the number of steps seen.
    """

    safe: Any
    reference: Any
    level: Any
    count: Any


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
    return DivergenceGuard(flat, jnp.full_like(norm, jnp.inf), norm, jnp.zeros((), jnp.int32))


def guard_step(guard: DivergenceGuard, flat, grad_norm, finite):
    r"""Update the guard with a new point; return ``(blown_up, new_guard)``.

    A chain has *blown up* when its state, log density or gradient is not finite
    (``finite`` False), or when the norm of its working-frame gradient exceeds
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
        keep(level, guard.level), count,
    )
    return blown, new


def freeze(diverging, old, new):
    """``old`` where ``diverging`` else ``new`` (pytrees of the same structure)."""
    return jax.tree.map(lambda a, b: jnp.where(diverging, a, b), old, new)


def resolve_step_size(step_size, default, dim: int):
    """A Langevin-family step size as held in a kernel's hyperparameters.

    ``default`` when ``step_size`` is ``None``; a schedule pytree as is; any other callable
    t ↦ ε_t wrapped in a :class:`~numpyro_sg.kernels.moves.CallableSchedule`; otherwise an
    array, a scalar or one entry per unconstrained coordinate (shape ``(dim,)``, checked).
    """
    eps = default if step_size is None else step_size
    if callable(eps) and not isinstance(eps, (PolynomialSchedule, CallableSchedule)):
        eps = CallableSchedule(eps)
    if not callable(eps):
        eps = jnp.asarray(eps, jnp.result_type(float))
        if eps.ndim > 1 or (eps.ndim == 1 and eps.shape != (dim,)):
            raise ValueError(
                f"step_size has shape {eps.shape} but the model has {dim} unconstrained coordinates."
            )
    return eps
