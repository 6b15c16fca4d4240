"""Stochastic gradient Barker dynamics (SGBD): vanilla, corrected and extreme.

Mauri & Zanella (2024), "Robust approximate sampling via stochastic gradient Barker dynamics",
AISTATS; the Barker proposal of Livingstone & Zanella (2022), "The Barker proposal: combining
robustness and efficiency in gradient-based MCMC", JRSS B.

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
τ̂ the EMA of the gradient-noise sd (the sd of the estimator ĝ_j).

The kernel applies these rules to the working coordinates of its preconditioner
(θ = θ₀ + L·u, :mod:`numpyro_sg.infer.preconditioner`; the identity with ``preconditioner=None``),
so σ is in posterior sds with the default Laplace preconditioner (SGBD's σ is a length, where
the Langevin kernels' ε is a variance), and may multiply the sign
logits by c = 1 + σ²/4 (:func:`discretisation_logit_scale`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random

from numpyro_sg.kernels.core import gradient_init, gradient_state, gradient_step
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.kernels.options import MINIBATCH_MOVES, check_choice, moved_options

__all__ = ["SGBD", "init", "step"]

#: default σ in the working frame of the Laplace preconditioner (see docs/warmup.md)
DEFAULT_STEP_SIZE = 0.8

#: 1.702: the scale in the probit approximation sigmoid(x) ≈ Φ(x/1.702) behind Prop. 2.
BARKER_LOGISTIC_SCALE = 1.702
#: 1.233σ bounds ~99% of |z| for z ~ N(σ, (0.1σ)²)
_INCREMENT_QUANTILE = 1.233


def sgbd_inflation(step_size, noise):
    """√(1 + σ²·c/1.702²) − 1: the fraction of variance SGBD's stationary distribution gains from
    gradient noise of variance c per coordinate (σ the step, a length): by the probit
    approximation the noise divides the sign's logit by s = √(1 + σ²c/1.702²), and a chain that
    targets π^(1/s) has s times π's variance (:mod:`numpyro_sg.kernels.noise_plan`)."""
    return float(np.sqrt(1.0 + step_size**2 * noise / BARKER_LOGISTIC_SCALE**2)) - 1.0


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


def keep_sign_probability(z, grad, noise_sd, variant: str, logit_scale=1.0):
    """Probability of keeping the sign of the increment z, per coordinate.

    ``logit_scale`` c multiplies the logit (vanilla: sigmoid(c·z·ĝ); corrected:
    sigmoid(c·α·z·ĝ)); c = 1 is the paper's rule, see :func:`discretisation_logit_scale`.
    """
    z, grad = jnp.asarray(z), jnp.asarray(grad)
    extreme = (z * grad > 0).astype(jnp.result_type(z, grad, float))
    if variant == "vanilla":
        return jax.nn.sigmoid(logit_scale * z * grad)
    if variant == "extreme":
        return extreme
    if variant == "corrected":
        corrected = jax.nn.sigmoid(logit_scale * barker_alpha(z, noise_sd) * z * grad)
        return jnp.where(past_breaking_point(z, noise_sd), extreme, corrected)
    raise ValueError(f"unknown SGBD variant {variant!r}")


def discretisation_logit_scale(sigma):
    r"""c = 1 + σ²/4: the logit multiplier that removes SGBD's first-order variance inflation.

    For a standard Gaussian target the Barker increments have drift ≈ c·σ²·ĝ/2 and variance
    ≈ σ², so the chain's stationary variance is ≈ 1/(c − c²σ²/4): 1 + σ²/4 + O(σ⁴) at c = 1,
    ≈ 1 at c = 1 + σ²/4 (measured: ``docs/warmup.md``, "Discretisation correction").  Meant for
    the working frame of a preconditioner close to the posterior covariance, like SGLD's
    ``correct_discretisation``.
    """
    return 1.0 + jnp.asarray(sigma) ** 2 / 4.0


def adapted_step_size(noise_sd, fallback):
    """σ_j = 1.702/(1.233·τ̂_j); ``fallback`` where τ̂_j is 0 (no gradient noise)."""
    safe = jnp.where(noise_sd > 0, noise_sd, 1.0)
    return jnp.where(noise_sd > 0, BARKER_LOGISTIC_SCALE / (_INCREMENT_QUANTILE * safe), fallback)


def sgbd_update(key, theta, grad, sigma, noise_sd, variant: str, logit_scale=1.0):
    """One SGBD move: returns (θ', z, p)."""
    key_z, key_b = random.split(key)
    z = barker_increment(key_z, jnp.broadcast_to(sigma, theta.shape))
    p = keep_sign_probability(z, grad, noise_sd, variant, logit_scale)
    b = jnp.where(random.uniform(key_b, theta.shape, theta.dtype) < p, 1.0, -1.0)
    return theta + b * z, z, p


