r"""SGNHT: the stochastic gradient Nosé–Hoover thermostat (Ding, Fang, Babbush, Chen, Skeel &
Neven 2014, "Bayesian sampling using stochastic gradient thermostats", NeurIPS).

One iteration, in the working coordinates u of the preconditioner with momentum v, learning
rate η = ε/2 (the same ε as SGLD's) and the thermostat ζ (a scalar per chain, started at a):

.. math::

   v' = (1 - \zeta)\,v + \eta\,L^\top\hat g(\theta) + \mathcal N(0, 2a\eta\tau),\qquad
   u' = u + v',\qquad \zeta' = \zeta + K(v') - \eta\tau.

The maths, the discretisation correction and the mapping to the paper and to
BlackJAX/SGMCMCJax are in :mod:`numpyro_sg.kernels.momentum`.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
from jax import random
from jax.flatten_util import ravel_pytree

from numpyro_sg.kernels.core import gradient_init, gradient_state, gradient_step
from numpyro_sg.kernels.momentum import (MomentumKernel, momentum_fields, momentum_hyperparameters, momentum_update,
                                         sghmc_noise_variance, thermostat_update)
from numpyro_sg.kernels.options import MINIBATCH_MOVES, moved_options
from numpyro_sg.kernels.sghmc import STATE_DOC

__all__ = ["SGNHT", "init", "step"]

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


SGNHTState = gradient_state(
    "SGNHTState", ("momentum", "momentum_norm", "thermostat"),
    doc=STATE_DOC.format(name="SGNHT", extra=", and ``thermostat`` ζ, the current friction "
                          "(per iteration; Ding et al.'s ξ times h = √(ε/2))"),
)


def sgnht_move(state, grad_w, noise_sd_w, step_size, key, *, correct_discretisation=False):
    """SGNHT's move in the working frame: the momentum kick with friction ζ, du = v', then ζ'."""
    h, zeta = state.hyper, state.thermostat
    variance = sghmc_noise_variance(step_size, h.friction, h.temperature)
    noise = random.normal(key, grad_w.shape, grad_w.dtype)
    v = momentum_update(state.momentum, grad_w, step_size, zeta, noise, variance)
    zeta_new = thermostat_update(zeta, v, step_size, h.temperature, correct_discretisation)
    return v, dict(momentum=v, momentum_norm=jnp.sqrt(jnp.sum(v**2)), thermostat=zeta_new)


def sgnht_fields(noise_sd, hyper, dim, dtype):
    """SGNHT's own state fields at the start: the momentum kernels' and ζ = a."""
    return momentum_fields(noise_sd, hyper, dim, dtype) | dict(thermostat=jnp.asarray(hyper.friction, dtype))


def init(position, estimate, minibatch, step_size, *, friction=SGNHT_DEFAULT_FRICTION, temperature=1.0,
         precond=None) -> SGNHTState:
    """SGNHT's state at ``position`` (zero momentum, ζ = a = ``friction``), ĝ =
    ``estimate(position, minibatch)``; ε in the units of ``precond`` (default: of ``position``)."""
    dim = ravel_pytree(position)[0].shape[0]
    hyper = momentum_hyperparameters(step_size, friction, temperature, dim)
    return gradient_init(SGNHTState, position, estimate, minibatch, hyper, sgnht_fields, precond)


def step(rng_key, state, estimate, minibatch, *, correct_discretisation=False, noise_ema_weight=0.1) -> SGNHTState:
    """One SGNHT iteration (pure; :func:`~numpyro_sg.kernels.core.gradient_step` with :func:`sgnht_move`)."""
    move = partial(sgnht_move, correct_discretisation=correct_discretisation)
    return gradient_step(rng_key, state, estimate, minibatch, move, noise_ema_weight)


class SGNHT(MomentumKernel):
    r"""Stochastic gradient Nosé–Hoover thermostat (Ding, Fang, Babbush, Chen, Skeel & Neven
    2014).

    In the working frame of the preconditioner (θ = θ₀ + L·u; see
    :mod:`numpyro_sg.kernels.momentum`), with η = ε/2 and the thermostat ζ (a scalar per chain,
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
    :param minibatch_options: :class:`~numpyro_sg.kernels.options.MinibatchOptions` (or a dict):
        ``replace``, ``check_data``, ``estimate_noise`` (compute τ̂ to monitor it,
        ``grad_noise_sd``; the update does not use it; default off), ``noise_ema_weight``.

    The options every gradient kernel shares (``preconditioner``, ``gradient``, ``warmup_options``,
    ``subsample_size``, ``init_strategy``, ``minibatch_options``) are documented once in
    :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

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
    DEFAULT_STEP_SIZE = SGNHT_DEFAULT_STEP_SIZE
    DEFAULT_FRICTION = SGNHT_DEFAULT_FRICTION

    @moved_options(MINIBATCH_MOVES)
    def __init__(self, model, step_size=None, *, friction=None, temperature=1.0,
                 preconditioner="laplace", gradient="cv", correct_discretisation=None,
                 warmup_options=None, subsample_size=None, init_strategy=None, minibatch_options=None):
        super().__init__(model, step_size, friction=friction, temperature=temperature,
                         correct_discretisation=correct_discretisation, shared=self.shared(locals()))
        self._resolve_estimate_noise(False)

    functional_step = staticmethod(step)

    def _hyperparameters(self, dim, precond):
        default = sgnht_default_step_size(dim) if self.step_size is None else None
        return momentum_hyperparameters(self.step_size, self.friction, self.temperature, dim, default)

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return sgnht_fields(noise_sd, hyper, dim, dtype)

    def _refresh(self, state):
        return super()._refresh(state)._replace(thermostat=state.hyper.friction)

    def diagnostics_text(self, state) -> str:
        return super().diagnostics_text(state) + f", thermostat {float(jnp.mean(state.thermostat)):.2f}"
