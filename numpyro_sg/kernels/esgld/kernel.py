r"""The :class:`ESGLD` kernel: the NumPyro shell (init, the pure step, selection output)."""

from __future__ import annotations

import functools
from dataclasses import replace

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import constrain_fn

from numpyro_sg.infer.minibatch import Minibatcher, subsample_plates
from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.infer.sharded_minibatch import ShardedMinibatcher
from numpyro_sg.infer.sharding import auto_view, eager_under_trace, find_data_shards
from numpyro_sg.kernels.esgld.sharded import shard_setup, sharded_minibatcher
from numpyro_sg.kernels.base import SGKernel
from numpyro_sg.kernels.chain_start import ChainStart
from numpyro_sg.kernels.options import SAMPLING_MOVES, SITE_MOVES, MinibatchOptions, check_positive, moved_options
from numpyro_sg.kernels.esgld.options import (
    DEFAULT_WEIGHT_ROWS,
    ESGLDOptions,
    ESGLDSettings,
    ESGLDSetup,
    anchor_applies,
    anchor_iterations,
    esgld_hyperparameters,
    resolve_algorithm,
)
from numpyro_sg.kernels.esgld.step import ESGLDState, esgld_initial_state, esgld_step
from numpyro_sg.kernels.esgld.warmup import coefficient_index, initial_mode, start_at_mode
from numpyro_sg.kernels.esgld.weights import proposal_weights, resolve_proposal_weights
from numpyro_sg.spike_slab import (
    SpikeSlab,
    SpikeSlabSites,
    effective_site_name,
    find_spike_slab,
    start_fn,
    strategy_indicator,
)


