r"""Stochastic gradient Langevin dynamics (SGLD) and its noise-corrected variant (c-SGLD).

Welling & Teh (2011), "Bayesian learning via stochastic gradient Langevin dynamics", ICML; the
noise-corrected variant c-SGLD as in Mauri & Zanella (2024), "Robust approximate sampling via
stochastic gradient Barker dynamics", AISTATS.

Update (the package's step-size convention), in the working coordinates u of the preconditioner M = L·Lᵀ (θ = θ₀ + L·u, :mod:`numpyro_sg.infer.preconditioner`):

.. math::

   u' = u + \tfrac{\varepsilon}{2}\,L^\top\hat g(\theta) + \mathcal N(0, v),\qquad
   \text{i.e.}\quad \theta' = \theta + \tfrac{\varepsilon}{2}\,M\hat g(\theta) + \mathcal N(0, vM),

with ĝ the mini-batch gradient of log π — plain, or with control variates around the warmup
mode (``gradient="cv"``, the default), tamed to norm 2√d + 5 in a dense Laplace frame
(:func:`~numpyro_sg.kernels.moves.tamed_gradient`) — and the injected variance per working coordinate

* vanilla: v = ε·τ, τ the temperature;
* ``correct_discretisation``: v = ε·τ·(1 − ε/4), which makes the Euler chain exact for a
  Gaussian target whitened by M (on by default with the Laplace preconditioner: with M the
  posterior covariance the chain's stationary covariance is M/(1 − ε/4) otherwise);
* corrected (c-SGLD): minus the gradient noise's own contribution,
  v = max(v − ε²·τ̂_j²/4, 0), τ̂ the EMA of the gradient-noise sd in the working frame.

With ``preconditioner=None`` (M = I) ε is in the units of the unconstrained parameters'
variance, as in the papers (Coullon, South & Nemeth's h is ε; Atchadé & Wang's γ is ε/2); with the default
Laplace preconditioner ε is dimensionless (ε = 1 moves about one posterior sd per step).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import random
from jax.flatten_util import ravel_pytree

from numpyro_sg.kernels.core import gradient_init, gradient_state, gradient_step
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.kernels.options import MINIBATCH_MOVES, check_choice, check_positive, moved_options
from numpyro_sg.kernels.moves import langevin_move, langevin_noise_variance, tamed_gradient
from numpyro_sg.kernels.step_size import resolve_step_size, step_size_at

__all__ = ["SGLD", "init", "step"]

#: default ε in the working frame of the Laplace preconditioner (see docs/warmup.md)
DEFAULT_STEP_SIZE = 0.7


class SGLDHyper(NamedTuple):
    """Hyperparameters of :class:`SGLD` held in its state: ``step_size`` ε (a scalar, one entry
    per unconstrained coordinate, or a schedule pytree evaluated at the iteration counter)
    and ``temperature`` τ."""

    step_size: Any
    temperature: Any


SGLDState = gradient_state("SGLDState", doc="""State of :class:`SGLD`.

