r"""Preconditioned SGLD (pSGLD, Li, Chen, Carlson & Carin 2016, Algorithm 1).

SGLD whose step is rescaled per coordinate by an RMSprop preconditioner built from the
history of the stochastic gradients (Li, Chen, Carlson & Carin 2016, "Preconditioned stochastic
gradient Langevin dynamics for deep neural networks", AAAI).  In the package's step-size
convention (SGLD is θ' = θ + (ε/2)·ĝ + N(0, ε·τ)), applied to the working coordinates u of the warmup's
preconditioner (θ = θ₀ + L·u, ĝ read as Lᵀ·ĝ, :mod:`numpyro_sg.infer.preconditioner`):

.. math::

   V' &= \alpha V + (1 - \alpha)\,\hat g \odot \hat g, \qquad
   G = \operatorname{diag}\!\big(1 / (\lambda + \sqrt{V'})\big), \\
   u' &= u + \tfrac{\varepsilon}{2}\,\big[G\,\hat g + \tau\,\Gamma\big] + \mathcal N(0,\, v),
   \qquad v = \varepsilon\,\tau\,G

(times (1 − εG/4) with ``correct_discretisation``, the same Gaussian-exact correction as
SGLD's, applied to the effective step εG), with

* α = ``alpha`` (0.99) and λ = ``damping`` (10⁻⁵), Li et al.'s defaults;
* Γ_j = ∂G_j/∂u_j, the correction for a position-dependent G, taken (as Li et al. do) with
  V' a function of the current point through the current gradient only:

  .. math::

     \Gamma_j = -(1 - \alpha)\,\frac{\hat g_j\, h_j}{\sqrt{V'_j}\,(\lambda + \sqrt{V'_j})^2},

  h_j = ∂ĝ_j/∂u_j, the diagonal of the working-frame Hessian of the mini-batch log
  density, estimated without bias by one Hutchinson probe (r ⊙ (LᵀHL)·r, r Rademacher) on a
  fresh mini-batch at the current point; about one Hessian-vector product per iteration.
  Γ is O(1 − α) and Li et al. drop it in practice ("the correction term Γ … can be ignored"),
  so it is off by default (``correction=False``).

Li et al.'s ε is ours; their α and λ are ``alpha`` and ``damping``.  SGMCMCJax's
``build_psgld_kernel(dt, loglikelihood, logprior, data, batch_size, alpha, eps)`` writes
x' = x + dt·½·G·ĝ + √(dt·G)·ξ with V updated first, so ``dt`` = ε, ``alpha`` = α, ``eps`` =
λ, no Γ (checked on identical gradients in ``tests/test_psgld_baoab.py``).  With
``preconditioner=None`` this kernel is Li et al.'s pSGLD exactly (V starts at 0, as theirs);
with the default Laplace preconditioner the RMSprop scaling acts on the whitened coordinates,
where ĝ_j ≈ −u_j + noise, so at stationarity V ≈ 1 + (gradient-noise variance) and
G ≈ 1/√(1 + noise variance) ≤ 1: the effective step εG is at most ε.  V then starts at 1 (its
value under the Laplace approximation without gradient noise) instead of 0, which would
make the first steps about 10/|ĝ| times too large.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.flatten_util import ravel_pytree

from numpyro_sg.kernels.options import MINIBATCH_MOVES, check_positive, moved_options
from numpyro_sg.kernels.core import gradient_init, gradient_state, gradient_step
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.kernels.moves import ema, langevin_move, langevin_noise_variance
from numpyro_sg.kernels.step_size import resolve_step_size, step_size_at
from numpyro_sg.infer.curvature import hutchinson_diagonal
from numpyro_sg.infer.options import Options
from numpyro_sg.infer.preconditioner import from_working, to_working

__all__ = ["PSGLD", "RMSpropOptions", "init", "step"]

#: default ε in the working frame of the Laplace preconditioner (docs/kernels.md, "pSGLD")
DEFAULT_STEP_SIZE = 0.8


def rmsprop_accumulate(rms, grad, alpha):
    """RMSprop's accumulator V' = α·V + (1 − α)·ĝ⊙ĝ (an :func:`~numpyro_sg.kernels.moves.ema`
    of ĝ² with weight 1 − α)."""
    return ema(rms, jnp.square(grad), 1.0 - alpha)


def rmsprop_preconditioner(rms, damping):
    """The diagonal of pSGLD's preconditioner, G = 1/(λ + √V), λ = ``damping``."""
    return 1.0 / (damping + jnp.sqrt(rms))


