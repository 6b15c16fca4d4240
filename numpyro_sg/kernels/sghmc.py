r"""SGHMC (Chen, Fox & Guestrin 2014) and SGNHT (Ding et al. 2014): the momentum kernels.

One iteration, in the working coordinates u of the preconditioner with momentum v and
learning rate η = ε/2 (the same ε as SGLD's):

.. math::

   v' = (1 - \alpha)\,v + \eta\,L^\top\hat g(\theta) + \mathcal N(0, s^2),\qquad
   u' = u + v',

SGHMC with a fixed friction α, SGNHT with a thermostat ζ in place of α.  The maths, the
discretisation correction and the mapping to the papers and to BlackJAX/SGMCMCJax are in
:mod:`numpyro_sg.kernels.momentum`.
"""

from __future__ import annotations

import jax.numpy as jnp

from numpyro_sg.kernels.base import check_choice
from numpyro_sg.kernels.gradient import gradient_state
from numpyro_sg.kernels.momentum import (
    MomentumKernel,
    momentum_update,
    sghmc_noise_variance,
    thermostat_update,
)
from numpyro_sg.kernels.sgld import DEFAULT_STEP_SIZE as SGLD_DEFAULT_STEP_SIZE
from numpyro_sg.kernels.step_size import step_size_at

#: default friction α of SGHMC (the fraction of the momentum forgotten per iteration)
DEFAULT_FRICTION = 0.5
#: default ε of SGHMC in the working frame of the Laplace preconditioner (η = ε/2): α times
#: SGLD's default, so that the Langevin step the chain takes at high friction, ε/α, is SGLD's
#: ε = 0.7; a larger ε mixes faster but is biased where the posterior is far from Gaussian
#: (measured: docs/kernels.md, "SGHMC", "Defaults")
DEFAULT_STEP_SIZE = DEFAULT_FRICTION * SGLD_DEFAULT_STEP_SIZE
#: largest default ε of SGNHT in the working frame of the Laplace preconditioner
SGNHT_DEFAULT_STEP_SIZE = 1.0
#: SGNHT's default ε per unconstrained coordinate below that (:func:`sgnht_default_step_size`)
SGNHT_STEP_PER_DIMENSION = 0.05
#: default friction a of SGNHT (injected noise 2·a·η·τ; the thermostat starts at a)
SGNHT_DEFAULT_FRICTION = 0.2



def sgnht_default_step_size(dim: int) -> float:
    """SGNHT's default ε for ``dim`` coordinates: min(1, 0.05·d).

    The thermostat is driven by mean_j(v_j²), whose relative sd is √(2/d): ζ fluctuates with
    sd ≈ √(η/d), and on small models a larger step lets it leave its stable range, so the step
    grows with d and reaches ε = 1 at d = 20 (measured on whitened Gaussians: ``docs/kernels.md``,
    "Thermostat stability and the default step").
    """
    return float(min(SGNHT_DEFAULT_STEP_SIZE, SGNHT_STEP_PER_DIMENSION * dim))