``i`` iteration counter (warmup included); ``z`` unconstrained parameters (dict);
``log_density_grad`` the stochastic gradient ĝ at ``z`` (flat); ``grad_noise_sd`` the EMA τ̂ of the
gradient-noise sd per working coordinate (NaN when not estimated); ``step_size`` the ε that
produced ``z``; ``hyper`` the :class:`SGLDHyper`; ``precond`` the preconditioner; ``anchor``
the control-variate anchor (``None`` for plain gradients); ``guard`` the blow-up detector;
``diverging`` True from the first divergence on; ``batch_state`` the index-drawing state;
``rng_key`` the chain's key.
""")


def sgld_move(state, grad_w, noise_sd_w, step_size, key, *, variant="vanilla", correct_discretisation=False):
    """SGLD's move in the working frame: du = (ε/2)·ĝ_w + N(0, v), v as in the module docstring,
    ĝ_w tamed in a dense Laplace frame (:func:`~numpyro_sg.kernels.moves.tamed_gradient`)."""
    variance = langevin_noise_variance(step_size, state.hyper.temperature,
                                       noise_sd_w if variant == "corrected" else None, correct_discretisation)
    noise = random.normal(key, grad_w.shape, grad_w.dtype)
    return langevin_move(jnp.zeros_like(grad_w), tamed_gradient(grad_w, state.precond), step_size, noise, variance), {}


def sgld_inflation(step_size, noise, curvature=1.0):
    """(ε·(λ − 1) + ε·c)/(4 − ε·λ): the fraction of variance SGLD's stationary distribution
    (``correct_discretisation``) gains from gradient noise of variance c per step, on a Gaussian
    target whitened by the preconditioner whose curvature is λ = ``curvature`` (1: the
    preconditioner's own; ε·c/(4 − ε) then) (:mod:`numpyro_sg.kernels.noise_plan`; ``inf`` for
    ε·λ ≥ 4, where the chain is unstable)."""
    room = 4.0 - step_size * curvature
    return float("inf") if room <= 0 else step_size * (curvature - 1.0 + noise) / room


def sgld_fields(noise_sd, hyper, dim, dtype):
    """SGLD's own state fields at the start: the step size."""
    return dict(step_size=step_size_at(hyper.step_size, 0, dtype))


def init(position, estimate, minibatch, step_size, *, temperature=1.0, precond=None) -> SGLDState:
    """SGLD's state at ``position`` (a pytree), with ĝ = ``estimate(position, minibatch)``.

    ``step_size`` ε: a float, one entry per coordinate or a schedule t ↦ ε_t, in the units of
    ``precond`` (default M = I: the units of ``position``'s variance).  See :func:`step`.
    """
    dim = ravel_pytree(position)[0].shape[0]
    hyper = SGLDHyper(resolve_step_size(step_size, None, dim), jnp.asarray(temperature, jnp.result_type(float)))
    return gradient_init(SGLDState, position, estimate, minibatch, hyper, sgld_fields, precond)


def step(rng_key, state, estimate, minibatch, *, variant="vanilla", correct_discretisation=False,
         noise_ema_weight=0.1) -> SGLDState:
    """One SGLD iteration (pure): the move with ĝ held in ``state``, then ĝ at the new point on
    ``minibatch`` (:func:`~numpyro_sg.kernels.core.gradient_step`).

    **Example**, in a loop of your own (``grad_log_post(theta, batch)`` an unbiased estimate of
    ∇ log π, e.g. a BlackJAX gradient estimator):

    .. code-block:: python

        from numpyro_sg.kernels import sgld

        state = sgld.init(theta0, grad_log_post, first_batch, step_size=1e-4)

        def one_step(state, xs):
            key, batch = xs
            state = sgld.step(key, state, grad_log_post, batch)
            return state, state.z

        state, draws = jax.lax.scan(one_step, state, (keys, batches))
    """
    move = partial(sgld_move, variant=variant, correct_discretisation=correct_discretisation)
    return gradient_step(rng_key, state, estimate, minibatch, move, noise_ema_weight)


