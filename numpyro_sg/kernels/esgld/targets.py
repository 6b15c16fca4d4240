"""How the chains on γ evaluate the target, and the paper's model-averaged gradient.

An :class:`~numpyro_sg.kernels.esgld.paper.IndicatorTarget` evaluates log π(γ, θ | X_S)
proposal by proposal: :func:`glm_indicator_target` updates the linear predictor of a GLM
likelihood for the one or two changed coordinates (O(n)), :func:`generic_indicator_target`
runs the model; :func:`coordinate_table` holds a per-coordinate prior at ±θ.
:func:`model_averaged_gradient` is the gradient of the Langevin step of Song, Sun, Ye &
Liang (2020), "Extended stochastic gradient MCMC for large-scale Bayesian variable
selection": (1/m)·Σ_k ∇_θ log π(θ | γ_k, X_S).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from numpyro_sg.kernels.esgld.paper import IndicatorTarget
from numpyro_sg.spike_slab import GLMBatch, GLMFamily, SpikeSlab


def generic_indicator_target(terms: Callable) -> IndicatorTarget:
    """The target evaluated by the model: ``terms(theta, gamma) -> (log_prior, (n,) terms)`` at
    every proposal (O(n·p) for a GLM; e.g. ``SpikeSlab.terms_fn`` with the other values and
    the indices bound).

    **Example:**

    .. code-block:: python

        fn = ss.terms_fn((X, y))
        target = generic_indicator_target(lambda th, g: fn({"theta": th}, g, indices))
    """

    def update(carry, gamma, theta, gamma2, theta2, prop):
        lp2, terms2 = terms(theta2, gamma2)
        return lp2 - carry[0], terms2 - carry[1], (lp2, terms2)

    return IndicatorTarget(lambda gamma, theta: terms(theta, gamma), update)


def coordinate_table(prior_at_theta, prior_at_minus_theta):
    """table[s, g, j] = log p(γ_j = g) + log p(±θ_j | γ_j = g), s = 0 for +θ_j, 1 for −θ_j, from
    the :class:`~numpyro_sg.spike_slab.CoordinatePrior` at θ and at −θ: shape (2, 2, p).

    **Example:**

    .. code-block:: python

        cp = ss.coordinate_prior_fn((X, y))
        table = coordinate_table(cp(values, theta), cp(values, -theta))
    """
    return jnp.stack([
        jnp.stack([cp.indicator0 + cp.coefficient0, cp.indicator1 + cp.coefficient1])
        for cp in (prior_at_theta, prior_at_minus_theta)
    ])


def glm_indicator_target(batch: GLMBatch, family: GLMFamily, theta0, prior) -> IndicatorTarget:
    """The O(n)-per-proposal target of a GLM likelihood.

    The linear predictor η of the mini-batch (``batch`` at β = θ0·γ) is updated for the one or
    two changed coordinates, η' = η + X[:, j_in]·θ'_{j_in} − X[:, j_out]·θ_{j_out}, and the terms
    are ``batch.scale * family.loglik(η', y, params)``.  ``prior`` is either a
    :func:`coordinate_table` (2, 2, p) — O(1) per proposal, exact when the prior is
    per-coordinate; the sign of θ_j relative to ``theta0`` picks the row — or a callable
    ``prior(theta, gamma) -> log prior`` (every site outside the plate, O(p)).

    **Example:**

    .. code-block:: python

        batch = ss.glm_batch_fn((X, y))(values, theta * gamma, indices)
        target = glm_indicator_target(batch, ss.glm.family, theta, table)
    """
    Xt = batch.X.T  # (p, n): contiguous rows for the O(n) column updates

    def loglik_terms(eta):
        return batch.scale * family.loglik(eta, batch.y, batch.params)

    def eta_after(eta, theta, theta2, prop):
        d_in = jnp.where(prop.has_in, theta2[prop.j_in], 0.0)
        d_out = jnp.where(prop.has_out, -theta[prop.j_out], 0.0)
        return eta + Xt[prop.j_in] * d_in + Xt[prop.j_out] * d_out

    if callable(prior):
        def init(gamma, theta):
            return batch.eta, loglik_terms(batch.eta), prior(theta, gamma)

        def update(carry, gamma, theta, gamma2, theta2, prop):
            eta, terms, lp = carry
            eta2 = eta_after(eta, theta, theta2, prop)
            terms2, lp2 = loglik_terms(eta2), prior(theta2, gamma2)
            return lp2 - lp, terms2 - terms, (eta2, terms2, lp2)

        return IndicatorTarget(init, update)

    def slot(j, has, gamma, theta, gamma2, theta2):
        old = prior[(theta[j] != theta0[j]).astype(jnp.int32), gamma[j], j]
        new = prior[(theta2[j] != theta0[j]).astype(jnp.int32), gamma2[j], j]
        return jnp.where(has, new - old, 0.0)

    def update_table(carry, gamma, theta, gamma2, theta2, prop):
        eta, terms = carry
        d_prior = (slot(prop.j_out, prop.has_out, gamma, theta, gamma2, theta2)
                   + slot(prop.j_in, prop.has_in, gamma, theta, gamma2, theta2))
        eta2 = eta_after(eta, theta, theta2, prop)
        terms2 = loglik_terms(eta2)
        return d_prior, terms2 - terms, (eta2, terms2)

    return IndicatorTarget(lambda gamma, theta: (batch.eta, loglik_terms(batch.eta)), update_table)


def indicator_target(ss: SpikeSlab, values, gamma, indices, model_args=(),
                     model_kwargs=None) -> IndicatorTarget:
    """The :class:`IndicatorTarget` of a spike-and-slab model at constrained ``values`` (θ among
    them) and model ``gamma`` on the data ``indices``: :func:`glm_indicator_target` for a GLM
    likelihood (with a :func:`coordinate_table` when the prior is per-coordinate, else the
    prior sites), otherwise :func:`generic_indicator_target`.

    **Example:**

    .. code-block:: python

        target = indicator_target(ss, {"theta": theta}, gamma, {"data": idx}, (X, y))
        chain = rjmh_indicator_chain(key, gamma, theta, w, target, num_steps=10, max_size=q)
    """
    coef = ss.coefficient
    theta = values[coef]
    if ss.glm is None:
        terms = ss.terms_fn(model_args, model_kwargs)
        return generic_indicator_target(lambda th, g: terms({**values, coef: th}, g, indices))
    batch = ss.glm_batch_fn(model_args, model_kwargs)(values, theta * gamma, indices)
    if ss.per_coordinate_prior:
        prior = coordinate_prior_table(ss, values, theta, model_args, model_kwargs)
    else:
        prior_fn = ss.prior_fn(model_args, model_kwargs)

        def prior(th, g):
            return prior_fn({**values, coef: th}, g)

    return glm_indicator_target(batch, ss.glm.family, theta, prior)


def model_averaged_gradient(log_density: Callable, unravel: Callable, flat, gammas, indices):
    """``(value, gradient)`` of (1/m)·Σ_k log π(θ | γ_k, X_S) at the flat unconstrained point.

    ``log_density(params, gamma, indices)`` as :meth:`SpikeSlab.log_density_fn
    <numpyro_sg.spike_slab.SpikeSlab.log_density_fn>`, ``gammas`` the m models (m, p): the
    model-averaged gradient of the paper's Langevin step, one vectorised evaluation.

    **Example:**

    .. code-block:: python

        value, grad = model_averaged_gradient(ss.log_density_fn((X, y)), unravel, flat,
                                              chain.gammas, indices)
    """

    def mean_log_density(x):
        params = unravel(x)
        return jnp.mean(jax.vmap(lambda g: log_density(params, g, indices))(gammas))

    return jax.value_and_grad(mean_log_density)(flat)


def coordinate_prior_table(ss: SpikeSlab, values, theta, model_args, model_kwargs):
    """The (2, 2, p) :func:`coordinate_table` of the model's coordinate prior at ±θ (exact for a
    per-coordinate prior, the informed proposal's approximation otherwise)."""
    cp = ss.coordinate_prior_fn(model_args, model_kwargs)
    both = jax.vmap(lambda t: cp(values, t))(jnp.stack([theta, -theta]))
    return coordinate_table(*(jax.tree.map(lambda a, s=s: a[s], both) for s in (0, 1)))
