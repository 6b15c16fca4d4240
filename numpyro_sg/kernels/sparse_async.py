r"""SparseAsync — Atchadé & Wang's asynchronous spike-and-slab sampler (paper 003, Alg. 1–3; SPEC §6).

The model (see :mod:`numpyro_sg.spike_slab`) has an indicator δ ∈ {0,1}^p, a coefficient
θ ∈ ℝ^p whose prior factorises over coordinates given δ (paper: π(δ) ∝ p^(−u·size(δ)),
θ_j | δ_j ~ N(0, 1/ρ_{δ_j})), and a likelihood ℓ that depends on θ only through β = θ·δ.
The conditional inclusion probability of coordinate j is read from the model's own
per-coordinate prior terms:

.. math::

   q_j = \operatorname{sigmoid}\big(\operatorname{logit}\pi(\delta_j{=}1)
        + \log p(\theta_j\mid 1) - \log p(\theta_j\mid 0) + \ell_1 - \ell_0\big),

ℓ₁ = ℓ(θ·δ^{(j,1)}), ℓ₀ = ℓ(θ·δ^{(j,0)}) (for the paper's prior this is eq. (4) with
a = u·log p + ½·log(ρ0/ρ1)).  One iteration:

* **STEP 1.** Excluded coordinates θ_j (δ_j = 0) are draws from the spike p(θ_j | δ_j = 0);
  the active block [θ]_δ is moved by a kernel invariant for its conditional
  exp(log p([θ]_δ | δ) + ℓ((θ, 0)_δ)): an exact Gaussian draw (``inner="gaussian"``, Gaussian
  likelihood with known scale, linear predictor X·β; :func:`gaussian_block_draw`), one MALA
  step (``inner="mala"``; :func:`numpyro_sg.kernels.moves.mala_step`), or, for
  ``variant="sgld"``, one SGLD step on a mini-batch
  (:func:`numpyro_sg.kernels.moves.langevin_move`).
* **STEP 2.** A uniformly random subset J of J = ``update_size`` coordinates is chosen
  (:func:`draw_subset`) and their indicators are redrawn: ``variant="exact"`` (Alg. 1)
  sequentially from q_j (:func:`sequential_sweep`); ``variant="async"`` (Alg. 2) all in
  parallel (:func:`async_update`) from
  q̃_j = sigmoid(logit π(δ_j=1) + log p(θ_j|1) − log p(θ_j|0) + θ_j·G_j + Q_j) with one gradient
  G = ∇_β ℓ(β) (:func:`glm_async_gradient`, :func:`dense_async_gradient`) at
  β = θ·(δ ∨ 1_J) (``async_point="current"``) or β = θ·ϑ (ϑ = δ with the chosen coordinates
  off, the paper's eq. (7): ``"excluded"``); ``variant="sgld"`` (Alg. 3) likewise with Ĝ
  from STEP 1's mini-batch scaled by N/B.

Step-size convention (the package's, SPEC §2): θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·I) for both the
MALA proposal and the SGLD step; paper 003 writes γ with noise √(2γ), so ε = 2γ (its MALA
γ = 0.01 is ε = 0.02, its SA-SGLD γ = 0.005 is ε = 0.01).  The MALA ε is adapted during
warmup only, by Robbins–Monro (:func:`robbins_monro`).

Lazy spike draws: an excluded θ_j is used by the algorithm only when j is chosen in STEP 2,
where it is drawn afresh from the spike; at other times its value has no effect on the chain.
The kernel therefore draws the J chosen ones only and, for the output, redraws every excluded
coordinate from the spike at each kept draw (in ``postprocess_fn``, from a key stored with the
draw).  The returned θ therefore has the law of Alg. 1–3's θ̄ at every draw.

**Fast path** (GLM likelihood η = offset + X·β of family Gaussian / Bernoulli / Poisson, Normal
spike and slab, θ the only continuous site): the active set is a padded index list of static
size ``max_active`` (kept by :func:`compact_active`); STEP 1 gathers the size(δ) active columns
of X (padded to the next power of two, so the cost follows size(δ)), STEP 2 gathers the J chosen
columns, so an iteration costs O(N·(size(δ) + J)) (plus O(N·size(δ)²) for the exact Gaussian
draw), independent of p.  The chosen subset is drawn in O(J) (first J distinct values of 2J
uniform integers; an exact uniform draw of a J-subset).  Otherwise a dense path evaluates the
model on the full data (mini-batch for ``"sgld"``) for any model of the spike-and-slab form.

Structure: the pure functions of this module (:func:`draw_subset`,
:func:`gaussian_block_draw`, :func:`sequential_sweep`, :func:`glm_async_gradient`,
:func:`dense_async_gradient`, :func:`async_inclusion_logits`, :func:`async_update`,
:func:`compact_active`, :func:`robbins_monro`) hold the maths; :class:`SparseAsync` is the
NumPyro shell: it finds the model's structure once at ``init`` and its pure ``step`` composes
those functions, with the hyperparameter ε in the state (:class:`SparseAsyncHyper`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
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
from numpyro_sg.kernels.guard import freeze
from numpyro_sg.kernels.moves import langevin_move, mala_step
from numpyro_sg.infer.minibatch import Minibatcher, check_data_finite, full_data, jit_with_data, with_indices
from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.infer.model_info import base_distribution
from numpyro_sg.spike_slab import (
    CoordinateNormal,
    SpikeSlab,
    SpikeSlabError,
    effective_site_name,
    find_spike_slab,
    init_to_spike,
)
from numpyro_sg.spike_slab.glm import design_array, family_of, per_element_log_prob

__all__ = [
    "SparseAsync",
    "SparseAsyncHyper",
    "SparseAsyncState",
    "async_inclusion_logits",
    "async_update",
    "compact_active",
    "dense_async_gradient",
    "draw_subset",
    "gaussian_block_draw",
    "glm_async_gradient",
    "robbins_monro",
    "sequential_sweep",
]

_VARIANTS = ("exact", "async", "sgld")
_INNERS = ("auto", "gaussian", "mala")
_TAYLORS = (None, "first", "sensitive", "second")
_POINTS = (None, "current", "excluded")
_FAST_PATHS = ("auto", "glm", "generic")
_KEY = "_spike_key"


# -------------------------------------------------------------------------------------------
# pure building blocks
# -------------------------------------------------------------------------------------------
def draw_subset(key, p: int, J: int):
    """A uniformly random subset of {0, …, p−1} of size J, as a (J,) int32 array (distinct).

    For p > 8·J: the first J distinct values (in order of appearance) of 2·J i.i.d. uniform
    integers, O(J log J); in the (rare) event of fewer than J distinct values, or for small p,
    an exact ``random.choice`` without replacement (O(p log p)).  Both are exactly uniform: the
    event "J distinct values among 2·J draws" is invariant under relabelling.

    **Example:**

    .. code-block:: python

        chosen = draw_subset(jax.random.PRNGKey(0), 10_000, 100)   # (100,) distinct indices
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


