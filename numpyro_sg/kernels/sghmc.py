r"""Second-order SG-MCMC: SGHMC (Chen, Fox & Guestrin 2014) and SGNHT (Ding et al. 2014).

Both keep a momentum v beside the working coordinates u of the preconditioner
(θ = θ₀ + L·u, :mod:`numpyro_sg.infer.preconditioner`; v is in the units of u, a displacement per
iteration) and take one stochastic gradient per iteration, at the current point.  With the
package's step size ε (SPEC §2; the same ε as SGLD's) the learning rate is **η = ε/2**, and
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

Defaults (Laplace preconditioner, control variates): SGHMC ε = 1, α = 0.5; SGNHT
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
from jax import random

from numpyro_sg.kernels.base import GradientKernel, check_choice, check_positive, gradient_state
from numpyro_sg.kernels.guard import freeze
from numpyro_sg.kernels.step_size import resolve_step_size, step_size_at

__all__ = [
    "SGHMC",
    "SGNHT",
    "MomentumKernel",
    "MomentumHyper",
    "SGHMCState",
    "SGNHTState",
    "learning_rate",
    "sghmc_noise_variance",
    "momentum_update",
    "kinetic_energy",
    "thermostat_update",
    "blackjax_parameters",
    "DEFAULT_STEP_SIZE",
    "DEFAULT_FRICTION",
    "SGNHT_DEFAULT_STEP_SIZE",
    "SGNHT_STEP_PER_DIMENSION",
    "sgnht_default_step_size",
    "SGNHT_DEFAULT_FRICTION",
]

#: default ε of SGHMC in the working frame of the Laplace preconditioner (η = ε/2)
DEFAULT_STEP_SIZE = 1.0
#: default friction α of SGHMC (the fraction of the momentum forgotten per iteration)
DEFAULT_FRICTION = 0.5
#: largest default ε of SGNHT in the working frame of the Laplace preconditioner
SGNHT_DEFAULT_STEP_SIZE = 1.0
#: SGNHT's default ε per unconstrained coordinate below that (:func:`sgnht_default_step_size`)
SGNHT_STEP_PER_DIMENSION = 0.05
#: default friction a of SGNHT (injected noise 2·a·η·τ; the thermostat starts at a)
SGNHT_DEFAULT_FRICTION = 0.2


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


def sgnht_default_step_size(dim: int) -> float:
    """SGNHT's default ε for ``dim`` coordinates: min(1, 0.05·d).

    The thermostat is driven by mean_j(v_j²), whose relative sd is √(2/d): measured on
    whitened Gaussians, ζ fluctuates with sd ≈ √(η/d), the chains blow up (ζ leaves the stable
    range) from sd ≈ 0.25 on, and the fluctuations shrink the position variance by ≈ Var(ζ).
    ε = 0.05·d (η = d/40) holds the sd near 0.16 (a variance bias of ≈ 2.5%) for small models
    and reaches the SGHMC default ε = 1 at d = 20.
    """
    return float(min(SGNHT_DEFAULT_STEP_SIZE, SGNHT_STEP_PER_DIMENSION * dim))


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
    """Hyperparameters of :class:`SGHMC` and :class:`SGNHT` held in their state: ``step_size``
    ε (scalar, per coordinate, or a schedule pytree), ``friction`` (α or a, scalar) and
    ``temperature`` τ."""

    step_size: Any
    friction: Any
    temperature: Any


_STATE_DOC = """State of :class:`{name}`.

