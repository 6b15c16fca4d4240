r"""How ESGLD evaluates its target: the indicator targets of the chains on γ, their
acceptance and penalty, the paper's model-averaged gradient, and the control variates.

**Indicator targets.** An :class:`IndicatorTarget` evaluates log π(γ, θ | X_S) proposal by
proposal: :func:`glm_indicator_target` updates the linear predictor of a GLM likelihood for
the one or two changed coordinates (O(n)), :func:`generic_indicator_target` runs the model;
:func:`coordinate_table` holds a per-coordinate prior at ±θ.  :func:`acceptance_probability`
is the Metropolis–Hastings probability of one proposal; :func:`penalty` the penalty method
for a noisy ratio (Ceperley & Dewing (1999), "The penalty method for random walks with
uncertain energies"): the mini-batch estimate of a proposal's log-likelihood difference,
Σ_{i∈S} a_i with a_i = (N/n)·Δℓ_i, has variance σ̂² = n·var_i(a_i) (times 1 − n/N without
replacement), and σ̂²/2 is subtracted from the log acceptance ratio.

**The paper's gradient.** :func:`model_averaged_gradient` is the gradient of the Langevin
step of Song, Sun, Ye & Liang (2020), "Extended stochastic gradient MCMC for large-scale
Bayesian variable selection": (1/m)·Σ_k ∇_θ log π(θ | γ_k, X_S).

**Control variates** for a GLM likelihood ℓ_i(η_i), η = X·β, β = θ·γ (the default ESGLD).
Around an anchor β̂ (an :class:`~numpyro_sg.infer.minibatch.Anchor` with its Hessian,
:func:`glm_anchor`) each datum's term is expanded to second order in η̂_i = x_iᵀβ̂,

.. math::

   \tilde\ell_i(\eta) = \ell_i(\hat\eta_i) + \ell_i'(\hat\eta_i)(\eta-\hat\eta_i)
                        + \tfrac12\ell_i''(\hat\eta_i)(\eta-\hat\eta_i)^2 ,

whose full-data sum is the quadratic L̃(β) = L(β̂) + gᵀδ + ½ δᵀHδ, δ = β − β̂, with
g = Σ_i x_i ℓ'_i(η̂_i) and H = Σ_i x_i x_iᵀ ℓ''_i(η̂_i) computed once per anchor (O(N·p²),
one matrix product).  The log-likelihood is estimated by

.. math::

   \hat L(\beta) = \tilde L(\beta) + \frac{N}{n}\sum_{i\in S} r_i(\beta),\qquad
   r_i = \ell_i - \tilde\ell_i ,

unbiased for L(β), exact for a Gaussian likelihood (r_i ≡ 0) and with a noise that scales
with the third derivative and ‖η − η̂‖³ otherwise (:func:`remainder_terms`); its gradient is
:func:`cv_loglik_gradient`.  :func:`laplace_step_scale` is the conditional posterior variance
of θ_j under L̃, the unit of the default step size.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from numpyro_sg.infer.minibatch import Anchor
from numpyro_sg.spike_slab import GLMBatch, GLMFamily, SpikeSlab


class IndicatorTarget(NamedTuple):
    """How :func:`~numpyro_sg.kernels.esgld.paper.rjmh_indicator_chain` evaluates
    log π(γ, θ | X_S) (pure callables).

    ``init(gamma, theta) -> carry`` evaluates the start; ``update(carry, gamma, theta, gamma2,
    theta2, proposal) -> (d_log_prior, d_terms, carry2)`` the proposal (γ2, θ2): the change of
    the log prior (every site outside the plate) and of the (n,) scaled per-datum
    log-likelihood terms, and the carry at (γ2, θ2).  Build one with
    :func:`generic_indicator_target`, :func:`glm_indicator_target` or :func:`indicator_target`.
    """

    init: Callable
    update: Callable


def acceptance_probability(log_ratio, valid=True):
    """min(1, exp(``log_ratio``)) where ``valid`` and the ratio is not NaN, else 0: the
    Metropolis–Hastings acceptance probability of one proposal.

    >>> import jax.numpy as jnp
    >>> acceptance_probability(jnp.array([-jnp.inf, jnp.log(0.5), 3.0, jnp.nan])).tolist()
    [0.0, 0.5, 1.0, 0.0]
    """
    ok = valid & ~jnp.isnan(log_ratio)
    return jnp.where(ok, jnp.exp(jnp.minimum(jnp.where(ok, log_ratio, -jnp.inf), 0.0)), 0.0)


def penalty(delta_terms, fpc=1.0, total=None):
    """σ̂²/2 with σ̂² = n·var_i(a_i)·fpc, a_i the scaled per-datum log-likelihood differences.

    The penalty method for a noisy Metropolis–Hastings ratio subtracts it from the log
    acceptance ratio; ``fpc`` is the finite-population correction (1 − n/N without
    replacement, 1 with replacement).  Zero for n < 2.  ``total`` sums (n, Σa, Σa²) over
    data shards (``delta_terms`` one shard's rows), ``None`` on one device.

    **Example:**

    .. code-block:: python

        penalty(jnp.array([1.0, -1.0, 3.0]))    # 0.5 · 3 · var = 6.0
    """
    n = delta_terms.shape[0]
    if total is None:
        if n < 2:
            return jnp.zeros((), delta_terms.dtype)
        return 0.5 * n * jnp.var(delta_terms, ddof=1) * fpc
    n, s1, s2 = total(jnp.stack([jnp.asarray(n, delta_terms.dtype), jnp.sum(delta_terms),
                                 jnp.sum(delta_terms**2)]))
    var = (s2 - s1 * s1 / n) / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(n >= 2, 0.5 * n * jnp.maximum(var, 0.0) * fpc, 0.0)


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


#: supports up to this size use a small gather in :func:`hess_matvec`
_SMALL_SUPPORT = 64


class CVBatch(NamedTuple):
    """The mini-batch of a control-variate estimate: ``Xt`` the design rows transposed (p, n),
    ``y``, ``params``, ``scale`` = N/n, and at the anchor ``eta_hat`` η̂_i, ``ll_hat`` ℓ_i(η̂_i),
    ``d1_hat`` ℓ'_i(η̂_i), ``d2_hat`` ℓ''_i(η̂_i)."""

    Xt: Any
    y: Any
    params: Any
    scale: Any
    eta_hat: Any
    ll_hat: Any
    d1_hat: Any
    d2_hat: Any


def glm_anchor(full: GLMBatch, family: GLMFamily, beta, total=None) -> Anchor:
    """The second-order :class:`~numpyro_sg.infer.minibatch.Anchor` of a GLM log-likelihood at
    β̂ = ``beta``: g = Σ_i x_i·ℓ'_i(η̂_i) and H = Σ_i x_i x_iᵀ·ℓ''_i(η̂_i) of the full data ``full`` (a
    :class:`~numpyro_sg.spike_slab.GLMBatch` at β̂ = ``beta``, scale 1): O(N·p²), one product.
    ``total`` sums g and H over data shards (``full`` one shard's rows; one reduction of
    p + p² floats), ``None`` on one device.

    **Example:**

    .. code-block:: python

        anchor = glm_anchor(ss.glm_batch_fn((X, y))({"theta": b}, b), ss.glm.family, b)
    """
    d1 = full.scale * family.dloglik(full.eta, full.y, full.params)
    d2 = full.scale * family.d2loglik(full.eta, full.y, full.params)
    X = full.X
    grad, hess = X.T @ d1, X.T @ (d2[:, None] * X)
    if total is not None:
        grad, hess = total((grad, hess))
    return Anchor(jnp.asarray(beta, grad.dtype), grad, 0.5 * (hess + hess.T))


def cv_batch(batch: GLMBatch, family: GLMFamily) -> CVBatch:
    """The :class:`CVBatch` of a mini-batch ``batch`` whose ``eta`` is taken at the anchor β̂.

    **Example:**

    .. code-block:: python

        cvb = cv_batch(ss.glm_batch_fn((X, y))(values, anchor.point, indices), ss.glm.family)
    """
    eta, y, params = batch.eta, batch.y, batch.params
    return CVBatch(batch.X.T, y, params, batch.scale, eta, family.loglik(eta, y, params),
                   family.dloglik(eta, y, params), family.d2loglik(eta, y, params))


def remainder_terms(cvb: CVBatch, family: GLMFamily, eta):
    """(N/n)·r_i with r_i = ℓ_i(η_i) − ℓ̃_i(η_i), ℓ̃ the second-order expansion at η̂_i: the
    mini-batch part of the control-variate estimate L̂ (zero for a Gaussian likelihood).

    **Example:**

    .. code-block:: python

        remainder_terms(cvb, fam, cvb.eta_hat)      # zeros: the expansion is exact at η̂
    """
    u = eta - cvb.eta_hat
    approx = cvb.ll_hat + cvb.d1_hat * u + 0.5 * cvb.d2_hat * u * u
    return cvb.scale * (family.loglik(eta, cvb.y, cvb.params) - approx)


def hess_matvec(hess, v, max_nonzero: int | None = None):
    """H·v for a symmetric H, reading only the rows of the (at most ``max_nonzero``) non-zero
    entries of v: O(p·k) instead of O(p²) (δ = β − β̂ is sparse when β and β̂ are models of
    at most q variables, k = 2q; a support of at most 64 reads 64 rows).  ``None``: the
    dense product.

    **Example:**

    .. code-block:: python

        hess_matvec(H, beta - anchor.point, 2 * q)
    """
    if max_nonzero is None or max_nonzero >= v.shape[0]:
        return hess @ v
    count = jnp.sum(v != 0)

    def gathered(k):
        idx = jnp.nonzero(v != 0, size=k, fill_value=0)[0]
        return jnp.where(jnp.arange(k) < count, v[idx], 0.0) @ hess[idx]

    small = min(_SMALL_SUPPORT, max_nonzero)
    if small == max_nonzero:
        return gathered(max_nonzero)
    return lax.cond(count <= small, lambda: gathered(small), lambda: gathered(max_nonzero))


def cv_loglik_gradient(surrogate_grad, cvb: CVBatch, family: GLMFamily, eta, total=None):
    """∇_β L̂ = G + Xᵀ_S·(N/n)·(ℓ'_i(η_i) − ℓ'_i(η̂_i) − ℓ''_i(η̂_i)·(η_i − η̂_i)): the
    control-variate gradient of the log-likelihood in β at the state whose surrogate gradient
    is G = g + H·(β − β̂) and mini-batch predictor η (O(n·p)).  ``total`` sums the mini-batch
    part over data shards (``cvb`` one shard's rows), ``None`` on one device.

    **Example:**

    .. code-block:: python

        grad_beta = cv_loglik_gradient(chain.surrogate_grad, cvb, fam, chain.eta)
    """
    u = eta - cvb.eta_hat
    a = cvb.scale * (family.dloglik(eta, cvb.y, cvb.params) - cvb.d1_hat - cvb.d2_hat * u)
    batch_part = cvb.Xt @ a
    return surrogate_grad + (batch_part if total is None else total(batch_part))


def laplace_step_scale(gamma, hess_diag, prior_curvature, floor=1e-12):
    """v_j = 1 / (γ_j·(−H_jj) − ∂²log π(θ|γ)/∂θ_j²): the conditional posterior variance of θ_j
    under the quadratic surrogate, which makes ε_j = h·v_j a dimensionless step h
    ("ε in units of the posterior scale"; excluded coordinates get their spike variance).

    **Example:**

    .. code-block:: python

        v = laplace_step_scale(gamma, jnp.diag(anchor.hess), -1 / prior_var)
    """
    prec = gamma.astype(hess_diag.dtype) * (-hess_diag) - prior_curvature
    return 1.0 / jnp.maximum(prec, floor)