def gaussian_block_draw(key, X, weights, residual, prior_loc, prior_scale, mask=None):
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
    precision = jnp.diag(1.0 / sd**2) + (X * weights[:, None]).T @ X
    b = jnp.where(mask, prior_loc / sd**2, 0.0) + X.T @ (weights * residual)
    L = jnp.linalg.cholesky(precision)
    mean = jax.scipy.linalg.cho_solve((L, True), b)
    xi = random.normal(key, (m,), X.dtype)
    u = mean + jax.scipy.linalg.solve_triangular(L.T, xi, lower=False)
    return jnp.where(mask, u, 0.0)


def sequential_sweep(key, carry, conditional: Callable, num_updates: int):
    r"""Alg. 1's STEP 2: ``num_updates`` single-site Gibbs updates of binary indicators, in turn.

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


def _evaluation_shift(theta_J, delta_J, point):
    """Change of the chosen β_J from β = θ·δ to the asynchronous evaluation point."""
    if point == "current":
        return theta_J * (1 - delta_J)  # every chosen coordinate on at θ_j
    return -theta_J * delta_J  # every chosen coordinate off


def glm_async_gradient(X_J, eta, theta_J, delta_J, family, y, params, scale=1.0, second=False,
                       point="current"):
    r"""G_j = ∂ℓ/∂β_j (and H_j = ∂²ℓ/∂β_j²) for the chosen coordinates of a GLM, O(n·J).

    ℓ(β) = scale·Σ_i f(η_i), η = offset + X·β (``family.loglik`` f).  ``eta`` is η at the
    current β = θ·δ; the evaluation point sets the chosen coordinates of β to θ_J
    (``point="current"``: all on) or to 0 (``"excluded"``: all off), i.e. η_e = η + X_J·Δ with
    Δ = θ_J·(1 − δ_J) or −θ_J·δ_J; then G = scale·X_Jᵀ f′(η_e) and H = scale·(X_J²)ᵀ f″(η_e).

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
    :return: ``(G, H)``, H ``None`` unless ``second``.

    **Example:**

    .. code-block:: python

        G, H = glm_async_gradient(X[:, chosen], X @ (theta * delta), theta[chosen],
                                  delta[chosen], GLM_FAMILIES["bernoulli"], y, {}, second=True)
    """
    eta_e = eta + X_J @ _evaluation_shift(theta_J, delta_J, point)
    G = scale * (X_J.T @ family.dloglik(eta_e, y, params))
    H = scale * ((X_J * X_J).T @ family.d2loglik(eta_e, y, params)) if second else None
    return G, H


def dense_async_gradient(loglik: Callable, theta, delta, chosen, second=False, point="current"):
    r"""G_j = ∂ℓ/∂β_j (and H_j = ∂²ℓ/∂β_j²) for the chosen coordinates, for any likelihood.

    ℓ = ``loglik`` (β ↦ ℓ(β), e.g. the model's log-likelihood in the effective coefficients)
    is differentiated at β = θ·(δ ∨ 1_J) (``point="current"``) or β = θ·δ·(1 − 1_J)
    (``"excluded"``); H by one Hessian-vector product per chosen coordinate.

    :param loglik: β (p,) ↦ ℓ(β), a scalar.
    :param theta: (p,) coefficients.
    :param delta: (p,) current indicators.
    :param chosen: (J,) chosen coordinates (distinct).
    :param bool second: also return H.
    :param str point: ``"current"`` or ``"excluded"``.
    :return: ``(G, H)`` of shape (J,), H ``None`` unless ``second``.

    **Example:**

    .. code-block:: python

        G, _ = dense_async_gradient(lambda b: -0.5 * jnp.sum((y - X @ b) ** 2), theta, delta,
                                    chosen)
    """
    shift = _evaluation_shift(theta[chosen], delta[chosen], point)
    beta = (theta * delta).at[chosen].add(shift)
    grad_fn = jax.grad(loglik)
    G = grad_fn(beta)[chosen]
    H = None
    if second:
        def diagonal(j):
            e = jnp.zeros_like(beta).at[j].set(1.0)
            return jax.jvp(grad_fn, (beta,), (e,))[1][j]

        H = jax.vmap(diagonal)(chosen)
    return G, H


def async_inclusion_logits(prior_logodds, theta, grad, hess=None, taylor="first", point="current"):
    """logit q̃_j = prior log-odds + θ_j·G_j + Q_j for the chosen coordinates (SPEC §6).

    ``taylor="first"``: Q = 0; ``"sensitive"``: Q = ½θ_j²G_j² (paper eq. (6)); ``"second"``:
    Q = ±½θ_j²·abs(∂²ℓ/∂β_j²) (``hess``), + at the point where j is on (``point="current"``) and −
    where it is off (``"excluded"``), so that it is exact for a Gaussian likelihood at either.

    **Example:**

    .. code-block:: python

        logits = async_inclusion_logits(prior_logodds, theta_J, G, H, "second", "current")
    """
    out = prior_logodds + theta * grad
    if taylor == "sensitive":
        out = out + 0.5 * theta**2 * grad**2
    elif taylor == "second":
        sign = 1.0 if point == "current" else -1.0
        out = out + sign * 0.5 * theta**2 * jnp.abs(hess)
    return out


def async_update(key, prior_logodds, theta, grad, hess=None, taylor="first", point="current"):
    r"""Alg. 2/3's STEP 2: the chosen indicators drawn independently, all at once.

    V_j ~ Bernoulli(q̃_j) independently, logit q̃_j = :func:`async_inclusion_logits`
    (prior log-odds + θ_j·G_j + Q_j), with G (and H) from one gradient at the evaluation point
    (:func:`glm_async_gradient` or :func:`dense_async_gradient`).

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


def robbins_monro(step_size, accept_prob, iteration, target=0.5, rate=0.55):
    """log ε ← log ε + (k+1)^(−rate)·(α_k − target) (the authors' MALA adaptation).

    **Example:**

    .. code-block:: python

        eps = robbins_monro(eps, accept_prob, state.i, target=0.5)
    """
    gain = (iteration + 1.0) ** (-rate)
    return jnp.exp(jnp.log(step_size) + gain * (accept_prob - target))


def _langevin_block_move(kind, key, x, logp_grad_fn, step_size, mask):
    """STEP 1's gradient move: ``"mala"`` one MALA step, ``"sgld"`` one SGLD step (masked
    coordinates stay put).  Returns (x', acceptance probability; 1 for SGLD)."""
    log_density, grad = logp_grad_fn(x)
    if kind == "mala":
        res = mala_step(key, x, log_density, grad, logp_grad_fn, step_size, mask)
        return res.x, res.accept_prob
    noise = random.normal(random.split(key)[0], jnp.shape(x), x.dtype) * mask
    return langevin_move(x, grad * mask, step_size, noise, step_size), jnp.ones((), x.dtype)


def _norm_logpdf(x, loc, scale):
    return -0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi)