class ESGLD(SGKernel):
    r"""Extended SGLD for Bayesian variable selection with a spike-and-slab NumPyro model
    (Song, Sun, Ye & Liang (2020), "Extended stochastic gradient MCMC for large-scale Bayesian
    variable selection", Biometrika).

    Each iteration draws a mini-batch S of n of the N data, runs ``num_models`` = m moves of a
    Metropolis–Hastings chain on the indicator γ (θ fixed up to sign flips), then moves θ by
    one Langevin step.  The paper's algorithm (``proposal="paper", gradient="plain",
    preconditioner=None``) averages the gradient over the m models γ_1..γ_m:

    .. math::

       \theta' = \theta + \frac{\varepsilon}{2m}\sum_{k=1}^m
       \nabla_\theta \log \pi(\theta\mid\gamma_k, X_S) + \mathcal N(0, \varepsilon\tau I),

    log π(θ | γ, X_S) = log π(θ|γ) + (N/n)·Σ_{i∈S} log f(x_i | θ·γ).  The default for a GLM
    likelihood (θ the only continuous site) uses informed single-flip moves accepted on a
    control-variate estimate of the log-likelihood and one Langevin step at the last model γ_m,
    θ_j' = θ_j + (ε_j/2)·ĝ_j + N(0, ε_j·τ), ε_j = h·v_j, ĝ the control-variate gradient and v_j
    the conditional posterior variance of θ_j (:mod:`numpyro_sg.kernels.esgld`).  A chain whose
    state, log density or gradient becomes non-finite or explodes is frozen at its last safe
    point with ``diverging`` set (:func:`~numpyro_sg.kernels.guard.guarded_update`).

    **Step size.** ``step_size`` is in the preconditioner's units: with the default Laplace
    scaling (``preconditioner="laplace"``) it is h, in units of each coefficient's
    conditional posterior sd (the injected noise of θ_j has sd √(h·τ) posterior sds; ``None``:
    :data:`~numpyro_sg.kernels.esgld.options.DEFAULT_STEP_SIZE` = 0.25; 0.1 without the
    control-variate anchor, see ``preconditioner``).  With
    ``preconditioner=None, gradient="plain"`` it is the paper's absolute step ε (``None``:
    :data:`~numpyro_sg.kernels.esgld.options.PAPER_STEP_SIZE` = 1e-6; the paper uses ε ≈ 1/N
    or smaller).  A float, an array over the flat unconstrained continuous sites, or a
    schedule t ↦ ε_t (:func:`~numpyro_sg.polynomial_schedule`, or any callable); held in the
    state (``state.hyper``), so :func:`numpyro_sg.mamba` can vary it across vectorised arms.

    >>> import jax, numpy as np, numpyro_sg as nsg
    >>> from numpyro.infer import MCMC
    >>> from numpyro_sg.datasets import esgld_linear_model
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(500, 5)).astype(np.float32)
    >>> y = (X @ np.array([1.5, -1.0, 0, 0, 0]) + rng.normal(size=500)).astype(np.float32)
    >>> mcmc = MCMC(nsg.ESGLD(esgld_linear_model), num_warmup=200, num_samples=300, progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X, y, subsample_size=100)
    >>> (mcmc.get_samples()["inclusion"].mean(0) > 0.5).tolist()
    [True, True, False, False, False]

    :param model: NumPyro model with a subsample plate, an indicator site (Bernoulli, shape
        (p,)) and a coefficient site (real, shape (p,)) entering the likelihood only through
        their product (see :mod:`numpyro_sg.spike_slab`).
    :param step_size: h (Laplace scaling) or the absolute ε (``preconditioner=None``); see
        "Step size" above.
    :param int num_models: m, the number of MH steps (models) on γ per iteration (paper: 10).
    :param max_model_size: q, models are truncated to size(γ) ≤ q (1 ≤ q ≤ p; default p).
    :param proposal: ``"auto"`` (default: ``"informed"`` when the likelihood is a detected GLM
        and θ the only continuous site, else ``"paper"``), ``"informed"`` (locally balanced
        single flips of (γ_j, sign θ_j) drawn ∝ exp(Δ̃/2) from the full-data quadratic
        surrogate of every flip, exact MH on the control-variate estimate;
        :func:`~numpyro_sg.kernels.esgld.informed.informed_indicator_chain`), ``"paper"`` (the
        weighted birth / death / exchange moves of the paper's supplement §3 with
        ``options["proposal_weights"]``), or an array of p weights (the paper's moves with these weights).
    :param gradient: ``"auto"`` (``"cv"`` where ``"informed"`` applies, else ``"plain"``),
        ``"cv"`` (control-variate gradient around the anchor, at the last model γ_m) or
        ``"plain"`` (the paper's model-averaged mini-batch gradient).
    :param preconditioner: ``"auto"`` (``"laplace"``), ``"laplace"`` (as for every kernel, M = the
        posterior covariance of a Laplace approximation and ``step_size`` in its units, posterior
        sds: here M = diag(v), v_j the Laplace variance of θ_j given the current model γ, which
        changes every iteration — a dense M would be refactorised at each change) or ``None``
        (absolute step).  Where the anchor does not
        apply (another continuous site such as an intercept, or a likelihood that is not a
        GLM) the Laplace step reads the model's own full-data curvature and the other
        continuous sites start at the mode with γ = 0 (:mod:`~numpyro_sg.kernels.esgld.warmup`;
        default h = :data:`~numpyro_sg.kernels.esgld.options.PLAIN_LAPLACE_STEP_SIZE` = 0.1,
        the mini-batch gradient being plain).  The informed proposal, ``"cv"`` and ``"laplace"`` carry a
        control-variate anchor (g and H of the full data at β̂, computed at iteration 0 and,
        for a non-Gaussian likelihood, again at iteration 100 at the chain's current β:
        :func:`~numpyro_sg.kernels.esgld.options.anchor_iterations`; O(N·p²) each, p² floats of
        memory).
    :param subsample_size: mini-batch size n, as for every kernel; n = N means full-batch: every
        iteration uses all N data (no noise).
    :param init_strategy: NumPyro init strategy for the continuous sites (run with γ = 0);
        default :func:`~numpyro_sg.spike_slab.init_to_spike` (θ from the spike, which the
        paper's search needs).
    :param sites: the site names, a :class:`~numpyro_sg.spike_slab.SpikeSlabSites` or a dict of
        its fields: ``indicator`` and ``coefficient`` (found automatically when omitted),
        ``effective`` (output name of β = θ·γ; default ``"beta"``, or ``"<coefficient>_eff"`` if
        the model has a non-deterministic site called ``beta``; a deterministic site of the
        model with that name is used as is) and ``inclusion`` (output name of the inclusion
        frequency, default ``"inclusion"``).
    :param options: the other options, an :class:`~numpyro_sg.kernels.esgld.options.ESGLDOptions`
        or a dict of its fields: ``proposal_weights`` (the paper's moves' weights: ``"auto"``,
        ``"correlation"``, ``"deviance"``, ``"uniform"`` or an array), ``flip_sign``,
        ``mh_correction`` (``None`` or ``"penalty"``), ``fast_path`` (``"auto"``, ``"glm"`` or
        ``"generic"``), ``weight_rows`` (data rows read by data-based weights, default
        :data:`~numpyro_sg.kernels.esgld.options.DEFAULT_WEIGHT_ROWS` = 20,000) and
        ``temperature`` τ (default 1); each documented in
        :class:`~numpyro_sg.kernels.esgld.options.ESGLDOptions`.
    :param minibatch_options: ``replace`` and ``check_data`` of
        :class:`~numpyro_sg.kernels.options.MinibatchOptions` (or a dict of them; the fields of
        the gradient estimate's noise do not apply), documented in
        :class:`~numpyro_sg.kernels.base.SGKernel`.

    The former keywords (``indicator=``, ``coefficient=``, ``effective_name=``,
    ``inclusion_name=``, ``proposal_weights=``, ``flip_sign=``, ``mh_correction=``,
    ``fast_path=``, ``weight_rows=``, ``temperature=``, ``replace=``, ``check_data=``) still work,
    with a ``DeprecationWarning`` naming the new place.

    Output per draw (``mcmc.get_samples()``): the constrained continuous sites (θ, …), the
    indicator γ_m as int32 in {0, 1}, the effective coefficients β = θ·γ_m and the inclusion
    frequency (1/m)·Σ_k γ_k (its mean over draws estimates the marginal posterior inclusion
    probabilities, the paper's Theorem 1(iii)); with informed proposals also
    ``<inclusion>_rb`` (``sites``), the Rao-Blackwellised inclusion (the mean over the m states of
    P(γ_j = 1 | θ, γ_{−j}, X) under the surrogate, eq. 8 of the ESGLD slides).  Extra fields:
    ``step_size``, ``accept_prob`` (the mean over the m indicator moves of the
    Metropolis–Hastings acceptance probability min(1, ratio)), ``model_size``, ``diverging``.

    **At scale:**

    .. code-block:: python

        mcmc = MCMC(nsg.ESGLD(model, num_models=10, max_model_size=50),
                    num_warmup=2000, num_samples=3000)
        mcmc.run(jax.random.PRNGKey(0), X, y)
        nsg.selection_summary(mcmc, beta_true)        # inclusion, selected, β̂; FSR … in attrs
        # the paper's algorithm:
        nsg.ESGLD(model, 1e-6, proposal="paper", gradient="plain", preconditioner=None)

    **Data on a mesh.** With the data rows split over devices (``NamedSharding(mesh,
    P("data"))``, ``jit_model_args=True``) the default (informed, control-variate) step runs on
    every shard's rows with the state replicated, every row sum one all-reduce
    (:mod:`~numpyro_sg.kernels.esgld.sharded`); the paper's moves and gradient are refused there.
    """

    State = ESGLDState
    HYPERPARAMETERS = ("step_size", "temperature")

    @moved_options(SAMPLING_MOVES | SITE_MOVES | {name: ("options", name) for name in (
        "proposal_weights", "flip_sign", "mh_correction", "fast_path", "weight_rows", "temperature")})
    def __init__(self, model, step_size=None, *, num_models: int = 10, max_model_size: int | None = None,
                 proposal="auto", gradient: str = "auto", preconditioner: str | None = "auto",
                 subsample_size=None, init_strategy=None, sites=None, options=None, minibatch_options=None):
        if step_size is not None and not callable(step_size):
            check_positive("step_size", step_size)
        #: the :class:`~numpyro_sg.kernels.esgld.options.ESGLDSettings`: direct arguments, ``options`` and ``sites``
        self.settings = ESGLDSettings(num_models, max_model_size, proposal, gradient, preconditioner,
                                      ESGLDOptions.of(options), SpikeSlabSites.of(sites))
        super().__init__(model, subsample_size=subsample_size, init_strategy=init_strategy,
                         minibatch_options=MinibatchOptions.only(minibatch_options, ("replace", "check_data"), "ESGLD"))
        self.step_size = step_size
        self._setup = None

    @property
    def options(self) -> ESGLDOptions:
        """The :class:`~numpyro_sg.kernels.esgld.options.ESGLDOptions` in effect."""
        return self.settings.options

    @property
    def sites(self) -> SpikeSlabSites:
        """The :class:`~numpyro_sg.spike_slab.SpikeSlabSites` given (names resolved at ``init``:
        :attr:`indicator`, :attr:`coefficient`, :attr:`effective_name`)."""
        return self.settings.sites

    @property
    def temperature(self) -> float:
        """τ (``options.temperature``)."""
        return self.settings.options.temperature

    # -- public metadata ---------------------------------------------------------------------
    @property
    def setup(self) -> ESGLDSetup | None:
        """The static :class:`~numpyro_sg.kernels.esgld.options.ESGLDSetup` built at ``init``
        (what :func:`~numpyro_sg.kernels.esgld.step.esgld_step` reads)."""
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
        return self.sites.effective if self._setup is None else self._setup.effective_name

    @property
    def inclusion_name(self) -> str:
        """Name of the output inclusion frequency."""
        return self.sites.inclusion

    @property
    def uses_glm_path(self) -> bool:
        """True when proposals use the O(n) GLM update (known after ``init``)."""
        return self._setup is not None and self.spike_slab.glm is not None

    def diagnostics_text(self, state) -> str:
        msg = f"step size {float(jnp.mean(state.step_size)):.2e}, |γ| {int(jnp.max(state.model_size))}"
        msg += f", acc. {float(jnp.mean(state.accept_prob)):.2f}"
        if bool(jnp.any(state.diverging)):
            msg += ", DIVERGED"
        return msg

    # -- init ----------------------------------------------------------------------------
    def _prepare(self, model_args, model_kwargs) -> ESGLDSetup:
        """The static :class:`ESGLDSetup`, from one model trace (and one vectorised check run)."""
        o, opts, names = self.settings, self.settings.options, self.settings.sites
        data_args, data_kwargs = auto_view(model_args, model_kwargs)  # eager code on Explicit meshes too
        info = trace_model(self._model, data_args, data_kwargs)
        plates = subsample_plates(info, self._subsample_size, check_data=self.minibatch_options.check_data,
                                  model_args=data_args, model_kwargs=data_kwargs)
        if len(plates) != 1:
            raise ValueError(f"ESGLD needs exactly one subsample plate; the model has {[p.name for p in plates]}.")
        ss = find_spike_slab(self._model, data_args, data_kwargs, indicator=names.indicator,
                             coefficient=names.coefficient, subsample_size=self._subsample_size,
                             glm={"auto": "auto", "glm": True, "generic": False}[opts.fast_path], info=info)
        p, plate = ss.num_coefficients, ss.plate
        q = p if o.max_model_size is None else int(o.max_model_size)
        if not 1 <= q <= p:
            raise ValueError(f"max_model_size must lie in [1, p] = [1, {p}], got {q}.")
        proposal, gradient, preconditioner = resolve_algorithm(o, ss)
        kind = "uniform" if proposal == "informed" else resolve_proposal_weights(opts.proposal_weights, ss.glm, p)
        if proposal == "informed" and opts.weight_rows is not None:
            raise ValueError("weight_rows has no effect with proposal='informed' (it reads no weights).")
        data_weights = isinstance(kind, str) and kind != "uniform"
        if opts.weight_rows is not None and not data_weights:
            raise ValueError(f"weight_rows has no effect: the proposal weights of this model are {kind!r}.")
        if opts.mh_correction is not None and plate.subsample_size == plate.size:
            raise ValueError("mh_correction='penalty' has no effect with a full batch (subsample_size = N).")
        existing = info.site_types
        if names.inclusion in existing:
            raise ValueError(f"sites={{'inclusion': {names.inclusion!r}}} (the output name of the inclusion "
                             "frequency) is a site of the model; pick another.")
        shards = find_data_shards(model_args, model_kwargs, plates)
        if shards is None:
            self._mb = Minibatcher(self._model, plates, replace=self.minibatch_options.replace)
        else:
            self._mb = sharded_minibatcher(self._model, plates, shards, ss, proposal, gradient, self.minibatch_options.replace)
        self._deterministic_in_plate = ss.deterministic_in_plate
        flat, unravel = ravel_pytree(info.unconstrained_example())
        return ESGLDSetup(
            ss, self._mb, unravel, int(flat.shape[0]), q, o.num_models, opts.flip_sign,
            None if opts.mh_correction is None else self._mb.fraction_unsampled, names.inclusion,
            effective_site_name(ss, existing, names.effective), kind,
            min(opts.weight_rows or DEFAULT_WEIGHT_ROWS, plate.size) if data_weights else None,
            proposal, gradient, preconditioner,
            rb_name=f"{names.inclusion}_rb" if proposal == "informed" else None,
        )

    def _plan_chains(self, key_init, init_params, model_args, model_kwargs, num_chains) -> ChainStart:
        """ESGLD's part of :meth:`~numpyro_sg.kernels.base.SGKernel.init`: the setup
        (:meth:`_prepare`: spike-and-slab structure, mini-batcher, Laplace scales and anchor
        schedule), the starting indicators, and each chain's start (one model trace)."""
        with eager_under_trace(key_init):  # structural work stays eager under pmap too
            setup = self._prepare(model_args, model_kwargs)
            if setup.preconditioner == "laplace" and not anchor_applies(setup.spike_slab):
                setup = replace(setup, laplace_index=coefficient_index(setup.spike_slab, setup.unravel, setup.dim))
            glm = setup.spike_slab.glm
            family_name = glm.family_name if setup.anchored and glm is not None else "other"
            if setup.anchored or setup.laplace_index is not None:
                setup = replace(setup, num_warmup=self._num_warmup,
                                anchor_steps=anchor_iterations(family_name, self._num_warmup))
            else:
                setup = replace(setup, num_warmup=self._num_warmup)
            self._setup = setup
            self._step_setup = shard_setup(setup, self._mb)
            self._deterministic_in_plate = setup.spike_slab.deterministic_in_plate
        if isinstance(self._mb, ShardedMinibatcher):  # (shard_map cannot run under compile-time eval)
            self._mb.check_plate_sizes(model_args, model_kwargs)
        ss, rows = setup.spike_slab, setup.weight_rows
        given, gamma0 = _given_start(ss, init_params, setup.inclusion_name, num_chains, self._init_strategy)
        if not isinstance(gamma0, jax.core.Tracer) and bool(jnp.any(jnp.sum(gamma0, -1) > setup.max_model_size)):
            raise ValueError(f"The initial indicator has more than max_model_size = {setup.max_model_size} ones.")
        hyper = esgld_hyperparameters(self.step_size, self.temperature, setup.dim, setup.preconditioner,
                                      noisy_gradient=setup.laplace_index is not None)
        family, strategy = (None if ss.glm is None else ss.glm.family), self._init_strategy

        mode = None
        if setup.laplace_index is not None and given is None:  # from the mode with the initial γ
            mode = initial_mode(self._model, ss, jnp.zeros((ss.num_coefficients,), jnp.int32),
                                model_args, model_kwargs)

        def init_one(key, key_init, given, gamma, model_args, model_kwargs):
            if given is None or rows is not None:  # one model trace: the start and the weights' data
                given, glm_rows = start_fn(ss, model_args, model_kwargs, strategy, rows)(key_init, given)
            else:
                glm_rows = None
            if mode is not None:  # the other continuous sites start at the mode
                flat, unravel = ravel_pytree(given)
                given = unravel(start_at_mode(mode, setup.laplace_index, flat))
            weights = proposal_weights(setup.weight_kind, ss.num_coefficients, glm_rows, family)
            return esgld_initial_state(setup, given, gamma, weights, hyper, key)

        # the start reads a few rows (on the data's view); its anchor comes at step 0
        return ChainStart(init_one, (key_init, given, gamma0), (0, 0, 0), view=True)

    # -- one iteration -----------------------------------------------------------------
    def step(self, state, model_args, model_kwargs):
        """One iteration of one chain: :func:`~numpyro_sg.kernels.esgld.step.esgld_step` with the
        setup built at ``init``; on data split over a mesh, the same step on every shard's rows
        with the state replicated (:meth:`~numpyro_sg.infer.sharding.DataShards.replicated`)."""
        if not isinstance(self._mb, ShardedMinibatcher):
            return esgld_step(self._setup, state, model_args, model_kwargs)
        self._mb.check_compiled_data(state.i, model_args, model_kwargs)
        return self._mb.shards.replicated(functools.partial(esgld_step, self._step_setup), state,
                                          model_args, model_kwargs)

    # -- output ------------------------------------------------------------------------
    def _constrain(self, z, model, model_args, model_kwargs):
        """A draw's continuous sites (deterministic ones included), γ, the inclusion frequency
        and β = θ·γ (unless the model has it as a deterministic site); the shell's
        ``postprocess_fn`` runs it (:meth:`~numpyro_sg.kernels.base.SGKernel.postprocess_fn`)."""
        setup = self._setup
        ss = setup.spike_slab
        params, gamma = setup.unpack(z)
        out = constrain_fn(ss.conditioned(gamma, model), model_args, model_kwargs, params, return_deterministic=True)
        out[ss.indicator] = gamma
        out[setup.inclusion_name] = z[setup.inclusion_name]
        if setup.rb_name is not None:
            out[setup.rb_name] = z[setup.rb_name]
        if setup.effective_name not in out:
            out[setup.effective_name] = out[ss.coefficient] * gamma
        return out


def _given_start(ss: SpikeSlab, init_params, inclusion_name, num_chains, init_strategy=None):
    """(given unconstrained continuous values or None, starting indicator as int32: from
    ``init_params``, else ``init_to_value``'s, else 0)."""
    given, gamma = None, None
    if init_params is not None:
        given = {k: v for k, v in dict(init_params).items() if k not in (ss.indicator, inclusion_name)}
        gamma = dict(init_params).get(ss.indicator)
        given = given or None
    if gamma is None:
        gamma = strategy_indicator(init_strategy, ss.indicator, num_chains)
    if gamma is None:
        gamma = jnp.zeros((ss.num_coefficients,) if num_chains is None else (num_chains, ss.num_coefficients))
    return given, jnp.asarray(gamma).astype(jnp.int32)