def rmsprop_correction(grad, curvature, rms, alpha, damping):
    r"""pSGLD's Γ_j = ∂G_j/∂u_j for G_j = 1/(λ + √V_j), V_j = α·V_prev + (1 − α)·ĝ_j(u)²:

    Γ_j = −(1 − α)·ĝ_j·h_j / (√V_j·(λ + √V_j)²), with ``rms`` the updated V (V_prev already
    folded in) and ``curvature`` h_j = ∂ĝ_j/∂u_j.  Zero where V_j = 0 (then ĝ_j = 0 too).
    """
    root = jnp.sqrt(rms)
    safe = jnp.where(root > 0, root, 1.0)
    gamma = -(1.0 - alpha) * grad * curvature / (safe * (damping + safe) ** 2)
    return jnp.where(root > 0, gamma, 0.0)


def psgld_update(grad, rms, step_size, noise, *, alpha, damping, temperature=1.0,
                 curvature=None, correct_discretisation=False):
    r"""One pSGLD move of the working coordinates: returns ``(du, V', G)``.

    V' = α·V + (1 − α)·ĝ², G = 1/(λ + √V'), du = (ε/2)·(G·ĝ + τ·Γ) + √v·ξ with v = ε·τ·G
    (times (1 − εG/4) with ``correct_discretisation``) and ξ = ``noise``; Γ
    (:func:`rmsprop_correction`) only when ``curvature`` (h = ∂ĝ/∂u) is given.
    """
    rms = rmsprop_accumulate(rms, grad, alpha)
    G = rmsprop_preconditioner(rms, damping)
    drift = G * grad
    if curvature is not None:
        drift = drift + temperature * rmsprop_correction(grad, curvature, rms, alpha, damping)
    variance = langevin_noise_variance(step_size * G, temperature, None, correct_discretisation)
    return langevin_move(jnp.zeros_like(grad), drift, step_size, noise, variance), rms, G


@dataclass(frozen=True)
class RMSpropOptions(Options):
    """pSGLD's RMSprop accumulator: :class:`PSGLD`'s ``rmsprop`` (``None``, a dict of these fields
    or an instance).

    :param float alpha: α ∈ [0, 1), the decay of the accumulator V (Li et al.: 0.99).
    :param float damping: λ > 0 in G = 1/(λ + √V) (Li et al.: 10⁻⁵; SGMCMCJax's ``eps``).
    :param initial: V's start (a float ≥ 0); ``None`` (default): 1 with the ``"laplace"`` or
        ``"adapt"`` preconditioner (V's value under the Laplace approximation), 0 otherwise
        (Li et al.).

    >>> RMSpropOptions.of({"alpha": 0.9})
    RMSpropOptions(alpha=0.9, damping=1e-05, initial=None)
    """

    alpha: float = 0.99
    damping: float = 1e-5
    initial: float | None = None

    ARGUMENT = "rmsprop"
    LABEL = "RMSprop option"

    def __post_init__(self):
        if not (np.ndim(self.alpha) == 0 and 0.0 <= float(self.alpha) < 1.0):
            raise ValueError(f"alpha must be a number in [0, 1), got {self.alpha!r}.")
        if np.ndim(self.damping) != 0:
            raise ValueError(f"damping must be a number, got {self.damping!r}.")
        check_positive("damping", self.damping)
        initial = self.initial
        if initial is not None and not (np.ndim(initial) == 0 and np.isfinite(initial) and float(initial) >= 0.0):
            raise ValueError(f"initial (RMSprop's V at the start) must be a finite number ≥ 0 (or None), got {initial!r}.")


