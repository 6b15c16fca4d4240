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
  likelihood with known scale, linear predictor X·β), one MALA step (``inner="mala"``), or,
  for ``variant="sgld"``, one SGLD step on a mini-batch.
* **STEP 2.** A uniformly random subset J of J = ``update_size`` coordinates is chosen and
  their indicators are redrawn: ``variant="exact"`` (Alg. 1) sequentially from q_j;
  ``variant="async"`` (Alg. 2) all in parallel from
  q̃_j = sigmoid(logit π(δ_j=1) + log p(θ_j|1) − log p(θ_j|0) + θ_j·G_j + Q_j) with one gradient
  G = ∇_β ℓ(β) at β = θ·(δ ∨ 1_J) (``async_point="current"``) or β = θ·ϑ (ϑ = δ with the
  chosen coordinates off, the paper's eq. (7): ``"excluded"``); ``variant="sgld"`` (Alg. 3)
  likewise with Ĝ from STEP 1's mini-batch scaled by N/B.

Step-size convention (the package's, SPEC §2): θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·I) for both the
MALA proposal and the SGLD step; paper 003 writes γ with noise √(2γ), so ε = 2γ (its MALA
γ = 0.01 is ε = 0.02, its SA-SGLD γ = 0.005 is ε = 0.01).

Lazy spike draws: an excluded θ_j is used by the algorithm only when j is chosen in STEP 2,
where it is drawn afresh from the spike; at other times its value has no effect on the chain.
The kernel therefore draws the J chosen ones only and, for the output, redraws every excluded
coordinate from the spike at each kept draw (in ``postprocess_fn``, from a key stored with the
draw).  The returned θ therefore has the law of Alg. 1–3's θ̄ at every draw.

**Fast path** (GLM likelihood η = offset + X·β of family Gaussian / Bernoulli / Poisson, Normal
spike and slab, θ the only continuous site): the active set is a padded index list of static
size ``max_active``; STEP 1 gathers the size(δ) active columns of X (padded to the next power of
two, so the cost follows size(δ)), STEP 2 gathers the J chosen columns, so an iteration costs
O(N·(size(δ) + J)) (plus O(N·size(δ)²) for the exact Gaussian draw), independent of p.  The
chosen subset is drawn in O(J) (first J distinct values of 2J uniform integers; an exact
uniform draw of a J-subset).  Otherwise a dense path evaluates the model on the full data
(mini-batch for ``"sgld"``) for any model of the spike-and-slab form.
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
from numpyro_sg.minibatch import Minibatcher, full_data
from numpyro_sg.spike_slab import (
    SpikeSlabError,
    effective_site_name,
    find_spike_slab,
    initial_values,
    site_types,
)

__all__ = [
    "SparseAsync",
    "SparseAsyncState",
    "draw_subset",
    "async_inclusion_logits",
    "robbins_monro",
]

_VARIANTS = ("exact", "async", "sgld")
_INNERS = ("auto", "gaussian", "mala")
_TAYLORS = (None, "first", "sensitive", "second")
_POINTS = ("current", "excluded")
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


def async_inclusion_logits(prior_logodds, theta, grad, hess=None, taylor="first", point="current"):
    """logit q̃_j = prior log-odds + θ_j·G_j + Q_j for the chosen coordinates (SPEC §6).

    ``taylor="first"``: Q = 0; ``"sensitive"``: Q = ½θ_j²G_j² (paper eq. (6)); ``"second"``:
    Q = ±½θ_j²·abs(∂²ℓ/∂β_j²) (``hess``), + at the point where j is on (``point="current"``) and −
    where it is off (``"excluded"``), so that it is exact for a Gaussian likelihood at either.
    """
    out = prior_logodds + theta * grad
    if taylor == "sensitive":
        out = out + 0.5 * theta**2 * grad**2
    elif taylor == "second":
        sign = 1.0 if point == "current" else -1.0
        out = out + sign * 0.5 * theta**2 * jnp.abs(hess)
    return out


def robbins_monro(step_size, accept_prob, iteration, target=0.5, rate=0.55):
    """log ε ← log ε + (k+1)^(−rate)·(α_k − target) (the authors' MALA adaptation)."""
    gain = (iteration + 1.0) ** (-rate)
    return jnp.exp(jnp.log(step_size) + gain * (accept_prob - target))


def _norm_logpdf(x, loc, scale):
    return -0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi)


def _bucket_sizes(m):
    sizes, b = [], 8
    while b < m:
        sizes.append(b)
        b *= 2
    sizes.append(m)
    return tuple(sizes)


class SparseAsyncState(NamedTuple):
    """State of :class:`SparseAsync`.

    ``i`` iteration counter (warmup included); ``z`` a dict of the unconstrained continuous
    sites (θ included; excluded θ_j hold stale values, see the module docstring), the indicator
    δ (int32) and the key of the output's spike draws; ``step_size`` the MALA / SGLD ε;
    ``accept_rate`` the MALA acceptance probability of this iteration (1 for an exact draw or
    SGLD); ``model_size`` size(δ); ``active`` the padded list of active coordinates (fast path;
    a dummy otherwise); ``aux`` per-chain constants of the fast path (prior parameters, offset,
    observations); ``diverging`` True from the first non-finite state on; ``overflow`` True
    once size(δ) would exceed ``max_active`` (the chain is frozen and an error is raised).
    """

    i: Any
    z: Any
    step_size: Any
    accept_rate: Any
    model_size: Any
    active: Any
    aux: Any
    diverging: Any
    overflow: Any
    batch_state: Any
    rng_key: Any


class _Aux(NamedTuple):
    logit_prior: Any
    spike_loc: Any
    spike_scale: Any
    slab_loc: Any
    slab_scale: Any
    offset: Any
    y: Any
    params: Any
    Xt: Any = None


class SparseAsync(SGKernel):
    r"""Atchadé & Wang's (asynchronous) spike-and-slab sampler for a NumPyro model.

    See :mod:`numpyro_sg.kernels.sparse_async` for the algorithm.  Step-size convention:
    θ' = θ + (ε/2)·ĝ + N(0, ε·I) (MALA proposal and SGLD step); the paper's γ is ε/2.

    :param model: NumPyro model with an indicator site (Bernoulli, shape (p,)), a coefficient
        site (real, shape (p,), prior per coordinate given the indicator) and a likelihood that
        depends on the coefficient only through their product (see
        :mod:`numpyro_sg.spike_slab`).  ``"exact"`` and ``"async"`` use the full data (a
        subsample plate is run at full size; a model without a plate is accepted);
        ``"sgld"`` needs a subsample plate, whose size is the mini-batch B.
    :param str variant: ``"exact"`` (Alg. 1: J indicators updated sequentially from the exact
        q_j — asymptotically exact), ``"async"`` (Alg. 2, default) or ``"sgld"`` (Alg. 3,
        SA-SGLD).
    :param int update_size: J, the number of indicators updated per iteration (1 ≤ J ≤ p;
        default min(100, p), the paper's J = 100).
    :param step_size: ε of the MALA step (``inner="mala"``; adapted during warmup by
        Robbins–Monro toward acceptance ``target_accept``, rate k^(−0.55)) or of the SGLD step
        (fixed).  Default 0.02 for MALA and 0.01 for SGLD (the paper's γ = 0.01 and 0.005).
    :param str inner: STEP 1 kernel for ``"exact"``/``"async"``: ``"gaussian"`` (exact draw
        from the Gaussian conditional; Gaussian likelihood with a fixed scale through X·β and a
        Normal slab), ``"mala"``, or ``"auto"`` (gaussian when it applies, else MALA).
    :param taylor: Q_j of the asynchronous update: ``"first"`` (Q = 0), ``"sensitive"``
        (Q = ½θ_j²G_j², the paper's eq. (6)) or ``"second"`` (Q = ½θ_j²·abs(∂²ℓ/∂β_j²), exact for
        a Gaussian likelihood).  Default ``None``: ``"first"`` for a Gaussian likelihood,
        ``"sensitive"`` otherwise.  Measured (SPEC §6, linear, p = 1,000, N = 500, J = 100,
        2,000 iterations): with ϱ = 0 the paper's choice (``taylor="sensitive"``,
        ``async_point="excluded"``) over-selects (size(δ) 66–89 instead of 10, relative error
        4× the exact sampler's) while the defaults (Q = 0 at the current point) match the exact
        sampler; with ϱ = 0.9 Q = ½θ²G² explored best.
    :param str async_point: where G is evaluated: ``"current"`` (β = θ·(δ ∨ 1_J), every chosen
        coordinate on at its current value; default, the authors' code) or ``"excluded"``
        (β = θ·ϑ, the chosen ones off; the paper's text).
    :param int max_active: static size of the active-set index list of the fast path (default
        min(p, 256)); exceeding it is an error that names this argument.
    :param bool adapt_step_size: adapt the MALA ε during warmup (default True).
    :param float target_accept: target MALA acceptance of the adaptation (default 0.5).
    :param indicator: name of the indicator site (found automatically when omitted).
    :param coefficient: name of the coefficient site (found automatically when omitted).
    :param str fast_path: ``"auto"``, ``"glm"`` (require the GLM fast path; an error says why
        it does not apply) or ``"generic"`` (dense evaluation of the model).
    :param effective_name: output name of θ·δ (default ``"beta"``, or ``"<coefficient>_eff"``
        when the model has a non-deterministic ``beta`` site).
    :param init_strategy: NumPyro init strategy of the continuous sites (default: θ from the
        spike, δ = 0; pass ``init_params={..., "delta": δ0}`` to start from another model).
    :param kwargs: ``subsample_size`` (the mini-batch B of ``"sgld"``), ``replace``,
        ``check_data``: see :class:`~numpyro_sg.kernels.base.SGKernel`.

    Output per draw (``mcmc.get_samples()``): θ (excluded coordinates drawn from the spike),
    δ (int32), θ·δ.  Extra fields: ``model_size`` (size(δ)), ``step_size``, ``accept_rate``,
    ``diverging``.
    """

    State = SparseAsyncState

    def __init__(
        self,
        model,
        variant: str = "async",
        update_size: int | None = None,
        step_size=None,
        *,
        inner: str = "auto",
        taylor: str | None = None,
        async_point: str = "current",
        max_active: int | None = None,
        adapt_step_size: bool = True,
        target_accept: float = 0.5,
        indicator: str | None = None,
        coefficient: str | None = None,
        fast_path: str = "auto",
        effective_name: str | None = None,
        init_strategy=None,
        **kwargs,
    ):
        if variant not in _VARIANTS:
            raise ValueError(f"variant must be one of {_VARIANTS}, got {variant!r}.")
        if update_size is not None and (
            isinstance(update_size, bool) or not isinstance(update_size, (int, np.integer)) or update_size < 1
        ):
            raise ValueError(f"update_size must be an int ≥ 1 (and ≤ p), got {update_size!r}.")
        if step_size is not None and not (np.ndim(step_size) == 0 and float(step_size) > 0):
            raise ValueError(f"step_size must be a positive float, got {step_size!r}.")
        if inner not in _INNERS:
            raise ValueError(f"inner must be one of {_INNERS}, got {inner!r}.")
        if taylor not in _TAYLORS:
            raise ValueError(f"taylor must be one of {_TAYLORS}, got {taylor!r}.")
        if async_point not in _POINTS:
            raise ValueError(f"async_point must be one of {_POINTS}, got {async_point!r}.")
        if max_active is not None and (
            isinstance(max_active, bool) or not isinstance(max_active, (int, np.integer)) or max_active < 1
        ):
            raise ValueError(f"max_active must be an int ≥ 1, got {max_active!r}.")
        if fast_path not in ("auto", "glm", "generic"):
            raise ValueError(f"fast_path must be 'auto', 'glm' or 'generic', got {fast_path!r}.")
        if not 0.0 < target_accept < 1.0:
            raise ValueError(f"target_accept must lie in (0, 1), got {target_accept!r}.")
        super().__init__(model, init_strategy=init_strategy, **kwargs)
        self.variant = variant
        self.update_size = update_size
        self.step_size = step_size
        self.inner = inner
        self.taylor = taylor
        self.async_point = async_point
        self.max_active = max_active
        self.adapt_step_size = bool(adapt_step_size)
        self.target_accept = float(target_accept)
        self._indicator = indicator
        self._coefficient = coefficient
        self.fast_path = fast_path
        self._effective_name = effective_name
        self._ss = None

    # -- public metadata ---------------------------------------------------------------------
    @property
    def spike_slab(self):
        """The :class:`~numpyro_sg.spike_slab.SpikeSlab` structure found at ``init``."""
        return self._ss

    @property
    def uses_fast_path(self) -> bool:
        """True when the O(N·(size(δ) + J)) GLM path is used (known after ``init``)."""
        return bool(getattr(self, "_fast", False))

    @property
    def default_fields(self):
        return ("z", "diverging")

    def get_diagnostics_str(self, state):
        msg = f"|δ| {int(jnp.max(state.model_size))}"
        if self._inner_kind == "mala" or self.variant == "sgld":
            msg += f", ε {float(jnp.mean(state.step_size)):.2e}, acc. {float(jnp.mean(state.accept_rate)):.2f}"
        if bool(jnp.any(state.diverging)):
            msg += ", DIVERGED"
        return msg

    # -- set-up ------------------------------------------------------------------------------
    def _setup(self, model_args, model_kwargs):
        leaves = jax.tree.leaves((model_args, model_kwargs))
        cached = getattr(self, "_setup_leaves", None)
        if cached is not None and len(cached) == len(leaves) and all(a is b for a, b in zip(cached, leaves)):
            return  # same data (e.g. the next chain of chain_method="sequential")
        self._setup_impl(model_args, model_kwargs)
        if not any(isinstance(x, jax.core.Tracer) for x in leaves):
            self._setup_leaves = leaves

    def _setup_impl(self, model_args, model_kwargs):
        sgld = self.variant == "sgld"
        ss = find_spike_slab(
            self._model, model_args, model_kwargs,
            indicator=self._indicator, coefficient=self._coefficient,
            subsample_size=self._subsample_size if sgld else None,
            glm="auto",
        )
        self._ss = ss
        p = ss.num_coefficients
        J = min(100, p) if self.update_size is None else int(self.update_size)
        if not 1 <= J <= p:
            raise ValueError(f"update_size must lie in [1, p] = [1, {p}], got {J}.")
        self._J = J
        if sgld:
            if ss.plate is None:
                raise ValueError(
                    "variant='sgld' needs a subsample plate (numpyro.plate('data', N, "
                    "subsample_size=B)); the model has none. Use variant='async' or 'exact'."
                )
            self._mb = Minibatcher(self._model, (ss.plate,), replace=self._replace)
        else:
            self._mb = None
        why = None
        if ss.glm is None:
            why = "no GLM likelihood (linear predictor X·β) was detected"
        elif not ss.per_coordinate_prior:
            why = "the prior of the coefficients is not a product over coordinates given the indicator"
        elif tuple(ss.continuous_sites) != (ss.coefficient,):
            why = (
                f"the model has continuous sites {list(ss.continuous_sites)} besides the "
                f"coefficient {ss.coefficient!r}"
            )
        else:
            try:
                ss.coordinate_normal_fn(model_args, model_kwargs)(
                    {ss.coefficient: jnp.zeros((p,))}
                )
            except SpikeSlabError as e:
                why = str(e)
        if self.fast_path == "glm" and why is not None:
            raise ValueError(f"fast_path='glm' but the GLM fast path does not apply: {why}.")
        self._fast = self.fast_path != "generic" and why is None
        fam = ss.glm.family_name if ss.glm is not None else None
        gaussian_ok = self._fast and fam == "gaussian"
        if self.inner == "gaussian" and not gaussian_ok and not sgld:
            raise ValueError(
                "inner='gaussian' needs the GLM fast path with a Gaussian likelihood"
                + (f" ({why})" if why else f" (the likelihood family is {fam!r})")
                + "; use inner='mala'."
            )
        if sgld:
            self._inner_kind = "sgld"
        elif self.inner == "auto":
            self._inner_kind = "gaussian" if gaussian_ok else "mala"
        else:
            self._inner_kind = self.inner
        self._taylor = self.taylor or ("first" if fam == "gaussian" else "sensitive")
        m = min(p, 256) if self.max_active is None else min(int(self.max_active), p)
        self._m = m
        self._buckets = _bucket_sizes(m)
        eps = self.step_size
        if eps is None:
            eps = 0.01 if sgld else 0.02
        self._eps0 = float(eps)
        existing = site_types(self._model, model_args, model_kwargs)
        eff = effective_site_name(ss, existing, self._effective_name)
        self.effective_name = eff

    # -- init ----------------------------------------------------------------------------------
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        self._num_warmup = int(num_warmup)
        # chain_method="parallel" calls init under a trace: run the structural checks eagerly
        with jax.ensure_compile_time_eval():
            self._setup(model_args, model_kwargs)
        ss, p, m = self._ss, self._ss.num_coefficients, self._m
        batched, rng_key, key_init = split_init_key(rng_key)
        init_params, delta0 = initial_values(
            ss, key_init, init_params, self._init_strategy, model_args, model_kwargs,
            num_chains=jnp.shape(rng_key)[0] if batched else None, ignore=(_KEY,),
        )
        one_chain = jax.tree.map(lambda x: x[0], init_params) if batched else init_params
        _, self._unravel = ravel_pytree(one_chain)
        if not isinstance(delta0, jax.core.Tracer):  # chain_method="parallel" traces init
            d_np = np.asarray(delta0)
            if not np.all((d_np == 0) | (d_np == 1)):
                raise ValueError(f"The initial indicator {ss.indicator!r} must be 0/1.")
            size0 = int(d_np.reshape(-1, p).sum(-1).max())
            if self._fast and size0 > m:
                raise ValueError(
                    f"The initial indicator {ss.indicator!r} has {size0} active coordinates, "
                    f"more than max_active = {m}; pass a larger max_active."
                )
        delta0 = delta0.astype(jnp.int32)

        def init_one(params, delta, key, model_args, model_kwargs):
            key, key_batch, key_out = random.split(key, 3)
            flat = ravel_pytree(params)[0]
            batch_state = self._mb.init_batch_state(key_batch) if self._mb is not None else None
            if self._fast:
                active = jnp.nonzero(delta, size=m, fill_value=p)[0].astype(jnp.int32)
                aux = self._aux(params, model_args, model_kwargs)
            else:
                active = jnp.zeros((1,), jnp.int32)
                aux = None
            z = dict(params)
            z[ss.indicator] = delta
            z[_KEY] = key_out
            return SparseAsyncState(
                i=jnp.int32(0),
                z=z,
                step_size=jnp.asarray(self._eps0, flat.dtype),
                accept_rate=jnp.ones((), flat.dtype),
                model_size=jnp.sum(delta).astype(jnp.int32),
                active=active,
                aux=aux,
                diverging=jnp.array(False),
                overflow=jnp.array(False),
                batch_state=batch_state,
                rng_key=key,
            )

        if batched:
            init_one = jax.vmap(init_one, in_axes=(0, 0, 0, None, None))
        # the data arrays are arguments, not constants baked into the compiled program
        state = jit_with_data(init_one, model_args, model_kwargs)(init_params, delta0, rng_key)
        self._sample_fn = self.sample
        return state

    def _aux(self, params, model_args, model_kwargs):
        ss = self._ss
        p = ss.num_coefficients
        values = {ss.coefficient: params[ss.coefficient]}
        cn = ss.coordinate_normal_fn(model_args, model_kwargs)(values)
        batch = ss.glm_batch_fn(model_args, model_kwargs)(values, jnp.zeros((p,)), None)
        dtype = jnp.result_type(float)
        # exact/async gather whole columns of X: keep a (p, N) copy so that a column is one
        # contiguous read (gathering J columns of a row-major (N, p) array is N·J cache misses)
        Xt = None if self.variant == "sgld" else jnp.asarray(batch.X).T.copy()
        return _Aux(
            *(jnp.asarray(a, dtype) for a in cn),
            offset=jnp.asarray(batch.eta, dtype),
            y=jnp.asarray(batch.y, dtype),
            params={k: jnp.asarray(v, dtype) for k, v in batch.params.items()},
            Xt=Xt,
        )

    # -- one iteration ---------------------------------------------------------------------------
    def step(self, state, model_args, model_kwargs):
        if self._fast:
            new = self._step_fast(state, model_args, model_kwargs)
        else:
            new = self._step_dense(state, model_args, model_kwargs)
        ok = all_finite(ravel_pytree({k: v for k, v in new.z.items() if k != _KEY})[0])
        diverging = state.diverging | ~ok
        keep = lambda old, nw: jax.tree.map(lambda a, b: jnp.where(diverging, a, b), old, nw)  # noqa: E731
        return new._replace(
            z=keep(state.z, new.z),
            active=keep(state.active, new.active),
            model_size=keep(state.model_size, new.model_size),
            diverging=diverging,
        )

    def _adapt(self, state, accept_prob):
        if self._inner_kind != "mala" or not self.adapt_step_size:
            return state.step_size
        new = robbins_monro(state.step_size, accept_prob, state.i, self.target_accept)
        return jnp.where(state.i < self._num_warmup, new, state.step_size)

    # ---- fast path -----------------------------------------------------------------------------
    def _step_fast(self, state, model_args, model_kwargs):
        ss, p, m, J = self._ss, self._ss.num_coefficients, self._m, self._J
        coef, ind = ss.coefficient, ss.indicator
        aux = state.aux
        fam = ss.glm.family
        key, k_sub, k_inner, k_spike, k_ber, k_batch, k_out = random.split(state.rng_key, 7)
        theta, delta = state.z[coef], state.z[ind]
        if self.variant == "sgld":
            X = ss.design_fn(model_args, model_kwargs)({coef: theta})
            N = X.shape[0]
        else:
            X, N = None, aux.Xt.shape[1]
        dtype = theta.dtype
        eps = state.step_size
        k = state.model_size
        active = state.active

        # mini-batch (sgld) or all data
        if self.variant == "sgld":
            idx_b, batch_state = self._mb.draw(k_batch, state.batch_state)
            rows = idx_b[ss.plate.name]
            scale = N / rows.shape[0]
            y, offset = aux.y[rows], aux.offset[rows]
            params = {kk: v[rows] for kk, v in aux.params.items()}
        else:
            rows, batch_state, scale = None, state.batch_state, 1.0
            y, offset, params = aux.y, aux.offset, aux.params

        def columns(cols):
            if rows is None:
                return jnp.take(aux.Xt, cols, axis=0, mode="fill", fill_value=0).T
            return X.at[rows[:, None], cols[None, :]].get(mode="fill", fill_value=0)

        def loglik(eta):
            return fam.loglik(eta, y, params)

        def dloglik(eta):
            return fam.dloglik(eta, y, params)

        # STEP 1: active block, padded to a bucket of static size
        def make_branch(mb):
            def branch(key):
                cols = active[:mb]
                mask = jnp.arange(mb) < k
                Xa = columns(cols)
                u = jnp.where(mask, theta.at[cols].get(mode="fill", fill_value=0), 0.0)
                mu = aux.slab_loc.at[cols].get(mode="fill", fill_value=0.0)
                sd = jnp.where(mask, aux.slab_scale.at[cols].get(mode="fill", fill_value=1.0), 1.0)
                if self._inner_kind == "gaussian":
                    w = 1.0 / params["scale"] ** 2
                    prec = jnp.diag(1.0 / sd**2) + (Xa * w[:, None]).T @ Xa
                    b = jnp.where(mask, mu / sd**2, 0.0) + Xa.T @ (w * (y - offset))
                    L = jnp.linalg.cholesky(prec)
                    mean = jax.scipy.linalg.cho_solve((L, True), b)
                    zz = random.normal(key, (mb,), dtype)
                    u2 = mean + jax.scipy.linalg.solve_triangular(L.T, zz, lower=False)
                    u2 = jnp.where(mask, u2, 0.0)
                    acc = jnp.ones((), dtype)
                else:
                    def logp_grad(v):
                        eta = offset + Xa @ v
                        lp = jnp.sum(jnp.where(mask, _norm_logpdf(v, mu, sd), 0.0)) + scale * jnp.sum(loglik(eta))
                        g = jnp.where(mask, -(v - mu) / sd**2 + scale * (Xa.T @ dloglik(eta)), 0.0)
                        return lp, g

                    k_noise, k_acc = random.split(key)
                    noise = jnp.where(mask, random.normal(k_noise, (mb,), dtype), 0.0)
                    lp0, g0 = logp_grad(u)
                    prop = u + 0.5 * eps * g0 + jnp.sqrt(eps) * noise
                    if self._inner_kind == "sgld":
                        u2, acc = prop, jnp.ones((), dtype)
                    else:
                        lp1, g1 = logp_grad(prop)
                        fwd = -jnp.sum((prop - u - 0.5 * eps * g0) ** 2) / (2 * eps)
                        bwd = -jnp.sum((u - prop - 0.5 * eps * g1) ** 2) / (2 * eps)
                        log_a = lp1 - lp0 + bwd - fwd
                        log_a = jnp.where(jnp.isfinite(log_a), log_a, -jnp.inf)
                        acc = jnp.exp(jnp.minimum(log_a, 0.0))
                        take = random.uniform(k_acc, (), dtype) < acc
                        u2 = jnp.where(take, prop, u)
                eta = offset + Xa @ u2
                u_full = jnp.zeros((m,), dtype).at[:mb].set(u2)
                return u_full, eta, acc

            return branch

        b_idx = jnp.searchsorted(jnp.asarray(self._buckets), k)
        u_new, eta_a, acc = lax.switch(b_idx, [make_branch(mb) for mb in self._buckets], k_inner)
        theta = theta.at[active].set(u_new, mode="drop")
        step_size = self._adapt(state, acc)

        # STEP 2: J chosen coordinates
        jj = draw_subset(k_sub, p, J)
        d_J = delta[jj]
        zs = random.normal(k_spike, (J,), dtype)
        th_J = jnp.where(d_J == 1, theta[jj], aux.spike_loc[jj] + aux.spike_scale[jj] * zs)
        lo = (
            aux.logit_prior[jj]
            + _norm_logpdf(th_J, aux.slab_loc[jj], aux.slab_scale[jj])
            - _norm_logpdf(th_J, aux.spike_loc[jj], aux.spike_scale[jj])
        )
        XJ = columns(jj)  # (n, J)
        if self.variant == "exact":
            XJt = XJ.T

            def body(eta, t):
                x, th, d = XJt[t], th_J[t], d_J[t]
                eta0 = eta - d * th * x
                eta1 = eta0 + th * x
                dl = jnp.sum(loglik(eta1) - loglik(eta0))
                v = random.bernoulli(random.fold_in(k_ber, t), jax.nn.sigmoid(lo[t] + dl))
                return jnp.where(v, eta1, eta0), v.astype(jnp.int32)

            _, V = lax.scan(body, eta_a, jnp.arange(J))
        else:
            if self.async_point == "current":
                eta_e = eta_a + XJ @ (th_J * (1 - d_J))
            else:
                eta_e = eta_a - XJ @ (th_J * d_J)
            G = scale * (XJ.T @ dloglik(eta_e))
            H = None
            if self._taylor == "second":
                H = scale * ((XJ * XJ).T @ fam.d2loglik(eta_e, y, params))
            logits = async_inclusion_logits(lo, th_J, G, H, self._taylor, self.async_point)
            V = random.bernoulli(k_ber, jax.nn.sigmoid(logits)).astype(jnp.int32)

        delta = delta.at[jj].set(V)
        theta = theta.at[jj].set(th_J)
        # active list: keep the survivors, append the newcomers, compact (O(m + J))
        keep = (active < p) & (delta.at[active].get(mode="fill", fill_value=0) == 1)
        added = (d_J == 0) & (V == 1)
        cand = jnp.concatenate([active, jj])
        mask = jnp.concatenate([keep, added])
        pos = jnp.cumsum(mask) - 1
        count = jnp.sum(mask).astype(jnp.int32)
        new_active = jnp.full((m,), p, jnp.int32).at[jnp.where(mask, pos, m)].set(cand, mode="drop")
        overflow = count > m

        z = {coef: theta, ind: delta, _KEY: k_out}
        new = state._replace(
            i=state.i + 1,
            z=z,
            step_size=step_size,
            accept_rate=acc,
            model_size=count,
            active=new_active,
            batch_state=batch_state,
            rng_key=key,
        )
        # an overflow freezes the chain (``sample`` raises as well)
        frozen = state._replace(i=state.i + 1, rng_key=key, overflow=jnp.array(True))
        return jax.tree.map(lambda a, b: jnp.where(overflow, a, b), frozen, new)

    def sample(self, state, model_args, model_kwargs):
        new = super().sample(state, model_args, model_kwargs)
        if self._fast:  # one check outside any vmap of the chains
            newly = jnp.any(new.overflow & ~state.overflow)
            lax.cond(newly, lambda: jax.debug.callback(self._raise_overflow, state.i), lambda: None)
        return new

    def _raise_overflow(self, iteration):
        raise ValueError(
            f"SparseAsync: at iteration {int(np.max(iteration)) + 1} the model size "
            f"size({self._ss.indicator}) would exceed max_active = {self._m} (the static size of "
            "the active-set index list of the fast path). Pass a larger max_active (cost O(N·max_active) per iteration at "
            "worst) or fast_path='generic'."
        )

    # ---- dense path ----------------------------------------------------------------------------
    def _step_dense(self, state, model_args, model_kwargs):
        ss, p, J = self._ss, self._ss.num_coefficients, self._J
        coef, ind = ss.coefficient, ss.indicator
        key, k_sub, k_inner, k_spike, k_ber, k_batch, k_out = random.split(state.rng_key, 7)
        z = dict(state.z)
        delta = z.pop(ind)
        z.pop(_KEY)
        params = z
        unravel = self._unravel
        flat, _ = ravel_pytree(params)
        dtype = flat.dtype
        eps = state.step_size
        if self.variant == "sgld":
            indices, batch_state = self._mb.draw(k_batch, state.batch_state)
        else:
            indices, batch_state = ss.full_indices(), state.batch_state
        constrain = ss.constrain_fn(model_args, model_kwargs)
        log_density = ss.log_density_fn(model_args, model_kwargs)

        # STEP 1: excluded θ from the spike, then MALA / SGLD on the rest
        values = constrain(params, delta)
        spike = ss.spike_sample_fn(model_args, model_kwargs)(k_spike, values)
        params = dict(params)
        params[coef] = jnp.where(delta == 1, params[coef], spike.astype(dtype))
        flat = ravel_pytree(params)[0]
        mask_params = {kk: jnp.ones_like(v) for kk, v in params.items()}
        mask_params[coef] = delta.astype(dtype)
        mask = ravel_pytree(mask_params)[0]

        def logp_grad(x):
            return jax.value_and_grad(lambda x_: log_density(unravel(x_), delta, indices))(x)

        k_noise, k_acc = random.split(k_inner)
        noise = random.normal(k_noise, flat.shape, dtype) * mask
        lp0, g0 = logp_grad(flat)
        g0 = g0 * mask
        prop = flat + 0.5 * eps * g0 + jnp.sqrt(eps) * noise
        if self._inner_kind == "sgld":
            new_flat, acc = prop, jnp.ones((), dtype)
        else:
            lp1, g1 = logp_grad(prop)
            g1 = g1 * mask
            fwd = -jnp.sum((prop - flat - 0.5 * eps * g0) ** 2) / (2 * eps)
            bwd = -jnp.sum((flat - prop - 0.5 * eps * g1) ** 2) / (2 * eps)
            log_a = lp1 - lp0 + bwd - fwd
            log_a = jnp.where(jnp.isfinite(log_a), log_a, -jnp.inf)
            acc = jnp.exp(jnp.minimum(log_a, 0.0))
            new_flat = jnp.where(random.uniform(k_acc, (), dtype) < acc, prop, flat)
        step_size = self._adapt(state, acc)
        params = unravel(new_flat)
        values = constrain(params, delta)
        theta = values[coef]

        # STEP 2
        jj = draw_subset(k_sub, p, J)
        eff = ss.effective_loglik_terms_fn(model_args, model_kwargs)

        def ell(beta):
            return jnp.sum(eff(values, beta, indices))

        if ss.per_coordinate_prior:
            cp = ss.coordinate_prior_fn(model_args, model_kwargs)(values, theta)
            lo_all = cp.indicator1 - cp.indicator0 + cp.coefficient1 - cp.coefficient0
        else:
            prior = ss.prior_fn(model_args, model_kwargs)
            lo_all = None

        def prior_logodds(j, d):
            if lo_all is not None:
                return lo_all[j]
            return prior(values, d.at[j].set(1)) - prior(values, d.at[j].set(0))

        if self.variant == "exact":
            def body(d, t):
                j = jj[t]
                d1, d0 = d.at[j].set(1), d.at[j].set(0)
                dl = ell(theta * d1) - ell(theta * d0)
                v = random.bernoulli(random.fold_in(k_ber, t), jax.nn.sigmoid(prior_logodds(j, d) + dl))
                return jnp.where(v, d1, d0), None

            delta, _ = lax.scan(body, delta, jnp.arange(J))
        else:
            chosen = jnp.zeros((p,), delta.dtype).at[jj].set(1)
            point = jnp.maximum(delta, chosen) if self.async_point == "current" else delta * (1 - chosen)
            beta = theta * point
            grad_fn = jax.grad(ell)
            G = grad_fn(beta)[jj]
            H = None
            if self._taylor == "second":
                def hjj(j):
                    e = jnp.zeros((p,), beta.dtype).at[j].set(1.0)
                    return jax.jvp(grad_fn, (beta,), (e,))[1][j]

                H = jax.vmap(hjj)(jj)
            lo = jax.vmap(lambda j: prior_logodds(j, delta))(jj)
            logits = async_inclusion_logits(lo, theta[jj], G, H, self._taylor, self.async_point)
            V = random.bernoulli(k_ber, jax.nn.sigmoid(logits)).astype(delta.dtype)
            delta = delta.at[jj].set(V)

        z = dict(params)
        z[ind] = delta.astype(jnp.int32)
        z[_KEY] = k_out
        return state._replace(
            i=state.i + 1,
            z=z,
            step_size=step_size,
            accept_rate=acc,
            model_size=jnp.sum(delta).astype(jnp.int32),
            batch_state=batch_state,
            rng_key=key,
        )

    # -- output --------------------------------------------------------------------------------
    def postprocess_fn(self, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        ss = self._ss
        if ss is None:
            return lambda z: z
        if ss.deterministic_in_plate and ss.plate is not None:
            model = full_data(self._model, (ss.plate,))
        else:
            model = ss._run(self._model, ss.first_indices(1))
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
