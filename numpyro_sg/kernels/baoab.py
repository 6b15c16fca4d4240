r"""BAOAB: Leimkuhler & Matthews' splitting for underdamped Langevin dynamics, with
stochastic gradients (as SGMCMCJax's ``baoab``).

Underdamped Langevin dynamics for the working coordinates u of the warmup's preconditioner
(θ = θ₀ + L·u, ĝ read as Lᵀ·ĝ, :mod:`numpyro_sg.infer.preconditioner`) with a momentum p in the same
units, unit mass, friction γ and temperature τ:
du = p dt, dp = ĝ(u) dt − γ p dt + √(2γτ) dW, stationary at π(u)^(1/τ) ⊗ N(0, τ·I).  One
step of length h is B(h/2) A(h/2) O A(h/2) B(h/2):

.. math::

   \text{B:}\; p \leftarrow p + \tfrac h2\,\hat g(u), \qquad
   \text{A:}\; u \leftarrow u + \tfrac h2\,p, \qquad
   \text{O:}\; p \leftarrow c\,p + \sqrt{\tau(1 - c^2)}\,\xi, \quad c = e^{-\gamma h}.

**Step-size convention.**  ``step_size`` is ε = h², the package's Langevin ε: in the
high-friction limit (c = 0) BAOAB is u' = u + (h²/2)·ĝ + (h/2)·(ξ_k + ξ_{k+1}) (the
Leimkuhler–Matthews scheme), SGLD's drift (ε/2)·ĝ with noise of long-run variance ε per step.
So ε has SGLD's units (the parameters' variance with ``preconditioner=None``; dimensionless
in the Laplace frame, where h = √ε moves about h posterior sds per unit momentum).

**One gradient per iteration.**  The closing B(h/2) of a step and the opening B(h/2) of the
next use the same gradient ĝ(u_{k+1}), the one the kernel evaluates after each move.  The
state therefore carries the momentum *before* its closing half-kick (the momentum after the O
step), and each step opens with the two half-kicks at once,
p ← p + (h_prev/2 + h/2)·ĝ(u), h_prev the previous step's h (0 before the first step: the
chain starts with p = 0, as SGMCMCJax's and posteriors' do, and its first kick is h/2).
The positions are exactly BAOAB's (checked against a direct BAOAB in
``tests/test_psgld_baoab.py``); this is the BAOA form of posteriors' ``sgmcmc.baoa``.

For a Gaussian target and exact gradients BAOAB's positions are exactly distributed for any
h < 2 (Leimkuhler & Matthews 2013), and so is the momentum after the O step
(``kinetic_temperature`` = mean p² ≈ τ; gradient noise raises it: each kick adds h²·Var(ĝ)).

**Peers.**  SGMCMCJax 0.2.13's ``sgmcmcjax.diffusions.baoab(dt, gamma, tau)``: ``dt`` = h = √ε,
``gamma`` = γ, ``tau`` = √τ (its O step scales the noise's sd by tau).  (Its
``build_baoab_kernel`` unpacks both half-steps into one name and never moves the parameters,
a known SGMCMCJax bug.)  posteriors' ``sgmcmc.baoa.build(log_posterior, lr, alpha, sigma,
temperature)`` with ``sigma`` = 1: ``lr`` = h = √ε, ``alpha`` = γ, ``temperature`` = τ, for a
log posterior summed over the data.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import random
from jax.flatten_util import ravel_pytree

from numpyro_sg.kernels.options import MINIBATCH_MOVES, check_positive, moved_options
from numpyro_sg.kernels.core import gradient_init, gradient_state, gradient_step
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.kernels.step_size import resolve_step_size, step_size_at

__all__ = ["BAOAB", "init", "step"]

#: default ε = h² in the working frame of the Laplace preconditioner; with γ = 3 (c ≈ 0.17: near
#: the high-friction limit, a Langevin step of h² = 0.35) as accurate as SGLD also on posteriors
#: far from Gaussian, where larger steps mix faster but are biased (measured: docs/kernels.md,
#: "BAOAB", "Defaults")
DEFAULT_STEP_SIZE = 0.35
#: default friction γ (per unit time; c = exp(−γ·√ε) per step)
DEFAULT_FRICTION = 3.0


def ou_coefficient(h, friction):
    """c = exp(−γ·h): the O step's momentum retention over a time step h."""
    return jnp.exp(-friction * h)


