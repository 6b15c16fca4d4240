"""Per-group integrals over local latent variables, vectorised over the groups of a mini-batch.

Every function takes ``f``, the per-group log joint: ``b (n, k) -> (n,)`` with
f_g(b_g) = log p(y_g, b_g | θ), unscaled (the mini-batch's N/n factor is applied later, by the
plate, to the result).  The groups are independent given θ, so the Hessian of Σ_g f_g is
block diagonal; :func:`group_hessians` gets its n blocks of k×k from k Hessian-vector products
(cost O(n·k²), memory O(n·k²)).

* :func:`gaussian_marginal`: exact log p(y_g | θ) when f_g is quadratic in b_g (one Newton step
  from b = 0 lands on the mode b̂ and the Laplace formula is exact):
  log p(y_g | θ) = f_g(b̂_g) + (k/2) log 2π − ½ log det(−H_g).
* :func:`importance_marginal`: Fisher's identity ∇_θ log p(y_g | θ) = E[∇_θ log p(y_g, b_g | θ) |
  y_g, θ] by m self-normalised importance draws from a Student-t proposal centred at the
  conditional mode with the Laplace scale; the returned value is the importance estimate of
  log p(y_g | θ) whose θ-gradient (draws and proposal held fixed) is that estimator.
* :func:`imputation_surrogate`: Algorithm S1 of Song, Sun, Ye & Liang (2020), 'Extended
  stochastic gradient MCMC for large-scale Bayesian variable selection': m draws from the
  (Laplace) Gaussian conditional, equal weights; its θ-gradient is the mean of the complete-data
  gradients (exact conditional draws when the conditional is Gaussian).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import random
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import gammaln, logsumexp

LOG_2PI = math.log(2.0 * math.pi)  # a Python float: importing must not start a JAX backend


class LocalEstimate(NamedTuple):
    """Per-group results: ``value`` (n,) the log marginal (or surrogate) whose θ-gradient is the
    estimator, ``mean`` (n, k) and ``sd`` (n, k) of the locals' conditional (Rao-Blackwell
    moments; Laplace for the Gaussian method), ``ess`` (n,) the importance effective sample size
    (m for equal weights)."""

    value: jnp.ndarray
    mean: jnp.ndarray
    sd: jnp.ndarray
    ess: jnp.ndarray


def group_hessians(f: Callable, b):
    """``(value (n,), gradient (n, k), Hessian blocks (n, k, k))`` of the per-group ``f`` at ``b``."""
    n, k = b.shape

    def grad_sum(x):
        return jax.grad(lambda y: jnp.sum(f(y)))(x)

    g, hvp = jax.linearize(grad_sum, b)
    basis = jnp.broadcast_to(jnp.eye(k, dtype=b.dtype)[:, None, :], (k, n, k))
    cols = jax.vmap(hvp)(basis)            # cols[j, g, i] = H_g[i, j]
    return f(b), g, jnp.transpose(cols, (1, 2, 0))


#: up to this many locals per group the k×k algebra below is unrolled elementwise code; above,
#: LAPACK.  Besides being faster on tiny blocks, it keeps batched LAPACK calls out of the
#: programs: jaxlib < 0.11's CPU LAPACK kernels split a large batch over XLA's thread pool and
#: wait for it from a pool thread, which deadlocks when as many such calls run at once as the
#: pool has threads (two on a 2-core machine).
SMALL_K = 8


def _cholesky(A):
    """Lower Cholesky factor of A (..., k, k) (NaN where A is not positive definite)."""
    k = A.shape[-1]
    if k > SMALL_K:
        return jnp.linalg.cholesky(A)
    L = [[jnp.zeros_like(A[..., 0, 0])] * k for _ in range(k)]
    for j in range(k):
        L[j][j] = jnp.sqrt(A[..., j, j] - sum(L[j][m] ** 2 for m in range(j)))
        for i in range(j + 1, k):
            L[i][j] = (A[..., i, j] - sum(L[i][m] * L[j][m] for m in range(j))) / L[j][j]
    return jnp.stack([jnp.stack(row, -1) for row in L], -2)


def _solve_lower(C, B, transpose: bool = False):
    """X with C X = B (``transpose``: Cᵀ X = B), C (..., k, k) lower triangular, B (..., k, r)."""
    k = C.shape[-1]
    if k > SMALL_K:
        return solve_triangular(jnp.swapaxes(C, -1, -2) if transpose else C, B, lower=not transpose)
    x = [None] * k
    for i in (reversed(range(k)) if transpose else range(k)):
        others = range(i + 1, k) if transpose else range(i)
        acc = B[..., i, :] - sum((C[..., m, i] if transpose else C[..., i, m])[..., None] * x[m]
                                 for m in others)
        x[i] = acc / C[..., i, i][..., None]
    return jnp.stack(x, -2)


def _chol_neg(H):
    """Cholesky factor C (lower) of −H per group, symmetrised."""
    return _cholesky(-0.5 * (H + jnp.swapaxes(H, -1, -2)))


def _solve_neg(C, g):
    """(−H)⁻¹ g per group from the Cholesky factor C of −H."""
    return _solve_lower(C, _solve_lower(C, g[..., None]), transpose=True)[..., 0]


def _cov_sd(C):
    """Per-coordinate sd of the Laplace covariance (−H)⁻¹ = C⁻ᵀC⁻¹."""
    k = C.shape[-1]
    Cinv = _solve_lower(C, jnp.broadcast_to(jnp.eye(k, dtype=C.dtype), C.shape))
    return jnp.sqrt(jnp.sum(Cinv**2, axis=-2))


def gaussian_marginal(f: Callable, n: int, k: int, dtype) -> LocalEstimate:
    """Exact log p(y_g | θ) for a conditionally Gaussian local (−H_g constant in b_g).

    One Newton step from b = 0: b̂ = (−H)⁻¹ ∇f(0), then f(b̂) + (k/2) log 2π − ½ log det(−H).
    Differentiable in θ (autodiff through the Newton step gives the exact marginal's gradient).
    """
    b0 = jnp.zeros((n, k), dtype)
    _, g0, H = group_hessians(f, b0)
    C = _chol_neg(H)
    bhat = b0 + _solve_neg(C, g0)
    logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(C, axis1=-2, axis2=-1)), axis=-1)
    value = f(bhat) + 0.5 * k * LOG_2PI - 0.5 * logdet
    return LocalEstimate(value, bhat, _cov_sd(C), jnp.full((n,), jnp.inf, dtype))


def conditional_mode(f: Callable, n: int, k: int, dtype, steps: int = 25, max_step: float = 2.0,
                     tolerance: float = 1e-3):
    """The conditional mode b̂_g and the Cholesky factor of −H_g there, by damped Newton steps
    from 0 (each step's largest coordinate capped at ``max_step``) until every group's step is
    below ``tolerance`` of its conditional sds (‖C⁻¹∇f‖∞, C the Cholesky factor of −H_g), at most
    ``steps``; no gradient flows through the result (it only places the proposal)."""
    def body(carry):
        taken, b, _ = carry
        _, g, H = group_hessians(f, b)
        C = _chol_neg(H)
        step = _solve_neg(C, g)
        big = jnp.max(jnp.abs(step), axis=-1, keepdims=True)
        step = step * jnp.minimum(1.0, max_step / jnp.maximum(big, 1e-30))
        ok = jnp.all(jnp.isfinite(step), axis=-1, keepdims=True)
        size = jnp.max(jnp.where(ok, jnp.abs(_solve_lower(C, g[..., None])[..., 0]), 0.0))
        return taken + 1, jnp.where(ok, b + step, b), size

    start = (jnp.int32(0), jnp.zeros((n, k), dtype), jnp.asarray(jnp.inf, dtype))
    _, b, _ = jax.lax.while_loop(lambda c: (c[0] < steps) & (c[2] > tolerance), body, start)
    _, _, H = group_hessians(f, b)
    return jax.lax.stop_gradient(b), jax.lax.stop_gradient(_chol_neg(H))


def student_t_draws(key, bhat, C, m: int, df: float):
    """``(draws (m, n, k), log q (m, n))``: m multivariate Student-t draws per group with location
    b̂, scale matrix (C Cᵀ)⁻¹ and ``df`` degrees of freedom (``df=inf``: Gaussian)."""
    n, k = bhat.shape
    kz, kc = random.split(key)
    z = random.normal(kz, (m, n, k), bhat.dtype)
    gaussian = math.isinf(float(df))
    if gaussian:
        w = jnp.ones((m, n, 1), bhat.dtype)
    else:
        w = jnp.sqrt(df / (2.0 * random.gamma(kc, df / 2.0, (m, n, 1), bhat.dtype)))
    x = jax.vmap(lambda zz: _solve_lower(C, zz[..., None], transpose=True)[..., 0])(z * w)
    draws = bhat + x
    half_logdet = jnp.sum(jnp.log(jnp.diagonal(C, axis1=-2, axis2=-1)), axis=-1)  # ½ log det(−H)
    q2 = jnp.sum(z**2, axis=-1)  # Mahalanobis distance of the Gaussian part
    if gaussian:
        logq = half_logdet - 0.5 * k * LOG_2PI - 0.5 * q2
    else:
        maha = q2 * w[..., 0] ** 2
        logq = (gammaln((df + k) / 2) - gammaln(df / 2) - 0.5 * k * jnp.log(df * jnp.pi)
                + half_logdet - 0.5 * (df + k) * jnp.log1p(maha / df))
    return jax.lax.stop_gradient(draws), jax.lax.stop_gradient(logq)


def jackknifed_log_mean_exp(logw):
    """log (1/m) Σ_s exp(logw_s) over axis 0, jackknifed: m·L − (m − 1)·mean_j L₋ⱼ with L₋ⱼ the
    same without draw j.  The θ-gradient of log (1/m) Σ_s w_s is the self-normalised importance
    estimate of Fisher's identity, biased by O(1/m) per group — a bias that adds up over the
    groups (measured: ``docs/local_latents.md``, "What the kernels do") — and the jackknife
    removes its O(1/m) term (also from the log marginal itself)."""
    m = logw.shape[0]
    full = logsumexp(logw, axis=0) - math.log(m)
    if m < 2:
        return full
    # memory O(m·n): log(S − e_j) with S = Σ e_s, e = exp(logw − max) — at least 1 except for the
    # largest weight's own row, whose leave-one-out is a logsumexp without it
    top = jnp.arange(m)[:, None] == jnp.argmax(logw, axis=0)[None]
    shift = jax.lax.stop_gradient(jnp.max(logw, axis=0))
    e = jnp.exp(logw - shift)
    rest = jnp.where(top, 1.0, jnp.sum(e, axis=0) - e)
    without_top = logsumexp(jnp.where(top, -jnp.inf, logw), axis=0)
    leave_one_out = jnp.where(top, without_top, shift + jnp.log(rest)) - math.log(m - 1)   # (m, n)
    jackknifed = m * full - (m - 1) * jnp.mean(leave_one_out, axis=0)
    # a group with one draw of positive weight has no leave-one-out estimate without it
    return jnp.where(jnp.sum(jnp.isfinite(logw), axis=0) >= 2, jackknifed, full)


#: importance draws farther than this from the conditional mode, in units of the Laplace scale
#: (Mahalanobis distance under −H_g), are dropped (weight 0) and never evaluated
TAIL_RADIUS = 20.0


def log_joint_within_radius(f: Callable, draws, bhat, C, radius: float = TAIL_RADIUS):
    """``f`` at each draw (m, n, k) → (m, n), −∞ for draws more than ``radius`` Laplace scales
    from the mode ``bhat`` (C the Cholesky factor of −H_g there), which are evaluated at the mode.

    The Student-t(4) proposal puts one draw in 4·10⁶ beyond 70 scales (one local), and there the
    likelihood or its derivative can overflow (a log link's exp(η) at η ≈ −60 in float32: a finite
    value, a NaN derivative of the rate φ/μ). The draw's weight is 0 to float precision, yet the
    chain rule multiplies that 0 by an infinite partial and the θ-gradient of the whole
    mini-batch becomes NaN (the divergence guard then freezes the chain). Dropping such draws makes
    the estimate one of the integral over the ball of that radius: a conditional whose mass
    beyond 20 Laplace scales matters is far from anything the Laplace-scaled proposal can serve."""
    dist2 = jnp.sum(jnp.einsum("nji,mnj->mni", C, draws - bhat) ** 2, axis=-1)   # |Cᵀ(b − b̂)|²
    inside = dist2 <= radius**2
    return jnp.where(inside, jax.vmap(f)(jnp.where(inside[..., None], draws, bhat)), -jnp.inf)


def importance_marginal(f: Callable, n: int, k: int, dtype, key, num_draws: int,
                        df: float = 4.0, newton_steps: int = 25) -> LocalEstimate:
    """Self-normalised importance estimate of log p(y_g | θ) and its θ-gradient (Fisher's identity).

    value_g = log (1/m) Σ_s p(y_g, b_s | θ)/q(b_s), with b_s ~ q = Student-t(df) at the conditional
    mode with the Laplace scale, held fixed: its gradient is Σ_s w̄_s ∇_θ log p(y_g, b_s | θ),
    w̄ the normalised weights; jackknifed over the draws (:func:`jackknifed_log_mean_exp`).  Also returns the weighted mean/sd of the locals and the ESS.
    """
    bhat, C = conditional_mode(f, n, k, dtype, newton_steps)
    draws, logq = student_t_draws(key, bhat, C, num_draws, df)
    logp = log_joint_within_radius(f, draws, bhat, C)            # (m, n)
    logw = logp - logq
    value = jackknifed_log_mean_exp(logw)
    wbar = jax.lax.stop_gradient(jax.nn.softmax(logw, axis=0))  # (m, n)
    mean = jnp.einsum("mn,mnk->nk", wbar, draws)
    var = jnp.einsum("mn,mnk->nk", wbar, (draws - mean) ** 2)
    ess = 1.0 / jnp.sum(wbar**2, axis=0)
    return LocalEstimate(value, mean, jnp.sqrt(var), ess)


def imputation_surrogate(f: Callable, n: int, k: int, dtype, key, num_draws: int,
                         newton_steps: int = 25, gaussian: bool = False) -> LocalEstimate:
    """Algorithm S1's multiple imputation: the mean of f over m Gaussian draws from the (Laplace)
    conditional, draws held fixed.  Its θ-gradient is (1/m) Σ_s ∇_θ log p(y_g, b_s | θ); its
    value is not the log marginal (it lacks the entropy term).  ``gaussian``: the conditional
    is Gaussian, its mode one Newton step from 0 (else damped Newton steps, at most
    ``newton_steps``)."""
    if gaussian:
        _, g0, H = group_hessians(f, jnp.zeros((n, k), dtype))
        C = _chol_neg(H)
        bhat, C = jax.lax.stop_gradient(_solve_neg(C, g0)), jax.lax.stop_gradient(C)
    else:
        bhat, C = conditional_mode(f, n, k, dtype, newton_steps)
    draws, _ = student_t_draws(key, bhat, C, num_draws, jnp.inf)
    value = jnp.mean(jax.vmap(f)(draws), axis=0)
    return LocalEstimate(value, bhat, _cov_sd(C), jnp.full((n,), float(num_draws), dtype))


def resampled_draw(f: Callable, n: int, k: int, dtype, key, num_draws: int, df: float = 4.0,
                   newton_steps: int = 25):
    """One draw (n, k) per group from p(b_g | y_g, θ) ∝ exp f(b_g) by sampling importance
    resampling: ``num_draws`` Student-t(``df``) proposals at the conditional mode with the Laplace
    scale, one kept with probability ∝ its weight p/q (exact as ``num_draws`` → ∞; with
    ``df=inf`` and a Gaussian conditional every weight is equal and the draw is exact)."""
    key_draws, key_pick = random.split(key)
    bhat, C = conditional_mode(f, n, k, dtype, newton_steps)
    draws, logq = student_t_draws(key_draws, bhat, C, num_draws, df)
    logw = log_joint_within_radius(f, draws, bhat, C) - logq        # (m, n)
    pick = random.categorical(key_pick, logw, axis=0)                # (n,)
    return jnp.take_along_axis(draws, pick[None, :, None], axis=0)[0]