As :class:`~numpyro_sg.kernels.sgld.SGLDState` (``i``, ``z``, ``z_grad``, ``grad_noise_sd``,
``step_size`` the ε that produced ``z``, ``hyper`` a :class:`MomentumHyper`, ``precond``,
``anchor``, ``moments``, ``guard``, ``diverging``, ``batch_state``, ``rng_key``), plus
``momentum`` v, flat, in the working frame of the preconditioner (a displacement of u per
iteration; zero at the start), and ``momentum_norm`` its Euclidean norm{extra}.
"""

SGHMCState = gradient_state("SGHMCState", ("momentum", "momentum_norm"),
                            doc=_STATE_DOC.format(name="SGHMC", extra=""))
SGNHTState = gradient_state(
    "SGNHTState", ("momentum", "momentum_norm", "thermostat"),
    doc=_STATE_DOC.format(name="SGNHT", extra=", and ``thermostat`` ζ, the current friction "
                          "(per iteration; Ding et al.'s ξ times h = √(ε/2))"),
)


class MomentumKernel(GradientKernel):
    """Shell shared by :class:`SGHMC` and :class:`SGNHT` (not used directly): argument checks,
    the hyperparameters, a zero initial momentum, and momentum fields frozen with the chain
    on a divergence (and reset when ``preconditioner="adapt"`` changes the working frame)."""

    HYPERPARAMETERS = ("step_size", "friction", "temperature")
    #: state fields frozen with the chain when it diverges
    FROZEN_FIELDS = ("momentum", "momentum_norm")
    DEFAULT_STEP_SIZE = DEFAULT_STEP_SIZE
    DEFAULT_FRICTION = DEFAULT_FRICTION

    def __init__(self, model, step_size=None, *, friction=None, temperature=1.0,
                 correct_discretisation=None, estimate_noise=False, shared=None):
        if step_size is not None and not callable(step_size):
            check_positive("step_size", step_size)
        friction = self.DEFAULT_FRICTION if friction is None else friction
        if not (np.ndim(friction) == 0 and 0.0 < float(friction) <= 1.0):
            raise ValueError(f"friction must be a scalar in (0, 1], got {friction!r}.")
        check_positive("temperature", temperature)
        super().__init__(model, step_size, **shared)
        self.friction = float(friction)
        self.temperature = float(temperature)
        self.estimate_noise = bool(estimate_noise)
        if correct_discretisation is None:
            correct_discretisation = isinstance(self.preconditioner, str)
        self.correct_discretisation = bool(correct_discretisation)

    def _hyperparameters(self, dim, precond):
        dtype = jnp.result_type(float)
        return MomentumHyper(
            step_size=resolve_step_size(self.step_size, self.DEFAULT_STEP_SIZE, dim),
            friction=jnp.asarray(self.friction, dtype),
            temperature=jnp.asarray(self.temperature, dtype),
        )

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return dict(step_size=step_size_at(hyper.step_size, 0, dtype),
                    momentum=jnp.zeros((dim,), dtype), momentum_norm=jnp.zeros((), dtype))

    def _refresh(self, state):
        return state._replace(step_size=step_size_at(state.hyper.step_size, state.i))

    def _between_steps(self, state):
        new = super()._between_steps(state)
        if not self._adapt_at:
            return new
        i0 = state.i if jnp.ndim(state.i) == 0 else state.i[0]
        refit = jnp.isin(i0, jnp.asarray(self._adapt_at))  # the working frame changed
        return new._replace(momentum=jnp.where(refit, 0.0, new.momentum))

    def step(self, state, model_args, model_kwargs):
        """One iteration of one chain (:meth:`GradientKernel.step`), the momentum fields kept at
        their last values once the chain has diverged (the chain itself is frozen)."""
        new = super().step(state, model_args, model_kwargs)
        old = {f: getattr(state, f) for f in self.FROZEN_FIELDS}
        now = {f: getattr(new, f) for f in self.FROZEN_FIELDS}
        return new._replace(**freeze(new.diverging, old, now))

    def _noise(self, key, grad_w):
        return random.normal(key, grad_w.shape, grad_w.dtype)


class SGHMC(MomentumKernel):
    r"""Stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin 2014).

    In the working frame of the preconditioner (θ = θ₀ + L·u; see
    :mod:`numpyro_sg.kernels.sghmc`), with η = ε/2:

    v' = (1 − α)·v + η·Lᵀĝ(θ) + N(0, s²),  u' = u + v',

    s² = 2·α·η·τ·(1 − η/(4 − 2α)) with ``correct_discretisation`` (exact for Gaussian targets
    whitened by M), minus η²·τ̂² with ``variant="corrected"``.  α = 1 is SGLD with the same ε.
    Before the chains start, the warmup finds the mode, the Laplace preconditioner and the
    control-variate anchor (:mod:`numpyro_sg.infer.warmup`); the defaults ε = 1, α = 0.5 need no
    tuning.

    Mapping: Chen et al.'s learning rate η = ε/2, friction α, β̂ = η·τ̂²/2; BlackJAX's
    ``sghmc`` ``step_size`` = √(ε/2), ``alpha`` = α/√(ε/2), ``beta`` = τ̂²
    (:func:`blackjax_parameters`); SGMCMCJax's ``dt`` = ε/2, ``alpha`` = α.

    :param model: NumPyro model with a subsample plate.
    :param step_size: ε > 0 in the working frame of the preconditioner (the SGLD step size it
        reduces to at α = 1): a float, an array with one entry per unconstrained coordinate, or
        a schedule (:func:`~numpyro_sg.polynomial_schedule` or a callable t ↦ ε_t); ``None``
        (default) for :data:`DEFAULT_STEP_SIZE` (needs a preconditioner).
    :param float friction: α ∈ (0, 1], the fraction of the momentum forgotten per iteration
        (default :data:`DEFAULT_FRICTION`; Chen et al.'s α, continuous-time friction α/√η).
    :param str variant: ``"vanilla"`` (default) or ``"corrected"`` (subtract the gradient
        noise's variance η²·τ̂² from the injected noise; needs τ̂ from per-datum gradients).
    :param float temperature: τ (default 1).
    :param preconditioner: ``"laplace"`` (default), ``"adapt"``, ``None`` or an array; see
        :class:`~numpyro_sg.kernels.base.GradientKernel`.
    :param str gradient: ``"cv"`` (default) or ``"plain"``.
    :param correct_discretisation: multiply the injected variance by (1 − η/(4 − 2α))
        (default: on with the ``"laplace"``/``"adapt"`` preconditioner, off otherwise).
    :param bool estimate_noise: compute τ̂ (default: only when the variant needs it).
    :param warmup_options: options of the mode search, or a ModeFit to reuse.
    :param subsample_size: mini-batch size n (overrides the plate's; the N/n scale follows).
    :param bool replace: draw indices with replacement (default) or walk epochs.
    :param init_strategy: NumPyro init strategy (default ``None``: Laplace draws at the mode).
    :param bool check_data: check that the subsampled data are finite.
    :param float noise_ema_weight: β of the EMA of τ̂.

    Extra fields: ``step_size`` (ε), ``momentum`` (flat, working frame), ``momentum_norm``,
    ``grad_noise_sd``, ``diverging``.

    **Example:**

    .. code-block:: python

        mcmc = MCMC(nsg.SGHMC(model), num_warmup=1000, num_samples=2000, num_chains=4,
                    chain_method="vectorized")
        mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("momentum_norm",))

        # classic SGHMC: absolute step size, plain gradients, NumPyro's random start
        nsg.SGHMC(model, 1e-5, friction=0.1, preconditioner=None, gradient="plain",
                  init_strategy=numpyro.infer.init_to_uniform)
    """

    State = SGHMCState
    VARIANTS = ("vanilla", "corrected")

    def __init__(self, model, step_size=None, *, friction=None, variant="vanilla",
                 temperature=1.0, preconditioner="laplace", gradient="cv",
                 correct_discretisation=None, estimate_noise=None, warmup_options=None,
                 subsample_size=None, replace=True, init_strategy=None, check_data=True,
                 noise_ema_weight=0.1):
        check_choice("variant", variant, self.VARIANTS)
        needs = variant == "corrected"
        if needs and estimate_noise is False:
            raise ValueError("variant='corrected' needs estimate_noise=True.")
        super().__init__(model, step_size, friction=friction, temperature=temperature,
                         correct_discretisation=correct_discretisation,
                         estimate_noise=needs if estimate_noise is None else estimate_noise,
                         shared=self.shared(locals()))
        self.variant = variant

    def _move(self, state, grad_w, noise_sd_w, key):
        h = state.hyper
        eps = step_size_at(h.step_size, state.i, grad_w.dtype)
        variance = sghmc_noise_variance(
            eps, h.friction, h.temperature, noise_sd_w if self.variant == "corrected" else None,
            self.correct_discretisation,
        )
        v = momentum_update(state.momentum, grad_w, eps, h.friction, self._noise(key, grad_w), variance)
        return v, dict(step_size=eps, momentum=v, momentum_norm=jnp.sqrt(jnp.sum(v**2)))


class SGNHT(MomentumKernel):
    r"""Stochastic gradient Nosé–Hoover thermostat (Ding, Fang, Babbush, Chen, Skeel & Neven
    2014).

    In the working frame of the preconditioner (θ = θ₀ + L·u; see
    :mod:`numpyro_sg.kernels.sghmc`), with η = ε/2 and the thermostat ζ (a scalar per chain,
    started at a):

    v' = (1 − ζ)·v + η·Lᵀĝ(θ) + N(0, 2·a·η·τ),  u' = u + v',  ζ' = ζ + K(v') − η·τ,

    K(v') = mean_j(v'_j²) (Ding et al.), or (1 − ζ/2)·mean_j(v'_j²) with
    ``correct_discretisation`` (then the position variance is exact on every Gaussian target,
    whatever the gradient noise, up to the thermostat's own fluctuations).  The thermostat
    absorbs the unknown gradient noise: it settles where the friction balances the injected
    plus the gradient noise (ζ ≈ a + η·τ̂²/2).  The defaults, in the working frame of the
    Laplace preconditioner, are a = 0.2 and ε = min(1, 0.05·d)
    (:func:`sgnht_default_step_size`: the thermostat is driven by an average over the d
    coordinates and destabilises small models at larger steps).

    Mapping: Ding et al.'s h = √(ε/2), p = v/h, ξ = ζ/h, A = a/h; BlackJAX's ``sgnht``
    ``step_size`` = √(ε/2), ``alpha`` = a/√(ε/2) (:func:`blackjax_parameters`); SGMCMCJax's
    ``sgnht`` ``dt`` = ε/2, ``a`` = a (the same update as ours).

    :param model: NumPyro model with a subsample plate.
    :param step_size: ε > 0 in the working frame (a float, per coordinate array or schedule);
        ``None`` (default) for :func:`sgnht_default_step_size` min(1, 0.05·d) (needs a
        preconditioner).
    :param float friction: a ∈ (0, 1]: the injected noise 2·a·η·τ and the thermostat's start
        (default :data:`SGNHT_DEFAULT_FRICTION`).
    :param float temperature: τ (default 1).
    :param preconditioner: ``"laplace"`` (default), ``"adapt"``, ``None`` or an array.
    :param str gradient: ``"cv"`` (default) or ``"plain"``.
    :param correct_discretisation: measure the kinetic energy as (1 − ζ/2)·v² (default: on with
        the ``"laplace"``/``"adapt"`` preconditioner, off otherwise).
    :param bool estimate_noise: compute τ̂ to monitor it (``grad_noise_sd``; the update does not
        use it).
    :param warmup_options: options of the mode search, or a ModeFit to reuse.
    :param subsample_size: mini-batch size n (overrides the plate's; the N/n scale follows).
    :param bool replace: draw indices with replacement (default) or walk epochs.
    :param init_strategy: NumPyro init strategy (default ``None``: Laplace draws at the mode).
    :param bool check_data: check that the subsampled data are finite.
    :param float noise_ema_weight: β of the EMA of τ̂.

    Extra fields: ``step_size`` (ε), ``momentum``, ``momentum_norm``, ``thermostat`` (ζ),
    ``grad_noise_sd``, ``diverging``.  Replacing ``friction`` (tuning) restarts ζ at the new a.

    **Example:**

    .. code-block:: python

        mcmc = MCMC(nsg.SGNHT(model), num_warmup=1000, num_samples=2000, num_chains=4,
                    chain_method="vectorized")
        mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("thermostat",))
    """

    State = SGNHTState
    FROZEN_FIELDS = ("momentum", "momentum_norm", "thermostat")
    DEFAULT_STEP_SIZE = SGNHT_DEFAULT_STEP_SIZE
    DEFAULT_FRICTION = SGNHT_DEFAULT_FRICTION

    def __init__(self, model, step_size=None, *, friction=None, temperature=1.0,
                 preconditioner="laplace", gradient="cv", correct_discretisation=None,
                 estimate_noise=False, warmup_options=None, subsample_size=None, replace=True,
                 init_strategy=None, check_data=True, noise_ema_weight=0.1):
        super().__init__(model, step_size, friction=friction, temperature=temperature,
                         correct_discretisation=correct_discretisation,
                         estimate_noise=estimate_noise, shared=self.shared(locals()))

    def _hyperparameters(self, dim, precond):
        hyper = super()._hyperparameters(dim, precond)
        if self.step_size is None:
            hyper = hyper._replace(step_size=jnp.asarray(sgnht_default_step_size(dim), jnp.result_type(float)))
        return hyper

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return super()._init_fields(noise_sd, hyper, dim, dtype) | dict(
            thermostat=jnp.asarray(hyper.friction, dtype))

    def _refresh(self, state):
        return super()._refresh(state)._replace(thermostat=state.hyper.friction)

    def _move(self, state, grad_w, noise_sd_w, key):
        h = state.hyper
        eps = step_size_at(h.step_size, state.i, grad_w.dtype)
        zeta = state.thermostat
        variance = sghmc_noise_variance(eps, h.friction, h.temperature)
        v = momentum_update(state.momentum, grad_w, eps, zeta, self._noise(key, grad_w), variance)
        zeta_new = thermostat_update(zeta, v, eps, h.temperature, self.correct_discretisation)
        return v, dict(step_size=eps, momentum=v, momentum_norm=jnp.sqrt(jnp.sum(v**2)),
                       thermostat=zeta_new)

    def get_diagnostics_str(self, state):
        return super().get_diagnostics_str(state) + f", thermostat {float(jnp.mean(state.thermostat)):.2f}"

