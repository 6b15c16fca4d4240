r"""The primitives both SparseAsync paths share (:mod:`.glm` and :mod:`.dense`), pure functions
of arrays, each tested alone.

* **STEP 1**, the move of the active block [θ]_δ given δ: an exact draw from its Gaussian
  conditional (:func:`gaussian_block_draw`), or one gradient step (:func:`block_move`): one
  MALA step (:func:`mala_step`) or one SGLD step
  (:func:`~numpyro_sg.kernels.moves.langevin_move`), with the gradient norm the divergence
  guard compares (:func:`~numpyro_sg.kernels.guard.guard_norm`, over the moved coordinates)
  and the warmup adaptation of the MALA step size (:func:`robbins_monro`).
* **STEP 2**, the chosen subset of indicators and their redraw: the subset J of
  ``update_size`` coordinates (:func:`draw_subset`), the sequential Gibbs sweep of the exact
  sampler (:func:`sequential_sweep`), the asynchronous inclusion logits and the independent
  draws of Atchadé & Wang (2023), "A fast asynchronous MCMC sampler for sparse Bayesian
  inference" (:func:`async_inclusion_logits`, :func:`async_update`), and the fast path's
  padded list of active coordinates (:func:`compact_active`).
* The shared evaluation point of the asynchronous gradient: the current β with the chosen
  coordinates switched on or off (:func:`evaluation_shift`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax, random

from numpyro_sg.kernels.guard import all_finite, guard_norm
from numpyro_sg.kernels.moves import langevin_move, langevin_noise_variance


# -------------------------------------------------------------------------------------------
# STEP 1: the block move
# -------------------------------------------------------------------------------------------
class MALAResult(NamedTuple):
    """One MALA step: the new point, its log density and gradient, the acceptance probability."""

    x: Any
    log_density: Any
    grad: Any
    accept_prob: Any


def mala_step(key, x, log_density, grad, logp_grad_fn: Callable, step_size, mask=None) -> MALAResult:
    r"""One Metropolis-adjusted Langevin step targeting exp(log π).

    Proposal x* = x + (ε/2)·∇log π(x) + √ε·ξ (coordinates where ``mask`` is 0 stay put),
    accepted with probability min(1, π(x*)q(x | x*) / (π(x)q(x* | x))), q the Gaussian
    proposal density.  ``log_density`` and ``grad`` are log π and its gradient at x;
    ``logp_grad_fn(x) -> (log π, ∇ log π)``.
    """
    k_noise, k_acc = random.split(key)
    noise = random.normal(k_noise, jnp.shape(x), jnp.result_type(x))
    if mask is not None:
        noise, grad = noise * mask, grad * mask
    prop = x + 0.5 * step_size * grad + jnp.sqrt(step_size) * noise
    lp1, g1 = logp_grad_fn(prop)
    if mask is not None:
        g1 = g1 * mask
    fwd = -jnp.sum((prop - x - 0.5 * step_size * grad) ** 2) / (2 * step_size)
    bwd = -jnp.sum((x - prop - 0.5 * step_size * g1) ** 2) / (2 * step_size)
    log_a = lp1 - log_density + bwd - fwd
    log_a = jnp.where(jnp.isfinite(log_a), log_a, -jnp.inf)
    accept_prob = jnp.exp(jnp.minimum(log_a, 0.0))
    take = random.uniform(k_acc, (), jnp.result_type(x)) < accept_prob
    pick = lambda a, b: jnp.where(take, a, b)  # noqa: E731
    return MALAResult(pick(prop, x), pick(lp1, log_density), pick(g1, grad), accept_prob)


def gaussian_block_draw(key, X, weights, residual, prior_loc, prior_scale, mask=None, total=None):
    r"""Exact draw of a block u ∈ ℝ^m from its Gaussian conditional (STEP 1, ``inner="gaussian"``).

    The target is a Normal prior per coordinate times a Gaussian likelihood in X·u,

    .. math::

       p(u) \propto \exp\Big(-\sum_k \frac{(u_k-\mu_k)^2}{2 s_k^2}
                             - \sum_i \frac{w_i}{2}\,(r_i - x_i^\top u)^2\Big)
       = \mathcal N(P^{-1}b,\; P^{-1}),\quad P = \operatorname{diag}(s^{-2}) + X^\top W X,\;
       b = \mu/s^2 + X^\top W r,

    drawn as u = P⁻¹b + L⁻ᵀξ with P = L·Lᵀ (Cholesky) and ξ ~ N(0, I).  For the active block of
    a linear model with noise sd σ: X the active columns, w = 1/σ², r = y − offset, (μ, s) the
    slab.  ``mask`` (m,) marks the real coordinates of a padded block: the others are 0 on
    return and do not affect the real ones (their columns and prior are ignored).

    :param key: PRNG key.
    :param X: (n, m) design columns of the block.
    :param weights: (n,) likelihood precisions w_i.
    :param residual: (n,) residuals r_i (observations minus the offset).
    :param prior_loc: (m,) prior means μ.
    :param prior_scale: (m,) prior sds s.
    :param mask: optional (m,) bool, True for the real coordinates.
    :param total: optional function summing (XᵀWX, XᵀWr) over the data shards when the rows
        are this device's share (one ``psum``); ``None`` when X holds all the rows.
    :return: u, shape (m,).

    **Example:**

    .. code-block:: python

        u = gaussian_block_draw(key, X[:, active], jnp.full(N, 1 / sigma**2), y,
                                jnp.zeros(k), jnp.ones(k))
    """
    m = X.shape[1]
    mask = jnp.ones((m,), bool) if mask is None else jnp.asarray(mask, bool)
    X = jnp.where(mask[None, :], X, 0.0)
    sd = jnp.where(mask, prior_scale, 1.0)
    gram, score = (X * weights[:, None]).T @ X, X.T @ (weights * residual)
    if total is not None:
        gram, score = total((gram, score))
    precision = jnp.diag(1.0 / sd**2) + gram
    b = jnp.where(mask, prior_loc / sd**2, 0.0) + score
    L = jnp.linalg.cholesky(precision)
    mean = jax.scipy.linalg.cho_solve((L, True), b)
    xi = random.normal(key, (m,), X.dtype)
    u = mean + jax.scipy.linalg.solve_triangular(L.T, xi, lower=False)
    return jnp.where(mask, u, 0.0)


class BlockMove(NamedTuple):
    """One STEP 1 move: the new block ``x``, the MALA acceptance probability ``accept_prob``
    (1 for SGLD and the exact draw), the :func:`~numpyro_sg.kernels.guard.guard_norm` of the gradient and whether the
    log density and gradient were ``finite``."""

    x: Any
    accept_prob: Any
    grad_norm: Any
    finite: Any


def block_move(kind, key, x, logp_grad_fn: Callable, step_size, mask) -> BlockMove:
    r"""STEP 1's gradient move of the coordinates where ``mask`` is 1 (the others stay put).

    ``kind="mala"``: one MALA step, x* = x + (ε/2)·∇log π(x) + √ε·ξ accepted with the
    Metropolis–Hastings probability (:func:`mala_step`); the guard
    reads the gradient at the point kept.  ``kind="sgld"``: one Langevin step
    x' = x + (ε/2)·ĝ(x) + √ε·ξ (:func:`~numpyro_sg.kernels.moves.langevin_move`), ĝ the
    mini-batch gradient; the guard reads ĝ(x), the only gradient the step computes.
    ``logp_grad_fn(x) -> (log π(x), ∇ log π(x))``.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: (-0.5 * jnp.sum(x**2), -x)
    >>> move = block_move("mala", jax.random.PRNGKey(0), jnp.ones(3), f, 0.5, jnp.ones(3))
    >>> move.x.shape, bool(0 <= move.accept_prob <= 1), bool(move.finite)
    ((3,), True, True)
    """
    log_density, grad = logp_grad_fn(x)
    if kind == "mala":
        res = mala_step(key, x, log_density, grad, logp_grad_fn, step_size, mask)
        finite = jnp.isfinite(res.log_density) & all_finite(jnp.where(mask > 0, res.grad, 0.0))
        return BlockMove(res.x, res.accept_prob, guard_norm(res.grad, step_size, mask), finite)
    noise = random.normal(random.split(key)[0], jnp.shape(x), x.dtype) * mask
    new = langevin_move(x, grad * mask, step_size, noise, langevin_noise_variance(step_size))
    finite = jnp.isfinite(log_density) & all_finite(jnp.where(mask > 0, grad, 0.0))
    return BlockMove(new, jnp.ones((), x.dtype), guard_norm(grad, step_size, mask), finite)


def norm_logpdf(x, loc, scale):
    """Log density of N(loc, scale²) at x, elementwise."""
    return -0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi)


def robbins_monro(step_size, accept_prob, iteration, target=0.5, rate=0.55):
    """log ε ← log ε + (k+1)^(−rate)·(α_k − target) (the authors' MALA adaptation).

    >>> round(float(robbins_monro(0.1, 0.9, 0)), 4)   # accepted often: a larger step
    0.1492
    """
    gain = (iteration + 1.0) ** (-rate)
    return jnp.exp(jnp.log(step_size) + gain * (accept_prob - target))


# -------------------------------------------------------------------------------------------
# STEP 2: the indicators
# -------------------------------------------------------------------------------------------
def draw_subset(key, p: int, J: int):
    """A uniformly random subset of {0, …, p−1} of size J, as a (J,) int32 array (distinct).

    For p > 8·J: the first J distinct values (in order of appearance) of 2·J i.i.d. uniform
    integers, O(J log J); in the (rare) event of fewer than J distinct values, or for small p,
    an exact ``random.choice`` without replacement (O(p log p)).  Both are exactly uniform: the
    event "J distinct values among 2·J draws" is invariant under relabelling.

    >>> import jax
    >>> chosen = draw_subset(jax.random.PRNGKey(0), 10_000, 100)
    >>> chosen.shape, len(set(chosen.tolist()))
    ((100,), 100)
    """
    if J > p:
        raise ValueError(f"cannot draw {J} distinct coordinates out of p = {p}.")
    k1, k2 = random.split(key)
    if p <= 8 * J:
        return random.choice(k2, p, (J,), replace=False).astype(jnp.int32)
    M = 2 * J
    d = random.randint(k1, (M,), 0, p, dtype=jnp.int32)
    order = jnp.argsort(d, stable=True)
    s = d[order]
    first_sorted = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    is_first = jnp.zeros((M,), bool).at[order].set(first_sorted)
    pos = jnp.where(is_first, jnp.arange(M), M + jnp.arange(M))
    subset = d[jnp.argsort(pos)[:J]]
    return lax.cond(
        jnp.sum(is_first) >= J,
        lambda: subset,
        lambda: random.choice(k2, p, (J,), replace=False).astype(jnp.int32),
    )


def sequential_sweep(key, carry, conditional: Callable, num_updates: int):
    r"""The exact sampler's STEP 2: ``num_updates`` single-site Gibbs updates of binary
    indicators, in turn.

    For t = 0, …, T−1: ``logit, on, off = conditional(carry, t)`` gives the log-odds of the
    t-th chosen indicator being 1 given the current ``carry`` (which encodes the other
    indicators — δ itself, or a linear predictor updated in O(N)) and the carry with it set to
    1 (``on``) or to 0 (``off``); then v_t ~ Bernoulli(sigmoid(logit)) (key
    ``fold_in(key, t)``) and carry ← ``on`` if v_t else ``off``.  Each update conditions on
    the ones before it, so the sweep leaves the joint law of the indicators invariant.

    :param key: PRNG key.
    :param carry: a pytree: the state the conditionals read.
    :param conditional: ``(carry, t) -> (logit, carry_on, carry_off)``.
    :param int num_updates: T.
    :return: ``(carry, V)`` — the final carry and the T draws V (int32).

    **Example:**

    .. code-block:: python

        def conditional(delta, t):
            j = chosen[t]
            on, off = delta.at[j].set(1), delta.at[j].set(0)
            return log_target(on) - log_target(off), on, off

        delta, V = sequential_sweep(key, delta, conditional, chosen.shape[0])
    """

    def body(c, t):
        logit, on, off = conditional(c, t)
        v = random.bernoulli(random.fold_in(key, t), jax.nn.sigmoid(logit))
        return jax.tree.map(lambda a, b: jnp.where(v, a, b), on, off), v.astype(jnp.int32)

    return lax.scan(body, carry, jnp.arange(num_updates))


def async_inclusion_logits(prior_logodds, theta, grad, hess=None, taylor="first", point="current"):
    """logit q̃_j = prior log-odds + θ_j·G_j + Q_j for the chosen coordinates.

    ``taylor="first"``: Q = 0; ``"sensitive"``: Q = ½θ_j²G_j² (eq. (6) of Atchadé & Wang
    (2023)); ``"second"``: Q = ±½θ_j²·abs(∂²ℓ/∂β_j²) (``hess``), + at the point where j is on
    (``point="current"``) and − where it is off (``"excluded"``), so that it is exact for a
    Gaussian likelihood at either.

    >>> float(async_inclusion_logits(0.0, 0.5, 2.0, None, "sensitive"))
    1.5
    """
    out = prior_logodds + theta * grad
    if taylor == "sensitive":
        out = out + 0.5 * theta**2 * grad**2
    elif taylor == "second":
        sign = 1.0 if point == "current" else -1.0
        out = out + sign * 0.5 * theta**2 * jnp.abs(hess)
    return out


def async_update(key, prior_logodds, theta, grad, hess=None, taylor="first", point="current"):
    r"""The asynchronous samplers' STEP 2: the chosen indicators drawn independently, at once.

    V_j ~ Bernoulli(q̃_j) independently, logit q̃_j = :func:`async_inclusion_logits`
    (prior log-odds + θ_j·G_j + Q_j), with G (and H) from one gradient at the evaluation point
    (:func:`~numpyro_sg.kernels.sparse_async.glm_async_gradient` or
    :func:`~numpyro_sg.kernels.sparse_async.dense_async_gradient`).

    :return: V, (J,) int32.

    **Example:**

    .. code-block:: python

        G, H = glm_async_gradient(X_J, eta, theta_J, delta_J, family, y, params)
        V = async_update(key, prior_logodds, theta_J, G, H)   # new δ_J
    """
    logits = async_inclusion_logits(prior_logodds, theta, grad, hess, taylor, point)
    return random.bernoulli(key, jax.nn.sigmoid(logits)).astype(jnp.int32)


def compact_active(active, delta, chosen, added):
    """The padded active-set index list after STEP 2, in O(m + J).

    ``active`` (m,) lists the coordinates that were active (δ_j = 1) before STEP 2, padded with
    p = ``delta.shape[0]``; ``delta`` (p,) is the indicator after STEP 2; ``chosen`` (J,) the
    coordinates updated and ``added`` (J,) bool those of them switched on (0 → 1).  The new
    list holds the survivors (entries of ``active`` still active, in their order), then the
    newcomers (in the order of ``chosen``), padded with p.  ``count`` is their number; when it
    exceeds m the list is truncated (an overflow the caller must handle).

    :return: ``(new_active (m,) int32, count int32)``.

    **Example:**

    .. code-block:: python

        delta = delta.at[chosen].set(V)
        active, count = compact_active(active, delta, chosen, (old_delta_J == 0) & (V == 1))
    """
    m, p = active.shape[0], delta.shape[0]
    keep = (active < p) & (delta.at[active].get(mode="fill", fill_value=0) == 1)
    candidates = jnp.concatenate([active, chosen.astype(active.dtype)])
    mask = jnp.concatenate([keep, added])
    position = jnp.where(mask, jnp.cumsum(mask) - 1, m)
    new = jnp.full((m,), p, jnp.int32).at[position].set(candidates, mode="drop")
    return new, jnp.sum(mask).astype(jnp.int32)


# -------------------------------------------------------------------------------------------
# The evaluation point of the asynchronous gradient
# -------------------------------------------------------------------------------------------
def evaluation_shift(theta_J, delta_J, point):
    """Change Δ of the chosen β_J from β = θ·δ to the asynchronous evaluation point:
    θ_J·(1 − δ_J) (``point="current"``: every chosen coordinate on at θ_j) or −θ_J·δ_J
    (``"excluded"``: every chosen coordinate off).

    >>> import jax.numpy as jnp
    >>> evaluation_shift(jnp.array([2.0, 3.0]), jnp.array([1, 0]), "current").tolist()
    [0.0, 3.0]
    >>> evaluation_shift(jnp.array([2.0, 3.0]), jnp.array([1, 0]), "excluded").tolist()
    [-2.0, -0.0]
    """
    if point == "current":
        return theta_J * (1 - delta_J)
    return -theta_J * delta_J