class PSGLDHyper(NamedTuple):
    """Hyperparameters of :class:`PSGLD` held in its state: ``step_size`` ε (scalar, per
    coordinate, or a schedule), ``temperature`` τ, ``alpha`` α (RMSprop's decay) and ``damping``
    λ."""

    step_size: Any
    temperature: Any
    alpha: Any
    damping: Any


PSGLDState = gradient_state("PSGLDState", ("rms", "rms_scale", "curvature"), doc="""State of :class:`PSGLD`.

As :class:`~numpyro_sg.kernels.sgld.SGLDState` (``step_size`` the ε that produced ``z``), with
``rms`` the RMSprop accumulator V per working coordinate (flat), ``rms_scale`` the mean over
coordinates of G = 1/(λ + √V) used by the last move (the effective step is ε·G), and
``curvature`` the Hutchinson estimate of ∂ĝ_j/∂u_j at ``z`` used by Γ (NaN without
``correction``).
""")


def psgld_hyperparameters(step_size, dim: int, *, alpha=0.99, damping=1e-5, temperature=1.0,
                          default=None) -> PSGLDHyper:
    """The :class:`PSGLDHyper` of ε (``default`` when ``None``), α, λ and τ."""
    real = jnp.result_type(float)
    return PSGLDHyper(resolve_step_size(step_size, default, dim), jnp.asarray(temperature, real),
                      jnp.asarray(alpha, real), jnp.asarray(damping, real))


def psgld_fields(noise_sd, hyper, dim, dtype, rms_init=0.0):
    """pSGLD's own state fields at the start: ε, V = ``rms_init``, mean G, no curvature."""
    rms = jnp.full((dim,), rms_init, dtype)
    return dict(step_size=step_size_at(hyper.step_size, 0, dtype), rms=rms,
                rms_scale=jnp.mean(rmsprop_preconditioner(rms, hyper.damping)).astype(dtype),
                curvature=jnp.full((dim,), jnp.nan, dtype))


def psgld_move(state, grad_w, noise_sd_w, step_size, key, *, correction=False, correct_discretisation=False):
    """pSGLD's move in the working frame (:func:`psgld_update`); Γ from ``state.curvature`` with ``correction``."""
    h = state.hyper
    noise = random.normal(key, grad_w.shape, grad_w.dtype)
    du, rms, G = psgld_update(grad_w, state.rms, step_size, noise, alpha=h.alpha, damping=h.damping,
                              temperature=h.temperature, curvature=state.curvature if correction else None,
                              correct_discretisation=correct_discretisation)
    return du, dict(rms=rms, rms_scale=jnp.mean(G), curvature=state.curvature)


def init(position, estimate, minibatch, step_size, *, alpha=0.99, damping=1e-5, rms_init=0.0, temperature=1.0,
         precond=None) -> PSGLDState:
    """pSGLD's state at ``position`` with ĝ = ``estimate(position, minibatch)``; ε in the units of
    ``precond`` (default: of ``position``), V starting at ``rms_init`` (Li et al.: 0)."""
    dim = ravel_pytree(position)[0].shape[0]
    hyper = psgld_hyperparameters(step_size, dim, alpha=alpha, damping=damping, temperature=temperature)
    return gradient_init(PSGLDState, position, estimate, minibatch, hyper,
                         partial(psgld_fields, rms_init=rms_init), precond)


def step(rng_key, state, estimate, minibatch, *, correction=False, correct_discretisation=False,
         noise_ema_weight=0.1) -> PSGLDState:
    """One pSGLD iteration (pure; :func:`~numpyro_sg.kernels.core.gradient_step` with
    :func:`psgld_move`).  With ``correction`` set ``state.curvature`` (h = ∂ĝ_j/∂u_j at
    ``state.z``) before each step, as :meth:`PSGLD.step` does."""
    move = partial(psgld_move, correction=correction, correct_discretisation=correct_discretisation)
    return gradient_step(rng_key, state, estimate, minibatch, move, noise_ema_weight)