def _bucket_sizes(m):
    sizes, b = [], 8
    while b < m:
        sizes.append(b)
        b *= 2
    sizes.append(m)
    return tuple(sizes)


# -------------------------------------------------------------------------------------------
# state
# -------------------------------------------------------------------------------------------
class SparseAsyncHyper(NamedTuple):
    """Hyperparameters of :class:`SparseAsync` held in its state: ``step_size`` the base ε of
    the MALA / SGLD step (the user's or the tuner's value; warmup adaptation starts from it)."""

    step_size: Any


class SparseAsyncState(NamedTuple):
    """State of :class:`SparseAsync`.

    ``i`` iteration counter (warmup included); ``z`` a dict of the unconstrained continuous
    sites (θ included; excluded θ_j hold stale values, see the module docstring), the indicator
    δ (int32) and the key of the output's spike draws; ``step_size`` the current MALA / SGLD ε
    (Robbins–Monro-adapted during warmup); ``accept_rate`` the MALA acceptance probability of
    this iteration (1 for an exact draw or SGLD); ``model_size`` size(δ); ``active`` the padded
    list of active coordinates (fast path; a dummy otherwise); ``aux`` per-chain constants of
    the fast path (prior parameters, offset, observations, transposed design); ``hyper`` the
    :class:`SparseAsyncHyper`; ``diverging`` True from the first non-finite state on;
    ``overflow`` True once size(δ) would exceed ``max_active`` (the chain is frozen and an
    error is raised).
    """

    i: Any
    z: Any
    step_size: Any
    accept_rate: Any
    model_size: Any
    active: Any
    aux: Any
    hyper: Any
    diverging: Any
    overflow: Any
    batch_state: Any
    rng_key: Any


class _Aux(NamedTuple):
    prior: Any  # the CoordinateNormal spike and slab
    offset: Any
    y: Any
    params: Any
    Xt: Any = None


@dataclass(frozen=True)
class _Plan:
    """Static metadata of a kernel, resolved at ``init`` from the options and the model."""

    ss: SpikeSlab
    variant: str
    inner: str  # "gaussian", "mala" or "sgld"
    taylor: str | None  # None for "exact"
    point: str
    update_size: int  # J
    max_active: int  # m
    buckets: tuple
    fast: bool
    adapt: bool
    target: float
    step_size: float  # initial ε
    effective_name: str


class _GLMView(NamedTuple):
    """The data rows of one fast-path iteration: ``columns(cols)`` gives X[rows][:, cols]
    (out-of-range columns are 0), per-datum terms are ``scale * family.loglik(eta, y, params)``."""

    columns: Callable
    y: Any
    offset: Any
    params: Any
    scale: Any


# -------------------------------------------------------------------------------------------
# one iteration, GLM fast path
# -------------------------------------------------------------------------------------------
def _glm_view(plan, mb, state, model_args, model_kwargs, key):
    aux = state.aux
    if plan.variant != "sgld":  # all data: columns are contiguous rows of the (p, N) copy
        def columns(cols):
            return jnp.take(aux.Xt, cols, axis=0, mode="fill", fill_value=0).T

        return _GLMView(columns, aux.y, aux.offset, aux.params, 1.0), state.batch_state
    ss = plan.ss
    X = ss.design_fn(model_args, model_kwargs)({ss.coefficient: state.z[ss.coefficient]})
    indices, batch_state = mb.draw(key, state.batch_state)
    rows = indices[ss.plate.name]

    def columns(cols):
        return X.at[rows[:, None], cols[None, :]].get(mode="fill", fill_value=0)

    params = {k: v[rows] for k, v in aux.params.items()}
    view = _GLMView(columns, aux.y[rows], aux.offset[rows], params, X.shape[0] / rows.shape[0])
    return view, batch_state


def _glm_block_move(plan, view, aux, theta, active, size, step_size, key):
    """STEP 1 on the fast path: the active block, padded to a bucket of static size, is moved.
    Returns (θ, η at β = θ·δ, acceptance probability)."""
    family = plan.ss.glm.family

    def branch(mb):
        def move(key):
            cols = active[:mb]
            mask = jnp.arange(mb) < size
            Xa = view.columns(cols)
            u = jnp.where(mask, theta.at[cols].get(mode="fill", fill_value=0), 0.0)
            mu = aux.prior.slab_loc.at[cols].get(mode="fill", fill_value=0.0)
            sd = jnp.where(mask, aux.prior.slab_scale.at[cols].get(mode="fill", fill_value=1.0), 1.0)
            if plan.inner == "gaussian":
                w = 1.0 / view.params["scale"] ** 2
                u = gaussian_block_draw(key, Xa, w, view.y - view.offset, mu, sd, mask)
                acc = jnp.ones((), u.dtype)
            else:
                def logp_grad(v):
                    eta = view.offset + Xa @ v
                    lp = jnp.sum(jnp.where(mask, _norm_logpdf(v, mu, sd), 0.0))
                    lp = lp + view.scale * jnp.sum(family.loglik(eta, view.y, view.params))
                    g = -(v - mu) / sd**2 + view.scale * (Xa.T @ family.dloglik(eta, view.y, view.params))
                    return lp, jnp.where(mask, g, 0.0)

                u, acc = _langevin_block_move(plan.inner, key, u, logp_grad, step_size, mask)
            padded = jnp.zeros((plan.max_active,), u.dtype).at[:mb].set(u)
            return padded, view.offset + Xa @ u, acc

        return move

    which = jnp.searchsorted(jnp.asarray(plan.buckets), size)
    u, eta, acc = lax.switch(which, [branch(mb) for mb in plan.buckets], key)
    return theta.at[active].set(u, mode="drop"), eta, acc


