r"""The momentum layer of SGHMC (Chen, Fox & Guestrin 2014) and SGNHT (Ding et al. 2014).

References: T. Chen, E. Fox and C. Guestrin (2014), "Stochastic gradient Hamiltonian Monte
Carlo", ICML; N. Ding, Y. Fang, R. Babbush, C. Chen, R. Skeel and H. Neven (2014), "Bayesian
sampling using stochastic gradient thermostats", NeurIPS.  The kernels themselves are
:class:`numpyro_sg.kernels.sghmc.SGHMC` and :class:`numpyro_sg.kernels.sgnht.SGNHT`.

Both keep a momentum v beside the working coordinates u of the preconditioner
(θ = θ₀ + L·u, :mod:`numpyro_sg.infer.preconditioner`; v is in the units of u, a displacement per
iteration) and take one stochastic gradient per iteration, at the current point.  With the
package's step size ε (the same ε as SGLD's, :mod:`numpyro_sg.kernels.step_size`) the learning rate is **η = ε/2**, and
one iteration is

.. math::

   v' = (1 - \alpha)\,v + \eta\,L^\top\hat g(\theta) + \mathcal N(0, s^2),\qquad
   u' = u + v',

the momentum kicked first with the gradient at the current point, then the position moved
with the new momentum (Chen et al.'s Algorithm 2 and eq. (15); Ding et al.'s Algorithm 2).

* **SGHMC**: α = ``friction`` is fixed; the injected variance per working coordinate is
  s² = 2·α·η·τ, times (1 − η/(4 − 2α)) with ``correct_discretisation``
  (:func:`sghmc_noise_variance`), minus the stochastic gradient's own η²·τ̂_j² with
  ``variant="corrected"`` (Chen et al.'s β̂ = η·τ̂²/2).  With α = 1 the momentum is
  forgotten at every step and the update *is* SGLD's u' = u + (ε/2)·ĝ + N(0, ε·τ):
  same step size, same noise, same draws.
* **SGNHT**: the friction is a thermostat ζ (one scalar per chain) that adapts so that the
  kinetic energy matches the temperature, ζ' = ζ + mean_j(v'_j²) − η·τ (Ding et al.'s
  ξ' = ξ + (pᵀp/n − 1)·h in per-iteration units, :func:`thermostat_update`); the injected
  variance is s² = 2·a·η·τ with a = ``friction`` (Ding et al.'s A·h), and ζ starts at a.
  With ``correct_discretisation`` the kinetic energy is measured as (1 − ζ/2)·v'², which
  makes the position variance exact on every Gaussian target whatever the gradient noise,
  up to the thermostat's own fluctuations (Var(ζ) ≈ η/d shrinks the variance by about that).

Defaults (Laplace preconditioner, control variates): SGHMC ε = 0.35, α = 0.5; SGNHT
ε = min(1, 0.05·d), a = 0.2 (measured choices: docs/kernels.md).

**Discretisation.**  For a Gaussian target whitened by M (the Laplace preconditioner at its
best) with exact gradients, the chain above is linear; its stationary position variance is
s²·(2 − α)/(α·η·(4 − 2α − η)), i.e. 1/(1 − η/(4 − 2α)) with s² = 2αη — the factor
``correct_discretisation`` removes (for α = 1 it is SGLD's 1 − ε/4) — and its momentum variance
is 2η/(2 − α) times the position variance, whatever s²: so a thermostat that holds
(1 − ζ/2)·v² at η·τ holds the position variance at τ, for every curvature.  The chain is
stable for η < 4 − 2α on a whitened Gaussian.

**Mapping to the papers and peers** (M = I; U = −log π; ĝ = ∇log π; τ̂² the gradient-noise
variance of ĝ):

=================================  ========================================================
Chen et al. (2014), eq. (15)       η = ε/2 (learning rate), α = ``friction``,
                                   β̂ = η·τ̂²/2; their v is ours
BlackJAX ``sghmc`` / ``sgnht``     ``step_size`` h = √(ε/2), ``alpha`` = α/h (SGHMC) or
                                   a/h (SGNHT), ``beta`` = τ̂²; their momentum p = v/h and
                                   ξ = ζ/h (:func:`blackjax_parameters`)
SGMCMCJax ``sghmc`` / ``sgnht``    ``dt`` = ε/2, ``alpha`` = α and ``beta`` = η·τ̂²/2
                                   (SGHMC), ``a`` = a (SGNHT); their v is ours, their
                                   ``alpha`` (SGNHT state) is ζ
Ding et al. (2014), Algorithm 2    h = √(ε/2), p = v/h, ξ = ζ/h, A = a/h
=================================  ========================================================

BlackJAX's and SGMCMCJax's SGHMC move the position *before* the momentum kick (x' = x + v,
then v' from ĝ(x)); on the same sequence of gradients their positions are ours one
iteration late.  BlackJAX's ``sgnht`` does the same; SGMCMCJax's ``sgnht`` is ours exactly.
BlackJAX's ``sghmc`` also draws a fresh momentum at every ``step`` call and runs
``num_integration_steps`` (default 10) inner steps on that one mini-batch; SGMCMCJax's
resamples it every ``L`` steps.  Ours never resamples (the friction refreshes it) and draws
a new mini-batch at every iteration.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from numpyro_sg.kernels.options import check_positive
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.kernels.step_size import resolve_step_size, step_size_at

# -------------------------------------------------------------------------------------------
# the update maths
# -------------------------------------------------------------------------------------------
def learning_rate(step_size):
    """η = ε/2: the learning rate of Chen et al. (and SGMCMCJax's ``dt``) for the package's ε."""
    return 0.5 * step_size


def sghmc_noise_variance(step_size, friction, temperature=1.0, noise_sd=None,
                         correct_discretisation=False):
    r"""Variance of the momentum noise of SGHMC per working coordinate.

    s² = 2·α·η·τ with η = ε/2 (Chen et al.'s 2(α − β̂)η with β̂ = 0).
    ``correct_discretisation`` multiplies it by max(1 − η/(4 − 2α), 0): the chain's stationary
    position variance on a standard Gaussian target with exact gradients is then exactly τ
    (for α = 1, SGLD's factor 1 − ε/4).  With a gradient-noise sd τ̂ (``noise_sd``) the
    stochastic gradient already adds η²·τ̂² to the momentum, which is subtracted:
    s² = max(s² − η²·τ̂², 0) (Chen et al.'s β̂ = η·τ̂²/2).
    """
    eta = learning_rate(step_size)
    v = 2.0 * friction * eta * temperature
    if correct_discretisation:
        v = v * jnp.maximum(1.0 - eta / (4.0 - 2.0 * friction), 0.0)
    if noise_sd is not None:
        v = jnp.maximum(v - eta**2 * noise_sd**2, 0.0)
    return v


def sghmc_inflation(step_size, noise, friction, curvature=1.0):
    """(η·(λ − 1) + η·c·(2 − α)/α)/(4 − 2α − η·λ), η = ε/2: the fraction of variance SGHMC's
    stationary distribution (``correct_discretisation``) gains from gradient noise of variance c
    per step on a whitened Gaussian target of curvature λ = ``curvature`` (the stationary
    variance in the module docstring with η·λ for η and η²·c added to s²; at λ = 1
    η·c·(2 − α)/(α·(4 − 2α − η)), for α = 1 SGLD's ε·c/(4 − ε); ``inf`` where the chain is unstable)."""
    eta = 0.5 * step_size
    room = 4.0 - 2.0 * friction - eta * curvature
    return float("inf") if room <= 0 else eta * (curvature - 1.0 + noise * (2.0 - friction) / friction) / room


def momentum_update(momentum, grad, step_size, friction, noise, noise_variance):
    """v' = (1 − α)·v + η·ĝ + √s²·ξ, η = ε/2, ξ = ``noise`` ~ N(0, I), s² = ``noise_variance``.

    The position update is u' = u + v'.  ``friction`` is SGHMC's α or SGNHT's thermostat ζ.
    """
    return (1.0 - friction) * momentum + learning_rate(step_size) * grad + jnp.sqrt(noise_variance) * noise


def kinetic_energy(momentum, friction, correct_discretisation=False):
    """mean_j(v_j²), the quantity SGNHT's thermostat holds at η·τ; times (1 − ζ/2) with
    ``correct_discretisation`` (ζ = ``friction``, the friction that produced v): the momentum
    variance of the discretised chain is 2η/(2 − ζ) times the position variance."""
    k = jnp.mean(momentum**2)
    return k * (1.0 - 0.5 * friction) if correct_discretisation else k


def thermostat_update(thermostat, momentum, step_size, temperature=1.0, correct_discretisation=False):
    r"""ζ' = ζ + K(v') − η̄·τ, K the :func:`kinetic_energy` (η̄ the mean learning rate).

    Ding et al.'s ξ' = ξ + (pᵀp/n − 1)·h with h² = η, p = v/h and ζ = ξ·h.
    """
    eta = jnp.mean(learning_rate(jnp.asarray(step_size)))
    return thermostat + kinetic_energy(momentum, thermostat, correct_discretisation) - eta * temperature


def blackjax_parameters(step_size, friction, noise_variance=0.0) -> dict:
    """BlackJAX's ``sghmc``/``sgnht`` parameters for our ε, friction and gradient-noise variance.

    ``{"step_size": h, "alpha": friction/h, "beta": noise_variance}`` with h = √(ε/2); their
    momentum is p = v/h and their thermostat ξ = ζ/h.  (Their ``beta`` enters as
    h·(2α − h·β) in the noise variance of p: β is the variance τ̂² of the gradient estimator,
    our ``variant="corrected"``.)
    """
    h = float(learning_rate(step_size)) ** 0.5
    return {"step_size": h, "alpha": float(friction) / h, "beta": float(noise_variance)}


# -------------------------------------------------------------------------------------------
# the kernels
# -------------------------------------------------------------------------------------------
class MomentumHyper(NamedTuple):
    """Hyperparameters of SGHMC and SGNHT held in their state: ``step_size``
    ε (scalar, per coordinate, or a schedule pytree), ``friction`` (α or a, scalar) and
    ``temperature`` τ."""

    step_size: Any
    friction: Any
    temperature: Any


def momentum_hyperparameters(step_size, friction, temperature, dim: int, default=None) -> MomentumHyper:
    """The :class:`MomentumHyper` of ε (``default`` when ``None``), the friction and τ."""
    dtype = jnp.result_type(float)
    return MomentumHyper(resolve_step_size(step_size, default, dim), jnp.asarray(friction, dtype),
                         jnp.asarray(temperature, dtype))


def momentum_fields(noise_sd, hyper, dim, dtype):
    """The momentum kernels' own state fields at the start: ε, a zero momentum and its norm."""
    return dict(step_size=step_size_at(hyper.step_size, 0, dtype),
                momentum=jnp.zeros((dim,), dtype), momentum_norm=jnp.zeros((), dtype))


class MomentumKernel(GradientKernel):
    """Shell shared by :class:`~numpyro_sg.kernels.sghmc.SGHMC` and
    :class:`~numpyro_sg.kernels.sgnht.SGNHT` (not used directly): argument checks, the
    hyperparameters, a zero initial momentum, reset when ``preconditioner="adapt"`` changes the
    working frame."""

    HYPERPARAMETERS = ("step_size", "friction", "temperature")
    #: the subclass's default ε and friction
    DEFAULT_STEP_SIZE: float = None
    DEFAULT_FRICTION: float = None

    def __init__(self, model, step_size=None, *, friction=None, temperature=1.0,
                 correct_discretisation=None, shared=None):
        if step_size is not None and not callable(step_size):
            check_positive("step_size", step_size)
        friction = self.DEFAULT_FRICTION if friction is None else friction
        if not (np.ndim(friction) == 0 and 0.0 < float(friction) <= 1.0):
            raise ValueError(f"friction must be a scalar in (0, 1], got {friction!r}.")
        check_positive("temperature", temperature)
        super().__init__(model, step_size, **shared)
        self.friction = float(friction)
        self.temperature = float(temperature)
        if correct_discretisation is None:
            correct_discretisation = isinstance(self.preconditioner, str)
        self.correct_discretisation = bool(correct_discretisation)

    def step_options(self):
        return super().step_options() | dict(correct_discretisation=self.correct_discretisation)

    def _hyperparameters(self, dim, precond):
        return momentum_hyperparameters(self.step_size, self.friction, self.temperature, dim, self.default_step_size())

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return momentum_fields(noise_sd, hyper, dim, dtype)

    def _between_steps(self, state):
        new = super()._between_steps(state)
        if not self._adapt_at:
            return new
        i0 = state.i if jnp.ndim(state.i) == 0 else state.i[0]
        refit = jnp.isin(i0, jnp.asarray(self._adapt_at))  # the working frame changed
        return new._replace(momentum=jnp.where(refit, 0.0, new.momentum))