class PSGLD(GradientKernel):
    r"""Preconditioned SGLD (Li et al. 2016) for a NumPyro model with a subsample plate.

    u' = u + (ε/2)·[G·ĝ + τ·Γ] + N(0, ε·τ·G), G = 1/(λ + √V), V ← α·V + (1 − α)·ĝ², in the
    working frame of the preconditioner (see :mod:`numpyro_sg.kernels.psgld`).  With
    ``preconditioner=None`` and ``gradient="plain"`` this is Li et al.'s algorithm, ε their
    step size; with the defaults the warmup finds the mode, the Laplace preconditioner and
    the control-variate anchor (:mod:`numpyro_sg.infer.warmup`), the chains start at Laplace
    draws, and RMSprop rescales the whitened coordinates (G ≈ 1/√(1 + gradient-noise
    variance) there): ε = 0.8 with the discretisation correction.

    :param model: NumPyro model with a subsample plate.
    :param step_size: ε > 0 in the working frame: a float, an array with one entry per
        unconstrained coordinate, or a schedule (callable t ↦ ε_t); ``None`` (default) for
        :data:`DEFAULT_STEP_SIZE` (needs a preconditioner).
    :param rmsprop: the RMSprop accumulator's options, a :class:`RMSpropOptions` or a dict of its
        fields: ``alpha`` α ∈ [0, 1), its decay (Li et al.: 0.99); ``damping`` λ > 0 in
        G = 1/(λ + √V) (Li et al.: 10⁻⁵; SGMCMCJax's ``eps``); ``initial``, V's start (a float
        ≥ 0; default ``None``: 1 with the ``"laplace"`` or ``"adapt"`` preconditioner, V's value
        under the Laplace approximation, 0 otherwise, as Li et al.).  α and λ are held in the
        state (hyperparameters ``alpha`` and ``damping``).  The keywords ``alpha=``,
        ``damping=`` and ``rms_init=`` still work, deprecated.
    :param bool correction: add Li et al.'s Γ term (default ``False``, as they recommend);
        costs one Hessian-vector product per iteration (Hutchinson estimate of the diagonal
        curvature on a fresh mini-batch).
    :param float temperature: τ (default 1).
    :param correct_discretisation: inject ε·τ·G·(1 − ε·G/4) instead of ε·τ·G (default: on with
        the ``"laplace"``/``"adapt"`` preconditioner, off otherwise).
    :param minibatch_options: :class:`~numpyro_sg.kernels.options.MinibatchOptions` (or a dict):
        ``replace``, ``check_data``, ``estimate_noise`` (the gradient-noise sd τ̂, the
        ``grad_noise_sd`` field, from per-datum gradients; default off), ``noise_ema_weight``.

    The options every gradient kernel shares (``preconditioner``, ``gradient``, ``warmup_options``,
    ``subsample_size``, ``init_strategy``, ``minibatch_options``) are documented once in
    :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

    Extra fields: ``step_size``, ``rms``, ``rms_scale``, ``curvature``, ``grad_noise_sd``,
    ``diverging``.

    **Example** (a linear regression on 5,000 rows, whose posterior is known exactly; the
    defaults need no tuning):

    >>> import jax, numpy as np, numpyro_sg as nsg
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sg.datasets import (linear_regression_model, linear_regression_posterior,
    ...                                  simulate_linear_regression)
    >>> X, y, _ = simulate_linear_regression(5_000, 3, seed=0)
    >>> mean, cov = linear_regression_posterior(X, y)       # the exact posterior N(mean, cov)
    >>> mcmc = MCMC(nsg.PSGLD(linear_regression_model), num_warmup=500, num_samples=1000,
    ...             num_chains=2, chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("rms_scale",))
    >>> theta = np.asarray(mcmc.get_samples()["theta"])
    >>> theta.shape
    (2000, 3)
    >>> sd = np.sqrt(np.diag(cov))    # 2,000 draws: means within 0.25 sd, sds within 15 %
    >>> bool(np.all(abs(theta.mean(0) - mean) < 0.25 * sd)), bool(np.all(abs(theta.std(0) / sd - 1) < 0.15))
    (True, True)

    Other settings:

    .. code-block:: python

        # Li et al.'s pSGLD: absolute step size, plain gradients, NumPyro's random start
        nsg.PSGLD(model, 1e-4, preconditioner=None, gradient="plain",
                  init_strategy=numpyro.infer.init_to_uniform)
    """

    State = PSGLDState
    HYPERPARAMETERS = ("step_size", "temperature", "alpha", "damping")

    @moved_options(MINIBATCH_MOVES | {"alpha": ("rmsprop", "alpha"), "damping": ("rmsprop", "damping"),
                                      "rms_init": ("rmsprop", "initial")})
    def __init__(self, model, step_size=None, *, rmsprop=None, correction=False, temperature=1.0,
                 preconditioner="laplace", gradient="cv", correct_discretisation=None, warmup_options=None,
                 subsample_size=None, init_strategy=None, minibatch_options=None):
        if step_size is not None and not callable(step_size):
            check_positive("step_size", step_size)
        rmsprop = RMSpropOptions.of(rmsprop)
        check_positive("temperature", temperature)
        if not isinstance(correction, bool):
            raise TypeError(f"correction must be True or False, got {correction!r}.")
        super().__init__(model, step_size, **self.shared(locals()))
        #: the :class:`RMSpropOptions` (α and λ also in the state's hyperparameters)
        self.rmsprop = rmsprop
        self.temperature = float(temperature)
        self.correction = correction
        self._resolve_estimate_noise(False)
        if correct_discretisation is None:
            correct_discretisation = isinstance(self.preconditioner, str)
        self.correct_discretisation = bool(correct_discretisation)

    @property
    def alpha(self) -> float:
        """α, RMSprop's decay (``rmsprop.alpha``)."""
        return float(self.rmsprop.alpha)

    @property
    def damping(self) -> float:
        """λ in G = 1/(λ + √V) (``rmsprop.damping``)."""
        return float(self.rmsprop.damping)

    @property
    def rms_init(self) -> float:
        """V's start: ``rmsprop.initial``, or its default (1 with the Laplace preconditioner, else 0)."""
        if self.rmsprop.initial is None:
            return 1.0 if isinstance(self.preconditioner, str) else 0.0
        return float(self.rmsprop.initial)

    functional_step = staticmethod(step)

    def step_options(self):
        return super().step_options() | dict(correction=self.correction,
                                              correct_discretisation=self.correct_discretisation)

    def _hyperparameters(self, dim, precond):
        return psgld_hyperparameters(self.step_size, dim, alpha=self.alpha, damping=self.damping,
                                     temperature=self.temperature, default=DEFAULT_STEP_SIZE)

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return psgld_fields(noise_sd, hyper, dim, dtype, self.rms_init)

    def step(self, state, model_args, model_kwargs):
        """One iteration of one chain (pure); with ``correction`` the diagonal curvature at the
        current point is estimated first (it enters Γ)."""
        if self.correction:
            state = state._replace(curvature=self.curvature(state, model_args, model_kwargs))
        return super().step(state, model_args, model_kwargs)

    def curvature(self, state, model_args, model_kwargs):
        """Hutchinson estimate r ⊙ (LᵀH_S L)·r of the diagonal of the working-frame Hessian of
        the mini-batch log density at ``state.z`` (H_S on a fresh mini-batch S, r Rademacher;
        the same for plain and control-variate gradients, whose derivative is H_S)."""
        key_idx, key_probe = random.split(random.fold_in(state.rng_key, 1))
        indices, _ = self._mb.draw(key_idx, state.batch_state)
        log_density = self._mb.log_density_fn(model_args, model_kwargs)
        unravel, P = self._unravel, state.precond
        flat = ravel_pytree(state.z)[0]

        def grad_at(x):
            return jax.grad(lambda y: log_density(unravel(y), indices))(x)

        def hvp(r):
            return to_working(P, jax.jvp(grad_at, (flat,), (from_working(P, r),))[1])

        probe = random.rademacher(key_probe, flat.shape, flat.dtype)
        return hutchinson_diagonal(hvp, probe)
