r"""Extended SGLD (eSGLD) for Bayesian variable selection — paper 000 (Alg. 1, supp. §3), SPEC §5.

The model (see :mod:`numpyro_sg.spike_slab`) has an indicator γ ∈ {0,1}^p, a latent vector
θ ∈ ℝ^p whose prior may depend on γ, and a likelihood that depends on θ only through
β = θ·γ.  Iteration t, with mini-batch S_t of size n out of N:

1. Draw S_t.
2. Run a short reversible-jump Metropolis–Hastings chain on γ with θ fixed at θ⁽ᵗ⁾, targeting

   .. math::

      \pi(\gamma \mid \theta, X_{n,N}) \propto \pi(\gamma)\,\pi(\theta\mid\gamma)\,
      \exp\Big(\tfrac{N}{n}\sum_{i\in S_t}\log f(x_i \mid \theta\cdot\gamma)\Big),
      \qquad |\gamma| \le q,

   started from the last model of the previous iteration; its m successive states are the
   models γ_1..γ_m (``num_models``).  Moves: birth / death / exchange, each with
   probability 1/3 when 0 < size(S) < q, birth only at size(S) = 0, death only at size(S) = q.  Birth
   picks j ∉ S with probability ∝ w_j, death picks j ∈ S ∝ 1 − w_j, exchange does both.
   The acceptance ratio is the full Hastings ratio (target ratio × reverse/forward proposal
   probabilities, the move-type probabilities at the boundaries included).  With
   ``flip_sign=True`` (the paper's default) the sign of θ_j flips with probability ½ when j
   enters or leaves, as part of the (symmetric) proposal; an accepted flip carries into θ.
3. Langevin step on θ (and any other continuous site) averaged over the m models:

   .. math::

      \theta^{(t+1)} = \theta^{(t)} + \frac{\varepsilon_t}{2m}\sum_{k=1}^m
      \nabla_\theta \log \pi(\theta^{(t)}\mid\gamma_k, X_{n,N}) + \mathcal N(0, \varepsilon_t\tau I),

   with log π(θ | γ, X_{n,N}) = log π(θ|γ) + (N/n)·Σ_{i∈S_t} log f(x_i | θ·γ) (the package's
   step convention θ' = θ + (ε/2)·ĝ + N(0, ε·τ); θ⁽ᵗ⁾ is θ after the accepted sign flips).

Noisy acceptance (``mh_correction="penalty"``): the mini-batch estimate of the log-likelihood
difference of a proposal, Σ_{i∈S} a_i with a_i = (N/n)·Δℓ_i, has variance
σ̂² = n·var_i(a_i) = (N²/n)·var_i(Δℓ_i) (times 1 − n/N without replacement); the penalty
method for noisy Metropolis–Hastings subtracts σ̂²/2 from the log acceptance ratio.

Cost: for GLM likelihoods (linear predictor η = X·β; see :mod:`numpyro_sg.spike_slab`) a
proposal updates η for its one or two changed coordinates, O(n) (plus O(p) to pick the
coordinates); otherwise each proposal evaluates the model on the mini-batch.  The Langevin
step costs m model gradients on the mini-batch.  Nothing is O(N) per iteration.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import constrain_fn

from numpyro_sg.kernels.base import SGKernel, all_finite, jit_with_data, split_init_key
from numpyro_sg.minibatch import Minibatcher, discover_plates, full_data, with_indices
from numpyro_sg.spike_slab import (
    effective_site_name,
    find_spike_slab,
    init_to_spike,
    initial_values,
    site_types,
)

__all__ = [
    "ESGLD",
    "ESGLDState",
    "move_probabilities",
    "propose_move",
    "Proposal",
    "correlation_weights",
    "deviance_weights",
    "penalty",
    "init_to_spike",
]

_WEIGHT_KINDS = ("auto", "correlation", "deviance", "uniform")
_CORRECTIONS = (None, "penalty")
_W_MIN = 1e-6


# -------------------------------------------------------------------------------------------
# pure building blocks
# -------------------------------------------------------------------------------------------
def move_probabilities(size, max_size):
    """(P(birth), P(death), P(exchange)) for a current model S of size ``size`` (supp. §3).

    1/3 each when 0 < size(S) < q; birth only at size(S) = 0; death only at size(S) = q.
    """
    size = jnp.asarray(size)
    third = jnp.float32(1.0 / 3.0)
    pb = jnp.where(size == 0, 1.0, jnp.where(size >= max_size, 0.0, third))
    pd = jnp.where(size == 0, 0.0, jnp.where(size >= max_size, 1.0, third))
    pe = jnp.where((size == 0) | (size >= max_size), 0.0, third)
    return pb, pd, pe


class Proposal(NamedTuple):
    """A birth / death / exchange proposal.

    ``j_out`` leaves the model (death, exchange), ``j_in`` enters it (birth, exchange);
    ``has_out``/``has_in`` say whether each slot is used (an unused slot's index is a
    placeholder); ``s_out``/``s_in`` ∈ {−1, +1} are the sign flips of θ; ``log_q_ratio`` is
    log q(reverse)/q(forward); ``valid`` is False for a degenerate draw (rejected).
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