class SGLD(GradientKernel):
    r"""Stochastic gradient Langevin dynamics for a NumPyro model with a subsample plate.

    θ' = θ + (ε/2)·M·ĝ(θ) + N(0, v·M) (see :mod:`numpyro_sg.kernels.sgld`): before the chains
    start, the warmup finds the posterior mode, the Laplace preconditioner M and the
    control-variate anchor (:mod:`numpyro_sg.infer.warmup`), and the chains start from draws of the
    Laplace approximation.  The defaults need no tuning: ε = 0.7 in the preconditioner's
    units, with the discretisation correction.

    :param model: NumPyro model with a subsample plate.
    :param step_size: ε > 0 in the working frame of the preconditioner: a float, an array with
        one entry per unconstrained coordinate, a schedule (:func:`polynomial_schedule`, or any
        callable t ↦ ε_t, t the iteration counter including warmup); ``None`` (default) for
        :data:`DEFAULT_STEP_SIZE` (needs a preconditioner).
    :param str variant: ``"vanilla"`` or ``"corrected"`` (c-SGLD: subtract the gradient noise's
        variance from the injected noise; needs τ̂ from per-datum gradients).
    :param float temperature: τ (default 1).
    :param correct_discretisation: inject ε·τ·(1 − ε/4) instead of ε·τ (default: on with the
        ``"laplace"``/``"adapt"`` preconditioner, off otherwise).
    :param minibatch_options: :class:`~numpyro_sg.kernels.options.MinibatchOptions` (or a dict):
        ``replace``, ``check_data``, ``estimate_noise`` (τ̂ from per-datum gradients; default: only
        when the variant needs it), ``noise_ema_weight``.

    The options every gradient kernel shares (``preconditioner``, ``gradient``, ``warmup_options``,
    ``subsample_size``, ``init_strategy``, ``minibatch_options``) are documented once in
    :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

    Extra fields: ``step_size``, ``grad_noise_sd``, ``diverging``.

    **Example** (a linear regression on 5,000 rows, whose posterior is known exactly; the
    defaults need no tuning):

    >>> import jax, numpy as np, numpyro_sg as nsg
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sg.datasets import (linear_regression_model, linear_regression_posterior,
    ...                                  simulate_linear_regression)
    >>> X, y, _ = simulate_linear_regression(5_000, 3, seed=0)
    >>> mean, cov = linear_regression_posterior(X, y)       # the exact posterior N(mean, cov)
    >>> mcmc = MCMC(nsg.SGLD(linear_regression_model), num_warmup=500, num_samples=1000,
    ...             num_chains=2, chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X, y)
    >>> theta = np.asarray(mcmc.get_samples()["theta"])
    >>> theta.shape
    (2000, 3)
    >>> sd = np.sqrt(np.diag(cov))    # 2,000 draws: means within 0.25 sd, sds within 15 %
    >>> bool(np.all(abs(theta.mean(0) - mean) < 0.25 * sd)), bool(np.all(abs(theta.std(0) / sd - 1) < 0.15))
    (True, True)

    Other settings:

    .. code-block:: python

        # classic SGLD: absolute step size, plain gradients, NumPyro's random start
        nsg.SGLD(model, 1e-5, preconditioner=None, gradient="plain",
                 init_strategy=numpyro.infer.init_to_uniform)
    """

    State = SGLDState
    DEFAULT_STEP_SIZE = DEFAULT_STEP_SIZE
    HYPERPARAMETERS = ("step_size", "temperature")
    VARIANTS = ("vanilla", "corrected")

    @moved_options(MINIBATCH_MOVES)
    def __init__(self, model, step_size=None, *, variant="vanilla", temperature=1.0,
                 preconditioner="laplace", gradient="cv", correct_discretisation=None,
                 warmup_options=None, subsample_size=None, init_strategy=None, minibatch_options=None):
        check_choice("variant", variant, self.VARIANTS)
        if step_size is not None and not callable(step_size):
            check_positive("step_size", step_size)
        check_positive("temperature", temperature)
        super().__init__(model, step_size, **self.shared(locals()))
        self.variant = variant
        self.temperature = float(temperature)
        corrected = variant == "corrected"
        self._resolve_estimate_noise(corrected, needs=corrected, why="variant='corrected' needs")
        if correct_discretisation is None:
            correct_discretisation = isinstance(self.preconditioner, str)
        self.correct_discretisation = bool(correct_discretisation)

    functional_step = staticmethod(step)

    def step_options(self):
        return super().step_options() | dict(variant=self.variant, correct_discretisation=self.correct_discretisation)

    def _hyperparameters(self, dim, precond):
        eps = resolve_step_size(self.step_size, self.default_step_size(), dim)
        return SGLDHyper(step_size=eps, temperature=jnp.asarray(self.temperature, jnp.result_type(float)))

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return sgld_fields(noise_sd, hyper, dim, dtype)

    def noise_inflation(self, step_size, noise, curvature=1.0):
        return sgld_inflation(step_size, noise, curvature)
