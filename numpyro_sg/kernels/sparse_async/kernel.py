"""The NumPyro shell of SparseAsync: options, set-up once per data set, the pure step, output."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import constrain_fn

from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.infer.sharding import (auto_view, eager_under_trace, find_data_shards,
                                       spans_processes)
from numpyro_sg.kernels.base import SGKernel
from numpyro_sg.kernels.chain_start import ChainStart
from numpyro_sg.kernels.options import SAMPLING_MOVES, SITE_MOVES, MinibatchOptions, moved_options
from numpyro_sg.kernels.data_cache import PerDataCache
from numpyro_sg.kernels.sparse_async.options import SparseAsyncOptions, SparseAsyncSettings, check_options
from numpyro_sg.kernels.sparse_async.setup import SPIKE_KEY, initial_values, make_plan
from numpyro_sg.kernels.sparse_async.sharded import shard_plan
from numpyro_sg.kernels.sparse_async.step import SparseAsyncState, initial_state, sparse_async_step
from numpyro_sg.spike_slab import SpikeSlabSites, find_spike_slab


class SparseAsync(SGKernel):
    r"""Atchadé & Wang's (asynchronous) spike-and-slab sampler for a NumPyro model.

    Atchadé & Wang (2023), "A fast asynchronous MCMC sampler for sparse Bayesian inference".
    The target is π(δ, θ | data) ∝ π(δ)·∏_j p(θ_j | δ_j)·exp ℓ(θ·δ), δ ∈ {0,1}^p.  One
    iteration, in every variant:

    * **STEP 1** (continuous move): excluded θ_j (δ_j = 0) are drawn from the spike
      p(θ_j | δ_j = 0); the active block [θ]_δ is moved for its conditional
      π([θ]_δ | δ) ∝ p([θ]_δ | δ)·exp ℓ(θ·δ).
    * **STEP 2** (indicators): a uniformly random set J of J = ``update_size`` coordinates is
      chosen and δ_J redrawn, with a_j = logit π(δ_j=1) + log p(θ_j|1) − log p(θ_j|0).

    ``variant="exact"`` (Alg. 1; asymptotically exact):
        STEP 1 [θ]_δ ~ N(P⁻¹b, P⁻¹) exactly (``inner="gaussian"``: Gaussian likelihood through
        X·β) or one MALA step θ* = θ + (ε/2)·∇log π(θ) + √ε·ξ accepted with probability
        min(1, π(θ*)q(θ | θ*)/(π(θ)q(θ* | θ))) (``inner="mala"``); STEP 2 for j ∈ J in turn
        δ_j ~ Bernoulli(sigmoid(a_j + ℓ(θ·δ^{(j,1)}) − ℓ(θ·δ^{(j,0)}))).
    ``variant="async"`` (Alg. 2, default):
        STEP 1 as ``"exact"``; STEP 2 all j ∈ J at once, δ_j ~ Bernoulli(sigmoid(a_j + θ_j·G_j
        + Q_j)) independently, G = ∇_β ℓ(β) at β = θ·(δ ∨ 1_J) (``async_point="current"``) or
        at δ with J off (``"excluded"``), Q_j set by ``taylor``.
    ``variant="sgld"`` (Alg. 3, SA-SGLD):
        STEP 1 one SGLD step θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·I) on the active block, ĝ the
        gradient with the likelihood of a mini-batch of B data scaled by N/B; STEP 2 as
        ``"async"`` with Ĝ from the same mini-batch, scaled by N/B.

    **Step size.** ε (``step_size``) is absolute: it multiplies the raw gradient of the log
    density in the model's unconstrained coordinates (there is no preconditioner), in the MALA
    proposal and the SGLD step alike.  The paper writes γ·∇ with noise √(2γ), so ε = 2γ (its
    MALA γ = 0.01 is ε = 0.02, its SA-SGLD γ = 0.005 is ε = 0.01).  The MALA ε is adapted
    during warmup only, by Robbins–Monro toward ``target_accept_prob``; the SGLD ε is fixed.
    The module :mod:`numpyro_sg.kernels.sparse_async` describes the lazy spike draws and the
    O(N·(size(δ) + J)) GLM fast path.

    **Divergence.** Every variant calls the shared guard
    (:func:`~numpyro_sg.kernels.guard.guarded_update`) once per iteration, on the gradient norm
    max(1, √(ε·mean_j g_j²)) over the moved coordinates (:func:`~numpyro_sg.kernels.guard.guard_norm`):
    a chain whose state or gradient becomes non-finite or explodes is frozen at its last safe
    point and ``diverging`` is True from then on; after the run,
    :func:`numpyro_sg.check_convergence` (and :func:`numpyro_sg.to_inference_data`) issue a
    :class:`~numpyro_sg.DivergenceWarning` naming the chain and the iteration (nothing is
    reported from inside the compiled step).  On the fast path, a model size past
    ``max_active`` (the active list's static size) freezes the chain the same way, with
    ``overflow`` set, and the warning says to pass a larger ``max_active``.

    **Data on a mesh.** Data rows placed on the devices of a mesh (``NamedSharding(mesh,
    P("data"))``, ``MCMC(..., jit_model_args=True)``) run the fast path on every device's rows
    (:mod:`numpyro_sg.kernels.sparse_async.sharded`): the point and keys replicated, each
    device holding its rows of the per-datum constants, every sum over rows one ``psum``
    (``"sgld"``: n/D rows of each device's share); the dense path is refused there.

    An option that does not apply to the chosen variant (or to the STEP 1 move that
    ``inner="auto"`` picks) is an error, not silently ignored.

    :param model: NumPyro model with an indicator site (Bernoulli, shape (p,)), a coefficient
        site (real, shape (p,), prior per coordinate given the indicator) and a likelihood that
        depends on the coefficient only through their product (see
        :mod:`numpyro_sg.spike_slab`).  ``"exact"`` and ``"async"`` use the full data (a
        subsample plate is run at full size; a model without a plate is accepted);
        ``"sgld"`` needs a subsample plate, whose size is the mini-batch B.
    :param step_size: ε of the MALA step (``inner="mala"``) or of the SGLD step
        (``variant="sgld"``), absolute (see above).  Default 0.02 for MALA and 0.01 for SGLD.
        Held in the state (``state.hyper``), so :func:`numpyro_sg.mamba` can tune it over
        vectorised arms.
    :param str variant: ``"exact"``, ``"async"`` (default) or ``"sgld"``.
    :param int update_size: J, the number of indicators updated per iteration (1 ≤ J ≤ p;
        default min(100, p), the paper's J = 100).
    :param bool adapt_step_size: adapt the MALA ε during warmup (default True; MALA only).
    :param float target_accept_prob: target MALA acceptance of the adaptation (default 0.5).
    :param subsample_size: the mini-batch B of ``"sgld"`` (default: the plate's own size).
    :param init_strategy: NumPyro init strategy of the continuous sites (default: θ from the
        spike, δ = 0; pass ``init_params={..., "delta": δ0}`` to start from another model).
    :param sites: the site names, a :class:`~numpyro_sg.spike_slab.SpikeSlabSites` or a dict of
        its fields ``indicator``, ``coefficient`` (found automatically when omitted) and
        ``effective`` (output name of θ·δ; default ``"beta"``, or ``"<coefficient>_eff"`` when
        the model has a non-deterministic ``beta`` site); ``inclusion`` does not apply.
    :param options: the other options, a
        :class:`~numpyro_sg.kernels.sparse_async.options.SparseAsyncOptions` or a dict of its
        fields: ``inner`` (STEP 1 of ``"exact"``/``"async"``: ``"auto"``, ``"gaussian"`` or
        ``"mala"``), ``taylor`` (Q_j of the asynchronous update: ``"second"`` by default,
        ``"first"`` or ``"sensitive"``), ``async_point`` (``"current"`` by default or
        ``"excluded"``), ``max_active`` (static size of the fast path's active list, default
        min(p, 256)) and ``fast_path`` (``"auto"``, ``"glm"`` or ``"generic"``); each documented
        in :class:`~numpyro_sg.kernels.sparse_async.options.SparseAsyncOptions`.
    :param minibatch_options: ``replace`` and ``check_data`` of
        :class:`~numpyro_sg.kernels.options.MinibatchOptions` (or a dict of them), documented in
        :class:`~numpyro_sg.kernels.base.SGKernel`: ``"sgld"`` draws its mini-batch indices with
        replacement (default) or walks per-epoch permutations (``{"replace": False}``;
        ``replace`` applies to ``"sgld"`` only).

    The former keywords (``indicator=``, ``coefficient=``, ``effective_name=``, ``inner=``,
    ``taylor=``, ``async_point=``, ``max_active=``, ``fast_path=``, ``replace=``,
    ``check_data=``) still work, with a ``DeprecationWarning`` naming the new place.

    Output per draw (``mcmc.get_samples()``): θ (excluded coordinates drawn from the spike),
    δ (int32), θ·δ.  Extra fields: ``model_size`` (size(δ)), ``step_size``, ``accept_prob``,
    ``diverging``.

    >>> import jax, numpyro_sg as nsg
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sg import datasets as ds
    >>> X, y, _ = ds.simulate_sparse_linear(8, num_data=50, num_nonzero=2, seed=0)
    >>> kernel = nsg.SparseAsync(ds.sparse_async_linear_model, variant="async", update_size=4)
    >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=200, progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("model_size",))
    >>> mcmc.get_samples()["beta"].shape, kernel.inner_kind
    ((200, 8), 'gaussian')
    """

    State = SparseAsyncState
    HYPERPARAMETERS = ("step_size",)

    @moved_options(SAMPLING_MOVES | {name: SITE_MOVES[name] for name in ("indicator", "coefficient", "effective_name")}
                   | {name: ("options", name) for name in ("inner", "taylor", "async_point", "max_active", "fast_path")})
    def __init__(self, model, step_size=None, *, variant="async", update_size=None, adapt_step_size=None,
                 target_accept_prob=None, subsample_size=None, init_strategy=None, sites=None, options=None,
                 minibatch_options=None):
        #: the :class:`~numpyro_sg.kernels.sparse_async.options.SparseAsyncOptions`
        self.options = SparseAsyncOptions.of(options)
        #: the :class:`~numpyro_sg.spike_slab.SpikeSlabSites` given (names resolved at ``init``)
        self.sites = SpikeSlabSites.only(sites, ("indicator", "coefficient", "effective"), "SparseAsync")
        minibatch = MinibatchOptions.only(minibatch_options, ("replace", "check_data"), "SparseAsync")
        replace_given = "replace" in MinibatchOptions.given(minibatch_options)
        # plain attributes, not in the options object: a tuner batches kernels whose attributes
        # differ only in the state hyperparameters (step_size)
        self.step_size, self.variant, self.update_size = step_size, variant, update_size
        self.adapt_step_size, self.target_accept_prob = adapt_step_size, target_accept_prob
        check_options(self._settings(subsample_size, minibatch.replace if replace_given else None))
        super().__init__(model, subsample_size=subsample_size, init_strategy=init_strategy,
                         minibatch_options=minibatch)
        self._plan = None  # static metadata resolved at init (a Plan)
        self._constants = None  # the fast path's constants (prior, offset, y, …), set at init
        self._setup = PerDataCache()  # (plan, constants, Minibatcher, ShardedPlan) per data set
        self._sharded = None  # the ShardedPlan of data split over a mesh, set at init

    def _settings(self, subsample_size, replace) -> SparseAsyncSettings:
        o = self.options
        return SparseAsyncSettings(self.step_size, self.variant, self.update_size, o.inner, o.taylor, o.async_point,
                                   o.max_active, self.adapt_step_size, self.target_accept_prob, o.fast_path,
                                   subsample_size, replace)

    @property
    def settings(self) -> SparseAsyncSettings:
        """The direct arguments and the options together
        (:class:`~numpyro_sg.kernels.sparse_async.options.SparseAsyncSettings`)."""
        return self._settings(self._subsample_size, self.minibatch_options.replace)

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

    def diagnostics_text(self, state) -> str:
        msg = f"|δ| {int(jnp.max(state.model_size))}"
        if self.inner_kind in ("mala", "sgld"):
            msg += f", ε {float(jnp.mean(state.step_size)):.2e}, acc. {float(jnp.mean(state.accept_prob)):.2f}"
        if bool(jnp.any(state.diverging)):
            msg += ", DIVERGED"
        return msg

    # -- init ----------------------------------------------------------------------------------
    def _plan_chains(self, key_init, init_params, model_args, model_kwargs, num_chains) -> ChainStart:
        """SparseAsync's part of :meth:`~numpyro_sg.kernels.base.SGKernel.init`: the plan
        (:meth:`_make_plan`, once per data set) and each chain's starting θ and δ."""
        # chain_method="parallel" calls init under a trace: the structural work stays eager
        with eager_under_trace(key_init):
            self._plan, self._constants, self._mb, self._sharded = self._setup.get(
                model_args, model_kwargs, lambda: self._make_plan(model_args, model_kwargs))
            params, delta = initial_values(self._plan, self._constants, key_init, init_params,
                                           self._init_strategy, num_chains, *auto_view(model_args, model_kwargs))
        if self._sharded is not None:  # (shard_map cannot run under compile-time eval)
            self._sharded.data.check_plate_sizes(model_args, model_kwargs)
        self._check_initial_indicator(delta)
        self._deterministic_in_plate = self._plan.ss.deterministic_in_plate
        _, self._unravel = ravel_pytree(jax.tree.map(lambda x: x[0], params) if num_chains else params)

        def init_one(key, params, delta, constants, model_args, model_kwargs):
            return initial_state(self._plan, self._mb, params, delta, key, constants, model_args, model_kwargs)

        return ChainStart(init_one, (params, delta.astype(jnp.int32), self._constants), (0, 0, None))

    def _make_plan(self, model_args, model_kwargs):
        """``(plan, constants, Minibatcher, ShardedPlan or None)``: the structure found from one
        trace of the model, and on data split over a mesh what each shard's step reads."""
        o = self.settings
        if spans_processes(model_args, model_kwargs):
            raise ValueError(
                "SparseAsync samples data split over the devices of one process; these data span "
                "several processes (jax.distributed): use a gradient kernel (SGLD, SGBD, SGHMC, ...) "
                "there, or gather the rows into one process.")
        data_args, data_kwargs = auto_view(model_args, model_kwargs)  # eager code on Explicit meshes too
        info = trace_model(self._model, data_args, data_kwargs)
        ss = find_spike_slab(
            self._model, data_args, data_kwargs, indicator=self.sites.indicator, coefficient=self.sites.coefficient,
            glm="auto" if o.fast_path != "generic" else False,
            subsample_size=self._subsample_size if o.variant == "sgld" else None, info=info,
        )
        plan, constants, mb = make_plan(o, ss, info, self._model, data_args, data_kwargs,
                                        check_data=self.minibatch_options.check_data,
                                        replace=self.minibatch_options.replace, effective_name=self.sites.effective)
        shards = find_data_shards(model_args, model_kwargs, () if ss.plate is None else (
            ss.plate if o.variant == "sgld" else replace(ss.plate, subsample_size=ss.plate.size),))
        if shards is None:
            return plan, constants, mb, None
        sharded, constants = shard_plan(plan, constants, shards, self._model, self.minibatch_options.replace)
        return plan, constants, mb, sharded

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
                f"more than max_active = {plan.max_active}; pass a larger max_active (options={{'max_active': …}})."
            )

    # -- one iteration ---------------------------------------------------------------------------
    def step(self, state, model_args, model_kwargs):
        """One iteration of one chain (pure): STEP 1, STEP 2, ε adapted during warmup (MALA),
        then the shared divergence guard (a blown-up chain is frozen, ``diverging``)."""
        if self._sharded is None:
            return sparse_async_step(self._plan, self._mb, self._unravel, self._num_warmup, state,
                                     model_args, model_kwargs)
        sharded = self._sharded  # every shard's rows, the point replicated, the row sums psum'd
        sharded.data.check_compiled_data(state.i, model_args, model_kwargs)
        step = partial(sparse_async_step, sharded.plan, sharded.minibatcher, self._unravel, self._num_warmup)
        return sharded.data.shards.replicated(step, state, model_args, model_kwargs, sharded.specs)

    def divergence_message(self, state) -> str | None:
        """The shell's message, and for chains frozen by an overflow of the active list (fast
        path: size(δ) past ``max_active``) the fix."""
        message = super().divergence_message(state)
        overflow = np.asarray(getattr(state, "overflow", False), bool).reshape(-1)
        if message is None or not overflow.any():
            return message
        return message + (
            f" Chain(s) {[int(c) for c in np.nonzero(overflow)[0]]} stopped because the model size "
            f"size({self._plan.ss.indicator}) would exceed max_active = {self._plan.max_active} (the "
            "static size of the active-set index list of the fast path): pass a larger max_active "
            "(options={'max_active': …}; cost O(N·max_active) per iteration at worst) or "
            "options={'fast_path': 'generic'}."
        )

    # -- output --------------------------------------------------------------------------------
    def _draw_plates(self):
        ss = self.spike_slab
        return None if ss is None else (() if ss.plate is None else (ss.plate,))

    def _data_shards(self):
        return None if self._sharded is None else self._sharded.data.shards

    def _constrain(self, z, model, model_args, model_kwargs):
        """A draw's θ with its excluded coordinates drawn from the spike (from the key kept with
        the draw), δ, and θ·δ under :attr:`effective_name`; the shell's ``postprocess_fn`` runs
        it (:meth:`~numpyro_sg.kernels.base.SGKernel.postprocess_fn`)."""
        ss = self.spike_slab
        z = dict(z)
        delta = z.pop(ss.indicator)
        key = z.pop(SPIKE_KEY)
        out = constrain_fn(ss.conditioned(delta, model), model_args, model_kwargs, z, return_deterministic=True)
        spike = ss.spike_sample_fn(model_args, model_kwargs)(key, out)
        theta = jnp.where(delta == 1, out[ss.coefficient], spike.astype(out[ss.coefficient].dtype))
        out[ss.coefficient] = theta
        out[ss.indicator] = delta
        out[self.effective_name] = theta * delta
        return out
