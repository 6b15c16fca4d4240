r"""Cyclical SGLD (Zhang, Li, Zhang, Chen & Wilson 2020, "Cyclical stochastic gradient MCMC for
Bayesian deep learning", ICLR).  At iteration t, with r_t = (t mod L)/L in a cycle of L steps,

.. math::

   \varepsilon_t = \tfrac{\varepsilon_0}{2}\,\bigl(\cos(\pi r_t) + 1\bigr),\qquad
   u' = u + \tfrac{\varepsilon_t}{2}\,L^\top\hat g(\theta) + \mathcal N\bigl(0, v(\varepsilon_t, \tau_t)\bigr),

the move of :class:`~numpyro_sg.SGLD` (ε₀ in the same units), with τ_t = 0 (a gradient step)
while r_t < β (``exploration``), τ_t = τ after.  The ``exploring`` field marks the draws of the
exploration stages, which are not posterior draws.

>>> import jax, numpyro_sg as nsg
>>> from numpyro.infer import MCMC
>>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
>>> X, y, _ = simulate_logistic_regression(2_000, 3, seed=0)
>>> kernel = nsg.CyclicalSGLD(logistic_regression_model, cycle_length=100, exploration=0.2)
>>> mcmc = MCMC(kernel, num_warmup=200, num_samples=400, progress_bar=False)
>>> mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("exploring",))
>>> mcmc.get_samples()["theta"][~mcmc.get_extra_fields()["exploring"]].shape
(320, 3)
"""

from functools import partial

import jax.numpy as jnp

from numpyro_sg.kernels.core import gradient_state, gradient_step
from numpyro_sg.kernels.options import MINIBATCH_MOVES, moved_options
from numpyro_sg.kernels.sgld import SGLD, sgld_fields, sgld_move
from numpyro_sg.kernels.sgld import init as sgld_init

__all__ = ["CyclicalSGLD", "init", "step"]

CyclicalSGLDState = gradient_state("CyclicalSGLDState", ("exploring",), doc="""SGLD's state
fields (``step_size`` the ε_t that produced ``z``) and ``exploring``, True after an exploration step.""")


def cycle_phase(t, cycle_length, exploration_steps):
    """``(ε_t/ε₀, exploring)`` at iteration t: the cosine factor (cos(π·r_t) + 1)/2 with
    r_t = (t mod L)/L, and whether t mod L < ``exploration_steps`` (round(β·L))."""
    k = jnp.mod(t, cycle_length)
    return 0.5 * (jnp.cos(jnp.pi * k / cycle_length) + 1.0), k < exploration_steps


def cyclical_move(state, grad_w, noise_sd_w, step_size, key, *, cycle_length, exploration, **sgld_options):
    """SGLD's move with ε_t = the cosine factor × ε₀ (``step_size``), and τ_t = 0 while exploring."""
    factor, exploring = cycle_phase(state.i, cycle_length, round(exploration * cycle_length))
    hyper = state.hyper._replace(temperature=jnp.where(exploring, 0.0, state.hyper.temperature))
    du, _ = sgld_move(state._replace(hyper=hyper), grad_w, noise_sd_w, factor * step_size, key, **sgld_options)
    return du, dict(step_size=factor * step_size, exploring=exploring)


def init(position, estimate, minibatch, step_size, *, cycle_length=200, exploration=0.0, temperature=1.0,
         precond=None):
    """Cyclical SGLD's state at ``position``: SGLD's (:func:`numpyro_sg.kernels.sgld.init`), ε₀ = ``step_size``."""
    state = sgld_init(position, estimate, minibatch, step_size, temperature=temperature, precond=precond)
    return CyclicalSGLDState(**state._asdict(), exploring=jnp.asarray(round(exploration * cycle_length) > 0))


def step(rng_key, state, estimate, minibatch, *, cycle_length=200, exploration=0.0, **sgld_options):
    """One cyclical SGLD iteration (pure); ``sgld_options`` as :func:`numpyro_sg.kernels.sgld.step`'s."""
    ema_weight = sgld_options.pop("noise_ema_weight", 0.1)
    move = partial(cyclical_move, cycle_length=cycle_length, exploration=exploration, **sgld_options)
    return gradient_step(rng_key, state, estimate, minibatch, move, ema_weight)


class CyclicalSGLD(SGLD):
    """Cyclical SGLD (the module docstring has the update and an example): ``step_size`` ε₀
    the peak step (default SGLD's), ``cycle_length`` L iterations per cycle (warmup included),
    ``exploration`` β ∈ [0, 1); any other option of :class:`~numpyro_sg.SGLD`."""

    State = CyclicalSGLDState
    functional_step = staticmethod(step)

    @moved_options(MINIBATCH_MOVES)
    def __init__(self, model, step_size=None, *, cycle_length: int = 200, exploration: float = 0.0,
                 **kwargs):
        if not (int(cycle_length) == cycle_length and cycle_length >= 2):
            raise ValueError(f"cycle_length must be an integer ≥ 2, got {cycle_length!r}.")
        if not 0.0 <= exploration < 1.0:
            raise ValueError(f"exploration must lie in [0, 1), got {exploration!r}.")
        if callable(step_size):
            raise ValueError("CyclicalSGLD sets its own schedule: step_size is the peak ε₀.")
        super().__init__(model, step_size, **kwargs)
        self.cycle_length, self.exploration = int(cycle_length), float(exploration)

    def step_options(self):
        return super().step_options() | dict(cycle_length=self.cycle_length, exploration=self.exploration)

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return sgld_fields(noise_sd, hyper, dim, dtype) | dict(
            exploring=jnp.asarray(round(self.exploration * self.cycle_length) > 0))
