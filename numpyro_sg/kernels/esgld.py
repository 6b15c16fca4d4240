r"""Extended SGLD (eSGLD) for Bayesian variable selection — paper 000 (Alg. 1, supp. §3), SPEC §5.

The model (see :mod:`numpyro_sg.spike_slab`) has an indicator γ ∈ {0,1}^p, a latent vector
θ ∈ ℝ^p whose prior may depend on γ, and a likelihood that depends on θ only through
β = θ·γ.  Iteration t, with mini-batch S_t of size n out of N:

1. Draw S_t.
2. Run a short reversible-jump Metropolis–Hastings chain on γ with θ fixed at θ⁽ᵗ⁾
   (:func:`rjmh_indicator_chain`), targeting

   .. math::

      \pi(\gamma \mid \theta, X_{n,N}) \propto \pi(\gamma)\,\pi(\theta\mid\gamma)\,
      \exp\Big(\tfrac{N}{n}\sum_{i\in S_t}\log f(x_i \mid \theta\cdot\gamma)\Big),
      \qquad |\gamma| \le q,

   started from the last model of the previous iteration; its m successive states are the
   models γ_1..γ_m (``num_models``).  Moves (:func:`propose_move`): birth / death / exchange,
   each with probability 1/3 when 0 < size(S) < q, birth only at size(S) = 0, death only at
   size(S) = q.  Birth picks j ∉ S with probability ∝ w_j, death picks j ∈ S ∝ 1 − w_j,
   exchange does both.  The acceptance ratio is the full Hastings ratio (target ratio ×
   reverse/forward proposal probabilities, the move-type probabilities at the boundaries
   included).  With ``flip_sign=True`` (the paper's default) the sign of θ_j flips with
   probability ½ when j enters or leaves, as part of the (symmetric) proposal; an accepted
   flip carries into θ.
3. Langevin step on θ (and any other continuous site) averaged over the m models
   (:func:`model_averaged_gradient`, :func:`~numpyro_sg.kernels.moves.langevin_move`):

   .. math::

      \theta^{(t+1)} = \theta^{(t)} + \frac{\varepsilon_t}{2m}\sum_{k=1}^m
      \nabla_\theta \log \pi(\theta^{(t)}\mid\gamma_k, X_{n,N}) + \mathcal N(0, \varepsilon_t\tau I),

   with log π(θ | γ, X_{n,N}) = log π(θ|γ) + (N/n)·Σ_{i∈S_t} log f(x_i | θ·γ) (the package's
   step convention θ' = θ + (ε/2)·ĝ + N(0, ε·τ); θ⁽ᵗ⁾ is θ after the accepted sign flips).

One iteration is the pure function :func:`esgld_step` of the state (hyperparameters ε and τ
included, :class:`ESGLDHyper`) and the data; the gradient is evaluated inside the iteration
at the point the chain on γ leaves, so ``init`` runs no chain and no gradient: it traces the
model once (:func:`~numpyro_sg.infer.model_info.trace_model`), checks it in one vectorised run
(:func:`~numpyro_sg.spike_slab.find_spike_slab`) and draws the start in one more
(:func:`~numpyro_sg.spike_slab.start_fn`, which also reads the data rows of data-based
proposal weights).

The default for a GLM likelihood (issue #16; :mod:`numpyro_sg.kernels.esgld_informed`,
:func:`esgld_step`) replaces step 2 by informed single-flip moves accepted on a
control-variate estimate of the log-likelihood (exact for a Gaussian likelihood) and step 3
by a Langevin step at the last model with the control-variate gradient and a step in units of
the conditional posterior variance; ``proposal="paper", gradient="plain",
preconditioner=None`` is the paper's algorithm above.

Noisy acceptance (``mh_correction="penalty"``): the mini-batch estimate of the log-likelihood
difference of a proposal, Σ_{i∈S} a_i with a_i = (N/n)·Δℓ_i, has variance
σ̂² = n·var_i(a_i) = (N²/n)·var_i(Δℓ_i) (times 1 − n/N without replacement); the penalty
method for noisy Metropolis–Hastings subtracts σ̂²/2 from the log acceptance ratio
(:func:`penalty`).

Cost: for GLM likelihoods (linear predictor η = X·β; see :mod:`numpyro_sg.spike_slab`) a
proposal updates η for its one or two changed coordinates, O(n) (plus O(p) to pick the
coordinates; :func:`glm_indicator_target`); otherwise each proposal evaluates the model on
the mini-batch (:func:`generic_indicator_target`).  The Langevin step costs m model
gradients on the mini-batch.  Nothing is O(N) per iteration.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import constrain_fn

from numpyro_sg.kernels.base import (
    SGKernel,
    all_finite,
    check_choice,
    check_positive,
    split_init_key,
)
from numpyro_sg.kernels.esgld_informed import (
    GLMAnchor,
    cv_batch,
    cv_loglik_gradient,
    glm_anchor,
    hess_matvec,
    informed_indicator_chain,
    laplace_step_scale,
)
from numpyro_sg.kernels.guard import freeze
from numpyro_sg.kernels.moves import langevin_move, langevin_noise_variance
from numpyro_sg.kernels.step_size import CallableSchedule, PolynomialSchedule, step_size_at
from numpyro_sg.infer.minibatch import (
    Minibatcher,
    full_data,
    jit_with_data,
    subsample_plates,
    with_indices,
)
from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.spike_slab import (
    GLMBatch,
    GLMFamily,
    SpikeSlab,
    effective_site_name,
    find_spike_slab,
    init_to_spike,
    start_fn,
)

__all__ = [
    "ESGLD",
    "ESGLDState",
    "ESGLDHyper",
    "ESGLDSetup",
    "ESGLDOptions",
    "esgld_step",
    "esgld_initial_state",
    "esgld_hyperparameters",
    "DEFAULT_WEIGHT_ROWS",
    "move_probabilities",
    "propose_move",
    "apply_proposal",
    "Proposal",
    "IndicatorTarget",
    "IndicatorChain",
    "rjmh_indicator_chain",
    "generic_indicator_target",
    "glm_indicator_target",
    "coordinate_table",
    "indicator_target",
    "model_averaged_gradient",
    "resolve_proposal_weights",
    "proposal_weights",
    "correlation_weights",
    "deviance_weights",
    "penalty",
    "init_to_spike",
    "anchor_iterations",
    "DEFAULT_STEP_SIZE",
    "PAPER_STEP_SIZE",
]

_WEIGHT_KINDS = ("auto", "correlation", "deviance", "uniform")
_CORRECTIONS = (None, "penalty")
_FAST_PATHS = ("auto", "glm", "generic")
_PROPOSALS = ("auto", "informed", "paper")
_GRADIENTS = ("auto", "cv", "plain")
_PRECONDITIONERS = ("auto", "laplace", None)
#: default dimensionless step h with the Laplace preconditioner (ε_j = h·v_j, v_j the
#: conditional posterior variance of θ_j under the control-variate surrogate)
DEFAULT_STEP_SIZE = 0.25
#: default absolute step ε without a preconditioner (the paper's linear example)
PAPER_STEP_SIZE = 1e-6
_W_MIN = 1e-6
#: rows of the data read for data-based proposal weights when ``weight_rows`` is not given
DEFAULT_WEIGHT_ROWS = 20_000


# -------------------------------------------------------------------------------------------
# proposals on γ
# -------------------------------------------------------------------------------------------
def move_probabilities(size, max_size):
    """(P(birth), P(death), P(exchange)) for a current model S of size ``size`` (supp. §3).

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
    """Draw a reversible-jump proposal from model γ (supp. §3) and its Hastings log-ratio.

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


def penalty(delta_terms, fpc=1.0):
    """σ̂²/2 with σ̂² = n·var_i(a_i)·fpc, a_i the scaled per-datum log-likelihood differences.

    The penalty method for a noisy Metropolis–Hastings ratio subtracts it from the log
    acceptance ratio; ``fpc`` is the finite-population correction (1 − n/N without
    replacement, 1 with replacement).  Zero for n < 2.

    **Example:**

    .. code-block:: python

        penalty(jnp.array([1.0, -1.0, 3.0]))    # 0.5 · 3 · var = 6.0
    """
    n = delta_terms.shape[0]
    if n < 2:
        return jnp.zeros((), delta_terms.dtype)
    return 0.5 * n * jnp.var(delta_terms, ddof=1) * fpc


# -------------------------------------------------------------------------------------------
# the reversible-jump chain on γ
# -------------------------------------------------------------------------------------------
class IndicatorTarget(NamedTuple):
    """How :func:`rjmh_indicator_chain` evaluates log π(γ, θ | X_S) (pure callables).

    ``init(gamma, theta) -> carry`` evaluates the start; ``update(carry, gamma, theta, gamma2,
    theta2, proposal) -> (d_log_prior, d_terms, carry2)`` the proposal (γ2, θ2): the change of
    the log prior (every site outside the plate) and of the (n,) scaled per-datum
    log-likelihood terms, and the carry at (γ2, θ2).  Build one with
    :func:`generic_indicator_target`, :func:`glm_indicator_target` or :func:`indicator_target`.
    """

    init: Callable
    update: Callable


class IndicatorChain(NamedTuple):
    """Result of :func:`rjmh_indicator_chain`: ``gamma`` the last model (int32, (p,)), ``theta``
    θ after the accepted sign flips, ``gammas`` the chain's states (num_steps, p),
    ``num_accepted`` the number of accepted proposals."""

    gamma: Any
    theta: Any
    gammas: Any
    num_accepted: Any


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
        gam, th, ev, n_acc = carry
        k_prop, k_acc = random.split(k)
        prop = propose_move(k_prop, gam, weights, max_size, flip_sign)
        gam2, th2 = apply_proposal(gam, th, prop)
        d_prior, d_terms, ev2 = target.update(ev, gam, th, gam2, th2, prop)
        log_alpha = d_prior + jnp.sum(d_terms) + prop.log_q_ratio
        if penalty_fpc is not None:
            log_alpha = log_alpha - penalty(d_terms, penalty_fpc)
        accept = prop.valid & (jnp.log(random.uniform(k_acc, (), th.dtype)) < log_alpha)
        kept = freeze(~accept, (gam, th, ev), (gam2, th2, ev2))  # old unless accepted
        return kept + (n_acc + accept.astype(jnp.int32),), kept[0]

    carry0 = (gamma, theta, target.init(gamma, theta), jnp.int32(0))
    (gam, th, _, n_acc), gammas = lax.scan(body, carry0, random.split(key, num_steps))
    return IndicatorChain(gam, th, gammas, n_acc)


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
        cp = ss.coordinate_prior_fn(model_args, model_kwargs)
        both = jax.vmap(lambda t: cp(values, t))(jnp.stack([theta, -theta]))
        prior = coordinate_table(*(jax.tree.map(lambda a, s=s: a[s], both) for s in (0, 1)))
    else:
        prior_fn = ss.prior_fn(model_args, model_kwargs)

        def prior(th, g):
            return prior_fn({**values, coef: th}, g)

    return glm_indicator_target(batch, ss.glm.family, theta, prior)


def model_averaged_gradient(log_density: Callable, unravel: Callable, flat, gammas, indices):
    """``(value, gradient)`` of (1/m)·Σ_k log π(θ | γ_k, X_S) at the flat unconstrained point.

    ``log_density(params, gamma, indices)`` as :meth:`SpikeSlab.log_density_fn
    <numpyro_sg.spike_slab.SpikeSlab.log_density_fn>`, ``gammas`` the m models (m, p): the
    model-averaged gradient of the Langevin step (SPEC §5 step 3), one vectorised evaluation.

    **Example:**

    .. code-block:: python

        value, grad = model_averaged_gradient(ss.log_density_fn((X, y)), unravel, flat,
                                              chain.gammas, indices)
    """

    def mean_log_density(x):
        params = unravel(x)
        return jnp.mean(jax.vmap(lambda g: log_density(params, g, indices))(gammas))

    return jax.value_and_grad(mean_log_density)(flat)


# -------------------------------------------------------------------------------------------
# proposal weights
# -------------------------------------------------------------------------------------------
def correlation_weights(X, y):
    """w_j = exp(abs(corr(y, x_j)) − 1) (supp. §3, linear models); constant columns get exp(−1).

    **Example:**

    .. code-block:: python

        correlation_weights(X[:20_000], y[:20_000])      # (p,) in (0, 1)
    """
    X = jnp.asarray(X)
    y = jnp.asarray(y, X.dtype)
    n = X.shape[0]
    xm = jnp.mean(X, 0)
    ym = jnp.mean(y)
    cov = (X.T @ (y - ym)) / n
    xs = jnp.sqrt(jnp.maximum(jnp.mean(X * X, 0) - xm * xm, 0.0))
    ys = jnp.std(y)
    corr = jnp.where(xs > 1e-12, jnp.abs(cov) / jnp.maximum(xs * ys, 1e-30), 0.0)
    return jnp.clip(jnp.exp(jnp.clip(corr, 0.0, 1.0) - 1.0), _W_MIN, 1 - _W_MIN)


def deviance_weights(X, y, family, params=None, newton_steps=8):
    """w_j = exp(−(d_j − min d)/(5·sd(d)) − 0.1) (supp. §3, GLMs).

    d_j is the deviance (−2 × maximised log-likelihood) of the model with an intercept and x_j
    only, fitted by ``newton_steps`` Newton steps for all j at once; constant columns (an
    intercept) get the largest weight exp(−0.1), as in the paper.

    **Example:**

    .. code-block:: python

        deviance_weights(X, y, GLM_FAMILIES["bernoulli"])      # (p,) in (0, 1)
    """
    X = jnp.asarray(X)
    y = jnp.asarray(y, X.dtype)
    params = params or {}
    p = X.shape[1]
    a = jnp.zeros((p,), X.dtype)
    b = jnp.zeros((p,), X.dtype)

    def step(_, ab):
        a, b = ab
        eta = a[None, :] + X * b[None, :]
        d1 = family.dloglik(eta, y[:, None], params)
        d2 = family.d2loglik(eta, y[:, None], params)
        ga, gb = d1.sum(0), (d1 * X).sum(0)
        haa, hab, hbb = d2.sum(0), (d2 * X).sum(0), (d2 * X * X).sum(0)
        haa, hbb = haa - 1e-6, hbb - 1e-6
        det = haa * hbb - hab * hab
        da = -(hbb * ga - hab * gb) / det
        db = -(-hab * ga + haa * gb) / det
        return a + jnp.clip(da, -5, 5), b + jnp.clip(db, -5, 5)

    a, b = lax.fori_loop(0, newton_steps, step, (a, b))
    eta = a[None, :] + X * b[None, :]
    d = -2.0 * family.loglik(eta, y[:, None], params).sum(0)
    const = jnp.std(X, 0) < 1e-12
    dv = jnp.where(const, jnp.nan, d)
    dmin = jnp.nanmin(dv)
    sd = jnp.maximum(jnp.nanstd(dv), 1e-12)
    w = jnp.exp(-(d - dmin) / (5.0 * sd) - 0.1)
    w = jnp.where(const, jnp.exp(-0.1), w)
    return jnp.clip(jnp.where(jnp.isfinite(w), w, _W_MIN), _W_MIN, 1 - _W_MIN)



def resolve_proposal_weights(kind, glm, num_coefficients):
    """The proposal-weight kind of a model: ``"auto"`` becomes ``"correlation"`` for a Gaussian
    GLM likelihood, ``"deviance"`` for another GLM and ``"uniform"`` otherwise; an array is
    checked to have p entries.  Raises ``ValueError`` for data-based weights without a GLM
    likelihood (``glm`` is the model's :class:`~numpyro_sg.spike_slab.GLMInfo` or ``None``).

    **Example:**

    .. code-block:: python

        resolve_proposal_weights("auto", ss.glm, ss.num_coefficients)     # 'correlation'
    """
    if not isinstance(kind, str):
        w = np.asarray(kind, dtype=float)
        if w.shape != (num_coefficients,):
            raise ValueError(
                f"proposal_weights has shape {w.shape}; the model has p = {num_coefficients} coefficients."
            )
        return w
    if kind == "auto":
        if glm is None:
            return "uniform"
        return "correlation" if glm.family_name == "gaussian" else "deviance"
    if kind in ("correlation", "deviance") and glm is None:
        raise ValueError(
            f"proposal_weights={kind!r} needs a GLM likelihood (linear predictor X·β), "
            "which was not detected for this model; use 'uniform' or an array."
        )
    return kind


def proposal_weights(kind, num_coefficients, glm_rows: GLMBatch | None = None, family=None):
    """The proposal weights w (p,) in (0, 1) of a resolved ``kind``
    (:func:`resolve_proposal_weights`): an array as given (clipped to [1e-6, 1 − 1e-6]),
    ``"uniform"`` w_j = ½, ``"correlation"`` :func:`correlation_weights` or ``"deviance"``
    :func:`deviance_weights` of the data rows ``glm_rows`` (a
    :class:`~numpyro_sg.spike_slab.GLMBatch`, e.g. ``start_fn(..., rows=…)``'s) of the GLM
    ``family``.

    **Example:**

    .. code-block:: python

        start = start_fn(ss, (X, y), rows=20_000)(key)
        w = proposal_weights("correlation", ss.num_coefficients, start.glm_rows)
    """
    dtype = jnp.result_type(float)
    if not isinstance(kind, str):
        return jnp.clip(jnp.asarray(kind, dtype), _W_MIN, 1 - _W_MIN)
    if kind == "uniform":
        return jnp.full((num_coefficients,), 0.5, dtype)
    if kind == "correlation":
        return correlation_weights(glm_rows.X, glm_rows.y)
    params = {k: v[:, None] for k, v in glm_rows.params.items()}
    return deviance_weights(glm_rows.X, glm_rows.y, family, params)


# -------------------------------------------------------------------------------------------
# the chain's state and one iteration
# -------------------------------------------------------------------------------------------
class ESGLDHyper(NamedTuple):
    """Hyperparameters of :class:`ESGLD` held in its state: ``step_size`` ε (a scalar, one entry
    per unconstrained continuous coordinate, or a schedule pytree evaluated at the iteration
    counter with :func:`~numpyro_sg.kernels.step_size.step_size_at`) and ``temperature`` τ."""

    step_size: Any
    temperature: Any


class ESGLDState(NamedTuple):
    """State of :class:`ESGLD`.

    ``i`` iteration counter (warmup included); ``z`` a dict of the unconstrained continuous
    sites, the indicator (int32, the last model γ_m of the inner chain) and the inclusion
    frequency (1/m)·Σ_k γ_k; ``step_size`` the ε that produced ``z``; ``hyper`` the
    :class:`ESGLDHyper`; ``accept_rate`` the fraction of the m reversible-jump proposals
    accepted; ``model_size`` size(γ_m); ``weights`` the proposal weights w; ``diverging``
    True from the first non-finite state or gradient on (the chain is then frozen);
    ``batch_state`` the index-drawing state; ``rng_key`` the chain's key; ``anchor`` the
    control-variate :class:`~numpyro_sg.kernels.esgld_informed.GLMAnchor` (``None`` for the
    paper's algorithm).
    """

    i: Any
    z: Any
    step_size: Any
    hyper: Any
    accept_rate: Any
    model_size: Any
    weights: Any
    diverging: Any
    batch_state: Any
    rng_key: Any
    anchor: Any = None


def anchor_iterations(family_name: str, num_warmup: int) -> tuple:
    """Iterations at which the control-variate anchor is (re)computed at the current β: 0, and
    for a non-Gaussian likelihood also 100, 400 and 1,000 when they fall in the warmup (the
    informed moves find the strong effects within the first iterations, but θ needs a few
    hundred Langevin steps to reach its posterior scale, and a stale anchor leaves a noisy
    estimate that inflates null inclusions: measured on Table S1 seed 0 with h = 0.1 and
    anchors at 0 and 100 only, FSR 0.27; a Gaussian likelihood's expansion is exact whatever
    the anchor, so once is enough).  Each anchor costs one full-data product Xᵀ·diag(ℓ'')·X,
    O(N·p²).

    **Example:**

    .. code-block:: python

        anchor_iterations("bernoulli", 2000)     # (0, 100, 400, 1000)
    """
    if family_name == "gaussian":
        return (0,)
    return (0,) + tuple(k for k in (100, 400, 1000) if k < num_warmup)


def esgld_hyperparameters(step_size, temperature, dim: int) -> ESGLDHyper:
    """The :class:`ESGLDHyper` of the options: a plain callable step size is wrapped in a
    :class:`~numpyro_sg.kernels.step_size.CallableSchedule`; an array must have ``dim`` entries.

    **Example:**

    .. code-block:: python

        esgld_hyperparameters(1e-6, 1.0, dim=2001)
    """
    dtype = jnp.result_type(float)
    if callable(step_size) and not isinstance(step_size, (PolynomialSchedule, CallableSchedule)):
        step_size = CallableSchedule(step_size)
    if not callable(step_size):
        step_size = jnp.asarray(step_size, dtype)
        if step_size.ndim > 1 or (step_size.ndim == 1 and step_size.shape != (dim,)):
            raise ValueError(
                f"step_size has shape {step_size.shape} but the model has {dim} unconstrained "
                "continuous coordinates."
            )
    return ESGLDHyper(step_size, jnp.asarray(temperature, dtype))


@dataclass(frozen=True)
class ESGLDSetup:
    """Static configuration of an ESGLD chain, built by :meth:`ESGLD.init` from one model trace.

    ``spike_slab`` the model's :class:`~numpyro_sg.spike_slab.SpikeSlab`; ``minibatcher`` its
    index drawing; ``unravel`` flat → dict of the unconstrained continuous sites; ``dim`` their
    number of coordinates; ``max_model_size`` q; ``num_models`` m; ``flip_sign``;
    ``penalty_fpc`` the finite-population correction of the penalty (``None``: no penalty);
    ``inclusion_name`` / ``effective_name`` the names of the inclusion frequency and of
    β = θ·γ in the output; ``weight_kind`` the resolved proposal weights
    (:func:`resolve_proposal_weights`) and ``weight_rows`` the data rows they read (``None``
    for weights that read no data); ``proposal`` ``"informed"`` or ``"paper"``, ``gradient``
    ``"cv"`` or ``"plain"``, ``preconditioner`` ``"laplace"`` or ``None`` (resolved);
    ``anchor_steps`` the iterations at which the control-variate anchor is (re)computed at the
    current β; ``num_warmup`` (the penalty applies from then on); ``rb_name`` the name of the
    Rao-Blackwellised inclusion output (``None`` without informed proposals).
    """

    spike_slab: SpikeSlab
    minibatcher: Minibatcher
    unravel: Callable
    dim: int
    max_model_size: int
    num_models: int = 10
    flip_sign: bool = True
    penalty_fpc: float | None = None
    inclusion_name: str = "inclusion"
    effective_name: str = "beta"
    weight_kind: Any = "uniform"
    weight_rows: int | None = None
    proposal: str = "paper"
    gradient: str = "plain"
    preconditioner: str | None = None
    anchor_steps: tuple = ()
    num_warmup: int = 0
    rb_name: str | None = None

    @property
    def anchored(self) -> bool:
        """True when the chain carries a control-variate anchor (:class:`GLMAnchor`)."""
        return self.proposal == "informed" or self.gradient == "cv" or self.preconditioner == "laplace"

    @property
    def full_batch(self) -> bool:
        """True when every iteration uses all N data (subsample size n = N)."""
        plate = self.spike_slab.plate
        return plate.subsample_size == plate.size

    def draw(self, key, batch_state):
        """``(indices, new batch state)`` of the next mini-batch (all N data when full-batch)."""
        if self.full_batch:
            return self.spike_slab.full_indices(), batch_state
        return self.minibatcher.draw(key, batch_state)

    def pack(self, flat, gammas, rao_blackwell=None) -> dict:
        """The state's ``z``: continuous sites, the last model γ_m, the inclusion frequency and
        (informed proposals) the Rao-Blackwellised inclusion (γ_m's frequency when not given)."""
        z = dict(self.unravel(flat))
        z[self.spike_slab.indicator] = gammas[-1].astype(jnp.int32)
        z[self.inclusion_name] = jnp.mean(gammas.astype(flat.dtype), 0)
        if self.rb_name is not None:
            z[self.rb_name] = z[self.inclusion_name] if rao_blackwell is None else rao_blackwell.astype(flat.dtype)
        return z

    def unpack(self, z):
        """``(continuous params, γ)`` of the state's ``z``."""
        z = dict(z)
        gamma = z.pop(self.spike_slab.indicator)
        z.pop(self.inclusion_name)
        if self.rb_name is not None:
            z.pop(self.rb_name)
        return z, gamma


def esgld_initial_state(setup: ESGLDSetup, params, gamma, weights, hyper: ESGLDHyper, key) -> ESGLDState:
    """The state at the start ``(params, γ)``: no chain has run (``accept_rate`` 0, inclusion
    frequency γ).

    **Example:**

    .. code-block:: python

        state = esgld_initial_state(setup, {"theta": theta0}, jnp.zeros(p, jnp.int32), w, hyper, key)
    """
    flat = ravel_pytree(params)[0].astype(jnp.result_type(float))
    key, key_batch = random.split(key)
    gamma = jnp.asarray(gamma).astype(jnp.int32)
    return ESGLDState(
        i=jnp.int32(0),
        z=setup.pack(flat, gamma[None]),
        step_size=step_size_at(hyper.step_size, 0, flat.dtype),
        hyper=hyper,
        accept_rate=jnp.zeros((), flat.dtype),
        model_size=jnp.sum(gamma).astype(jnp.int32),
        weights=weights,
        diverging=jnp.array(False),
        batch_state=setup.minibatcher.init_batch_state(key_batch),
        rng_key=key,
        anchor=_empty_anchor(setup.spike_slab.num_coefficients, flat.dtype) if setup.anchored else None,
    )


def _empty_anchor(p, dtype):
    """A zero :class:`GLMAnchor` placeholder (replaced at iteration 0)."""
    return GLMAnchor(jnp.zeros((p,), dtype), jnp.zeros((p,), dtype), jnp.zeros((p, p), dtype))


def esgld_step(setup: ESGLDSetup, state: ESGLDState, model_args, model_kwargs) -> ESGLDState:
    r"""One ESGLD iteration of one chain (pure; SPEC §5):

    1. draw the mini-batch S;
    2. m = ``num_models`` reversible-jump steps on γ at θ (:func:`rjmh_indicator_chain` on
       :func:`indicator_target`), accepted sign flips carried into θ;
    3. θ' = θ + (ε/2)·(1/m)·Σ_k ∇ log π(θ | γ_k, X_S) + N(0, ε·τ·I)
       (:func:`model_averaged_gradient`, :func:`~numpyro_sg.kernels.moves.langevin_move`),
       ε = ε_t of ``state.hyper``.

    With a control-variate anchor (``setup.anchored``: informed proposals, ``gradient="cv"``
    or the Laplace step) the iteration is instead: re-anchor at the iterations
    ``setup.anchor_steps``; m informed single-flip MH steps
    (:func:`~numpyro_sg.kernels.esgld_informed.informed_indicator_chain`) or the paper's chain;
    θ' = θ + (ε/2)⊙ĝ + N(0, ε·τ) at the last model γ_m with the control-variate gradient
    ĝ = ∇_θ log π(θ|γ_m) + γ_m⊙∇_β L̂ and ε_j = h·v_j
    (:func:`~numpyro_sg.kernels.esgld_informed.laplace_step_scale`).

    A non-finite θ', log density or gradient freezes the chain at its state
    (:func:`~numpyro_sg.kernels.guard.freeze`) and sets ``diverging`` from then on.

    **Example:**

    .. code-block:: python

        state = jax.jit(lambda s: esgld_step(kernel.setup, s, (X, y), {}))(state)
    """
    if setup.anchored:
        return _anchored_step(setup, state, model_args, model_kwargs)
    ss = setup.spike_slab
    key, key_batch, key_rj, key_noise = random.split(state.rng_key, 4)
    params, gamma = setup.unpack(state.z)
    indices, batch_state = setup.draw(key_batch, state.batch_state)
    values = ss.constrain_fn(model_args, model_kwargs)(params, gamma)
    chain = rjmh_indicator_chain(
        key_rj, gamma, values[ss.coefficient], state.weights,
        indicator_target(ss, values, gamma, indices, model_args, model_kwargs),
        num_steps=setup.num_models, max_size=setup.max_model_size, flip_sign=setup.flip_sign,
        penalty_fpc=_penalty_now(setup, state.i),
    )
    # θ is real-valued: its unconstrained value is itself
    params = {**params, ss.coefficient: chain.theta.astype(jnp.asarray(params[ss.coefficient]).dtype)}
    flat = ravel_pytree(params)[0]
    value, grad = model_averaged_gradient(ss.log_density_fn(model_args, model_kwargs), setup.unravel,
                                          flat, chain.gammas, indices)
    eps = step_size_at(state.hyper.step_size, state.i, flat.dtype)
    noise = random.normal(key_noise, flat.shape, flat.dtype)
    new_flat = langevin_move(flat, grad, eps, noise, langevin_noise_variance(eps, state.hyper.temperature))
    diverging = state.diverging | ~(all_finite(new_flat) & jnp.isfinite(value) & all_finite(grad))
    return state._replace(
        i=state.i + 1,
        z=freeze(diverging, state.z, setup.pack(new_flat, chain.gammas)),
        step_size=eps,
        accept_rate=chain.num_accepted.astype(flat.dtype) / setup.num_models,
        model_size=freeze(diverging, state.model_size, jnp.sum(chain.gamma).astype(jnp.int32)),
        diverging=diverging,
        batch_state=batch_state,
        rng_key=key,
    )


def _penalty_now(setup: ESGLDSetup, i):
    """The penalty's finite-population correction at iteration ``i``, or ``None`` without a
    penalty.  The automatic rule: no penalty during the warmup (the search, when the anchor
    is still moving and the estimate's sd can be hundreds of nats), the full penalty after."""
    if setup.penalty_fpc is None:
        return None
    return jnp.where(i >= setup.num_warmup, setup.penalty_fpc, 0.0)


def _coordinate_prior_table(ss: SpikeSlab, values, theta, model_args, model_kwargs):
    """The (2, 2, p) :func:`coordinate_table` at ±θ (exact for a per-coordinate prior, the
    proposal's approximation otherwise)."""
    cp = ss.coordinate_prior_fn(model_args, model_kwargs)
    both = jax.vmap(lambda t: cp(values, t))(jnp.stack([theta, -theta]))
    return coordinate_table(*(jax.tree.map(lambda a, s=s: a[s], both) for s in (0, 1)))


def _anchored_step(setup: ESGLDSetup, state: ESGLDState, model_args, model_kwargs) -> ESGLDState:
    r"""One iteration with the control-variate anchor (θ the only continuous site, GLM
    likelihood; :mod:`numpyro_sg.kernels.esgld_informed`):

    0. at the iterations ``setup.anchor_steps`` the anchor moves to the current β = θ·γ
       (g and H on the full data, O(N·p²));
    1. the m moves on γ: :func:`~numpyro_sg.kernels.esgld_informed.informed_indicator_chain`
       (``proposal="informed"``) or the paper's :func:`rjmh_indicator_chain`;
    2. the Langevin step on θ at the last model γ_m,
       θ' = θ + (ε/2)⊙ĝ + N(0, ε·τ), ĝ = ∇_θ log π(θ|γ_m) + γ_m⊙∇_β L̂ with the control-variate
       gradient (``gradient="cv"``, :func:`~numpyro_sg.kernels.esgld_informed.cv_loglik_gradient`)
       or the paper's model-averaged mini-batch gradient (``"plain"``); with
       ``preconditioner="laplace"`` ε_j = h·v_j
       (:func:`~numpyro_sg.kernels.esgld_informed.laplace_step_scale`), h the step size.
    """
    ss = setup.spike_slab
    coef = ss.coefficient
    family = ss.glm.family
    key, key_batch, key_rj, key_noise = random.split(state.rng_key, 4)
    params, gamma = setup.unpack(state.z)
    indices, batch_state = setup.draw(key_batch, state.batch_state)
    values = ss.constrain_fn(model_args, model_kwargs)(params, gamma)
    theta = values[coef]
    dtype = theta.dtype
    glm_batch = ss.glm_batch_fn(model_args, model_kwargs)
    anchor = state.anchor
    if setup.anchor_steps:
        beta_now = theta * gamma.astype(dtype)
        due = jnp.any(state.i == jnp.asarray(setup.anchor_steps))
        anchor = lax.cond(due, lambda: glm_anchor(glm_batch(values, beta_now), family, beta_now),
                          lambda: anchor)
        anchor = jax.tree.map(lambda a: a.astype(dtype), anchor)
    cvb = cv_batch(glm_batch(values, anchor.beta, indices), family)
    table = _coordinate_prior_table(ss, values, theta, model_args, model_kwargs)
    prior_fn = ss.prior_fn(model_args, model_kwargs)

    def log_prior(th, g):
        return prior_fn({**values, coef: th}, g)

    penalty_fpc = _penalty_now(setup, state.i)
    rb = None
    if setup.proposal == "informed":
        chain = informed_indicator_chain(
            key_rj, gamma, theta, anchor, cvb, family, table,
            None if ss.per_coordinate_prior else log_prior, num_steps=setup.num_models,
            max_size=setup.max_model_size, flip_sign=setup.flip_sign, penalty_fpc=penalty_fpc,
            max_nonzero=2 * setup.max_model_size)
        rb = chain.rao_blackwell
    else:
        chain = rjmh_indicator_chain(
            key_rj, gamma, theta, state.weights,
            indicator_target(ss, values, gamma, indices, model_args, model_kwargs),
            num_steps=setup.num_models, max_size=setup.max_model_size, flip_sign=setup.flip_sign,
            penalty_fpc=penalty_fpc)
    th = chain.theta.astype(dtype)
    g_m = chain.gamma
    gm = g_m.astype(dtype)
    prior_at = functools.partial(log_prior, g=g_m)
    if setup.gradient == "cv":
        if setup.proposal == "informed":  # the chain carries G and η at θ·γ_m
            G, eta = chain.surrogate_grad, chain.eta
        else:
            delta = th * gm - anchor.beta
            G = anchor.grad + hess_matvec(anchor.hess, delta, 2 * setup.max_model_size)
            eta = cvb.eta_hat + cvb.Xt.T @ delta
        prior_value, prior_grad = jax.value_and_grad(prior_at)(th)
        value = prior_value
        grad = prior_grad + gm * cv_loglik_gradient(G, cvb, family, eta)
    else:
        value, grad = model_averaged_gradient(ss.log_density_fn(model_args, model_kwargs), setup.unravel,
                                              th, chain.gammas, indices)
    h = step_size_at(state.hyper.step_size, state.i, dtype)
    if setup.preconditioner == "laplace":
        curvature = jax.jvp(jax.grad(prior_at), (th,), (jnp.ones_like(th),))[1]
        eps = h * laplace_step_scale(g_m, jnp.diagonal(anchor.hess), curvature)
    else:
        eps = h
    noise = random.normal(key_noise, th.shape, dtype)
    new_flat = langevin_move(th, grad, eps, noise, langevin_noise_variance(eps, state.hyper.temperature))
    diverging = state.diverging | ~(all_finite(new_flat) & jnp.isfinite(value) & all_finite(grad))
    return state._replace(
        i=state.i + 1,
        z=freeze(diverging, state.z, setup.pack(new_flat, chain.gammas, rb)),
        step_size=h,
        accept_rate=chain.num_accepted.astype(dtype) / setup.num_models,
        model_size=freeze(diverging, state.model_size, jnp.sum(g_m).astype(jnp.int32)),
        diverging=diverging,
        batch_state=batch_state,
        rng_key=key,
        anchor=anchor,  # not frozen: a copy of H per iteration would cost more than the step
    )


# -------------------------------------------------------------------------------------------
# the kernel
# -------------------------------------------------------------------------------------------
def _is_int_at_least(value, minimum) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= minimum


@dataclass(frozen=True)
class ESGLDOptions:
    """The static options of :class:`ESGLD`, validated on construction (see :class:`ESGLD` for
    their meaning); an array of proposal weights is held as a tuple.

    **Example:**

    .. code-block:: python

        ESGLDOptions(num_models=10, max_model_size=50).max_model_size     # 50
    """

    num_models: int = 10
    max_model_size: int | None = None
    proposal_weights: Any = "auto"
    flip_sign: bool = True
    mh_correction: str | None = None
    indicator: str | None = None
    coefficient: str | None = None
    fast_path: str = "auto"
    effective_name: str | None = None
    inclusion_name: str = "inclusion"
    weight_rows: int | None = None
    proposal: Any = "auto"
    gradient: str = "auto"
    preconditioner: str | None = "auto"

    def __post_init__(self):
        if not _is_int_at_least(self.num_models, 1):
            raise ValueError(f"num_models must be an int ≥ 1, got {self.num_models!r}.")
        check_choice("gradient", self.gradient, _GRADIENTS)
        check_choice("preconditioner", self.preconditioner, _PRECONDITIONERS)
        if isinstance(self.proposal, str):
            check_choice("proposal", self.proposal, _PROPOSALS + ("an array",))
        else:  # an array: the paper's moves with these weights
            if not (isinstance(self.proposal_weights, str) and self.proposal_weights == "auto"):
                raise ValueError("Give proposal weights either as proposal=array or as proposal_weights=, not both.")
            object.__setattr__(self, "proposal_weights", self.proposal)
            object.__setattr__(self, "proposal", "paper")
        if self.max_model_size is not None and not _is_int_at_least(self.max_model_size, 1):
            raise ValueError(f"max_model_size must be an int ≥ 1 (and ≤ p), got {self.max_model_size!r}.")
        check_choice("mh_correction", self.mh_correction, _CORRECTIONS)
        check_choice("fast_path", self.fast_path, _FAST_PATHS)
        weights = self.proposal_weights
        if isinstance(weights, str):
            check_choice("proposal_weights", weights, _WEIGHT_KINDS + ("an array",))
        else:
            w = np.asarray(weights, dtype=float)
            if w.ndim != 1 or not np.all((w > 0) & (w < 1)):
                raise ValueError("proposal_weights as an array must be a vector of values in (0, 1).")
            object.__setattr__(self, "proposal_weights", tuple(float(v) for v in w))
        if self.weight_rows is not None:
            if not _is_int_at_least(self.weight_rows, 1):
                raise ValueError(f"weight_rows must be an int ≥ 1, got {self.weight_rows!r}.")
            if not isinstance(weights, str) or weights == "uniform":
                raise ValueError(
                    "weight_rows applies only to data-based proposal weights ('correlation', "
                    f"'deviance' or 'auto'); it has no effect with proposal_weights={weights!r}."
                )


class ESGLD(SGKernel):
    r"""Extended SGLD for Bayesian variable selection with a spike-and-slab NumPyro model.

    Each iteration draws a mini-batch, runs ``num_models`` steps of a reversible-jump MH
    chain on the indicator γ (θ fixed), then moves θ by one Langevin step averaged over the
    m models: θ' = θ + (ε/(2m))·Σ_k ∇_θ log π(θ | γ_k, X_{n,N}) + N(0, ε·τ·I) (the package's
    convention θ' = θ + (ε/2)·ĝ + N(0, ε·τ)).  The class is a shell around the pure
    :func:`esgld_step`; see :mod:`numpyro_sg.kernels.esgld` for the moves and the Hastings
    ratio.

    :param model: NumPyro model with a subsample plate, an indicator site (Bernoulli, shape
        (p,)) and a coefficient site (real, shape (p,)) entering the likelihood only through
        their product (see :mod:`numpyro_sg.spike_slab`).
    :param step_size: with the Laplace preconditioner (the default for a GLM likelihood) a
        dimensionless h > 0, ε_j = h·v_j with v_j the conditional posterior variance of θ_j
        under the control-variate surrogate (``None``: :data:`DEFAULT_STEP_SIZE` = 0.25);
        without it (``preconditioner=None``) an absolute ε > 0 (``None``:
        :data:`PAPER_STEP_SIZE` = 1e-6; the paper uses ε ≈ 1/N or smaller).  A float, an array
        over the flat unconstrained continuous sites, or a schedule t ↦ ε_t
        (:func:`~numpyro_sg.polynomial_schedule`, or any callable).  Held in the state
        (:class:`ESGLDHyper`), so :func:`numpyro_sg.mamba` can vary it across vectorised arms.
    :param int num_models: m, the number of MH steps (models) on γ per iteration (paper: 10).
    :param max_model_size: q, models are truncated to size(γ) ≤ q (1 ≤ q ≤ p; default p).
    :param proposal: ``"auto"`` (default: ``"informed"`` when the likelihood is a detected GLM
        and θ the only continuous site, else ``"paper"``), ``"informed"`` (locally balanced
        single flips of (γ_j, sign θ_j) drawn ∝ exp(Δ̃/2) from the full-data quadratic
        surrogate of every flip, exact MH on the control-variate estimate;
        :func:`~numpyro_sg.kernels.esgld_informed.informed_indicator_chain`), ``"paper"`` (the
        weighted birth / death / exchange moves of supp. §3 with ``proposal_weights``), or an
        array of p weights (the paper's moves with these weights).
    :param gradient: ``"auto"`` (``"cv"`` where ``"informed"`` applies, else ``"plain"``),
        ``"cv"`` (control-variate gradient around the anchor, at the last model γ_m) or
        ``"plain"`` (the paper's model-averaged mini-batch gradient).
    :param preconditioner: ``"auto"`` (``"laplace"`` where ``"informed"`` applies, else
        ``None``), ``"laplace"`` (step in units of the conditional posterior variance) or
        ``None`` (absolute step).  The informed proposal, ``"cv"`` and ``"laplace"`` carry a
        control-variate anchor (g and H of the full data at β̂, computed at iteration 0 and,
        for a non-Gaussian likelihood, again at iteration 100 at the chain's current β:
        :func:`anchor_iterations`; O(N·p²) each, p² floats of memory).
    :param proposal_weights: ``"auto"`` (``"correlation"`` for a Gaussian GLM likelihood,
        ``"deviance"`` for other GLMs, ``"uniform"`` otherwise), ``"correlation"``
        (w_j = exp(abs(corr(y, x_j)) − 1)), ``"deviance"`` (w_j = exp(−(d_j − min d)/(5·sd d) −
        0.1), d_j the one-variable GLM deviance), both on the first ``weight_rows`` rows,
        ``"uniform"`` (w_j = ½) or an array of p weights in (0, 1).
    :param bool flip_sign: flip θ_j's sign with probability ½ when j enters or leaves
        (default, as in the paper).
    :param mh_correction: ``None`` (plain mini-batch acceptance, as in the paper) or
        ``"penalty"`` (subtract half the estimated variance of the mini-batch log-likelihood
        difference — of the control-variate remainder with the anchor — from the log
        acceptance ratio).  Automatic rule: no penalty during the warmup (the search), the full
        penalty after it.  An error with a full batch (n = N), where there is no noise to
        correct.
    :param float temperature: τ (default 1).
    :param indicator: name of the indicator site (found automatically when omitted).
    :param coefficient: name of the coefficient site (found automatically when omitted).
    :param fast_path: ``"auto"`` (GLM fast path when the likelihood is a GLM), ``"glm"``
        (require it) or ``"generic"`` (evaluate the model for every proposal).
    :param effective_name: name of the output β = θ·γ (default ``"beta"``, or
        ``"<coefficient>_eff"`` if the model has a non-deterministic site called ``beta``);
        a deterministic site of the model with that name is used as is.
    :param str inclusion_name: name of the output inclusion frequency (default
        ``"inclusion"``).
    :param weight_rows: rows used to compute data-based proposal weights (default
        :data:`DEFAULT_WEIGHT_ROWS` = 20,000); an error with weights that read no data.
    :param subsample_size: mini-batch size n (overrides the plate's; the N/n scale follows).
        n = N means full-batch: every iteration uses all N data (no noise).
    :param bool replace: draw indices with replacement (default) or walk epochs.
    :param init_strategy: NumPyro init strategy for the continuous sites (run with γ = 0);
        default :func:`init_to_spike` (θ from the spike, which the paper's search needs).
    :param bool check_data: check that the subsampled data are finite.

    Output per draw (``mcmc.get_samples()``): the constrained continuous sites (θ, …), the
    indicator γ_m as int32 in {0, 1}, the effective coefficients β = θ·γ_m and the inclusion
    frequency (1/m)·Σ_k γ_k (its mean over draws estimates the marginal posterior inclusion
    probabilities, Theorem 1(iii)); with informed proposals also ``<inclusion_name>_rb``, the
    Rao-Blackwellised inclusion (the mean over the m states of P(γ_j = 1 | θ, γ_{−j}, X) under
    the surrogate; slides 004, eq. 8).  Extra fields: ``step_size``, ``accept_rate``,
    ``model_size``, ``diverging``.

    **Example:**

    .. code-block:: python

        mcmc = MCMC(nsg.ESGLD(model, num_models=10, max_model_size=50),
                    num_warmup=2000, num_samples=3000)
        mcmc.run(jax.random.PRNGKey(0), X, y)
        nsg.selection_summary(mcmc, beta_true)        # inclusion, selected, β̂; FSR … in attrs
        # the paper's algorithm:
        nsg.ESGLD(model, 1e-6, proposal="paper", gradient="plain", preconditioner=None)
    """

    State = ESGLDState
    HYPERPARAMETERS = ("step_size", "temperature")

    def __init__(self, model, step_size=None, *, num_models: int = 10, max_model_size: int | None = None,
                 proposal="auto", gradient: str = "auto", preconditioner: str | None = "auto",
                 proposal_weights="auto", flip_sign: bool = True, mh_correction: str | None = None,
                 temperature: float = 1.0, indicator: str | None = None, coefficient: str | None = None,
                 fast_path: str = "auto", effective_name: str | None = None,
                 inclusion_name: str = "inclusion", weight_rows: int | None = None,
                 subsample_size=None, replace: bool = True, init_strategy=None, check_data: bool = True):
        if step_size is not None and not callable(step_size):
            check_positive("step_size", step_size)
        check_positive("temperature", temperature)
        arguments = locals()
        self.options = ESGLDOptions(**{f.name: arguments[f.name] for f in fields(ESGLDOptions)})
        super().__init__(model, subsample_size=subsample_size, replace=replace,
                         init_strategy=init_strategy, check_data=check_data)
        self.step_size = step_size
        self.temperature = float(temperature)
        self._setup = None

    # -- public metadata ---------------------------------------------------------------------
    @property
    def setup(self) -> ESGLDSetup | None:
        """The static :class:`ESGLDSetup` built at ``init`` (what :func:`esgld_step` reads)."""
        return self._setup

    @property
    def spike_slab(self):
        """The :class:`~numpyro_sg.spike_slab.SpikeSlab` structure found at ``init``."""
        return None if self._setup is None else self._setup.spike_slab

    @property
    def indicator(self):
        """Name of the indicator site (known after ``init``)."""
        return None if self._setup is None else self.spike_slab.indicator

    @property
    def coefficient(self):
        """Name of the coefficient site (known after ``init``)."""
        return None if self._setup is None else self.spike_slab.coefficient

    @property
    def effective_name(self) -> str | None:
        """Name of the output β = θ·γ (resolved at ``init``; the option before)."""
        return self.options.effective_name if self._setup is None else self._setup.effective_name

    @property
    def inclusion_name(self) -> str:
        """Name of the output inclusion frequency."""
        return self.options.inclusion_name

    @property
    def uses_glm_path(self) -> bool:
        """True when proposals use the O(n) GLM update (known after ``init``)."""
        return self._setup is not None and self.spike_slab.glm is not None

    def get_diagnostics_str(self, state):
        msg = f"step size {float(jnp.mean(state.step_size)):.2e}, |γ| {int(jnp.max(state.model_size))}"
        msg += f", acc. {float(jnp.mean(state.accept_rate)):.2f}"
        if bool(jnp.any(state.diverging)):
            msg += ", DIVERGED"
        return msg

    # -- init ----------------------------------------------------------------------------
    def _prepare(self, model_args, model_kwargs) -> ESGLDSetup:
        """The static :class:`ESGLDSetup`, from one model trace (and one vectorised check run)."""
        o = self.options
        info = trace_model(self._model, model_args, model_kwargs)
        plates = subsample_plates(info, self._subsample_size, check_data=self._check_data,
                                  model_args=model_args, model_kwargs=model_kwargs)
        if len(plates) != 1:
            raise ValueError(f"ESGLD needs exactly one subsample plate; the model has {[p.name for p in plates]}.")
        ss = find_spike_slab(self._model, model_args, model_kwargs, indicator=o.indicator,
                             coefficient=o.coefficient, subsample_size=self._subsample_size,
                             glm={"auto": "auto", "glm": True, "generic": False}[o.fast_path], info=info)
        p, plate = ss.num_coefficients, ss.plate
        q = p if o.max_model_size is None else int(o.max_model_size)
        if not 1 <= q <= p:
            raise ValueError(f"max_model_size must lie in [1, p] = [1, {p}], got {q}.")
        proposal, gradient, preconditioner = _resolve_anchored_options(o, ss)
        kind = "uniform" if proposal == "informed" else resolve_proposal_weights(o.proposal_weights, ss.glm, p)
        if proposal == "informed" and o.weight_rows is not None:
            raise ValueError("weight_rows has no effect with proposal='informed' (it reads no weights).")
        data_weights = isinstance(kind, str) and kind != "uniform"
        if o.weight_rows is not None and not data_weights:
            raise ValueError(f"weight_rows has no effect: the proposal weights of this model are {kind!r}.")
        if o.mh_correction is not None and plate.subsample_size == plate.size:
            raise ValueError("mh_correction='penalty' has no effect with a full batch (subsample_size = N).")
        existing = info.site_types
        if o.inclusion_name in existing:
            raise ValueError(f"inclusion_name={o.inclusion_name!r} is a site of the model; pick another.")
        self._mb = Minibatcher(self._model, plates, replace=self._replace)
        self._deterministic_in_plate = ss.deterministic_in_plate
        flat, unravel = ravel_pytree(info.unconstrained_example())
        return ESGLDSetup(
            ss, self._mb, unravel, int(flat.shape[0]), q, o.num_models, o.flip_sign,
            None if o.mh_correction is None else self._mb.fraction_unsampled, o.inclusion_name,
            effective_site_name(ss, existing, o.effective_name), kind,
            min(o.weight_rows or DEFAULT_WEIGHT_ROWS, plate.size) if data_weights else None,
            proposal, gradient, preconditioner,
            rb_name=f"{o.inclusion_name}_rb" if proposal == "informed" else None,
        )

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        self._num_warmup = int(num_warmup)
        with jax.ensure_compile_time_eval():  # structural work stays eager under pmap too
            setup = self._prepare(model_args, model_kwargs)
            if setup.anchored:
                setup = replace(setup, num_warmup=self._num_warmup,
                                anchor_steps=anchor_iterations(setup.spike_slab.glm.family_name, self._num_warmup))
            else:
                setup = replace(setup, num_warmup=self._num_warmup)
            self._setup = setup
        ss, rows = setup.spike_slab, setup.weight_rows
        batched, rng_key, key_init = split_init_key(rng_key)
        given, gamma0 = _given_start(ss, init_params, setup.inclusion_name,
                                     jnp.shape(rng_key)[0] if batched else None)
        if not isinstance(gamma0, jax.core.Tracer) and bool(jnp.any(jnp.sum(gamma0, -1) > setup.max_model_size)):
            raise ValueError(f"The initial indicator has more than max_model_size = {setup.max_model_size} ones.")
        step = self.step_size
        if step is None:
            step = DEFAULT_STEP_SIZE if setup.preconditioner == "laplace" else PAPER_STEP_SIZE
        hyper = esgld_hyperparameters(step, self.temperature, setup.dim)
        family, strategy = (None if ss.glm is None else ss.glm.family), self._init_strategy

        def init_one(key_init, key, given, gamma, model_args, model_kwargs):
            if given is None or rows is not None:  # one model trace: the start and the weights' data
                given, glm_rows = start_fn(ss, model_args, model_kwargs, strategy, rows)(key_init, given)
            else:
                glm_rows = None
            weights = proposal_weights(setup.weight_kind, ss.num_coefficients, glm_rows, family)
            return esgld_initial_state(setup, given, gamma, weights, hyper, key)

        if batched:
            init_one = jax.vmap(init_one, in_axes=(0, 0, 0, 0, None, None))
        state = jit_with_data(init_one, model_args, model_kwargs)(key_init, rng_key, given, gamma0)
        self._sample_fn = self.sample
        return state

    # -- one iteration -----------------------------------------------------------------
    def step(self, state, model_args, model_kwargs):
        """One iteration of one chain: :func:`esgld_step` with the setup built at ``init``."""
        return esgld_step(self._setup, state, model_args, model_kwargs)

    def _refresh(self, state):
        return state._replace(step_size=step_size_at(state.hyper.step_size, state.i))

    # -- output ------------------------------------------------------------------------
    def postprocess_fn(self, model_args, model_kwargs):
        """Constrained draws: the continuous sites (deterministic ones included), γ, the
        inclusion frequency and β = θ·γ (unless the model has it as a deterministic site)."""
        model_kwargs = {} if model_kwargs is None else model_kwargs
        setup = self._setup
        if setup is None:
            return lambda z: z
        ss = setup.spike_slab
        model = full_data(self._model, self._mb.plates) if ss.deterministic_in_plate else with_indices(
            self._model, ss.first_indices(1)
        )
        eff, incl = setup.effective_name, setup.inclusion_name

        def postprocess(z):
            params, gamma = setup.unpack(z)
            out = constrain_fn(ss.conditioned(gamma, model), model_args, model_kwargs, params,
                               return_deterministic=True)
            out[ss.indicator] = gamma
            out[incl] = z[incl]
            if setup.rb_name is not None:
                out[setup.rb_name] = z[setup.rb_name]
            if eff not in out:
                out[eff] = out[ss.coefficient] * gamma
            return out

        return postprocess


def _resolve_anchored_options(o: ESGLDOptions, ss: SpikeSlab):
    """(proposal, gradient, preconditioner) resolved for the model: ``"auto"`` becomes
    ``"informed"`` / ``"cv"`` / ``"laplace"`` when the likelihood is a detected GLM and θ is
    the only continuous site (what the control-variate anchor needs), else ``"paper"`` /
    ``"plain"`` / ``None`` (the proposal also becomes ``"paper"`` when proposal weights or
    ``weight_rows`` are given); asking for the former on another model raises ``ValueError``."""
    ok = ss.glm is not None and tuple(ss.continuous_sites) == (ss.coefficient,)
    why = ("needs a GLM likelihood (linear predictor X·β, fast_path 'auto' or 'glm') and the "
           f"coefficient {ss.coefficient!r} as the only continuous site; this model has "
           f"glm={'yes' if ss.glm is not None else 'no'}, continuous sites {list(ss.continuous_sites)}.")
    resolved = []
    for name, value, good, bad in (("proposal", o.proposal, "informed", "paper"),
                                   ("gradient", o.gradient, "cv", "plain"),
                                   ("preconditioner", o.preconditioner, "laplace", None)):
        if value == "auto":
            value = good if ok else bad
            if name == "proposal" and (o.proposal_weights != "auto" or o.weight_rows is not None):
                value = "paper"  # weights were asked for: the paper's weighted moves
        elif value == good and not ok:
            raise ValueError(f"{name}={good!r} {why}")
        resolved.append(value)
    return tuple(resolved)


def _given_start(ss: SpikeSlab, init_params, inclusion_name, num_chains):
    """(given unconstrained continuous values or None, starting indicator as int32)."""
    given, gamma = None, None
    if init_params is not None:
        given = {k: v for k, v in dict(init_params).items() if k not in (ss.indicator, inclusion_name)}
        gamma = dict(init_params).get(ss.indicator)
        given = given or None
    if gamma is None:
        gamma = jnp.zeros((ss.num_coefficients,) if num_chains is None else (num_chains, ss.num_coefficients))
    return given, jnp.asarray(gamma).astype(jnp.int32)
