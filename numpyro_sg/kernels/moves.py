r"""Pure moves shared by the kernels, each written once and tested alone.

Step-size convention (:mod:`numpyro_sg.kernels.step_size`): the Langevin move with step size ε
and temperature τ is θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·τ·I), applied to the working coordinates of
the preconditioner (:mod:`numpyro_sg.infer.preconditioner`).

* the Langevin move :func:`langevin_move` and its injected-noise variance
  :func:`langevin_noise_variance` (noise correction of c-SGLD, discretisation correction);
* one Metropolis-adjusted Langevin step :func:`mala_step`;
* the exponential moving average :func:`ema` of the gradient-noise estimate.

Divergence handling lives in :mod:`numpyro_sg.kernels.guard`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
from jax import random

__all__ = ["langevin_move", "langevin_noise_variance", "mala_step", "ema"]


# -------------------------------------------------------------------------------------------
# Langevin
# -------------------------------------------------------------------------------------------
def langevin_noise_variance(step_size, temperature=1.0, noise_sd=None, correct_discretisation=False):
    r"""Variance of the Gaussian noise injected by a Langevin step, per coordinate.

    v = ε·τ (plain).  ``correct_discretisation=True`` multiplies by (1 − ε/4): for a standard
    Gaussian target in the working frame the Euler chain u' = (1 − ε/2)·u + √v·ξ is then
    stationary at exactly N(0, 1) .  With a gradient-noise sd τ̂ (``noise_sd``),
    the stochastic gradient already contributes (ε/2)²·τ̂², which is subtracted (c-SGLD): v = max(ε·τ·c − ε²·τ̂²/4, 0), c = 1 or 1 − ε/4.
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