_STATE_DOC = """State of :class:`{name}`.

As :class:`~numpyro_sg.kernels.sgld.SGLDState` (``i``, ``z``, ``log_density_grad``, ``grad_noise_sd``,
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


class SGHMC(MomentumKernel):
    r"""Stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin 2014).

    In the working frame of the preconditioner (θ = θ₀ + L·u; see
    :mod:`numpyro_sg.kernels.sghmc`), with η = ε/2:

    v' = (1 − α)·v + η·Lᵀĝ(θ) + N(0, s²),  u' = u + v',

    s² = 2·α·η·τ·(1 − η/(4 − 2α)) with ``correct_discretisation`` (exact for Gaussian targets
    whitened by M), minus η²·τ̂² with ``variant="corrected"``.  α = 1 is SGLD with the same ε.
    Before the chains start, the warmup finds the mode, the Laplace preconditioner and the
    control-variate anchor (:mod:`numpyro_sg.infer.warmup`); the defaults ε = 0.35, α = 0.5 (the
    Langevin step ε/α of SGLD's default) need no tuning.

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
    :param correct_discretisation: multiply the injected variance by (1 − η/(4 − 2α))
        (default: on with the ``"laplace"``/``"adapt"`` preconditioner, off otherwise).
    :param bool estimate_noise: compute τ̂ (default: only when the variant needs it).

    The options every gradient kernel shares (``preconditioner``, ``gradient``, ``warmup_options``,
    ``subsample_size``, ``replace``, ``init_strategy``, ``check_data``, ``noise_ema_weight``) are
    documented once in :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

    Extra fields: ``step_size`` (ε), ``momentum`` (flat, working frame), ``momentum_norm``,
    ``grad_noise_sd``, ``diverging``.

    **Example** (a linear regression on 5,000 rows, whose posterior is known exactly; the
    defaults need no tuning):

    >>> import jax, numpy as np, numpyro_sg as nsg
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sg.datasets import (linear_regression_model, linear_regression_posterior,
    ...                                  simulate_linear_regression)
    >>> X, y, _ = simulate_linear_regression(5_000, 3, seed=0)
    >>> mean, cov = linear_regression_posterior(X, y)       # the exact posterior N(mean, cov)
    >>> mcmc = MCMC(nsg.SGHMC(linear_regression_model), num_warmup=500, num_samples=1000,
    ...             num_chains=2, chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("momentum_norm",))
    >>> theta = np.asarray(mcmc.get_samples()["theta"])
    >>> theta.shape
    (2000, 3)
    >>> sd = np.sqrt(np.diag(cov))    # 2,000 draws: means within 0.25 sd, sds within 15 %
    >>> bool(np.all(abs(theta.mean(0) - mean) < 0.25 * sd)), bool(np.all(abs(theta.std(0) / sd - 1) < 0.15))
    (True, True)

    Other settings:

    .. code-block:: python

        # classic SGHMC: absolute step size, plain gradients, NumPyro's random start
        nsg.SGHMC(model, 1e-5, friction=0.1, preconditioner=None, gradient="plain",
                  init_strategy=numpyro.infer.init_to_uniform)
    """

    State = SGHMCState
    DEFAULT_STEP_SIZE = DEFAULT_STEP_SIZE
    DEFAULT_FRICTION = DEFAULT_FRICTION
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
    :param correct_discretisation: measure the kinetic energy as (1 − ζ/2)·v² (default: on with
        the ``"laplace"``/``"adapt"`` preconditioner, off otherwise).
    :param bool estimate_noise: compute τ̂ to monitor it (``grad_noise_sd``; the update does not
        use it).

    The options every gradient kernel shares (``preconditioner``, ``gradient``, ``warmup_options``,
    ``subsample_size``, ``replace``, ``init_strategy``, ``check_data``, ``noise_ema_weight``) are
    documented once in :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

    Extra fields: ``step_size`` (ε), ``momentum``, ``momentum_norm``, ``thermostat`` (ζ),
    ``grad_noise_sd``, ``diverging``.  Replacing ``friction`` (tuning) restarts ζ at the new a.

    **Example** (a linear regression on 5,000 rows, whose posterior is known exactly; the
    defaults need no tuning):

    >>> import jax, numpy as np, numpyro_sg as nsg
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sg.datasets import (linear_regression_model, linear_regression_posterior,
    ...                                  simulate_linear_regression)
    >>> X, y, _ = simulate_linear_regression(5_000, 3, seed=0)
    >>> mean, cov = linear_regression_posterior(X, y)       # the exact posterior N(mean, cov)
    >>> mcmc = MCMC(nsg.SGNHT(linear_regression_model), num_warmup=500, num_samples=1000,
    ...             num_chains=2, chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("thermostat",))
    >>> theta = np.asarray(mcmc.get_samples()["theta"])
    >>> theta.shape
    (2000, 3)
    >>> sd = np.sqrt(np.diag(cov))    # 2,000 draws: means within 0.25 sd, sds within 15 %
    >>> bool(np.all(abs(theta.mean(0) - mean) < 0.25 * sd)), bool(np.all(abs(theta.std(0) / sd - 1) < 0.15))
    (True, True)
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

    def diagnostics_text(self, state) -> str:
        return super().diagnostics_text(state) + f", thermostat {float(jnp.mean(state.thermostat)):.2f}"
