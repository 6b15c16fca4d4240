"""Stochastic gradient Langevin dynamics (SGLD) and its noise-corrected variant (c-SGLD).

Update (SPEC §3, step-size convention of the whole package):

    θ' = θ + (ε/2)·ĝ(θ) + N(0, v),   v = ε·τ                          (vanilla)
                                      v_j = max(ε·τ − ε²·τ̂_j²/4, 0)      (corrected)

ĝ the unbiased mini-batch gradient of log π, τ the temperature, τ̂_j the exponential moving
average of the gradient-noise sd of coordinate j (the sd of the estimator ĝ_j).  Paper 002
writes h for ε; paper 003 writes γ with ε = 2γ.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
from jax import random

from numpyro_sg.kernels.base import SGKernel

__all__ = [
    "SGLD",
    "SGLDState",
    "polynomial_schedule",
    "sgld_update",
    "corrected_noise_variance",
]


def polynomial_schedule(a: float, b: float = 1.0, kappa: float = 0.55) -> Callable:
    """Decaying step sizes ε_t = a·(b + t)^(−κ), κ ∈ (0, 1] (t = 0, 1, … counts warmup too)."""
    if not 0.0 < kappa <= 1.0:
        raise ValueError(f"kappa must lie in (0, 1], got {kappa}.")
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be positive, got a={a}, b={b}.")

    def schedule(t):
        return a * (b + t) ** (-kappa)

    schedule.__doc__ = f"ε_t = {a}·({b} + t)^(−{kappa})"
    return schedule


def corrected_noise_variance(step_size, temperature, noise_sd):
    """Variance to inject in c-SGLD: max(ε·τ − ε²·τ̂²/4, 0) per coordinate.

    The stochastic gradient already contributes variance (ε/2)²·τ̂² to each coordinate; only
    the rest of the Langevin variance ε·τ is injected.
    """
    return jnp.maximum(step_size * temperature - step_size**2 * noise_sd**2 / 4.0, 0.0)


def sgld_update(theta, grad, step_size, noise, noise_variance):
    """θ + (ε/2)·ĝ + √v·ξ with ξ = ``noise`` ~ N(0, I) and v = ``noise_variance``."""
    return theta + 0.5 * step_size * grad + jnp.sqrt(noise_variance) * noise


def _check_positive(name, value):
    if not callable(value) and not jnp.all(jnp.asarray(value) > 0):
        raise ValueError(f"{name} must be positive, got {value!r}.")


class SGLDState(NamedTuple):
    """State of :class:`SGLD`.

    ``i`` iteration counter (warmup included); ``z`` unconstrained parameters (dict);
    ``z_grad`` the stochastic gradient ĝ at ``z`` (flat); ``grad_noise_sd`` the EMA τ̂ of the
    gradient-noise sd per coordinate (NaN when not estimated); ``step_size`` the ε that
    produced ``z`` (per coordinate when given as an array); ``diverging`` True from the first non-finite state or gradient on.
    """

    i: Any
    z: Any
    z_grad: Any
    grad_noise_sd: Any
    step_size: Any
    diverging: Any
    batch_state: Any
    rng_key: Any


class SGLD(SGKernel):
    """Stochastic gradient Langevin dynamics for a NumPyro model with a subsample plate.

    θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·τ·I) (``variant="vanilla"``); ``variant="corrected"``
    (c-SGLD, paper 001 Alg. 7) injects only max(ε·τ − ε²·τ̂_j²/4, 0) per coordinate, τ̂ the
    EMA of the gradient-noise sd.  ε is ``step_size`` (a float, or a callable t ↦ ε_t such as
    :func:`polynomial_schedule`, t the iteration counter including warmup).  The chain lives
    on NumPyro's unconstrained space.

    :param model: NumPyro model with a subsample plate.
    :param step_size: ε > 0: a float, an array with one entry per unconstrained coordinate
        (a constant diagonal preconditioner, θ'_j = θ_j + (ε_j/2)·ĝ_j + N(0, ε_j·τ), for
        posteriors whose coordinates have very different scales), or a callable schedule.
    :param str variant: ``"vanilla"`` or ``"corrected"``.
    :param float temperature: τ (default 1).
    :param bool estimate_noise: compute τ̂ from per-datum gradients (default: only when the
        variant needs it; costs about one extra gradient evaluation per iteration).
    :param kwargs: ``subsample_size``, ``replace``, ``init_strategy``, ``check_data``,
        ``noise_ema_weight``: see :class:`~numpyro_sg.kernels.base.SGKernel`.

    Extra fields: ``step_size``, ``grad_noise_sd``, ``diverging``.
    """

    State = SGLDState
    VARIANTS = ("vanilla", "corrected")

    def __init__(
        self,
        model,
        step_size=1e-4,
        *,
        variant: str = "vanilla",
        temperature: float = 1.0,
        estimate_noise: bool | None = None,
        **kwargs,
    ):
        if variant not in self.VARIANTS:
            raise ValueError(f"variant must be one of {self.VARIANTS}, got {variant!r}.")
        _check_positive("step_size", step_size)
        _check_positive("temperature", temperature)
        super().__init__(model, **kwargs)
        self.step_size = step_size
        self.variant = variant
        self.temperature = float(temperature)
        self.estimate_noise = (variant == "corrected") if estimate_noise is None else estimate_noise
        if variant == "corrected" and not self.estimate_noise:
            raise ValueError("variant='corrected' needs estimate_noise=True.")
        self._needs_single_plate = self.estimate_noise

    def _step_size_at(self, t):
        if callable(self.step_size):
            return jnp.asarray(self.step_size(t), dtype=jnp.result_type(float))
        return jnp.asarray(self.step_size, dtype=jnp.result_type(float))

    def _init_extra(self, flat, noise_sd):
        eps = self._step_size_at(0)
        if eps.ndim > 1 or (eps.ndim == 1 and eps.shape != flat.shape):
            raise ValueError(
                f"step_size has shape {eps.shape} but the model has {flat.shape[0]} "
                "unconstrained coordinates."
            )
        return dict(step_size=eps)

    def _update(self, state, flat, key):
        eps = self._step_size_at(state.i)
        if self.variant == "corrected":
            var = corrected_noise_variance(eps, self.temperature, state.grad_noise_sd)
        else:
            var = eps * self.temperature
        noise = random.normal(key, flat.shape, flat.dtype)
        return sgld_update(flat, state.z_grad, eps, noise, var), dict(step_size=eps)
