r"""SGHMC (Chen, Fox & Guestrin 2014), "Stochastic gradient Hamiltonian Monte Carlo", ICML.

One iteration, in the working coordinates u of the preconditioner with momentum v and
learning rate η = ε/2 (the same ε as SGLD's):

.. math::

   v' = (1 - \alpha)\,v + \eta\,L^\top\hat g(\theta) + \mathcal N(0, s^2),\qquad
   u' = u + v',

SGHMC with a fixed friction α (SGNHT, :mod:`numpyro_sg.kernels.sgnht`, has a thermostat ζ in
place of α).  The maths, the discretisation correction and the mapping to the papers and to
BlackJAX/SGMCMCJax are in :mod:`numpyro_sg.kernels.momentum`.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
from jax import random
from jax.flatten_util import ravel_pytree

from numpyro_sg.kernels.core import gradient_init, gradient_state, gradient_step
from numpyro_sg.kernels.momentum import (MomentumKernel, momentum_fields, momentum_hyperparameters, momentum_update,
                                         sghmc_inflation,
                                         sghmc_noise_variance)
from numpyro_sg.kernels.moves import tamed_gradient
from numpyro_sg.kernels.options import MINIBATCH_MOVES, check_choice, moved_options
from numpyro_sg.kernels.sgld import DEFAULT_STEP_SIZE as SGLD_DEFAULT_STEP_SIZE

__all__ = ["SGHMC", "init", "step"]

#: default friction α of SGHMC (the fraction of the momentum forgotten per iteration)
DEFAULT_FRICTION = 0.5
#: default ε of SGHMC in the working frame of the Laplace preconditioner (η = ε/2): α times
#: SGLD's default, so that the Langevin step the chain takes at high friction, ε/α, is SGLD's
#: ε = 0.7; a larger ε mixes faster but is biased where the posterior is far from Gaussian
#: (measured: docs/kernels.md, "SGHMC", "Defaults")
DEFAULT_STEP_SIZE = DEFAULT_FRICTION * SGLD_DEFAULT_STEP_SIZE
STATE_DOC = """State of :class:`{name}`.

As :class:`~numpyro_sg.kernels.sgld.SGLDState` (``i``, ``z``, ``log_density_grad``, ``grad_noise_sd``,
``step_size`` the ε that produced ``z``, ``hyper`` a :class:`MomentumHyper`, ``precond``,
``anchor``, ``moments``, ``guard``, ``diverging``, ``batch_state``, ``rng_key``), plus
``momentum`` v, flat, in the working frame of the preconditioner (a displacement of u per
iteration; zero at the start), and ``momentum_norm`` its Euclidean norm{extra}.
"""

SGHMCState = gradient_state("SGHMCState", ("momentum", "momentum_norm"),
                            doc=STATE_DOC.format(name="SGHMC", extra=""))
def sghmc_move(state, grad_w, noise_sd_w, step_size, key, *, variant="vanilla", correct_discretisation=False):
    """SGHMC's move in the working frame: v' = (1 − α)·v + η·ĝ_w + N(0, s²), du = v' (η = ε/2),
    ĝ_w tamed in a dense Laplace frame (:func:`~numpyro_sg.kernels.moves.tamed_gradient`)."""
    h = state.hyper
    variance = sghmc_noise_variance(step_size, h.friction, h.temperature,
                                    noise_sd_w if variant == "corrected" else None, correct_discretisation)
    noise = random.normal(key, grad_w.shape, grad_w.dtype)
    v = momentum_update(state.momentum, tamed_gradient(grad_w, state.precond), step_size, h.friction, noise, variance)
    return v, dict(momentum=v, momentum_norm=jnp.sqrt(jnp.sum(v**2)))


def init(position, estimate, minibatch, step_size, *, friction=DEFAULT_FRICTION, temperature=1.0,
         precond=None) -> SGHMCState:
    """SGHMC's state at ``position`` (zero momentum), ĝ = ``estimate(position, minibatch)``; ε
    (``step_size``) in the units of ``precond`` (default: of ``position``)."""
    dim = ravel_pytree(position)[0].shape[0]
    hyper = momentum_hyperparameters(step_size, friction, temperature, dim)
    return gradient_init(SGHMCState, position, estimate, minibatch, hyper, momentum_fields, precond)


def step(rng_key, state, estimate, minibatch, *, variant="vanilla", correct_discretisation=False,
         noise_ema_weight=0.1) -> SGHMCState:
    """One SGHMC iteration (pure; :func:`~numpyro_sg.kernels.core.gradient_step` with :func:`sghmc_move`)."""
    move = partial(sghmc_move, variant=variant, correct_discretisation=correct_discretisation)
    return gradient_step(rng_key, state, estimate, minibatch, move, noise_ema_weight)


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
    :param minibatch_options: :class:`~numpyro_sg.kernels.options.MinibatchOptions` (or a dict):
        ``replace``, ``check_data``, ``estimate_noise`` (τ̂; default: only when the variant needs
        it), ``noise_ema_weight``.

    The options every gradient kernel shares (``preconditioner``, ``gradient``, ``warmup_options``,
    ``subsample_size``, ``init_strategy``, ``minibatch_options``) are documented once in
    :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

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

    @moved_options(MINIBATCH_MOVES)
    def __init__(self, model, step_size=None, *, friction=None, variant="vanilla",
                 temperature=1.0, preconditioner="laplace", gradient="cv",
                 correct_discretisation=None, warmup_options=None, subsample_size=None,
                 init_strategy=None, minibatch_options=None):
        check_choice("variant", variant, self.VARIANTS)
        super().__init__(model, step_size, friction=friction, temperature=temperature,
                         correct_discretisation=correct_discretisation, shared=self.shared(locals()))
        needs = variant == "corrected"
        self._resolve_estimate_noise(needs, needs=needs, why="variant='corrected' needs")
        self.variant = variant

    functional_step = staticmethod(step)

    def step_options(self):
        return super().step_options() | dict(variant=self.variant)

    def noise_inflation(self, step_size, noise, curvature=1.0):
        return sghmc_inflation(step_size, noise, self.friction, curvature)