def baoab_update(momentum, grad, h, h_prev, friction, temperature, noise):
    r"""One BAOAB step of the working coordinates with a single gradient: returns ``(du, p')``.

    ``momentum`` p̃ is the momentum before its closing half-kick and ``grad`` ĝ the gradient
    at the current point:

    p = p̃ + (h_prev/2 + h/2)·ĝ (the previous step's closing B and this step's opening B),
    du = (h/2)·p (A), p' = c·p + √(τ(1 − c²))·ξ with c = exp(−γh) and ξ = ``noise`` (O),
    du ← du + (h/2)·p' (A).  p' is the next p̃.
    """
    p = momentum + 0.5 * (h_prev + h) * grad
    du = 0.5 * h * p
    c = ou_coefficient(h, friction)
    p = c * p + jnp.sqrt(temperature * (1.0 - c**2)) * noise
    return du + 0.5 * h * p, p


class BAOABHyper(NamedTuple):
    """Hyperparameters of :class:`BAOAB` held in its state: ``step_size`` ε = h² (scalar, per
    coordinate, or a schedule), ``friction`` γ and ``temperature`` τ."""

    step_size: Any
    friction: Any
    temperature: Any


BAOABState = gradient_state("BAOABState", ("momentum", "kinetic_temperature"), doc="""State of :class:`BAOAB`.

As :class:`~numpyro_sg.kernels.sgld.SGLDState`, with ``step_size`` the ε = h² of the step that
produced ``z`` (0 before the first step: no half-kick is owed then), ``momentum`` the
working-frame momentum after the last O step, before its closing half-kick (flat; the
momentum of the BAOAB chain at ``z`` is ``momentum`` + (h/2)·ĝ), and ``kinetic_temperature``
its mean square over coordinates (≈ τ at equilibrium on a Gaussian target; gradient noise
raises it).
""")


def baoab_hyperparameters(step_size, dim: int, *, friction=DEFAULT_FRICTION, temperature=1.0,
                          default=None) -> BAOABHyper:
    """The :class:`BAOABHyper` of ε (``default`` when ``None``), γ and τ."""
    real = jnp.result_type(float)
    return BAOABHyper(resolve_step_size(step_size, default, dim), jnp.asarray(friction, real),
                      jnp.asarray(temperature, real))


def baoab_fields(noise_sd, hyper, dim, dtype):
    """BAOAB's own state fields at the start: no step taken (ε = 0: no half-kick owed), p̃ = 0."""
    eps = step_size_at(hyper.step_size, 0, dtype)
    return dict(step_size=jnp.zeros_like(eps), momentum=jnp.zeros((dim,), dtype),
                kinetic_temperature=jnp.zeros((), dtype))


def baoab_move(state, grad_w, noise_sd_w, step_size, key):
    """BAOAB's move in the working frame (:func:`baoab_update`, h = √ε, h_prev from the last step)."""
    h = state.hyper
    noise = random.normal(key, grad_w.shape, grad_w.dtype)
    du, p = baoab_update(state.momentum, grad_w, jnp.sqrt(step_size), jnp.sqrt(state.step_size),
                         h.friction, h.temperature, noise)
    return du, dict(momentum=p, kinetic_temperature=jnp.mean(p**2))


def init(position, estimate, minibatch, step_size, *, friction=DEFAULT_FRICTION, temperature=1.0,
         precond=None) -> BAOABState:
    """BAOAB's state at ``position`` with ĝ = ``estimate(position, minibatch)``; ε = h² in the
    units of ``precond`` (default: of ``position``)."""
    dim = ravel_pytree(position)[0].shape[0]
    hyper = baoab_hyperparameters(step_size, dim, friction=friction, temperature=temperature)
    return gradient_init(BAOABState, position, estimate, minibatch, hyper, baoab_fields, precond)


def step(rng_key, state, estimate, minibatch, *, noise_ema_weight=0.1) -> BAOABState:
    """One BAOAB iteration (pure; :func:`~numpyro_sg.kernels.core.gradient_step` with :func:`baoab_move`)."""
    return gradient_step(rng_key, state, estimate, minibatch, baoab_move, noise_ema_weight)