class SGBDHyper(NamedTuple):
    """Hyperparameters of :class:`SGBD` held in its state: ``step_size`` σ (scalar or one entry
    per unconstrained coordinate; the base value that adaptation starts from)."""

    step_size: Any


SGBDState = gradient_state("SGBDState", ("frac_past_breaking_point",), doc="""State of :class:`SGBD`.

As :class:`~numpyro_sg.kernels.sgld.SGLDState`, with ``step_size`` the σ used per working
coordinate (flat; adapted when ``adapt_step_size``), ``hyper`` the :class:`SGBDHyper` and
``frac_past_breaking_point`` the fraction of coordinates whose increment had abs(z_j)·τ̂_j ≥
1.702 at this iteration (NaN without τ̂).
""")


def sgbd_move(state, grad_w, noise_sd_w, step_size, key, *, variant="corrected", adapt_until=None,
              correct_discretisation=False):
    """SGBD's move in the working frame (the module docstring's three steps); with ``adapt_until``
    (an iteration, ``inf`` for always) σ_j = 1.702/(1.233·τ̂_j) before that iteration, the
    last σ after it."""
    if adapt_until is None:
        sigma = jnp.broadcast_to(step_size, grad_w.shape)
    else:
        sigma = jnp.where(state.i < adapt_until, adapted_step_size(noise_sd_w, state.step_size), state.step_size)
    scale = discretisation_logit_scale(sigma) if correct_discretisation else 1.0
    du, z, _ = sgbd_update(key, jnp.zeros_like(grad_w), grad_w, sigma, noise_sd_w, variant, scale)
    frac = jnp.mean(past_breaking_point(z, noise_sd_w).astype(grad_w.dtype))
    frac = jnp.where(jnp.any(jnp.isnan(noise_sd_w)), jnp.nan, frac)  # NaN: τ̂ not estimated
    return du, dict(step_size=sigma, frac_past_breaking_point=frac)


def sgbd_fields(noise_sd, hyper, dim, dtype, adapt=False):
    """SGBD's own state fields at the start: σ per coordinate (adapted to τ̂ with ``adapt``)."""
    sigma = jnp.broadcast_to(hyper.step_size, (dim,)).astype(dtype)
    if adapt:
        sigma = adapted_step_size(noise_sd, sigma)
    return dict(step_size=sigma, frac_past_breaking_point=jnp.asarray(jnp.nan, dtype))


def init(position, estimate, minibatch, step_size, *, adapt_step_size=False, precond=None) -> SGBDState:
    """SGBD's state at ``position`` with ĝ = ``estimate(position, minibatch)``: σ = ``step_size``
    (a scalar or one entry per coordinate) in the units of ``precond`` (default: of ``position``)."""
    hyper = SGBDHyper(jnp.asarray(step_size, jnp.result_type(float)))
    fields = partial(sgbd_fields, adapt=bool(adapt_step_size))
    return gradient_init(SGBDState, position, estimate, minibatch, hyper, fields, precond, jnp.square)


def step(rng_key, state, estimate, minibatch, *, variant="corrected", adapt_until=None,
         correct_discretisation=False, noise_ema_weight=0.1) -> SGBDState:
    """One SGBD iteration (pure; :func:`~numpyro_sg.kernels.core.gradient_step` with
    :func:`sgbd_move`).  The corrected variant and adaptation need τ̂ from the estimator."""
    move = partial(sgbd_move, variant=variant, adapt_until=adapt_until, correct_discretisation=correct_discretisation)
    return gradient_step(rng_key, state, estimate, minibatch, move, noise_ema_weight, jnp.square)


