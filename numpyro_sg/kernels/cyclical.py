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

import jax.numpy as jnp

from numpyro_sg.kernels.gradient import gradient_state
from numpyro_sg.kernels.sgld import SGLD
from numpyro_sg.kernels.step_size import step_size_at

CyclicalSGLDState = gradient_state("CyclicalSGLDState", ("exploring",), doc="""SGLD's state
fields (``step_size`` the ε_t that produced ``z``) and ``exploring``, True after an exploration step.""")


def cycle_phase(t, cycle_length, exploration_steps):
    """``(ε_t/ε₀, exploring)`` at iteration t: the cosine factor (cos(π·r_t) + 1)/2 with
    r_t = (t mod L)/L, and whether t mod L < ``exploration_steps`` (round(β·L))."""
    k = jnp.mod(t, cycle_length)
    return 0.5 * (jnp.cos(jnp.pi * k / cycle_length) + 1.0), k < exploration_steps


class CyclicalSGLD(SGLD):
    """Cyclical SGLD (the module docstring has the update and an example): ``step_size`` ε₀
    the peak step (default SGLD's), ``cycle_length`` L iterations per cycle (warmup included),
    ``exploration`` β ∈ [0, 1); any other option of :class:`~numpyro_sg.SGLD`."""

    State = CyclicalSGLDState

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
        self.exploration_steps = round(self.exploration * self.cycle_length)

    def _at(self, state, t):
        factor, exploring = cycle_phase(t, self.cycle_length, self.exploration_steps)
        return factor * step_size_at(state.hyper.step_size, t), exploring

    def _init_fields(self, noise_sd, hyper, dim, dtype):
        return dict(step_size=step_size_at(hyper.step_size, 0, dtype),
                    exploring=jnp.asarray(self.exploration_steps > 0))

    def _refresh(self, state):
        return state._replace(step_size=self._at(state, state.i)[0])

    def _move(self, state, grad_w, noise_sd_w, key):
        eps, exploring = self._at(state, state.i)
        temperature = jnp.where(exploring, 0.0, state.hyper.temperature)
        hyper = state.hyper._replace(step_size=eps, temperature=temperature)
        du, fields = super()._move(state._replace(hyper=hyper), grad_w, noise_sd_w, key)
        return du, dict(fields, exploring=exploring)
