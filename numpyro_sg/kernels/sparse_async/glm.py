r"""One iteration of SparseAsync on the GLM fast path (linear predictor η = offset + X·β of a
Gaussian / Bernoulli / Poisson likelihood, Normal spike and slab, θ the only continuous site).

The active set is a padded index list of static size ``max_active``; STEP 1
(:func:`glm_block_move`) gathers the size(δ) active columns of X, padded to the next bucket
(8, 16, 32, …), STEP 2 (:func:`glm_indicator_update`) the J chosen ones, so an iteration
costs O(N·(size(δ) + J)) (plus O(N·size(δ)²) for the exact Gaussian draw), independent of p.
The asynchronous update's one gradient is computed from those columns in O(N·J)
(:func:`glm_async_gradient`); the primitives shared with the dense path are in :mod:`.updates`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax, random

from numpyro_sg.kernels.guard import all_finite, freeze
from numpyro_sg.kernels.sparse_async.setup import SPIKE_KEY
from numpyro_sg.kernels.sparse_async.updates import (
    async_update,
    block_move,
    compact_active,
    draw_subset,
    evaluation_shift,
    gaussian_block_draw,
    norm_logpdf,
    sequential_sweep,
)


class GLMView(NamedTuple):
    """The data rows of one fast-path iteration: ``columns(cols)`` gives X[rows][:, cols]
    (out-of-range columns are 0), per-datum terms are ``scale * family.loglik(eta, y, params)``."""

    columns: Callable
    y: Any
    offset: Any
    params: Any
    scale: Any


def glm_view(plan, mb, state, model_args, model_kwargs, key):
    """``(GLMView, batch_state)``: all data (exact, async) or a mini-batch (sgld)."""
    aux = state.aux
    if plan.variant != "sgld":  # all data: columns are contiguous rows of the (p, N) copy
        def columns(cols):
            return jnp.take(aux.Xt, cols, axis=0, mode="fill", fill_value=0).T

        return GLMView(columns, aux.y, aux.offset, aux.params, 1.0), state.batch_state
    ss = plan.ss
    X = ss.design_fn(model_args, model_kwargs)({ss.coefficient: state.z[ss.coefficient]})
    if plan.row_axes is not None:  # a stratified mini-batch: each shard draws its own rows
        key = random.fold_in(key, lax.axis_index(plan.row_axes))
    indices, batch_state = mb.draw(key, state.batch_state)
    rows = indices[ss.plate.name]

    def columns(cols):
        return X.at[rows[:, None], cols[None, :]].get(mode="fill", fill_value=0)

    params = {k: v[rows] for k, v in aux.params.items()}
    view = GLMView(columns, aux.y[rows], aux.offset[rows], params, X.shape[0] / rows.shape[0])
    return view, batch_state


def bucket_move(plan, view, aux, theta, active, size, step_size, width):
    """STEP 1 for a bucket of static ``width``: ``key -> (padded block, η, BlockMove fields)``."""
    family = plan.ss.glm.family

    def move(key):
        cols = active[:width]
        mask = jnp.arange(width) < size
        Xa = view.columns(cols)
        u = jnp.where(mask, theta.at[cols].get(mode="fill", fill_value=0), 0.0)
        mu = aux.prior.slab_loc.at[cols].get(mode="fill", fill_value=0.0)
        sd = jnp.where(mask, aux.prior.slab_scale.at[cols].get(mode="fill", fill_value=1.0), 1.0)
        if plan.inner == "gaussian":
            w = 1.0 / view.params["scale"] ** 2
            u = gaussian_block_draw(key, Xa, w, view.y - view.offset, mu, sd, mask, total=plan.total)
            one = jnp.ones((), u.dtype)
            acc, norm, finite = one, one, all_finite(u)  # no gradient: the guard norm's floor
        else:
            def logp_grad(v):  # the likelihood's value and gradient: one sum over the rows
                eta = view.offset + Xa @ v
                lik, score = plan.total((jnp.sum(family.loglik(eta, view.y, view.params)),
                                         Xa.T @ family.dloglik(eta, view.y, view.params)))
                lp = jnp.sum(jnp.where(mask, norm_logpdf(v, mu, sd), 0.0)) + view.scale * lik
                g = -(v - mu) / sd**2 + view.scale * score
                return lp, jnp.where(mask, g, 0.0)

            u, acc, norm, finite = block_move(plan.inner, key, u, logp_grad, step_size,
                                              mask.astype(u.dtype))
        padded = jnp.zeros((plan.max_active,), u.dtype).at[:width].set(u)
        return padded, view.offset + Xa @ u, acc, norm, finite

    return move


def glm_block_move(plan, view, aux, theta, active, size, step_size, key):
    """STEP 1 on the fast path: the active block, padded to the smallest bucket that holds it,
    is drawn exactly or moved by MALA / SGLD.  Returns ``(θ, η at β = θ·δ, acceptance
    probability, guard norm, finite)``."""
    branches = [bucket_move(plan, view, aux, theta, active, size, step_size, w) for w in plan.buckets]
    which = jnp.searchsorted(jnp.asarray(plan.buckets), size)
    u, eta, acc, norm, finite = lax.switch(which, branches, key)
    return theta.at[active].set(u, mode="drop"), eta, acc, norm, finite


def glm_async_gradient(X_J, eta, theta_J, delta_J, family, y, params, scale=1.0, second=False,
                       point="current", total=None):
    r"""G_j = ∂ℓ/∂β_j (and H_j = ∂²ℓ/∂β_j²) for the chosen coordinates of a GLM, O(n·J).

    ℓ(β) = scale·Σ_i f(η_i), η = offset + X·β (``family.loglik`` f).  ``eta`` is η at the
    current β = θ·δ; the evaluation point sets the chosen coordinates of β to θ_J
    (``point="current"``: all on) or to 0 (``"excluded"``: all off), i.e. η_e = η + X_J·Δ with
    Δ = :func:`evaluation_shift`; then G = scale·X_Jᵀ f′(η_e) and H = scale·(X_J²)ᵀ f″(η_e).

    :param X_J: (n, J) columns of the chosen coordinates.
    :param eta: (n,) linear predictor at the current β.
    :param theta_J: (J,) coefficients θ_J (fresh spike draws for the excluded ones).
    :param delta_J: (J,) current indicators.
    :param family: a :class:`~numpyro_sg.spike_slab.GLMFamily` (``GLM_FAMILIES[name]``).
    :param y: (n,) observations.
    :param params: the family's other parameters (``{"scale": σ}`` for the Gaussian).
    :param scale: N/n for a mini-batch (1 for the full data).
    :param bool second: also return H (for ``taylor="second"``).
    :param str point: ``"current"`` or ``"excluded"``.
    :param total: optional function summing (G, H) over the data shards when the rows are this
        device's share (one ``psum``); ``None`` when they are all the rows.
    :return: ``(G, H)``, H ``None`` unless ``second``.

    **Example:**

    .. code-block:: python

        G, H = glm_async_gradient(X[:, chosen], X @ (theta * delta), theta[chosen],
                                  delta[chosen], GLM_FAMILIES["bernoulli"], y, {}, second=True)
    """
    eta_e = eta + X_J @ evaluation_shift(theta_J, delta_J, point)
    G = scale * (X_J.T @ family.dloglik(eta_e, y, params))
    H = scale * ((X_J * X_J).T @ family.d2loglik(eta_e, y, params)) if second else None
    return (G, H) if total is None else total((G, H))


def glm_indicator_update(plan, view, aux, theta, delta, eta, keys):
    """STEP 2 on the fast path: returns (chosen, their old δ, their θ, their new δ)."""
    k_sub, k_spike, k_ber = keys
    J, family = plan.update_size, plan.ss.glm.family
    chosen = draw_subset(k_sub, theta.shape[0], J)
    d_J = delta[chosen]
    prior = jax.tree.map(lambda a: a[chosen], aux.prior)
    fresh = prior.spike_loc + prior.spike_scale * random.normal(k_spike, (J,), theta.dtype)
    th_J = jnp.where(d_J == 1, theta[chosen], fresh)
    lo = (prior.logit_prior + norm_logpdf(th_J, prior.slab_loc, prior.slab_scale)
          - norm_logpdf(th_J, prior.spike_loc, prior.spike_scale))
    X_J = view.columns(chosen)  # (n, J)
    if plan.variant == "exact":
        Xt_J = X_J.T

        def conditional(eta, t):  # O(n): switch coordinate chosen[t] off, then on
            eta0 = eta - d_J[t] * th_J[t] * Xt_J[t]
            eta1 = eta0 + th_J[t] * Xt_J[t]
            ll = family.loglik(eta1, view.y, view.params) - family.loglik(eta0, view.y, view.params)
            return lo[t] + view.scale * plan.total(jnp.sum(ll)), eta1, eta0

        V = sequential_sweep(k_ber, eta, conditional, J)[1]
    else:
        G, H = glm_async_gradient(X_J, eta, th_J, d_J, family, view.y, view.params, view.scale,
                                  second=plan.taylor == "second", point=plan.point, total=plan.total)
        V = async_update(k_ber, lo, th_J, G, H, plan.taylor, plan.point)
    return chosen, d_J, th_J, V


def glm_iteration(plan, mb, state, model_args, model_kwargs):
    """STEP 1 and STEP 2 on the fast path: ``(new state, guard norm, finite)``; an overflow of
    the active list sets ``overflow``, which the guard treats as a blow-up (the chain freezes)."""
    ss = plan.ss
    key, k_sub, k_inner, k_spike, k_ber, k_batch, k_out = random.split(state.rng_key, 7)
    view, batch_state = glm_view(plan, mb, state, model_args, model_kwargs, k_batch)
    theta, delta = state.z[ss.coefficient], state.z[ss.indicator]
    theta, eta, acc, norm, finite = glm_block_move(plan, view, state.aux, theta, state.active,
                                                   state.model_size, state.step_size, k_inner)
    chosen, d_J, th_J, V = glm_indicator_update(plan, view, state.aux, theta, delta, eta,
                                                (k_sub, k_spike, k_ber))
    delta, theta = delta.at[chosen].set(V), theta.at[chosen].set(th_J)
    active, count = compact_active(state.active, delta, chosen, (d_J == 0) & (V == 1))
    new = state._replace(
        i=state.i + 1, z={ss.coefficient: theta, ss.indicator: delta, SPIKE_KEY: k_out},
        accept_prob=acc, model_size=count, active=active, batch_state=batch_state, rng_key=key,
    )
    frozen = state._replace(i=state.i + 1, rng_key=key, overflow=jnp.array(True))
    return freeze(count > plan.max_active, frozen, new), norm, finite
