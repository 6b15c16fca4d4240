r"""Control variates for a GLM likelihood ℓ_i(η_i), η = X·β, β = θ·γ (the default ESGLD).

Around an anchor β̂ (:class:`GLMAnchor`, :func:`glm_anchor`) each datum's term is expanded to
second order in η̂_i = x_iᵀβ̂,

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

from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax

from numpyro_sg.spike_slab import GLMBatch, GLMFamily

#: supports up to this size use a small gather in :func:`hess_matvec`
_SMALL_SUPPORT = 64


class GLMAnchor(NamedTuple):
    """The control-variate anchor of a GLM likelihood: ``beta`` β̂ (p,), ``grad``
    g = Σ_i x_i·ℓ'_i(η̂_i) (p,) and ``hess`` H = Σ_i x_i x_iᵀ·ℓ''_i(η̂_i) (p, p), full-data sums."""

    beta: Any
    grad: Any
    hess: Any


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


def glm_anchor(full: GLMBatch, family: GLMFamily, beta, total=None) -> GLMAnchor:
    """g = Σ_i x_i·ℓ'_i(η̂_i) and H = Σ_i x_i x_iᵀ·ℓ''_i(η̂_i) of the full data ``full`` (a
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
    return GLMAnchor(jnp.asarray(beta, grad.dtype), grad, 0.5 * (hess + hess.T))


def cv_batch(batch: GLMBatch, family: GLMFamily) -> CVBatch:
    """The :class:`CVBatch` of a mini-batch ``batch`` whose ``eta`` is taken at the anchor β̂.

    **Example:**

    .. code-block:: python

        cvb = cv_batch(ss.glm_batch_fn((X, y))(values, anchor.beta, indices), ss.glm.family)
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

        hess_matvec(H, beta - anchor.beta, 2 * q)
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