def propose_move(key, gamma, weights, max_size, flip_sign=True):
    """Draw a reversible-jump proposal from model γ (supp. §3) and its Hastings log-ratio.

    Birth S → S ∪ {j}: q = P_b(size(S))·w_j/Σ_{k∉S} w_k, reverse P_d(size(S)+1)·(1−w_j)/Σ_{k∈S∪{j}}(1−w_k).
    Death S → S∖{j}: q = P_d(size(S))·(1−w_j)/Σ_{k∈S}(1−w_k), reverse P_b(size(S)−1)·w_j/Σ_{k∉S∖{j}} w_k.
    Exchange (j out, k in): q = P_e·(1−w_j)/Σ_{S}(1−w)·w_k/Σ_{∉S} w, reverse likewise from
    S' = S∖{j}∪{k}.  Sign flips (probability ½ each) are symmetric and add no factor.
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


def apply_proposal(gamma, theta, prop):
    """(γ', θ') after a proposal (slot by slot, so a placeholder index never clobbers)."""
    g1 = gamma.at[prop.j_out].set(jnp.where(prop.has_out, 0, gamma[prop.j_out]).astype(gamma.dtype))
    g2 = g1.at[prop.j_in].set(jnp.where(prop.has_in, 1, g1[prop.j_in]).astype(gamma.dtype))
    t1 = theta.at[prop.j_out].multiply(jnp.where(prop.has_out, prop.s_out, 1.0))
    t2 = t1.at[prop.j_in].multiply(jnp.where(prop.has_in, prop.s_in, 1.0))
    return g2, t2


def penalty(delta_terms, fpc=1.0):
    """σ̂²/2 with σ̂² = n·var_i(a_i)·fpc, a_i the scaled per-datum log-likelihood differences."""
    n = delta_terms.shape[0]
    if n < 2:
        return jnp.zeros((), delta_terms.dtype)
    return 0.5 * n * jnp.var(delta_terms, ddof=1) * fpc


def correlation_weights(X, y):
    """w_j = exp(abs(corr(y, x_j)) − 1) (supp. §3, linear models); constant columns get exp(−1)."""
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


# -------------------------------------------------------------------------------------------
# the kernel
# -------------------------------------------------------------------------------------------
class ESGLDState(NamedTuple):
    """State of :class:`ESGLD`.

    ``i`` iteration counter (warmup included); ``z`` a dict of the unconstrained continuous
    sites, the indicator (int32, the last model γ_m of the inner chain) and the inclusion
    frequency (1/m)·Σ_k γ_k; ``z_grad`` the model-averaged stochastic gradient at ``z``
    (flat, continuous sites); ``step_size`` the ε that produced ``z``; ``accept_rate`` the
    fraction of the m reversible-jump proposals accepted; ``model_size`` size(γ_m); ``weights``
    the proposal weights w; ``diverging`` True from the first non-finite state or gradient on.
    """

    i: Any
    z: Any
    z_grad: Any
    step_size: Any
    accept_rate: Any
    model_size: Any
    weights: Any
    diverging: Any
    batch_state: Any
    rng_key: Any


class ESGLD(SGKernel):
    r"""Extended SGLD for Bayesian variable selection with a spike-and-slab NumPyro model.

    Each iteration draws a mini-batch, runs ``num_models`` steps of a reversible-jump MH
    chain on the indicator γ (θ fixed), then moves θ by one Langevin step averaged over the
    m models: θ' = θ + (ε/(2m))·Σ_k ∇_θ log π(θ | γ_k, X_{n,N}) + N(0, ε·τ·I) (the package's
    convention θ' = θ + (ε/2)·ĝ + N(0, ε·τ)).  See :mod:`numpyro_sg.kernels.esgld` for the
    moves and the Hastings ratio.

    :param model: NumPyro model with a subsample plate, an indicator site (Bernoulli, shape
        (p,)) and a coefficient site (real, shape (p,)) entering the likelihood only through
        their product (see :mod:`numpyro_sg.spike_slab`).
    :param step_size: ε > 0: a float, an array over the flat unconstrained continuous sites,
        or a callable schedule t ↦ ε_t (e.g. :func:`~numpyro_sg.polynomial_schedule`).
        The paper uses ε ≈ 1/N or smaller (1e-6 at N = 50,000 for the linear example).
    :param int num_models: m, the number of RJ-MH steps (models) per iteration (paper: 10).
    :param max_model_size: q, models are truncated to size(γ) ≤ q (1 ≤ q ≤ p; default p).
    :param proposal_weights: ``"auto"`` (``"correlation"`` for a Gaussian GLM likelihood,
        ``"deviance"`` for other GLMs, ``"uniform"`` otherwise), ``"correlation"``
        (w_j = exp(abs(corr(y, x_j)) − 1)), ``"deviance"`` (w_j = exp(−(d_j − min d)/(5·sd d) −
        0.1), d_j the one-variable GLM deviance, fitted on at most ``weight_rows`` rows),
        ``"uniform"`` (w_j = ½) or an array of p weights in (0, 1).
    :param bool flip_sign: flip θ_j's sign with probability ½ when j enters or leaves
        (default, as in the paper).
    :param mh_correction: ``None`` (plain mini-batch acceptance, as in the paper) or
        ``"penalty"`` (subtract half the estimated variance of the mini-batch log-likelihood
        difference from the log acceptance ratio; use it when n is small or N is small, where
        the noisy ratio inflates the inclusion of null variables).
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
    :param int weight_rows: rows used to compute data-based proposal weights (default 20,000).
    :param init_strategy: NumPyro init strategy for the continuous sites; default
        :func:`init_to_spike` (θ from the spike, γ = 0, which the paper's search needs).
    :param kwargs: ``subsample_size``, ``replace``, ``check_data``: see
        :class:`~numpyro_sg.kernels.base.SGKernel`.  A ``subsample_size`` equal to N means
        full-batch: every iteration uses all N data (no noise, no penalty).

    Output per draw (``mcmc.get_samples()``): the constrained continuous sites (θ, …), the
    indicator γ_m as int32 in {0, 1}, the effective coefficients β = θ·γ_m and the inclusion
    frequency (1/m)·Σ_k γ_k (its mean over draws estimates the marginal posterior inclusion
    probabilities, Theorem 1(iii)).  Extra fields: ``step_size``, ``accept_rate``,
    ``model_size``, ``diverging``.
    """

    State = ESGLDState

    def __init__(
        self,
        model,
        step_size=1e-6,
        *,
        num_models: int = 10,
        max_model_size: int | None = None,
        proposal_weights="auto",
        flip_sign: bool = True,
        mh_correction: str | None = None,
        temperature: float = 1.0,
        indicator: str | None = None,
        coefficient: str | None = None,
        fast_path: str = "auto",
        effective_name: str | None = None,
        inclusion_name: str = "inclusion",
        weight_rows: int = 20_000,
        init_strategy=None,
        **kwargs,
    ):
        if not callable(step_size) and not np.all(np.asarray(step_size) > 0):
            raise ValueError(f"step_size must be positive, got {step_size!r}.")
        if isinstance(num_models, bool) or not isinstance(num_models, (int, np.integer)) or num_models < 1:
            raise ValueError(f"num_models must be an int ≥ 1, got {num_models!r}.")
        if max_model_size is not None and (
            isinstance(max_model_size, bool)
            or not isinstance(max_model_size, (int, np.integer))
            or max_model_size < 1
        ):
            raise ValueError(f"max_model_size must be an int ≥ 1 (and ≤ p), got {max_model_size!r}.")
        if mh_correction not in _CORRECTIONS:
            raise ValueError(f"mh_correction must be one of {_CORRECTIONS}, got {mh_correction!r}.")
        if isinstance(proposal_weights, str):
            if proposal_weights not in _WEIGHT_KINDS:
                raise ValueError(
                    f"proposal_weights must be one of {_WEIGHT_KINDS} or an array, got "
                    f"{proposal_weights!r}."
                )
        else:
            w = np.asarray(proposal_weights, dtype=float)
            if w.ndim != 1 or not np.all((w > 0) & (w < 1)):
                raise ValueError("proposal_weights as an array must be a vector of values in (0, 1).")
        if fast_path not in ("auto", "glm", "generic"):
            raise ValueError(f"fast_path must be 'auto', 'glm' or 'generic', got {fast_path!r}.")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature!r}.")
        super().__init__(model, init_strategy=init_strategy, **kwargs)
        self.step_size = step_size
        self.num_models = int(num_models)
        self.max_model_size = max_model_size
        self.proposal_weights = proposal_weights
        self.flip_sign = bool(flip_sign)
        self.mh_correction = mh_correction
        self.temperature = float(temperature)
        self._indicator = indicator
        self._coefficient = coefficient
        self.fast_path = fast_path
        self._effective_name = effective_name
        self.inclusion_name = inclusion_name
        self.weight_rows = int(weight_rows)
        self._ss = None
        self._q = None

    # -- public metadata ---------------------------------------------------------------------
    @property
    def spike_slab(self):
        """The :class:`~numpyro_sg.spike_slab.SpikeSlab` structure found at ``init``."""
        return self._ss

    @property
    def indicator(self):
        return None if self._ss is None else self._ss.indicator

    @property
    def coefficient(self):
        return None if self._ss is None else self._ss.coefficient

    @property
    def uses_glm_path(self) -> bool:
        """True when proposals use the O(n) GLM update (known after ``init``)."""
        return self._ss is not None and self._ss.glm is not None

    @property
    def default_fields(self):
        return ("z", "diverging")

    def get_diagnostics_str(self, state):
        msg = f"step size {float(jnp.mean(state.step_size)):.2e}, |γ| {int(jnp.max(state.model_size))}"
        msg += f", acc. {float(jnp.mean(state.accept_rate)):.2f}"
        if bool(jnp.any(state.diverging)):
            msg += ", DIVERGED"
        return msg

    # -- init ----------------------------------------------------------------------------
    def _setup(self, model_args, model_kwargs):
        """Plates, spike-and-slab structure, q, proposal-weight kind and output names."""
        plates = discover_plates(
            self._model, model_args, model_kwargs,
            subsample_size=self._subsample_size, check_data=self._check_data,
        )
        if len(plates) != 1:
            raise ValueError(f"ESGLD needs exactly one subsample plate; the model has {[p.name for p in plates]}.")
        ss = find_spike_slab(
            self._model, model_args, model_kwargs,
            indicator=self._indicator, coefficient=self._coefficient,
            subsample_size=self._subsample_size,
            glm={"auto": "auto", "glm": True, "generic": False}[self.fast_path],
        )
        self._ss = ss
        p = ss.num_coefficients
        q = p if self.max_model_size is None else int(self.max_model_size)
        if not 1 <= q <= p:
            raise ValueError(f"max_model_size must lie in [1, p] = [1, {p}], got {q}.")
        self._q = q
        kind = self.proposal_weights
        if isinstance(kind, str):
            if kind == "auto":
                kind = "uniform" if ss.glm is None else (
                    "correlation" if ss.glm.family_name == "gaussian" else "deviance"
                )
            if kind in ("correlation", "deviance") and ss.glm is None:
                raise ValueError(
                    f"proposal_weights={kind!r} needs a GLM likelihood (linear predictor X·β), "
                    "which was not detected for this model; use 'uniform' or an array."
                )
        else:
            w = np.asarray(kind, dtype=float)
            if w.shape != (p,):
                raise ValueError(f"proposal_weights has shape {w.shape}; the model has p = {p} coefficients.")
        self._weight_kind = kind
        self._mb = Minibatcher(self._model, plates, replace=self._replace)
        self._full_batch = ss.plate.subsample_size == ss.plate.size
        existing = site_types(self._model, model_args, model_kwargs)
        eff = effective_site_name(ss, existing, self._effective_name)
        if self.inclusion_name in existing:
            raise ValueError(f"inclusion_name={self.inclusion_name!r} is a site of the model; pick another.")
        self.effective_name = eff


    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        self._num_warmup = int(num_warmup)
        self._setup(model_args, model_kwargs)
        ss, q = self._ss, self._q
        batched, rng_key, key_init = split_init_key(rng_key)
        init_params, gamma0 = initial_values(
            ss, key_init, init_params, self._init_strategy, model_args, model_kwargs,
            num_chains=jnp.shape(rng_key)[0] if batched else None, ignore=(self.inclusion_name,),
        )
        one_chain = jax.tree.map(lambda x: x[0], init_params) if batched else init_params
        _, self._unravel = ravel_pytree(one_chain)
        gamma0 = gamma0.astype(jnp.int32)
        if bool(jnp.any(jnp.sum(gamma0, -1) > q)):
            raise ValueError(f"The initial indicator has more than max_model_size = {q} ones.")

        def init_one(params, gamma, key, model_args, model_kwargs):
            flat = ravel_pytree(params)[0]
            key, key_batch, key_idx, key_rj = random.split(key, 4)
            weights = self._weights(params, gamma, model_args, model_kwargs)
            batch_state = self._mb.init_batch_state(key_batch)
            indices, batch_state = self._draw(key_idx, batch_state)
            flat, gammas, acc, _, grad = self._models_and_gradient(
                flat, gamma, key_rj, indices, weights, model_args, model_kwargs
            )
            return ESGLDState(
                i=jnp.int32(0),
                z=self._pack(flat, gammas),
                z_grad=grad,
                step_size=self._step_size_at(0, flat),
                accept_rate=acc,
                model_size=jnp.sum(gammas[-1]).astype(jnp.int32),
                weights=weights,
                diverging=jnp.array(False),
                batch_state=batch_state,
                rng_key=key,
            )

        if batched:
            init_one = jax.vmap(init_one, in_axes=(0, 0, 0, None, None))
        state = jit_with_data(init_one, model_args, model_kwargs)(init_params, gamma0, rng_key)
        self._sample_fn = self.sample
        return state

    # -- helpers ---------------------------------------------------------------------------
    def _step_size_at(self, t, flat):
        eps = self.step_size(t) if callable(self.step_size) else self.step_size
        eps = jnp.asarray(eps, dtype=flat.dtype)
        if eps.ndim > 1 or (eps.ndim == 1 and eps.shape != flat.shape):
            raise ValueError(
                f"step_size has shape {eps.shape} but the model has {flat.shape[0]} "
                "unconstrained continuous coordinates."
            )
        return eps

    def _draw(self, key, batch_state):
        if self._full_batch:
            return self._ss.full_indices(), batch_state
        return self._mb.draw(key, batch_state)

    def _pack(self, flat, gammas):
        z = dict(self._unravel(flat))
        z[self._ss.indicator] = gammas[-1].astype(jnp.int32)
        z[self.inclusion_name] = jnp.mean(gammas.astype(flat.dtype), 0)
        return z

    def _unpack(self, z):
        z = dict(z)
        gamma = z.pop(self._ss.indicator)
        z.pop(self.inclusion_name)
        return z, gamma

    def _weights(self, params, gamma, model_args, model_kwargs):
        ss = self._ss
        p = ss.num_coefficients
        kind = self._weight_kind
        if not isinstance(kind, str):
            return jnp.clip(jnp.asarray(kind, jnp.result_type(float)), _W_MIN, 1 - _W_MIN)
        if kind == "uniform":
            return jnp.full((p,), 0.5, jnp.result_type(float))
        values = ss.constrain_fn(model_args, model_kwargs)(params, gamma)
        batch = ss.glm_batch_fn(model_args, model_kwargs)(values, jnp.zeros((p,)), None)
        rows = min(self.weight_rows, ss.plate.size)
        X, y = batch.X[:rows], batch.y[:rows]
        if kind == "correlation":
            return correlation_weights(X, y)
        prm = {k: v[:rows, None] for k, v in batch.params.items()}
        return deviance_weights(X, y, ss.glm.family, prm)

    def _models_and_gradient(self, flat, gamma, key, indices, weights, model_args, model_kwargs):
        """RJ-MH chain at θ (flat) on the mini-batch, then the model-averaged gradient.

        Returns (flat after accepted sign flips, models (m, p), acceptance rate, mean log
        density, gradient).
        """
        flat, gammas, n_acc = self._inner_chain(
            flat, gamma, key, indices, weights, model_args, model_kwargs, self.num_models
        )
        log_density = self._ss.log_density_fn(model_args, model_kwargs)
        unravel = self._unravel

        def mean_log_density(x):
            prm = unravel(x)
            return jnp.mean(jax.vmap(lambda g: log_density(prm, g, indices))(gammas))

        value, grad = jax.value_and_grad(mean_log_density)(flat)
        acc = n_acc.astype(flat.dtype) / self.num_models
        return flat, gammas, acc, value, grad

    def _inner_chain(self, flat, gamma, key, indices, weights, model_args, model_kwargs, num_steps):
        """``num_steps`` RJ-MH steps on γ at θ (flat) with the given data indices.

        Returns (flat after accepted sign flips, the chain's states (num_steps, p), number of
        accepted proposals).
        """
        ss = self._ss
        params = self._unravel(flat)
        values = ss.constrain_fn(model_args, model_kwargs)(params, gamma)
        theta = values[ss.coefficient]
        gamma = gamma.astype(jnp.int32)
        fpc = 0.0 if self._full_batch else (1.0 if self._replace else 1.0 - ss.plate.subsample_size / ss.plate.size)
        use_penalty = self.mh_correction == "penalty" and not self._full_batch
        q = self._q
        flip = self.flip_sign

        if ss.glm is not None:
            family = ss.glm.family
            batch = ss.glm_batch_fn(model_args, model_kwargs)(values, theta * gamma, indices)
            Xt = batch.X.T  # (p, n): contiguous rows for the O(n) column updates

            def loglik_terms(eta):
                return batch.scale * family.loglik(eta, batch.y, batch.params)

            eval_state0 = (batch.eta, loglik_terms(batch.eta))
        else:
            terms_fn = ss.terms_fn(model_args, model_kwargs)
            lp0, tr0 = terms_fn(values, gamma, indices)
            eval_state0 = (lp0, tr0)

        per_coord = ss.glm is not None and ss.per_coordinate_prior
        if per_coord:
            cfn = ss.coordinate_prior_fn(model_args, model_kwargs)
            cp_pos, cp_neg = cfn(values, theta), cfn(values, -theta)
            # table[s, g, j]: log p(γ_j = g) + log p(±θ_j | γ_j = g), s = 0 for +θ_j, 1 for −θ_j
            table = jnp.stack([
                jnp.stack([cp_pos.indicator0 + cp_pos.coefficient0, cp_pos.indicator1 + cp_pos.coefficient1]),
                jnp.stack([cp_neg.indicator0 + cp_neg.coefficient0, cp_neg.indicator1 + cp_neg.coefficient1]),
            ])
            prior_cur0 = jnp.zeros((), theta.dtype)
        elif ss.glm is not None:
            prior_fn = ss.prior_fn(model_args, model_kwargs)
            prior_cur0 = prior_fn(values, gamma)
        else:
            prior_cur0 = jnp.zeros((), theta.dtype)

        def body(carry, k):
            gam, th, flipped, ev, prior_cur, n_acc = carry
            k_prop, k_acc = random.split(k)
            prop = propose_move(k_prop, gam, weights, q, flip)
            gam2, th2 = apply_proposal(gam, th, prop)
            flipped2 = flipped.at[prop.j_out].set(
                jnp.where(prop.has_out & (prop.s_out < 0), 1 - flipped[prop.j_out], flipped[prop.j_out])
            )
            flipped2 = flipped2.at[prop.j_in].set(
                jnp.where(prop.has_in & (prop.s_in < 0), 1 - flipped2[prop.j_in], flipped2[prop.j_in])
            )
            prior_new = prior_cur
            if ss.glm is not None:
                # prior: O(1) per-coordinate table lookups, or the prior sites alone (O(p))
                if per_coord:
                    def slot(j, has):
                        old = table[flipped[j], gam[j], j]
                        new = table[flipped2[j], gam2[j], j]
                        return jnp.where(has, new - old, 0.0)

                    d_prior = slot(prop.j_out, prop.has_out) + slot(prop.j_in, prop.has_in)
                else:
                    vals2 = dict(values)
                    vals2[ss.coefficient] = th2
                    prior_new = prior_fn(vals2, gam2)
                    d_prior = prior_new - prior_cur
                # likelihood: O(n) update of the linear predictor for the changed coordinates
                eta, terms = ev
                d_in = jnp.where(prop.has_in, th2[prop.j_in], 0.0)
                d_out = jnp.where(prop.has_out, -th[prop.j_out], 0.0)
                eta2 = eta + Xt[prop.j_in] * d_in + Xt[prop.j_out] * d_out
                terms2 = loglik_terms(eta2)
                ev2 = (eta2, terms2)
            else:  # generic: one model evaluation on the mini-batch
                vals2 = dict(values)
                vals2[ss.coefficient] = th2
                lp2, terms2 = terms_fn(vals2, gam2, indices)
                terms = ev[1]
                d_prior = lp2 - ev[0]
                ev2 = (lp2, terms2)
            d_terms = terms2 - terms
            log_alpha = d_prior + jnp.sum(d_terms) + prop.log_q_ratio
            if use_penalty:
                log_alpha = log_alpha - penalty(d_terms, fpc)
            accept = prop.valid & (jnp.log(random.uniform(k_acc, (), theta.dtype)) < log_alpha)
            sel = lambda new, old: jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, old)  # noqa: E731
            carry = (
                sel(gam2, gam), sel(th2, th), sel(flipped2, flipped), sel(ev2, ev),
                sel(prior_new, prior_cur), n_acc + accept.astype(jnp.int32),
            )
            return carry, carry[0]

        flipped0 = jnp.zeros(theta.shape, jnp.int32)
        keys = random.split(key, num_steps)
        carry0 = (gamma, theta, flipped0, eval_state0, prior_cur0, jnp.int32(0))
        (gam, th, _, _, _, n_acc), gammas = lax.scan(body, carry0, keys)
        # θ is real-valued: its unconstrained value is itself
        params = dict(params)
        params[ss.coefficient] = th.astype(jnp.asarray(params[ss.coefficient]).dtype)
        return ravel_pytree(params)[0], gammas, n_acc

    # -- one iteration -----------------------------------------------------------------
    def step(self, state, model_args, model_kwargs):
        key, key_batch, key_noise, key_rj = random.split(state.rng_key, 4)
        params, gamma = self._unpack(state.z)
        flat = ravel_pytree(params)[0]
        eps = self._step_size_at(state.i, flat)
        noise = random.normal(key_noise, flat.shape, flat.dtype)
        moved = flat + 0.5 * eps * state.z_grad + jnp.sqrt(eps * self.temperature) * noise
        indices, batch_state = self._draw(key_batch, state.batch_state)
        new_flat, gammas, acc, value, grad = self._models_and_gradient(
            moved, gamma, key_rj, indices, state.weights, model_args, model_kwargs
        )
        ok = all_finite(new_flat) & jnp.isfinite(value) & all_finite(grad)
        diverging = state.diverging | ~ok
        new_z = self._pack(new_flat, gammas)
        keep = lambda old, new: jax.tree.map(lambda a, b: jnp.where(diverging, a, b), old, new)  # noqa: E731
        return state._replace(
            i=state.i + 1,
            z=keep(state.z, new_z),
            z_grad=keep(state.z_grad, grad),
            step_size=eps,
            accept_rate=acc,
            model_size=keep(state.model_size, jnp.sum(gammas[-1]).astype(jnp.int32)),
            diverging=diverging,
            batch_state=batch_state,
            rng_key=key,
        )

    # -- output ------------------------------------------------------------------------
    def postprocess_fn(self, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        ss = self._ss
        if ss is None:
            return lambda z: z
        model = full_data(self._model, self._mb.plates) if ss.deterministic_in_plate else with_indices(
            self._model, ss.first_indices(1)
        )
        eff, incl = self.effective_name, self.inclusion_name

        def postprocess(z):
            params, gamma = self._unpack(z)
            out = constrain_fn(
                ss.conditioned(gamma, model), model_args, model_kwargs, params, return_deterministic=True
            )
            out[ss.indicator] = gamma
            out[incl] = z[incl]
            if eff not in out:
                out[eff] = out[ss.coefficient] * gamma
            return out

        return postprocess