def _glm_indicator_update(plan, view, aux, theta, delta, eta, keys):
    """STEP 2 on the fast path: returns (chosen, their old δ, their θ, their new δ)."""
    k_sub, k_spike, k_ber = keys
    J, family = plan.update_size, plan.ss.glm.family
    chosen = draw_subset(k_sub, theta.shape[0], J)
    d_J = delta[chosen]
    prior = jax.tree.map(lambda a: a[chosen], aux.prior)
    fresh = prior.spike_loc + prior.spike_scale * random.normal(k_spike, (J,), theta.dtype)
    th_J = jnp.where(d_J == 1, theta[chosen], fresh)
    lo = (prior.logit_prior + _norm_logpdf(th_J, prior.slab_loc, prior.slab_scale)
          - _norm_logpdf(th_J, prior.spike_loc, prior.spike_scale))
    X_J = view.columns(chosen)  # (n, J)
    if plan.variant == "exact":
        Xt_J = X_J.T

        def conditional(eta, t):  # O(n): switch coordinate chosen[t] off, then on
            eta0 = eta - d_J[t] * th_J[t] * Xt_J[t]
            eta1 = eta0 + th_J[t] * Xt_J[t]
            ll = family.loglik(eta1, view.y, view.params) - family.loglik(eta0, view.y, view.params)
            return lo[t] + view.scale * jnp.sum(ll), eta1, eta0

        V = sequential_sweep(k_ber, eta, conditional, J)[1]
    else:
        G, H = glm_async_gradient(X_J, eta, th_J, d_J, family, view.y, view.params, view.scale,
                                  second=plan.taylor == "second", point=plan.point)
        V = async_update(k_ber, lo, th_J, G, H, plan.taylor, plan.point)
    return chosen, d_J, th_J, V


def _glm_iteration(plan, mb, state, model_args, model_kwargs):
    ss = plan.ss
    key, k_sub, k_inner, k_spike, k_ber, k_batch, k_out = random.split(state.rng_key, 7)
    view, batch_state = _glm_view(plan, mb, state, model_args, model_kwargs, k_batch)
    theta, delta = state.z[ss.coefficient], state.z[ss.indicator]
    theta, eta, acc = _glm_block_move(plan, view, state.aux, theta, state.active, state.model_size,
                                      state.step_size, k_inner)
    chosen, d_J, th_J, V = _glm_indicator_update(plan, view, state.aux, theta, delta, eta,
                                                 (k_sub, k_spike, k_ber))
    delta, theta = delta.at[chosen].set(V), theta.at[chosen].set(th_J)
    active, count = compact_active(state.active, delta, chosen, (d_J == 0) & (V == 1))
    new = state._replace(
        i=state.i + 1, z={ss.coefficient: theta, ss.indicator: delta, _KEY: k_out},
        accept_rate=acc, model_size=count, active=active, batch_state=batch_state, rng_key=key,
    )
    # an overflow of the active list freezes the chain (``sample`` raises as well)
    frozen = state._replace(i=state.i + 1, rng_key=key, overflow=jnp.array(True))
    return freeze(count > plan.max_active, frozen, new)


# -------------------------------------------------------------------------------------------
# one iteration, dense path (any model of the spike-and-slab form)
# -------------------------------------------------------------------------------------------
def _dense_block_move(plan, unravel, params, delta, indices, step_size, keys, model_args, model_kwargs):
    """STEP 1: excluded θ from the spike, then one MALA / SGLD step of the other coordinates."""
    ss = plan.ss
    k_spike, k_inner = keys
    values = ss.constrain_fn(model_args, model_kwargs)(params, delta)
    spike = ss.spike_sample_fn(model_args, model_kwargs)(k_spike, values)
    params = dict(params)
    theta = params[ss.coefficient]
    params[ss.coefficient] = jnp.where(delta == 1, theta, spike.astype(theta.dtype))
    flat = ravel_pytree(params)[0]
    mask = {k: jnp.ones_like(v) for k, v in params.items()}
    mask[ss.coefficient] = delta.astype(flat.dtype)
    log_density = ss.log_density_fn(model_args, model_kwargs)

    def logp_grad(x):
        return jax.value_and_grad(lambda x_: log_density(unravel(x_), delta, indices))(x)

    flat, acc = _langevin_block_move(plan.inner, k_inner, flat, logp_grad, step_size,
                                     ravel_pytree(mask)[0])
    return unravel(flat), acc


def _prior_logodds_fn(ss, values, theta, model_args, model_kwargs):
    """(j, δ) ↦ log p(δ_j = 1, θ_j | δ_−j) − log p(δ_j = 0, θ_j | δ_−j) from the model's prior."""
    if ss.per_coordinate_prior:
        cp = ss.coordinate_prior_fn(model_args, model_kwargs)(values, theta)
        table = cp.indicator1 - cp.indicator0 + cp.coefficient1 - cp.coefficient0
        return lambda j, d: table[j]
    prior = ss.prior_fn(model_args, model_kwargs)
    return lambda j, d: prior(values, d.at[j].set(1)) - prior(values, d.at[j].set(0))


def _dense_indicator_update(plan, values, delta, indices, keys, model_args, model_kwargs):
    """STEP 2 on the dense path: the new δ."""
    ss = plan.ss
    k_sub, k_ber = keys
    theta = values[ss.coefficient]
    chosen = draw_subset(k_sub, ss.num_coefficients, plan.update_size)
    terms = ss.effective_loglik_terms_fn(model_args, model_kwargs)

    def loglik(beta):
        return jnp.sum(terms(values, beta, indices))

    prior_logodds = _prior_logodds_fn(ss, values, theta, model_args, model_kwargs)
    if plan.variant == "exact":
        def conditional(d, t):
            j = chosen[t]
            on, off = d.at[j].set(1), d.at[j].set(0)
            return prior_logodds(j, d) + loglik(theta * on) - loglik(theta * off), on, off

        return sequential_sweep(k_ber, delta, conditional, plan.update_size)[0]
    G, H = dense_async_gradient(loglik, theta, delta, chosen, plan.taylor == "second", plan.point)
    lo = jax.vmap(lambda j: prior_logodds(j, delta))(chosen)
    V = async_update(k_ber, lo, theta[chosen], G, H, plan.taylor, plan.point)
    return delta.at[chosen].set(V.astype(delta.dtype))


def _dense_iteration(plan, mb, unravel, state, model_args, model_kwargs):
    ss = plan.ss
    key, k_sub, k_inner, k_spike, k_ber, k_batch, k_out = random.split(state.rng_key, 7)
    params = {k: v for k, v in state.z.items() if k not in (ss.indicator, _KEY)}
    delta = state.z[ss.indicator]
    if plan.variant == "sgld":
        indices, batch_state = mb.draw(k_batch, state.batch_state)
    else:
        indices, batch_state = ss.full_indices(), state.batch_state
    params, acc = _dense_block_move(plan, unravel, params, delta, indices, state.step_size,
                                    (k_spike, k_inner), model_args, model_kwargs)
    values = ss.constrain_fn(model_args, model_kwargs)(params, delta)
    delta = _dense_indicator_update(plan, values, delta, indices, (k_sub, k_ber), model_args,
                                    model_kwargs).astype(jnp.int32)
    return state._replace(
        i=state.i + 1, z={**params, ss.indicator: delta, _KEY: k_out}, accept_rate=acc,
        model_size=jnp.sum(delta).astype(jnp.int32), batch_state=batch_state, rng_key=key,
    )


