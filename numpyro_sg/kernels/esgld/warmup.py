r"""ESGLD's warmup and Laplace step where the control-variate anchor does not apply (a model
with other continuous sites than θ, such as an intercept, or a likelihood that is not a GLM).

* **Start.** The continuous sites other than θ start at the mode of the model with the
  chain's initial indicators (γ = 0 unless given), found by the gradient kernels' warmup
  (:func:`~numpyro_sg.infer.warmup.fit_model_mode`): an intercept starts where the data put
  it, not at NumPyro's uniform draw.  θ keeps its draw from the spike, where the search on γ
  starts (:func:`initial_mode`).
* **Laplace step.** ε_j = h·v_j with v_j a conditional posterior variance
  (:func:`warmup_step_scale`): for θ_j, v_j = 1/(γ_j·λ_j + prior precision of θ_j under γ),
  λ_j = −∂²L/∂β_j² the full-data log-likelihood's curvature at the current β = θ·γ; for every
  other coordinate 1/(−∂²log π/∂x_j²).  The curvatures (:class:`LaplaceScales`,
  :func:`laplace_scales`, O(N·d²) like the anchor's H) are computed at iteration 0 and again
  at the iterations of :func:`~numpyro_sg.kernels.esgld.options.anchor_iterations`, at the
  chain's current point.  Under the spike the step is in units of the spike's sd, so an
  excluded coefficient stays stable whatever h; under the slab it is in units of θ_j's
  conditional posterior sd, as the default step size promises.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax import random
from jax.scipy.optimize import minimize
from numpyro.handlers import condition
from numpyro.infer import init_to_median
from numpyro.infer.util import initialize_model

from numpyro_sg.infer.warmup import fit_model_mode
from numpyro_sg.spike_slab import find_spike_slab


class LaplaceScales(NamedTuple):
    """The curvatures of the Laplace step: ``lik_precision`` λ (p,), the full-data
    log-likelihood's −∂²L/∂β_j² at the current β, and ``variance`` (d,), 1/(−∂²log π/∂x_j²)
    for every flat unconstrained continuous coordinate (its θ entries are not used)."""

    lik_precision: Any
    variance: Any


def initial_mode(model, spike_slab, gamma, model_args, model_kwargs):
    """The flat unconstrained mode of ``model`` with the indicator fixed at ``gamma``
    (:func:`~numpyro_sg.infer.warmup.fit_model_mode` with the default warmup options), in the
    flat order of the kernel's continuous sites."""
    fit, _, unravel = fit_model_mode(condition(model, {spike_slab.indicator: gamma}), model_args, model_kwargs)
    return ravel_pytree(unravel(fit.mode))[0]


def coefficient_index(spike_slab, unravel, dim: int):
    """Where θ's coordinates sit in the flat vector of the continuous sites (a NumPy array)."""
    names = unravel(np.arange(dim, dtype=np.float32))
    return np.asarray(names[spike_slab.coefficient]).astype(int).ravel()


def prior_curvature(spike_slab, values, theta, gamma, model_args, model_kwargs):
    """∂²log π(θ | γ, …)/∂θ_j², the diagonal of the prior's Hessian in θ (one forward-over-
    reverse product; exact for a prior that is independent across coordinates)."""
    ss = spike_slab
    prior_fn = ss.prior_fn(model_args, model_kwargs)

    def log_prior(th):
        return prior_fn({**values, ss.coefficient: th}, gamma)

    return jax.jvp(jax.grad(log_prior), (theta,), (jnp.ones_like(theta),))[1]


def laplace_scales(spike_slab, unravel, index, flat, gamma, model_args, model_kwargs) -> LaplaceScales:
    """The :class:`LaplaceScales` at the flat point ``flat`` and model ``gamma``: the diagonal
    of the full-data Hessian of the full model's log density (every indicator on) at θ·γ,
    O(N·d²).

    **Example:**

    .. code-block:: python

        scales = laplace_scales(ss, setup.unravel, index, flat, gamma, (X, y), {})
    """
    ss = spike_slab
    ones = jnp.ones((ss.num_coefficients,), jnp.int32)
    x = flat.at[index].multiply(gamma.astype(flat.dtype))  # excluded coefficients at 0: β = θ·γ
    log_density = ss.log_density_fn(model_args, model_kwargs)
    full = ss.full_indices()
    precision = -jnp.diagonal(jax.hessian(lambda y: log_density(unravel(y), ones, full))(x))
    values = ss.constrain_fn(model_args, model_kwargs)(unravel(x), ones)
    slab = -prior_curvature(ss, values, x[index], ones, model_args, model_kwargs)
    lik = jnp.maximum(precision[index] - slab, 0.0)
    return LaplaceScales(lik, 1.0 / jnp.maximum(precision, 1e-12))


def warmup_step_scale(scales: LaplaceScales, index, gammas, prior_precisions, dtype):
    """v (d,): the conditional posterior variance the step is measured in (see the module);
    with the m models γ_1..γ_m of the chain on γ, the largest precision over them (the
    model-averaged gradient mixes them: the stiffest one bounds a stable step).

    :param index: :func:`coefficient_index`.
    :param gammas: the m models (m, p).
    :param prior_precisions: −∂²log π(θ|γ_k)/∂θ_j² for each model (m, p).
    """
    prec = jnp.max(gammas.astype(dtype) * scales.lik_precision.astype(dtype) + prior_precisions, axis=0)
    return scales.variance.astype(dtype).at[index].set(1.0 / jnp.maximum(prec, 1e-12))


def start_at_mode(mode, index, flat):
    """The flat start with every continuous coordinate but θ moved to ``mode`` (θ keeps its
    value: the draw from the spike that the search on γ starts from)."""
    return mode.astype(flat.dtype).at[index].set(flat[index])


def full_model_sds(model, model_args=(), model_kwargs=None, *, indicator=None, coefficient=None):
    """The Laplace sds (a NumPy array over the flat unconstrained continuous sites) at the mode
    of a spike-and-slab model's full model, every indicator on (each coefficient under its
    slab: the scale of a selected effect); the tuners' common score scale for ESGLD and
    SparseAsync.

    **Example:**

    .. code-block:: python

        scales = full_model_sds(model, (X, y))
    """
    ss = find_spike_slab(model, model_args, model_kwargs, check=False, indicator=indicator,
                         coefficient=coefficient)
    full = condition(model, {ss.indicator: jnp.ones((ss.num_coefficients,), jnp.int32)})
    if ss.plate is None or ss.plate.subsample_size is None:  # no mini-batches: a dense Laplace fit
        return _dense_laplace_sds(full, model_args, model_kwargs)
    P = fit_model_mode(full, model_args, model_kwargs)[0].preconditioner
    if P.chol is not None:
        return np.sqrt(np.sum(np.square(np.asarray(P.chol)), axis=1))
    return np.asarray(P.scale)


def _dense_laplace_sds(model, model_args, model_kwargs):
    """Laplace sds of a model without a subsample plate: BFGS to the mode of the full-data
    log density, then the dense Hessian there (the models such kernels run on are small)."""
    init = initialize_model(random.PRNGKey(0), model, model_args=model_args,
                            model_kwargs=model_kwargs or {}, init_strategy=init_to_median())
    flat, unravel = ravel_pytree(init.param_info.z)

    def potential(x):
        return init.potential_fn(unravel(x))

    mode = minimize(potential, flat, method="BFGS").x
    cov = jnp.linalg.inv(jax.hessian(potential)(mode))
    return np.sqrt(np.abs(np.diag(np.asarray(cov))))