class SGBD(GradientKernel):
    r"""Stochastic gradient Barker dynamics for a NumPyro model with a subsample plate.

    In the working frame of the preconditioner (θ = θ₀ + L·u, see
    :mod:`numpyro_sg.infer.preconditioner`) each coordinate proposes z_j ~ N(σ_j, (0.1σ_j)²) and keeps
    its sign with probability sigmoid(c_j·z_j·ĝ_j) (``"vanilla"``), the noise-corrected
    sigmoid(c_j·α_j·z_j·ĝ_j) with α_j = 1.702/√(1.702² − τ̂_j²z_j²), falling back to the
    extreme rule past the breaking point (``"corrected"``, the default), or 1{z_j·ĝ_j > 0}
    (``"extreme"``); then u_j ← u_j ± z_j.  ĝ and τ̂ are the stochastic gradient and its
    noise sd in the working frame; c_j = 1 (the paper) or 1 + σ_j²/4 with
    ``correct_discretisation`` (:func:`discretisation_logit_scale`).  Before the chains
    start, the warmup finds the mode, the Laplace preconditioner and the control-variate
    anchor (:mod:`numpyro_sg.infer.warmup`); σ = 0.8 posterior sds by default.

    :param model: NumPyro model with a subsample plate.
    :param step_size: σ > 0 in the working frame (scalar or per-coordinate array); ``None``
        (default) for :data:`DEFAULT_STEP_SIZE` (needs a preconditioner).
    :param str variant: ``"vanilla"``, ``"corrected"`` (default) or ``"extreme"``.
    :param adapt_step_size: ``True`` sets σ_j = 1.702/(1.233·τ̂_j) (the paper's rule: about 99%
        of increments below the breaking point) during warmup and keeps it fixed afterwards,
        as adaptation does everywhere in NumPyro; ``"always"`` adapts at every iteration (the
        paper's algorithm); ``False`` (default) keeps ``step_size``.  The rule is meant for
        plain gradients: with control variates τ̂ is small and the adapted σ large.
    :param correct_discretisation: use c = 1 + σ²/4 (default: on with the
        ``"laplace"``/``"adapt"`` preconditioner).
    :param minibatch_options: :class:`~numpyro_sg.kernels.options.MinibatchOptions` (or a dict):
        ``replace``, ``check_data``, ``estimate_noise`` (τ̂; default: when the variant or adaptation
        needs it), ``noise_ema_weight``.

    The options every gradient kernel shares (``preconditioner``, ``gradient``, ``warmup_options``,
    ``subsample_size``, ``init_strategy``, ``minibatch_options``) are documented once in
    :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

    Extra fields: ``step_size``, ``grad_noise_sd``, ``frac_past_breaking_point``, ``diverging``.

    **Example** (a linear regression on 5,000 rows, whose posterior is known exactly; the
    defaults need no tuning):

    >>> import jax, numpy as np, numpyro_sg as nsg
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sg.datasets import (linear_regression_model, linear_regression_posterior,
    ...                                  simulate_linear_regression)
    >>> X, y, _ = simulate_linear_regression(5_000, 3, seed=0)
    >>> mean, cov = linear_regression_posterior(X, y)       # the exact posterior N(mean, cov)
    >>> mcmc = MCMC(nsg.SGBD(linear_regression_model), num_warmup=500, num_samples=1000,
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

        # the paper's corrected SGBD with adaptive σ on plain gradients
        nsg.SGBD(model, 0.01, adapt_step_size="always", preconditioner=None, gradient="plain")
    """

    State = SGBDState
    DEFAULT_STEP_SIZE = DEFAULT_STEP_SIZE
    BOUNDED_MOVES = True
    HYPERPARAMETERS = ("step_size",)
    VARIANTS = ("vanilla", "corrected", "extreme")
    ADAPT = (False, True, "always")

    @moved_options(MINIBATCH_MOVES)
    def __init__(self, model, step_size=None, *, variant="corrected", adapt_step_size=False,
                 preconditioner="laplace", gradient="cv", correct_discretisation=None,
                 warmup_options=None, subsample_size=None, init_strategy=None, minibatch_options=None):
        check_choice("variant", variant, self.VARIANTS)
        check_choice("adapt_step_size", adapt_step_size, self.ADAPT)
        if step_size is not None:
            sigma = np.asarray(step_size, dtype=float)
            if sigma.ndim > 1 or not np.all(sigma > 0) or not np.all(np.isfinite(sigma)):
                raise ValueError(
                    f"step_size must be a positive finite scalar or 1-d array, got {step_size!r}."
                )
        super().__init__(model, step_size, **self.shared(locals()))
        self.variant = variant
        self.adapt_step_size = adapt_step_size
        needs = variant == "corrected" or bool(adapt_step_size)
        self._resolve_estimate_noise(needs, needs=needs, why="variant='corrected' and adapt_step_size need")
        if correct_discretisation is None:
            correct_discretisation = isinstance(self.preconditioner, str)
        self.correct_discretisation = bool(correct_discretisation)

    functional_step = staticmethod(step)
    step_variance = staticmethod(jnp.square)

    def step_options(self):
        until = {False: None, True: self._num_warmup, "always": float("inf")}[self.adapt_step_size]
        return super().step_options() | dict(variant=self.variant, adapt_until=until,
                                              correct_discretisation=self.correct_discretisation)

    def _hyperparameters(self, dim, precond):
        sigma = jnp.asarray(self.default_step_size() if self.step_size is None else self.step_size,
                            jnp.result_type(float))
        if sigma.ndim == 1 and sigma.shape != (dim,):
            raise ValueError(
                f"step_size has shape {sigma.shape} but the model has {dim} unconstrained coordinates."
            )
        return SGBDHyper(step_size=sigma)

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return sgbd_fields(noise_sd, hyper, dim, dtype, adapt=bool(self.adapt_step_size))

    def noise_inflation(self, step_size, noise, curvature=1.0):
        # Barker's moves are bounded: no overshoot where the curvature exceeds the Laplace one
        return None if self.adapt_step_size else sgbd_inflation(step_size, noise)