def _adapted_step_size(plan, state, accept_prob, num_warmup):
    """Robbins–Monro adaptation of the MALA ε toward ``target``, during warmup only."""
    if not plan.adapt:
        return state.step_size
    new = robbins_monro(state.step_size, accept_prob, state.i, plan.target)
    return jnp.where(state.i < num_warmup, new, state.step_size)


# -------------------------------------------------------------------------------------------
# set-up
# -------------------------------------------------------------------------------------------
def _check_int(name, value, hint=""):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int ≥ 1{hint}, got {value!r}.")


def _check_step_options(kind, given: dict, why: str = ""):
    """Raise when options of the MALA / SGLD step are given where STEP 1 has none of them."""
    if kind == "gaussian":
        bad = [k for k, v in given.items() if v is not None]
        if bad:
            raise ValueError(
                f"{', '.join(bad)} appl{'y' if len(bad) > 1 else 'ies'} to a MALA or SGLD step, but "
                f"STEP 1 here is the exact Gaussian draw (inner='gaussian'{why}); pass "
                "inner='mala' to use MALA, or leave them out."
            )
    elif kind == "sgld":
        bad = [k for k in ("adapt_step_size", "target_accept_prob") if given.get(k) is not None]
        if bad:
            raise ValueError(
                f"{', '.join(bad)} appl{'y' if len(bad) > 1 else 'ies'} to the MALA step; the SGLD "
                "step of variant='sgld' is not adapted (its step_size is kept)."
            )
    if given.get("adapt_step_size") is False and given.get("target_accept_prob") is not None:
        raise ValueError("target_accept_prob applies to the adaptation; adapt_step_size=False turns it off.")


def _check_options(variant, step_size, update_size, inner, taylor, async_point, max_active,
                   adapt_step_size, target_accept_prob, fast_path, subsample_size, replace):
    """Validate the options of :class:`SparseAsync` and their fit to the variant."""
    if isinstance(step_size, str):
        hint = (f"; variant is keyword-only: SparseAsync(model, variant={step_size!r})"
                if step_size in _VARIANTS else "")
        raise ValueError(f"step_size (the second positional argument) must be a positive float, "
                         f"got {step_size!r}{hint}.")
    if step_size is not None:
        if np.ndim(step_size) != 0:
            raise ValueError(f"step_size must be a positive float, got {step_size!r}.")
        check_positive("step_size", step_size)
    check_choice("variant", variant, _VARIANTS)
    _check_int("update_size", update_size, " (and ≤ p)")
    _check_int("max_active", max_active)
    check_choice("inner", inner, _INNERS)
    check_choice("taylor", taylor, _TAYLORS)
    check_choice("async_point", async_point, _POINTS)
    check_choice("fast_path", fast_path, _FAST_PATHS)
    check_choice("adapt_step_size", adapt_step_size, (None, True, False))
    if target_accept_prob is not None and not 0.0 < target_accept_prob < 1.0:
        raise ValueError(f"target_accept_prob must lie in (0, 1), got {target_accept_prob!r}.")
    if variant != "sgld":
        for name, value in (("subsample_size", subsample_size), ("replace", replace)):
            if value is not None:
                raise ValueError(f"{name} applies to variant='sgld' (mini-batches); variant="
                                 f"{variant!r} uses the full data.")
    elif inner != "auto":
        raise ValueError("inner applies to variant='exact' and 'async'; STEP 1 of variant='sgld' "
                         "is an SGLD step (leave inner out).")
    if variant == "exact":
        for name, value in (("taylor", taylor), ("async_point", async_point)):
            if value is not None:
                raise ValueError(f"{name} applies to the asynchronous update (variant='async' or "
                                 "'sgld'); variant='exact' redraws the indicators sequentially "
                                 "from the exact q_j.")
    if max_active is not None and fast_path == "generic":
        raise ValueError("max_active applies to the GLM fast path; fast_path='generic' turns it off.")
    given = {"step_size": step_size, "adapt_step_size": adapt_step_size,
             "target_accept_prob": target_accept_prob}
    kind = "sgld" if variant == "sgld" else (inner if inner != "auto" else None)
    _check_step_options(kind, given)


def _fast_path_reason(ss, fast_path, subsample_data, model_args, model_kwargs):
    """``(why the GLM fast path does not apply, or None; its constants or None)``."""
    if fast_path == "generic":
        return "fast_path='generic'", None
    if ss.glm is None:
        return "no GLM likelihood (linear predictor X·β) was detected", None
    if not ss.per_coordinate_prior:
        return "the prior of the coefficients is not a product over coordinates given the indicator", None
    if tuple(ss.continuous_sites) != (ss.coefficient,):
        return (f"the model has continuous sites {list(ss.continuous_sites)} besides the "
                f"coefficient {ss.coefficient!r}"), None
    try:
        return None, _fast_constants(ss, subsample_data, model_args, model_kwargs)
    except SpikeSlabError as err:
        return str(err), None


def _fast_constants(ss, subsample_data, model_args, model_kwargs):
    """The fast path's constants from ONE vectorised trace of the model at θ = 0 over all N
    data, with δ = 0 and δ = 1: the Normal spike and slab (:class:`CoordinateNormal`), the
    prior log-odds of inclusion, and the GLM's offset η(β = 0), observations and parameters
    (an :class:`_Aux` without ``Xt``)."""
    p = ss.num_coefficients
    zeros, ones = jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)
    values = {ss.coefficient: jnp.zeros((p,))}

    def one(gamma):
        tr, data = ss.trace_at(model_args, model_kwargs, values, gamma, ss.full_indices())
        base = base_distribution(tr[ss.coefficient]["fn"])
        if not isinstance(base, dist.Normal):
            raise SpikeSlabError(
                f"coefficient site {ss.coefficient!r} has distribution {type(base).__name__}; "
                "a per-coordinate Normal spike/slab is needed here."
            )
        ind = tr[ss.indicator]["fn"]
        logit = per_element_log_prob(ind, ones) - per_element_log_prob(ind, zeros)
        fam = family_of(tr[ss.glm.site]["fn"])
        n = jnp.shape(tr[ss.glm.site]["value"])[0]
        return (jnp.broadcast_to(base.loc, (p,)), jnp.broadcast_to(base.scale, (p,)), logit,
                jnp.broadcast_to(fam[1], (n,)), tr[ss.glm.site]["value"],
                {k: jnp.broadcast_to(v, (n,)) for k, v in fam[2].items()})

    loc, scale, logit, eta, y, params = jax.vmap(one)(jnp.stack([zeros, ones]))
    dtype = jnp.result_type(float)
    prior = CoordinateNormal(logit[0], loc[0], scale[0], loc[1], scale[1])
    return _Aux(
        prior=jax.tree.map(lambda a: jnp.asarray(a, dtype), prior),
        offset=jnp.asarray(eta[0], dtype), y=jnp.asarray(y[0], dtype),
        params={k: jnp.asarray(v[0], dtype) for k, v in params.items()},
    )


