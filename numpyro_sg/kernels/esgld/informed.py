r"""Informed, locally balanced moves on γ for ESGLD with a GLM likelihood (the default).

The candidates are the single flips c = (j, s): γ_j ← 1 − γ_j and θ_j ← s·θ_j, s ∈ {+1, −1}
(only +1 without sign flips); each is an involution, so its reverse is itself.  With Δ̃_c the
change of the surrogate log target (prior, from a per-coordinate table, plus the quadratic
surrogate L̃ of :mod:`~numpyro_sg.kernels.esgld.targets`; :func:`flip_evidence`) the
proposal is locally balanced (Zanella (2020), "Informed proposals for local MCMC in discrete
spaces", g(t) = √t): q(c | x) ∝ exp(Δ̃_c / 2), births forbidden at size(γ) = q.  The change of
L̃ when β_j changes by d is d·G_j + ½·H_jj·d², G = g + Hδ the surrogate gradient, carried
through the chain and updated by H[:, j]·d after a move, O(p).  The Hastings ratio uses
q(c | x') evaluated at the proposed state x' (the evidence recomputed there, O(p)), so

.. math::

   \log\alpha = \Delta\log\pi(\gamma,\theta)\big|_{\text{exact prior},\ \hat L}
                + \log q(c\mid x') - \log q(c\mid x) \;[-\ \text{penalty}],

an exact MH move for the inner target π(γ | θ, X_{n,N}) with the control-variate estimate L̂
in place of the full-data log-likelihood (:func:`informed_indicator_chain`).

**Rao-Blackwellised inclusion** (the estimator of eq. 8 of the ESGLD slides, per coordinate):
at each state of the inner chain, ρ_j = P(γ_j = 1 | θ, γ_{−j}, X) ≈ σ(Δ̃_{j,+1}) for an
excluded j (0 when a birth is not allowed) and σ(−Δ̃_{j,+1}) for an included one, averaged
over the m states (:func:`conditional_inclusion`); its mean over iterations estimates the
marginal inclusion probabilities with less noise than the indicator frequency.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax, random

from numpyro_sg.infer.minibatch import Anchor
from numpyro_sg.kernels.esgld.targets import CVBatch, acceptance_probability, hess_matvec, penalty, remainder_terms
from numpyro_sg.spike_slab import GLMFamily


class FlipEvidence(NamedTuple):
    """Evidence of the single-flip candidates (s, j), arrays of shape (S, p), S = 1 or 2 sign
    choices: ``delta`` Δ̃ the surrogate change of the log target, ``d`` the change of β_j,
    ``dprior`` the prior part of Δ̃, ``log_w`` the proposal log-weights Δ̃/2 (−∞ where the
    move is not allowed)."""

    delta: Any
    d: Any
    dprior: Any
    log_w: Any


class InformedChain(NamedTuple):
    """Result of :func:`informed_indicator_chain`: ``gamma`` the last model (int32), ``theta``
    after the accepted sign flips, ``gammas`` the m states (m, p), ``num_accepted``,
    ``surrogate_grad`` G at the last state, ``eta`` the mini-batch linear predictor there and
    ``rao_blackwell`` the mean of the conditional inclusion probabilities ρ over the m states,
    ``accept_prob`` the mean over the m steps of the acceptance probability min(1, ratio)."""

    gamma: Any
    theta: Any
    gammas: Any
    num_accepted: Any
    surrogate_grad: Any
    eta: Any
    rao_blackwell: Any
    accept_prob: Any = None


def flip_evidence(gamma, theta, theta0, G, hess_diag, table, max_size, flip_sign=True) -> FlipEvidence:
    """Surrogate evidence of every single flip (s, j) at the state (γ, θ) (see the module).

    Δ̃_{s,j} = [table[r', 1−γ_j, j] − table[r, γ_j, j]] + d·G_j + ½·H_jj·d², with
    d = (1 − γ_j)·s·θ_j − γ_j·θ_j the change of β_j, r = 1 where θ_j ≠ θ0_j (θ_j's sign
    flipped since the table was built at θ0), r' likewise after the flip; ``table`` is a
    (2, 2, p) :func:`~numpyro_sg.kernels.esgld.targets.coordinate_table`.  Births (γ_j = 0) get weight
    0 when size(γ) ≥ ``max_size``.  O(p).

    **Example:**

    .. code-block:: python

        ev = flip_evidence(gamma, theta, theta, anchor.grad, jnp.diag(anchor.hess), table, q)
        jax.nn.softmax(ev.log_w.ravel())      # the informed proposal
    """
    dtype = theta.dtype
    g = gamma.astype(dtype)
    included = gamma.astype(jnp.int32) == 1
    flipped = theta != theta0

    def lookup(r, inc):  # table[r, inc, j] by selects (elementwise, fuses) rather than a gather
        return jnp.where(r, jnp.where(inc, table[1, 1], table[1, 0]), jnp.where(inc, table[0, 1], table[0, 0]))

    prior_now = lookup(flipped, included)
    size = jnp.sum(included)
    allowed = included | (size < max_size)
    signs = (1.0, -1.0) if flip_sign else (1.0,)
    out = []
    for s in signs:
        d = (1.0 - g) * (s * theta) - g * theta
        dprior = lookup(flipped if s > 0 else ~flipped, ~included) - prior_now
        delta = dprior + d * G + 0.5 * hess_diag * d * d
        out.append((delta, d, dprior, jnp.where(allowed, 0.5 * delta, -jnp.inf)))
    return FlipEvidence(*(jnp.stack(a) for a in zip(*out)))


def conditional_inclusion(gamma, evidence: FlipEvidence, max_size):
    """ρ_j ≈ P(γ_j = 1 | θ, γ_{−j}, X): σ(Δ̃_{+1,j}) for an excluded j (0 where a birth is not
    allowed, size(γ) = q), σ(−Δ̃_{+1,j}) for an included one (the Rao-Blackwellised inclusion
    of the ESGLD slides, eq. 8, per coordinate).

    **Example:**

    .. code-block:: python

        rho = conditional_inclusion(gamma, flip_evidence(...), q)
    """
    gi = gamma.astype(jnp.int32)
    delta = evidence.delta[0]
    birth_ok = jnp.sum(gi) < max_size
    return jnp.where(gi == 1, jax.nn.sigmoid(-delta), jnp.where(birth_ok, jax.nn.sigmoid(delta), 0.0))


class _Carry(NamedTuple):
    """The informed chain's state: (γ, θ), the surrogate gradient G, the mini-batch predictor
    η, the remainder terms r, the log prior (``prior`` given) and the flip evidence."""

    gamma: Any
    theta: Any
    G: Any
    eta: Any
    r: Any
    lp: Any
    evidence: FlipEvidence


class _Context(NamedTuple):
    """What every step of the informed chain reads (fixed during the chain)."""

    anchor: Anchor
    cvb: CVBatch
    family: Any
    prior: Any
    evidence: Callable
    hdiag: Any
    signs: Any
    penalty_fpc: Any
    total: Callable


def _informed_move(key, x: _Carry, ctx: _Context):
    """One informed single-flip MH step from ``x``: ``(kept carry, accepted, acceptance
    probability)``."""
    k_prop, k_acc = random.split(key)
    p = x.theta.shape[0]
    c, log_q_fwd = _draw_from_log_weights(k_prop, x.evidence.log_w.reshape(-1))
    s_idx, j = c // p, c % p
    dj = x.evidence.d[s_idx, j]
    gam2 = x.gamma.at[j].set(1 - x.gamma[j])
    th2 = x.theta.at[j].multiply(ctx.signs[s_idx])
    G2 = x.G + ctx.anchor.hess[j] * dj  # H symmetric: a contiguous row
    eta2 = x.eta + ctx.cvb.Xt[j] * dj
    r2 = remainder_terms(ctx.cvb, ctx.family, eta2)
    ev2 = ctx.evidence(gam2, th2, G2)
    flat2 = ev2.log_w.reshape(-1)
    log_q_rev = flat2[c] - jax.nn.logsumexp(flat2)
    d_lik = dj * x.G[j] + 0.5 * ctx.hdiag[j] * dj * dj
    if ctx.prior is None:
        lp2, d_prior = x.lp, x.evidence.dprior[s_idx, j]
    else:
        lp2 = ctx.prior(th2, gam2)
        d_prior = lp2 - x.lp
    d_terms = r2 - x.r
    log_alpha = d_prior + d_lik + ctx.total(jnp.sum(d_terms)) + log_q_rev - log_q_fwd
    if ctx.penalty_fpc is not None:
        log_alpha = log_alpha - penalty(d_terms, ctx.penalty_fpc, ctx.total)
    ok = jnp.isfinite(log_alpha)
    accept = ok & (jnp.log(random.uniform(k_acc, (), x.theta.dtype)) < log_alpha)
    new = _Carry(gam2, th2, G2, eta2, r2, lp2, ev2)
    kept = jax.tree.map(lambda a, b: jnp.where(accept, b, a), x, new)
    return kept, accept, acceptance_probability(log_alpha, ok).astype(x.theta.dtype)


def informed_indicator_chain(key, gamma, theta, anchor: Anchor, cvb: CVBatch, family: GLMFamily,
                             table, prior: Callable | None = None, *, num_steps: int, max_size: int,
                             flip_sign: bool = True, penalty_fpc=None,
                             max_nonzero: int | None = None, total: Callable | None = None) -> InformedChain:
    r"""``num_steps`` informed single-flip MH steps on γ (θ fixed up to sign flips) targeting
    π(γ | θ, X_{n,N}) ∝ π(γ)·π(θ|γ)·exp(L̂(θ·γ)), L̂ the control-variate estimate, size(γ) ≤
    ``max_size``.

    Each step draws c = (s, j) ∝ exp(Δ̃_c/2) (:func:`flip_evidence`), applies it, recomputes the
    evidence at the proposed state and accepts with probability
    min(1, exp(Δ log prior + ΔL̃ + Σ_i Δ(N/n)r_i + log q(c|x') − log q(c|x) − pen)), pen the
    :func:`~numpyro_sg.kernels.esgld.targets.penalty` of the Δ(N/n)r_i when ``penalty_fpc`` is
    given.  The log prior change is exact: from ``table`` when ``prior`` is ``None`` (a
    per-coordinate prior), else ``prior(theta, gamma)`` (every site outside the plate, O(p)).
    Cost per step: O(p) (evidence and H[:, j]) + O(n) (the remainder of the changed column).

    :param anchor: the :class:`~numpyro_sg.infer.minibatch.Anchor`.
    :param cvb: the mini-batch :class:`~numpyro_sg.kernels.esgld.targets.CVBatch`
        (at the anchor).
    :param table: (2, 2, p) coordinate prior table built at ``theta``.
    :param max_nonzero: bound on the non-zeros of β − β̂
        (:func:`~numpyro_sg.kernels.esgld.targets.hess_matvec`).
    :param total: sums a mini-batch sum over data shards (``cvb`` one shard's rows; one
        reduction of one float per step, three with the penalty); ``None`` on one device.
    :return: an :class:`InformedChain`.

    **Example:**

    .. code-block:: python

        chain = informed_indicator_chain(key, gamma, theta, anchor, cvb, fam, table,
                                         num_steps=10, max_size=50)
    """
    gamma = jnp.asarray(gamma).astype(jnp.int32)
    hdiag = jnp.diagonal(anchor.hess)

    def evidence(gam, th, G):
        return flip_evidence(gam, th, theta, G, hdiag, table, max_size, flip_sign)

    signs = jnp.array([1.0, -1.0] if flip_sign else [1.0], theta.dtype)
    ctx = _Context(anchor, cvb, family, prior, evidence, hdiag, signs, penalty_fpc,
                   (lambda x: x) if total is None else total)
    beta = theta * gamma.astype(theta.dtype)
    G0 = anchor.grad + hess_matvec(anchor.hess, beta - anchor.point, max_nonzero)
    eta0 = cvb.eta_hat + cvb.Xt.T @ (beta - anchor.point)
    lp0 = jnp.zeros((), theta.dtype) if prior is None else prior(theta, gamma)
    x0 = _Carry(gamma, theta, G0, eta0, remainder_terms(cvb, family, eta0), lp0, evidence(gamma, theta, G0))

    def body(carry, k):
        x, n_acc, sum_prob = carry
        x, accept, prob = _informed_move(k, x, ctx)
        rho = conditional_inclusion(x.gamma, x.evidence, max_size)
        return (x, n_acc + accept.astype(jnp.int32), sum_prob + prob), (x.gamma, rho)

    carry0 = (x0, jnp.int32(0), jnp.zeros((), theta.dtype))
    (x, n_acc, sum_prob), (gammas, rhos) = lax.scan(body, carry0, random.split(key, num_steps))
    return InformedChain(x.gamma, x.theta, gammas, n_acc, x.G, x.eta, jnp.mean(rhos, 0), sum_prob / num_steps)


def _draw_from_log_weights(key, log_w):
    """(c, log q(c)) with q ∝ exp(log_w): inverse CDF with one uniform (cheaper than Gumbel)."""
    top = jnp.max(log_w)
    w = jnp.exp(log_w - top)
    c = jnp.cumsum(w)
    u = random.uniform(key, (), log_w.dtype) * c[-1]
    idx = jnp.clip(jnp.searchsorted(c, u, side="right"), 0, log_w.shape[0] - 1)
    idx = jnp.where(w[idx] > 0, idx, jnp.argmax(log_w))  # never a zero-weight candidate
    return idx, log_w[idx] - top - jnp.log(c[-1])
