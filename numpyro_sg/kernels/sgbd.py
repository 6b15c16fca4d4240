"""Stochastic gradient Barker dynamics (SGBD), paper 001 §3–4 (Alg. 2–4), SPEC §4.

Coordinate-wise, for each j independently:

1. z_j ~ N(σ_j, (0.1·σ_j)²), σ the step size (scalar or per coordinate);
2. keep the sign of z_j with probability p_j:

   * vanilla: p_j = sigmoid(z_j·ĝ_j);
   * corrected: if abs(z_j) < 1.702/τ̂_j, α_j = 1.702/√(1.702² − τ̂_j²·z_j²) and
     p_j = sigmoid(α_j·z_j·ĝ_j); otherwise (past the breaking point) p_j = 1{z_j·ĝ_j > 0};
   * extreme: p_j = 1{z_j·ĝ_j > 0};

3. θ_j ← θ_j + b_j·z_j, b_j = +1 with probability p_j, else −1.

No accept/reject step.  ``adapt_step_size`` sets σ_j = 1.702/(1.233·τ̂_j), which keeps about
99% of increments below the breaking point.  ĝ is the unbiased mini-batch gradient of log π,
τ̂ the EMA of the gradient-noise sd (the sd of the estimator ĝ_j, SPEC §2).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import random

from numpyro_sg.kernels.base import SGKernel

__all__ = [
    "SGBD",
    "SGBDState",
    "BARKER_LOGISTIC_SCALE",
    "barker_increment",
    "past_breaking_point",
    "barker_alpha",
    "keep_sign_probability",
    "adapted_step_size",
    "sgbd_update",
]

#: 1.702: the scale in the probit approximation sigmoid(x) ≈ Φ(x/1.702) behind Prop. 2.
BARKER_LOGISTIC_SCALE = 1.702
#: 1.233σ bounds ~99% of |z| for z ~ N(σ, (0.1σ)²)
_INCREMENT_QUANTILE = 1.233


def barker_increment(key, sigma):
    """z ~ N(σ, (0.1·σ)²) elementwise (σ's shape)."""
    sigma = jnp.asarray(sigma)
    return sigma + 0.1 * sigma * random.normal(key, sigma.shape, sigma.dtype)


def past_breaking_point(z, noise_sd):
    """True where abs(z)·τ̂ ≥ 1.702, i.e. the corrected estimator does not exist."""
    return jnp.abs(z) * noise_sd >= BARKER_LOGISTIC_SCALE


def barker_alpha(z, noise_sd):
    """α = 1.702/√(1.702² − τ̂²·z²) (below the breaking point; NaN-free: 1 elsewhere)."""
    below = ~past_breaking_point(z, noise_sd)
    inside = jnp.where(below, BARKER_LOGISTIC_SCALE**2 - noise_sd**2 * z**2, 1.0)
    return jnp.where(below, BARKER_LOGISTIC_SCALE / jnp.sqrt(inside), 1.0)


def keep_sign_probability(z, grad, noise_sd, variant: str):
    """Probability of keeping the sign of the increment z, per coordinate."""
    z, grad = jnp.asarray(z), jnp.asarray(grad)
    extreme = (z * grad > 0).astype(jnp.result_type(z, grad, float))
    if variant == "vanilla":
        return jax.nn.sigmoid(z * grad)
    if variant == "extreme":
        return extreme
    if variant == "corrected":
        corrected = jax.nn.sigmoid(barker_alpha(z, noise_sd) * z * grad)
        return jnp.where(past_breaking_point(z, noise_sd), extreme, corrected)
    raise ValueError(f"unknown SGBD variant {variant!r}")


def adapted_step_size(noise_sd, fallback):
    """σ_j = 1.702/(1.233·τ̂_j); ``fallback`` where τ̂_j is 0 (no gradient noise)."""
    safe = jnp.where(noise_sd > 0, noise_sd, 1.0)
    return jnp.where(noise_sd > 0, BARKER_LOGISTIC_SCALE / (_INCREMENT_QUANTILE * safe), fallback)


def sgbd_update(key, theta, grad, sigma, noise_sd, variant: str):
    """One SGBD move: returns (θ', z, p)."""
    key_z, key_b = random.split(key)
    z = barker_increment(key_z, jnp.broadcast_to(sigma, theta.shape))
    p = keep_sign_probability(z, grad, noise_sd, variant)
    b = jnp.where(random.uniform(key_b, theta.shape, theta.dtype) < p, 1.0, -1.0)
    return theta + b * z, z, p


class SGBDState(NamedTuple):
    """State of :class:`SGBD`.

    As :class:`~numpyro_sg.kernels.sgld.SGLDState`, with ``step_size`` σ per coordinate
    (flat) and ``frac_past_breaking_point`` the fraction of coordinates whose increment had
    abs(z_j)·τ̂_j ≥ 1.702 at this iteration (NaN without τ̂).
    """

    i: Any
    z: Any
    z_grad: Any
    grad_noise_sd: Any
    step_size: Any
    frac_past_breaking_point: Any
    diverging: Any
    batch_state: Any
    rng_key: Any


class SGBD(SGKernel):
    """Stochastic gradient Barker dynamics for a NumPyro model with a subsample plate.

    Each coordinate proposes z_j ~ N(σ_j, (0.1σ_j)²) and keeps its sign with probability
    sigmoid(z_j·ĝ_j) (``"vanilla"``), the noise-corrected sigmoid(α_j·z_j·ĝ_j) with
    α_j = 1.702/√(1.702² − τ̂_j²z_j²) falling back to the extreme rule past the breaking point
    (``"corrected"``), or 1{z_j·ĝ_j > 0} (``"extreme"``); then θ_j ← θ_j ± z_j.  σ is
    ``step_size`` (the location of the increment distribution, on the unconstrained space;
    scalar or an array with one entry per unconstrained coordinate).

    :param model: NumPyro model with a subsample plate.
    :param step_size: σ > 0, scalar or per-coordinate array.
    :param str variant: ``"vanilla"``, ``"corrected"`` or ``"extreme"``.
    :param adapt_step_size: ``True`` sets σ_j⁽ᵏ⁾ = 1.702/(1.233·τ̂_j⁽ᵏ⁾) at every iteration (the
        paper's rule); ``"warmup"`` adapts during warmup only and then keeps σ fixed;
        ``False`` (default) keeps ``step_size``.
    :param bool estimate_noise: compute τ̂ (default: when the variant or adaptation needs it).
    :param kwargs: ``subsample_size``, ``replace``, ``init_strategy``, ``check_data``,
        ``noise_ema_weight``: see :class:`~numpyro_sg.kernels.base.SGKernel`.

    Extra fields: ``step_size``, ``grad_noise_sd``, ``frac_past_breaking_point``, ``diverging``.
    """

    State = SGBDState
    VARIANTS = ("vanilla", "corrected", "extreme")

    def __init__(
        self,
        model,
        step_size=1e-2,
        *,
        variant: str = "corrected",
        adapt_step_size=False,
        estimate_noise: bool | None = None,
        **kwargs,
    ):
        if variant not in self.VARIANTS:
            raise ValueError(f"variant must be one of {self.VARIANTS}, got {variant!r}.")
        if adapt_step_size not in (True, False, "warmup"):
            raise ValueError(f"adapt_step_size must be True, False or 'warmup', got {adapt_step_size!r}.")
        sigma = jnp.asarray(step_size, dtype=jnp.result_type(float))
        if sigma.ndim > 1 or not bool(jnp.all(sigma > 0)) or not bool(jnp.all(jnp.isfinite(sigma))):
            raise ValueError(
                f"step_size must be a positive finite scalar or 1-d array, got {step_size!r}."
            )
        super().__init__(model, **kwargs)
        self.step_size = sigma
        self.variant = variant
        self.adapt_step_size = adapt_step_size
        needs = variant == "corrected" or bool(adapt_step_size)
        self.estimate_noise = needs if estimate_noise is None else bool(estimate_noise)
        if needs and not self.estimate_noise:
            raise ValueError(
                "variant='corrected' and adapt_step_size need estimate_noise=True."
            )
        self._needs_single_plate = self.estimate_noise

    def _initial_sigma(self, flat):
        if self.step_size.ndim == 1 and self.step_size.shape != flat.shape:
            raise ValueError(
                f"step_size has shape {self.step_size.shape} but the model has {flat.shape[0]} "
                "unconstrained coordinates."
            )
        return jnp.broadcast_to(self.step_size, flat.shape).astype(flat.dtype)

    def _init_extra(self, flat, noise_sd):
        sigma = self._initial_sigma(flat)
        if self.adapt_step_size:
            sigma = adapted_step_size(noise_sd, sigma)
        return dict(step_size=sigma, frac_past_breaking_point=jnp.asarray(jnp.nan, flat.dtype))

    def _update(self, state, flat, key):
        tau = state.grad_noise_sd
        sigma = state.step_size
        if self.adapt_step_size:
            adapted = adapted_step_size(tau, sigma)
            if self.adapt_step_size == "warmup":
                adapted = jnp.where(state.i < self._num_warmup, adapted, sigma)
            sigma = adapted
        new, z, _ = sgbd_update(key, flat, state.z_grad, sigma, tau, self.variant)
        if self.estimate_noise:
            frac = jnp.mean(past_breaking_point(z, tau).astype(flat.dtype))
        else:
            frac = jnp.asarray(jnp.nan, flat.dtype)
        return new, dict(step_size=sigma, frac_past_breaking_point=frac)