def _spike_draws(prior: CoordinateNormal, coefficient, key, num_chains):
    """θ drawn from the Normal spike (δ = 0), per chain: the default start of the fast path."""
    def one(k):
        return {coefficient: prior.spike_loc + prior.spike_scale * random.normal(k, prior.spike_loc.shape)}

    return one(key) if num_chains is None else jax.vmap(one)(key)


def _resolve_inner(variant, inner, gaussian_ok, why, family):
    """The STEP 1 move: ``"sgld"``, ``"gaussian"`` or ``"mala"``."""
    if variant == "sgld":
        return "sgld"
    if inner == "gaussian" and not gaussian_ok:
        raise ValueError(
            "inner='gaussian' needs the GLM fast path with a Gaussian likelihood"
            + (f" ({why})" if why else f" (the likelihood family is {family!r})") + "; use inner='mala'."
        )
    if inner == "auto":
        return "gaussian" if gaussian_ok else "mala"
    return inner


def _initial_state(plan, mb, params, delta, key, constants, model_args, model_kwargs):
    """The state of one chain at (params, δ) (pure; jitted with the data as arguments)."""
    ss = plan.ss
    p = ss.num_coefficients
    key, key_batch, key_out = random.split(key, 3)
    dtype = ravel_pytree(params)[0].dtype
    if plan.fast:
        active = jnp.nonzero(delta, size=plan.max_active, fill_value=p)[0].astype(jnp.int32)
        aux = constants
    else:
        active, aux = jnp.zeros((1,), jnp.int32), None
    return SparseAsyncState(
        i=jnp.int32(0),
        z={**params, ss.indicator: delta, _KEY: key_out},
        step_size=jnp.asarray(plan.step_size, dtype),
        accept_rate=jnp.ones((), dtype),
        model_size=jnp.sum(delta).astype(jnp.int32),
        active=active,
        aux=aux,
        hyper=SparseAsyncHyper(jnp.asarray(plan.step_size, jnp.result_type(float))),
        diverging=jnp.array(False),
        overflow=jnp.array(False),
        batch_state=mb.init_batch_state(key_batch) if mb is not None else None,
        rng_key=key,
    )


