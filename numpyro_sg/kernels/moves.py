r"""Pure moves shared by the kernels, each written once and tested alone.

Step-size convention (:mod:`numpyro_sg.kernels.step_size`): the Langevin move with step size ε
and temperature τ is θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·τ·I), applied to the working coordinates of
the preconditioner (:mod:`numpyro_sg.infer.preconditioner`).

* the Langevin move :func:`langevin_move` and its injected-noise variance
  :func:`langevin_noise_variance` (noise correction of c-SGLD, discretisation correction);
* the tamed gradient :func:`tamed_gradient` of the Langevin and SGHMC moves in a dense Laplace frame;
* the exponential moving average :func:`ema` of the gradient-noise estimate.

Divergence handling lives in :mod:`numpyro_sg.kernels.guard`.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["langevin_move", "langevin_noise_variance", "tamed_gradient", "ema"]

#: the tamed gradient's largest norm in a dense Laplace frame is TAME_SCALE·√d + TAME_OFFSET
TAME_SCALE, TAME_OFFSET = 2.0, 5.0


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


def tamed_gradient(grad_w, precond):
    r"""ĝ_w·min(1, G/‖ĝ_w‖), G = 2√d + 5, in the frame of a dense Laplace ``precond`` (else ĝ_w).

    In the frame where the Laplace approximation is N(0, I) a posterior near it has gradients
    of norm about ‖u‖ ≈ √d (χ_d: sd 0.71), and the mini-batch noise the defaults allow adds
    a quarter of that variance at most; G is far outside both, so taming leaves such a chain
    unchanged.  Where the posterior's curvature rises far above the mode's a few sds out (a
    steep wall: a few rows tens of sds out with a saturating link), or an extreme row enters a
    mini-batch, an untamed Langevin or SGHMC step overshoots by tens or hundreds of sds; the
    tamed one moves at most (ε/2)·G.  A threshold form of the tamed unadjusted Langevin
    algorithm (Brosse, Durmus, Moulines & Sabanis 2019, "The tamed unadjusted Langevin
    algorithm", Stochastic Processes and their Applications).

    >>> g = tamed_gradient(jnp.array([30.0, 40.0]), type("P", (), {"kind": "dense"})())  # G = 2√2 + 5
    >>> [round(float(v), 3) for v in g]
    [4.697, 6.263]
    """
    if precond is None or precond.kind != "dense":
        return grad_w
    cap = TAME_SCALE * jnp.sqrt(grad_w.shape[-1]) + TAME_OFFSET
    return grad_w * jnp.minimum(1.0, cap / jnp.maximum(jnp.linalg.norm(grad_w), jnp.finfo(grad_w.dtype).tiny))


def ema(previous, current, weight):
    """Exponential moving average (1 − β)·previous + β·current, β = ``weight``."""
    return (1.0 - weight) * previous + weight * current
