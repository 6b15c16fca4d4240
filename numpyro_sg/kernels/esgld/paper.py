r"""The reversible-jump chain on the indicator γ of Song, Sun, Ye & Liang (2020), "Extended
stochastic gradient MCMC for large-scale Bayesian variable selection" (Biometrika), their
Algorithm 1 and supplement §3.

Moves (:func:`propose_move`): birth / death / exchange, each with probability 1/3 when
0 < size(S) < q, birth only at size(S) = 0, death only at size(S) = q
(:func:`move_probabilities`).  Birth picks j ∉ S with probability ∝ w_j, death picks j ∈ S
∝ 1 − w_j, exchange does both.  The acceptance ratio is the full Hastings ratio (target ratio
× reverse/forward proposal probabilities, the move-type probabilities at the boundaries
included).  With ``flip_sign=True`` (the paper's default) the sign of θ_j flips with
probability ½ when j enters or leaves, as part of the (symmetric) proposal.

Noisy acceptance: the mini-batch estimate of the log-likelihood difference of a proposal,
Σ_{i∈S} a_i with a_i = (N/n)·Δℓ_i, has variance σ̂² = n·var_i(a_i) (times 1 − n/N without
replacement); the penalty method for noisy Metropolis–Hastings (Ceperley & Dewing (1999),
"The penalty method for random walks with uncertain energies") subtracts σ̂²/2 from the log
acceptance ratio (:func:`~numpyro_sg.kernels.esgld.targets.penalty`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax, random

from numpyro_sg.kernels.esgld.targets import IndicatorTarget, acceptance_probability, penalty
from numpyro_sg.kernels.guard import freeze


def move_probabilities(size, max_size):
    """(P(birth), P(death), P(exchange)) for a current model S of size ``size`` (the paper's supplement §3).

    1/3 each when 0 < size(S) < q; birth only at size(S) = 0; death only at size(S) = q.

    **Example:**

    .. code-block:: python

        move_probabilities(jnp.array([0, 1, 3]), 3)   # births (1, 1/3, 0), deaths (0, 1/3, 1), …
    """
    size = jnp.asarray(size)
    third = jnp.float32(1.0 / 3.0)
    pb = jnp.where(size == 0, 1.0, jnp.where(size >= max_size, 0.0, third))
    pd = jnp.where(size == 0, 0.0, jnp.where(size >= max_size, 1.0, third))
    pe = jnp.where((size == 0) | (size >= max_size), 0.0, third)
    return pb, pd, pe


class Proposal(NamedTuple):
    """A birth / death / exchange proposal.

    ``move`` 0 birth, 1 death, 2 exchange; ``j_out`` leaves the model (death, exchange),
    ``j_in`` enters it (birth, exchange); ``has_out``/``has_in`` say whether each slot is
    used (an unused slot's index is a placeholder); ``s_out``/``s_in`` ∈ {−1, +1} are the sign
    flips of θ; ``log_q_ratio`` is log q(reverse)/q(forward); ``valid`` is False for a
    degenerate draw (rejected).
    """

    move: Any
    j_out: Any
    j_in: Any
    has_out: Any
    has_in: Any
    s_out: Any
    s_in: Any
    log_q_ratio: Any
    valid: Any


def _pick(key, mass):
    """Index j with probability mass_j / Σ mass (inverse CDF, one uniform): (j, mass_j > 0)."""
    c = jnp.cumsum(mass)
    u = random.uniform(key, (), c.dtype) * c[-1]
    j = jnp.clip(jnp.searchsorted(c, u, side="right"), 0, mass.shape[0] - 1)
    return j, mass[j] > 0


def propose_move(key, gamma, weights, max_size, flip_sign=True) -> Proposal:
    """Draw a reversible-jump proposal from model γ (the paper's supplement §3) and its Hastings log-ratio.

    Birth S → S ∪ {j}: q = P_b(size(S))·w_j/Σ_{k∉S} w_k, reverse P_d(size(S)+1)·(1−w_j)/Σ_{k∈S∪{j}}(1−w_k).
    Death S → S∖{j}: q = P_d(size(S))·(1−w_j)/Σ_{k∈S}(1−w_k), reverse P_b(size(S)−1)·w_j/Σ_{k∉S∖{j}} w_k.
    Exchange (j out, k in): q = P_e·(1−w_j)/Σ_{S}(1−w)·w_k/Σ_{∉S} w, reverse likewise from
    S' = S∖{j}∪{k}.  Sign flips (probability ½ each) are symmetric and add no factor.

    **Example:**

    .. code-block:: python

        prop = propose_move(key, jnp.zeros(4, jnp.int32), jnp.array([0.2, 0.5, 0.8, 0.4]), 2)
        prop.move, prop.j_in     # 0 (birth: the only move from the empty model), j ∝ w_j
    """
    k_move, k_in, k_out, k_s1, k_s2 = random.split(key, 5)
    g = gamma.astype(weights.dtype)
    size = jnp.sum(gamma.astype(jnp.int32))
    pb, pd, pe = move_probabilities(size, max_size)
    u = random.uniform(k_move, (), weights.dtype)
    move = jnp.where(u < pb, 0, jnp.where(u < pb + pd, 1, 2))  # 0 birth, 1 death, 2 exchange
    w_out_mass = (1.0 - g) * weights  # candidates to enter
    w_in_mass = g * (1.0 - weights)  # candidates to leave
    W_out = jnp.sum(w_out_mass)
    W_in = jnp.sum(w_in_mass)
    j_in, ok_in = _pick(k_in, w_out_mass)
    j_out, ok_out = _pick(k_out, w_in_mass)
    has_in = move != 1
    has_out = move != 0
    wi, wo = weights[j_in], weights[j_out]
    log = jnp.log
    pb1, pd1, _ = move_probabilities(size + 1, max_size)
    pbm, _, _ = move_probabilities(size - 1, max_size)
    birth = (log(pd1) + log(1 - wi) - log(W_in + (1 - wi))) - (log(pb) + log(wi) - log(W_out))
    death = (log(pbm) + log(wo) - log(W_out + wo)) - (log(pd) + log(1 - wo) - log(W_in))
    W_in2 = jnp.maximum(W_in - (1 - wo) + (1 - wi), 1e-30)
    W_out2 = jnp.maximum(W_out - wi + wo, 1e-30)
    exch = (log(1 - wi) - log(W_in2) + log(wo) - log(W_out2)) - (
        log(1 - wo) - log(W_in) + log(wi) - log(W_out)
    )
    log_q = jnp.where(move == 0, birth, jnp.where(move == 1, death, exch))
    valid = (~has_in | ok_in) & (~has_out | ok_out) & jnp.isfinite(log_q)
    if flip_sign:
        s_in = jnp.where(random.bernoulli(k_s1), -1.0, 1.0).astype(weights.dtype)
        s_out = jnp.where(random.bernoulli(k_s2), -1.0, 1.0).astype(weights.dtype)
    else:
        s_in = s_out = jnp.ones((), weights.dtype)
    return Proposal(move, j_out, j_in, has_out, has_in, s_out, s_in, jnp.where(valid, log_q, 0.0), valid)


def apply_proposal(gamma, theta, prop: Proposal):
    """(γ', θ') after a proposal: γ_{j_out} ← 0, γ_{j_in} ← 1, θ_j ← s_j·θ_j for the used slots
    (slot by slot, so a placeholder index never clobbers).

    **Example:**

    .. code-block:: python

        gamma2, theta2 = apply_proposal(gamma, theta, propose_move(key, gamma, w, q))
    """
    g1 = gamma.at[prop.j_out].set(jnp.where(prop.has_out, 0, gamma[prop.j_out]).astype(gamma.dtype))
    g2 = g1.at[prop.j_in].set(jnp.where(prop.has_in, 1, g1[prop.j_in]).astype(gamma.dtype))
    t1 = theta.at[prop.j_out].multiply(jnp.where(prop.has_out, prop.s_out, 1.0))
    t2 = t1.at[prop.j_in].multiply(jnp.where(prop.has_in, prop.s_in, 1.0))
    return g2, t2


class IndicatorChain(NamedTuple):
    """Result of :func:`rjmh_indicator_chain`: ``gamma`` the last model (int32, (p,)), ``theta``
    θ after the accepted sign flips, ``gammas`` the chain's states (num_steps, p),
    ``num_accepted`` the number of accepted proposals, ``accept_prob`` the mean over the steps
    of the Metropolis–Hastings acceptance probability min(1, ratio) (0 for a degenerate
    proposal)."""

    gamma: Any
    theta: Any
    gammas: Any
    num_accepted: Any
    accept_prob: Any = None


def rjmh_indicator_chain(key, gamma, theta, weights, target: IndicatorTarget, *, num_steps: int,
                         max_size: int, flip_sign: bool = True, penalty_fpc=None) -> IndicatorChain:
    r"""``num_steps`` reversible-jump Metropolis–Hastings steps on γ with θ fixed (up to sign
    flips), targeting π(γ | θ, X_S) ∝ π(γ)·π(θ|γ)·exp(Σ_i terms_i), size(γ) ≤ q = ``max_size``.

    Each step draws a proposal (:func:`propose_move`, weights w, optional sign flips),
    evaluates it with ``target`` and accepts it with probability
    min(1, exp(Δ log prior + Σ_i Δterms_i + log q(reverse)/q(forward) − pen)), pen the
    :func:`penalty` of the Δterms when ``penalty_fpc`` is given (its finite-population
    correction), else 0.  Pure: ``lax.scan`` over ``random.split(key, num_steps)``.

    :param key: PRNG key.
    :param gamma: the starting model, (p,) in {0, 1}.
    :param theta: θ (p,), fixed but for accepted sign flips.
    :param weights: proposal weights w (p,) in (0, 1).
    :param target: an :class:`IndicatorTarget`.
    :return: an :class:`IndicatorChain`.

    **Example:** a target without likelihood, log π(γ) = Σ_j a_j·γ_j:

    .. code-block:: python

        target = IndicatorTarget(
            init=lambda g, th: jnp.zeros(()),
            update=lambda c, g, th, g2, th2, prop: (jnp.sum(a * (g2 - g)), jnp.zeros(1), c))
        chain = rjmh_indicator_chain(key, jnp.zeros(p, jnp.int32), theta, w, target,
                                     num_steps=300, max_size=3, flip_sign=False)
    """
    gamma = jnp.asarray(gamma).astype(jnp.int32)

    def body(carry, k):
        gam, th, ev, n_acc, sum_prob = carry
        k_prop, k_acc = random.split(k)
        prop = propose_move(k_prop, gam, weights, max_size, flip_sign)
        gam2, th2 = apply_proposal(gam, th, prop)
        d_prior, d_terms, ev2 = target.update(ev, gam, th, gam2, th2, prop)
        log_alpha = d_prior + jnp.sum(d_terms) + prop.log_q_ratio
        if penalty_fpc is not None:
            log_alpha = log_alpha - penalty(d_terms, penalty_fpc)
        accept = prop.valid & (jnp.log(random.uniform(k_acc, (), th.dtype)) < log_alpha)
        kept = freeze(~accept, (gam, th, ev), (gam2, th2, ev2))  # old unless accepted
        prob = acceptance_probability(log_alpha, prop.valid).astype(th.dtype)
        return kept + (n_acc + accept.astype(jnp.int32), sum_prob + prob), kept[0]

    carry0 = (gamma, theta, target.init(gamma, theta), jnp.int32(0), jnp.zeros((), theta.dtype))
    (gam, th, _, n_acc, sum_prob), gammas = lax.scan(body, carry0, random.split(key, num_steps))
    return IndicatorChain(gam, th, gammas, n_acc, sum_prob / num_steps)