# -------------------------------------------------------------------------------------------
# the NumPyro shell
# -------------------------------------------------------------------------------------------
class SparseAsync(SGKernel):
    r"""Atchadé & Wang's (asynchronous) spike-and-slab sampler for a NumPyro model.

    See :mod:`numpyro_sg.kernels.sparse_async` for the algorithm.  Step-size convention:
    θ' = θ + (ε/2)·ĝ + N(0, ε·I) (MALA proposal and SGLD step); the paper's γ is ε/2.
    An option that does not apply to the chosen variant (or to the STEP 1 move that
    ``inner="auto"`` picks) is an error, not silently ignored.

    :param model: NumPyro model with an indicator site (Bernoulli, shape (p,)), a coefficient
        site (real, shape (p,), prior per coordinate given the indicator) and a likelihood that
        depends on the coefficient only through their product (see
        :mod:`numpyro_sg.spike_slab`).  ``"exact"`` and ``"async"`` use the full data (a
        subsample plate is run at full size; a model without a plate is accepted);
        ``"sgld"`` needs a subsample plate, whose size is the mini-batch B.
    :param step_size: ε of the MALA step (``inner="mala"``; adapted during warmup by
        Robbins–Monro toward acceptance ``target_accept_prob``, rate k^(−0.55)) or of the SGLD
        step (``variant="sgld"``; fixed).  Default 0.02 for MALA and 0.01 for SGLD (the paper's
        γ = 0.01 and 0.005).  Held in the state (:class:`SparseAsyncHyper`), so
        :func:`numpyro_sg.mamba` can tune it over vectorised arms.
    :param str variant: ``"exact"`` (Alg. 1: J indicators updated sequentially from the exact
        q_j — asymptotically exact), ``"async"`` (Alg. 2, default) or ``"sgld"`` (Alg. 3,
        SA-SGLD).
    :param int update_size: J, the number of indicators updated per iteration (1 ≤ J ≤ p;
        default min(100, p), the paper's J = 100).
    :param str inner: STEP 1 move for ``"exact"``/``"async"``: ``"gaussian"`` (exact draw
        from the Gaussian conditional; Gaussian likelihood with a fixed scale through X·β and a
        Normal slab), ``"mala"``, or ``"auto"`` (default: gaussian when it applies, else MALA).
        Not an option of ``"sgld"``.
    :param taylor: Q_j of the asynchronous update (``"async"``/``"sgld"``): ``"first"`` (Q = 0),
        ``"sensitive"`` (Q = ½θ_j²G_j², the paper's eq. (6)) or ``"second"``
        (Q = ½θ_j²·abs(∂²ℓ/∂β_j²), exact for a Gaussian likelihood).  Default: ``"first"`` for a
        Gaussian likelihood, ``"sensitive"`` otherwise.  Measured (SPEC §6, linear, p = 1,000,
        N = 500, J = 100, 2,000 iterations): with ϱ = 0 the paper's choice
        (``taylor="sensitive"``, ``async_point="excluded"``) over-selects (size(δ) 66–89
        instead of 10, relative error 4× the exact sampler's) while the defaults (Q = 0 at the
        current point) match the exact sampler; with ϱ = 0.9 Q = ½θ²G² explored best.
    :param str async_point: where G is evaluated (``"async"``/``"sgld"``): ``"current"``
        (default; β = θ·(δ ∨ 1_J), every chosen coordinate on at its current value, the authors'
        code) or ``"excluded"`` (β = θ·ϑ, the chosen ones off; the paper's text).
    :param int max_active: static size of the active-set index list of the fast path (default
        min(p, 256)); exceeding it is an error that names this argument.  Not an option of
        the dense path.
    :param bool adapt_step_size: adapt the MALA ε during warmup (default True; MALA only).
    :param float target_accept_prob: target MALA acceptance of the adaptation (default 0.5).
    :param indicator: name of the indicator site (found automatically when omitted).
    :param coefficient: name of the coefficient site (found automatically when omitted).
    :param str fast_path: ``"auto"``, ``"glm"`` (require the GLM fast path; an error says why
        it does not apply) or ``"generic"`` (dense evaluation of the model).
    :param effective_name: output name of θ·δ (default ``"beta"``, or ``"<coefficient>_eff"``
        when the model has a non-deterministic ``beta`` site).
    :param subsample_size: the mini-batch B of ``"sgld"`` (default: the plate's own size).
    :param bool replace: ``"sgld"`` draws its mini-batch indices with replacement (default)
        or walks per-epoch permutations (``False``).
    :param init_strategy: NumPyro init strategy of the continuous sites (default: θ from the
        spike, δ = 0; pass ``init_params={..., "delta": δ0}`` to start from another model).
    :param bool check_data: check at ``init`` that the data in the subsample plate are finite.

    Output per draw (``mcmc.get_samples()``): θ (excluded coordinates drawn from the spike),
    δ (int32), θ·δ.  Extra fields: ``model_size`` (size(δ)), ``step_size``, ``accept_rate``,
    ``diverging``.

    **Example:**

    .. code-block:: python

        kernel = nsg.SparseAsync(ds.sparse_async_linear_model, variant="async", update_size=100)
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=1000)
        mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("model_size",))

        # SA-SGLD on mini-batches of 100, ε = 0.01 (the paper's γ = 0.005)
        nsg.SparseAsync(ds.sparse_async_logistic_model, 0.01, variant="sgld", subsample_size=100)
    """

    State = SparseAsyncState
    HYPERPARAMETERS = ("step_size",)

    def __init__(self, model, step_size=None, *, variant="async", update_size=None, inner="auto",
                 taylor=None, async_point=None, max_active=None, adapt_step_size=None,
                 target_accept_prob=None, indicator=None, coefficient=None, fast_path="auto",
                 effective_name=None, subsample_size=None, replace=None, init_strategy=None,
                 check_data=True):
        _check_options(variant, step_size, update_size, inner, taylor, async_point, max_active,
                       adapt_step_size, target_accept_prob, fast_path, subsample_size, replace)
        super().__init__(model, subsample_size=subsample_size, replace=replace is not False,
                         init_strategy=init_strategy, check_data=check_data)
        self.step_size = step_size
        self.variant = variant
        self.update_size = update_size
        self.inner = inner
        self.taylor = taylor
        self.async_point = async_point
        self.max_active = max_active
        self.adapt_step_size = adapt_step_size
        self.target_accept_prob = target_accept_prob
        self.fast_path = fast_path
        self._sites = {"indicator": indicator, "coefficient": coefficient}
        self._effective_name = effective_name
        self._plan = None  # static metadata resolved at init (a _Plan)
        self._constants = None  # the fast path's constants (prior, offset, y, …), set at init
        self._setup_leaves = None  # the data the plan was made for

    # -- public metadata (known after ``init``) -----------------------------------------------
    @property
    def spike_slab(self):
        """The :class:`~numpyro_sg.spike_slab.SpikeSlab` structure found at ``init``."""
        return None if self._plan is None else self._plan.ss

    @property
    def uses_fast_path(self) -> bool:
        """True when the O(N·(size(δ) + J)) GLM path is used (known after ``init``)."""
        return self._plan is not None and self._plan.fast

    @property
    def inner_kind(self) -> str | None:
        """The STEP 1 move in use: ``"gaussian"``, ``"mala"`` or ``"sgld"`` (after ``init``)."""
        return None if self._plan is None else self._plan.inner

    @property
    def taylor_kind(self) -> str | None:
        """The Q_j of the asynchronous update in use (after ``init``; ``None`` for ``"exact"``)."""
        return None if self._plan is None else self._plan.taylor

    @property
    def effective_name(self) -> str | None:
        """Output name of θ·δ (after ``init``)."""
        return None if self._plan is None else self._plan.effective_name

    def get_diagnostics_str(self, state):
        msg = f"|δ| {int(jnp.max(state.model_size))}"
        if self.inner_kind in ("mala", "sgld"):
            msg += f", ε {float(jnp.mean(state.step_size)):.2e}, acc. {float(jnp.mean(state.accept_rate)):.2f}"
        if bool(jnp.any(state.diverging)):
            msg += ", DIVERGED"
        return msg

    # -- init ----------------------------------------------------------------------------------
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        self._num_warmup = int(num_warmup)
        batched, rng_key, key_init = split_init_key(rng_key)
        num_chains = jnp.shape(rng_key)[0] if batched else None
        # chain_method="parallel" calls init under a trace: the structural work stays eager
        with jax.ensure_compile_time_eval():
            params, delta = self._prepare(key_init, init_params, num_chains, model_args, model_kwargs)
        self._check_initial_indicator(delta)
        _, self._unravel = ravel_pytree(jax.tree.map(lambda x: x[0], params) if batched else params)
        init_one = partial(_initial_state, self._plan, self._mb)
        if batched:
            init_one = jax.vmap(init_one, in_axes=(0, 0, 0, None, None, None))
        # the data arrays are arguments, not constants baked into the compiled program
        state = jit_with_data(init_one, model_args, model_kwargs)(
            params, delta.astype(jnp.int32), rng_key, self._constants)
        self._sample_fn = self.sample
        return state

    def _prepare(self, key_init, init_params, num_chains, model_args, model_kwargs):
        """Structure (once per data set: the next chain of ``"sequential"`` reuses it) and the
        starting values, from one trace of the model (none when both are known)."""
        leaves = jax.tree.leaves((model_args, model_kwargs))
        cached = self._setup_leaves is not None and len(self._setup_leaves) == len(leaves) and all(
            a is b for a, b in zip(self._setup_leaves, leaves))
        if not cached:
            info = trace_model(self._model, model_args, model_kwargs)
            # the GLM family is needed for the fast path and for the default taylor (Gaussian or not)
            detect = self.fast_path != "generic" or (self.variant != "exact" and self.taylor is None)
            ss = find_spike_slab(
                self._model, model_args, model_kwargs, **self._sites, glm="auto" if detect else False,
                subsample_size=self._subsample_size if self.variant == "sgld" else None, info=info,
            )
            self._plan, self._constants = self._make_plan(ss, info, model_args, model_kwargs)
            if not any(isinstance(x, jax.core.Tracer) for x in leaves):
                self._setup_leaves = leaves
        ss = self._plan.ss
        params, delta = _split_init_params(ss, init_params)
        if not params and self._plan.fast and self._init_strategy is None:
            params = _spike_draws(self._constants.prior, ss.coefficient, key_init, num_chains)
        elif not params:
            strategy = self._init_strategy or init_to_spike(coefficient=ss.coefficient)
            zeros = jnp.zeros((ss.num_coefficients,), jnp.int32)
            params = trace_model(ss.conditioned(zeros), model_args, model_kwargs,
                                 init_strategy=strategy, rng_key=key_init).init_values
        if delta is None:
            shape = (ss.num_coefficients,) if num_chains is None else (num_chains, ss.num_coefficients)
            delta = jnp.zeros(shape, jnp.int32)
        return params, jnp.asarray(delta)

    def _make_plan(self, ss, info, model_args, model_kwargs):
        """The static :class:`_Plan` (and the fast path's Normal prior) for one data set."""
        p, sgld = ss.num_coefficients, self.variant == "sgld"
        J = min(100, p) if self.update_size is None else int(self.update_size)
        if not 1 <= J <= p:
            raise ValueError(f"update_size must lie in [1, p] = [1, {p}], got {J}.")
        if sgld and ss.plate is None:
            raise ValueError(
                "variant='sgld' needs a subsample plate (numpyro.plate('data', N, "
                "subsample_size=B)); the model has none. Use variant='async' or 'exact'."
            )
        if self._check_data and ss.plate is not None:
            check_data_finite(info, (ss.plate,), model_args, model_kwargs)
        self._mb = Minibatcher(self._model, (ss.plate,), replace=self._replace) if sgld else None
        why, constants = _fast_path_reason(ss, self.fast_path, info.subsample_data, model_args, model_kwargs)
        if self.fast_path == "glm" and why is not None:
            raise ValueError(f"fast_path='glm' but the GLM fast path does not apply: {why}.")
        family = ss.glm.family_name if ss.glm is not None else None
        inner = _resolve_inner(self.variant, self.inner, why is None and family == "gaussian", why, family)
        if self.inner == "auto":
            given = {"step_size": self.step_size, "adapt_step_size": self.adapt_step_size,
                     "target_accept_prob": self.target_accept_prob}
            _check_step_options(inner, given, why=", chosen by inner='auto'")
        if self.max_active is not None and why is not None:
            raise ValueError(f"max_active applies to the GLM fast path, which does not apply here: {why}.")
        m = min(p, 256) if self.max_active is None else min(int(self.max_active), p)
        taylor = self.taylor or ("first" if family == "gaussian" else "sensitive")
        plan = _Plan(
            ss=ss, variant=self.variant, inner=inner, taylor=None if self.variant == "exact" else taylor,
            point=self.async_point or "current", update_size=J, max_active=m, buckets=_bucket_sizes(m),
            fast=why is None, adapt=inner == "mala" and self.adapt_step_size is not False,
            target=0.5 if self.target_accept_prob is None else float(self.target_accept_prob),
            step_size=float(self.step_size if self.step_size is not None else (0.01 if sgld else 0.02)),
            effective_name=effective_site_name(ss, info.site_types, self._effective_name),
        )
        if constants is not None and self.variant != "sgld":
            # exact/async gather whole columns of X: keep a (p, N) copy so that a column is one
            # contiguous read (gathering J columns of a row-major (N, p) array is N·J cache misses)
            X = design_array(ss.glm.source, info.subsample_data, model_args, model_kwargs)
            constants = constants._replace(Xt=jnp.asarray(X, jnp.result_type(float)).T.copy())
        return plan, constants

    def _check_initial_indicator(self, delta):
        if isinstance(delta, jax.core.Tracer):  # chain_method="parallel" traces init
            return
        plan, d = self._plan, np.asarray(delta)
        if not np.all((d == 0) | (d == 1)):
            raise ValueError(f"The initial indicator {plan.ss.indicator!r} must be 0/1.")
        size = int(d.reshape(-1, plan.ss.num_coefficients).sum(-1).max())
        if plan.fast and size > plan.max_active:
            raise ValueError(
                f"The initial indicator {plan.ss.indicator!r} has {size} active coordinates, "
                f"more than max_active = {plan.max_active}; pass a larger max_active."
            )

    def _refresh(self, state):
        """The current ε restarts from the (replaced) base value ``hyper.step_size``."""
        return state._replace(step_size=jnp.asarray(state.hyper.step_size, jnp.result_type(state.step_size)))

    # -- one iteration ---------------------------------------------------------------------------
    def step(self, state, model_args, model_kwargs):
        """One iteration of one chain (pure): STEP 1, STEP 2, ε adapted during warmup (MALA);
        a chain whose continuous state becomes non-finite is frozen (``diverging``)."""
        plan = self._plan
        if plan.fast:
            new = _glm_iteration(plan, self._mb, state, model_args, model_kwargs)
        else:
            new = _dense_iteration(plan, self._mb, self._unravel, state, model_args, model_kwargs)
        new = new._replace(step_size=_adapted_step_size(plan, state, new.accept_rate, self._num_warmup))
        ok = all_finite(ravel_pytree({k: v for k, v in new.z.items() if k != _KEY})[0])
        diverging = state.diverging | ~ok
        z, active, size = freeze(diverging, (state.z, state.active, state.model_size),
                                 (new.z, new.active, new.model_size))
        return new._replace(z=z, active=active, model_size=size, diverging=diverging)

    def sample(self, state, model_args, model_kwargs):
        new = super().sample(state, model_args, model_kwargs)
        if self._plan.fast:  # one check outside any vmap of the chains
            newly = jnp.any(new.overflow & ~state.overflow)
            lax.cond(newly, lambda: jax.debug.callback(self._raise_overflow, state.i), lambda: None)
        return new

    def _raise_overflow(self, iteration):
        raise ValueError(
            f"SparseAsync: at iteration {int(np.max(iteration)) + 1} the model size "
            f"size({self._plan.ss.indicator}) would exceed max_active = {self._plan.max_active} (the "
            "static size of the active-set index list of the fast path). Pass a larger max_active "
            "(cost O(N·max_active) per iteration at worst) or fast_path='generic'."
        )

    # -- output --------------------------------------------------------------------------------
    def postprocess_fn(self, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        ss = self.spike_slab
        if ss is None:
            return lambda z: z
        if ss.deterministic_in_plate and ss.plate is not None:
            model = full_data(self._model, (ss.plate,))
        else:
            model = with_indices(self._model, ss.first_indices(1))
        spike_fn = ss.spike_sample_fn(model_args, model_kwargs)
        eff = self.effective_name

        def postprocess(z):
            z = dict(z)
            delta = z.pop(ss.indicator)
            key = z.pop(_KEY)
            out = constrain_fn(ss.conditioned(delta, model), model_args, model_kwargs, z, return_deterministic=True)
            spike = spike_fn(key, out)
            theta = jnp.where(delta == 1, out[ss.coefficient], spike.astype(out[ss.coefficient].dtype))
            out[ss.coefficient] = theta
            out[ss.indicator] = delta
            out[eff] = theta * delta
            return out

        return postprocess


def _split_init_params(ss, init_params):
    """``(continuous unconstrained values or {}, indicator or None)`` of the user's init_params."""
    if init_params is None:
        return {}, None
    params = {k: v for k, v in dict(init_params).items() if k not in (ss.indicator, _KEY)}
    return params, dict(init_params).get(ss.indicator)