class BAOAB(GradientKernel):
    r"""BAOAB splitting for underdamped Langevin dynamics with stochastic gradients.

    Per iteration, in the working frame of the preconditioner (see
    :mod:`numpyro_sg.kernels.baoab`), with h = √ε: p ← p + (h_prev/2 + h/2)·ĝ,
    u ← u + (h/2)·p, p ← c·p + √(τ(1 − c²))·ξ (c = exp(−γh)), u ← u + (h/2)·p; one stochastic
    gradient per iteration, positions exactly those of B(h/2)A(h/2)OA(h/2)B(h/2).  Before the
    chains start, the warmup finds the mode, the Laplace preconditioner and the
    control-variate anchor (:mod:`numpyro_sg.infer.warmup`); the chains start at Laplace draws with
    zero momentum.  Defaults: ε = 0.35 (h ≈ 0.59 posterior sd per unit momentum) and γ = 3.

    :param model: NumPyro model with a subsample plate.
    :param step_size: ε = h² > 0 in the working frame (SGLD's units): a float, an array with
        one entry per unconstrained coordinate (a diagonal mass), or a schedule (callable
        t ↦ ε_t); ``None`` (default) for :data:`DEFAULT_STEP_SIZE` (needs a preconditioner).
    :param float friction: γ > 0 per unit time (c = exp(−γ·√ε) per step); ``None`` (default)
        for :data:`DEFAULT_FRICTION` (needs a preconditioner: in absolute units γ must match
        the scale of √ε, e.g. γ ≈ 1/√ε).
    :param float temperature: τ (default 1).
    :param minibatch_options: :class:`~numpyro_sg.kernels.options.MinibatchOptions` (or a dict):
        ``replace``, ``check_data``, ``estimate_noise`` (the gradient-noise sd τ̂, the
        ``grad_noise_sd`` field, from per-datum gradients; default off), ``noise_ema_weight``.

    The options every gradient kernel shares (``preconditioner``, ``gradient``, ``warmup_options``,
    ``subsample_size``, ``init_strategy``, ``minibatch_options``) are documented once in
    :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

    Extra fields: ``step_size``, ``momentum``, ``kinetic_temperature``, ``grad_noise_sd``,
    ``diverging``.

    **Example** (a linear regression on 5,000 rows, whose posterior is known exactly; the
    defaults need no tuning):

    >>> import jax, numpy as np, numpyro_sg as nsg
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sg.datasets import (linear_regression_model, linear_regression_posterior,
    ...                                  simulate_linear_regression)
    >>> X, y, _ = simulate_linear_regression(5_000, 3, seed=0)
    >>> mean, cov = linear_regression_posterior(X, y)       # the exact posterior N(mean, cov)
    >>> mcmc = MCMC(nsg.BAOAB(linear_regression_model), num_warmup=500, num_samples=1000,
    ...             num_chains=2, chain_method="vectorized", progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("kinetic_temperature",))
    >>> theta = np.asarray(mcmc.get_samples()["theta"])
    >>> theta.shape
    (2000, 3)
    >>> sd = np.sqrt(np.diag(cov))    # 2,000 draws: means within 0.25 sd, sds within 15 %
    >>> bool(np.all(abs(theta.mean(0) - mean) < 0.25 * sd)), bool(np.all(abs(theta.std(0) / sd - 1) < 0.15))
    (True, True)

    Other settings:

    .. code-block:: python

        # absolute units, plain gradients: SGMCMCJax's baoab(dt=1e-3, gamma=10)
        nsg.BAOAB(model, 1e-6, friction=10.0, preconditioner=None, gradient="plain",
                  init_strategy=numpyro.infer.init_to_uniform)
    """

    State = BAOABState
    HYPERPARAMETERS = ("step_size", "friction", "temperature")

    @moved_options(MINIBATCH_MOVES)
    def __init__(self, model, step_size=None, *, friction=None, temperature=1.0,
                 preconditioner="laplace", gradient="cv", warmup_options=None, subsample_size=None,
                 init_strategy=None, minibatch_options=None):
        if step_size is not None and not callable(step_size):
            check_positive("step_size", step_size)
        if friction is None and preconditioner is None:
            raise ValueError(
                "friction=None chooses γ in the units of the preconditioner (γ·√ε is what "
                "matters); with preconditioner=None give friction, per unit time with the time step "
                "h = √step_size."
            )
        for name, value in (("friction", friction), ("temperature", temperature)):
            if value is not None and np.ndim(value) != 0:
                raise ValueError(f"{name} must be a number, got {value!r}.")
        check_positive("friction", DEFAULT_FRICTION if friction is None else friction)
        check_positive("temperature", temperature)
        super().__init__(model, step_size, **self.shared(locals()))
        self.friction = DEFAULT_FRICTION if friction is None else float(friction)
        self.temperature = float(temperature)
        self._resolve_estimate_noise(False)

    functional_step = staticmethod(step)

    def _hyperparameters(self, dim, precond):
        return baoab_hyperparameters(self.step_size, dim, friction=self.friction, temperature=self.temperature,
                                     default=DEFAULT_STEP_SIZE)

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return baoab_fields(noise_sd, hyper, dim, dtype)
