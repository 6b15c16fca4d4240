"""The NumPyro shell of every gradient-based kernel (SGLD, SGBD, SGHMC, SGNHT, pSGLD, BAOAB).

The update itself is the kernel module's functional ``step``, built on
:func:`~numpyro_sg.kernels.core.gradient_step` (move, gradient estimate, guard).
:class:`GradientKernel` builds what that step takes from the NumPyro model, the same way for
every kernel:

* **one model trace** at ``init`` read by plate discovery, data checks and deterministic sites;
* the **warmup** (:mod:`numpyro_sg.infer.warmup`): mode, Laplace preconditioner, control-variate
  anchor, the chains' starts, and the defaults' mini-batch size from the gradient noise it
  measured (:mod:`numpyro_sg.kernels.noise_plan`); ``"adapt"``'s updates between steps;
* the **gradient estimator** (:meth:`GradientKernel.gradient_estimator`) and each iteration's mini-batch;
* NumPyro's ``MCMCKernel`` contract, through :class:`~numpyro_sg.kernels.base.SGKernel`.

A kernel supplies its ``State``, ``_hyperparameters``, ``_init_fields``, ``functional_step`` and
``step_options``; see :mod:`numpyro_sg.kernels.cyclical` for a complete kernel in a few lines.
"""

from __future__ import annotations

import dataclasses
import warnings
import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.infer.initialization import init_to_uniform
from numpyro.util import is_prng_key

from numpyro_sg.diagnostics.convergence import ConvergenceWarning
from numpyro_sg.infer.minibatch import Anchor, subsample_plates
from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.infer.sharded_minibatch import make_minibatcher
from numpyro_sg.infer.sharding import auto_view, eager_under_trace
from numpyro_sg.infer.preconditioner import (adapted_preconditioner, given_preconditioner, init_moments,
                                             laplace_draw, update_moments)
from numpyro_sg.infer.progress import warmup_progress
from numpyro_sg.infer.warmup import ModeFit, WarmupOptions, find_mode
from numpyro_sg.infer.programs import tree_signature
from numpyro_sg.kernels.base import SGKernel
from numpyro_sg.kernels.chain_start import ChainStart, search_trace_key
from numpyro_sg.kernels.options import MINIBATCH_MOVES, check_choice, moved_options
from numpyro_sg.kernels.core import gradient_init
from numpyro_sg.kernels.data_cache import PerDataCache
from numpyro_sg.kernels.noise_plan import kernel_noise_plan, slow_chain_remedy
from numpyro_sg.locals.fitting import anchor_gradient, log_marginal_batcher
from numpyro_sg.locals.model import integrate_locals
from numpyro_sg.kernels.report import (chain_moments, excursion_report, frozen_chains, frozen_report, misfit_report,
                                       stiff_diagonal_remedy)

__all__ = ["GradientKernel"]


#: accepted string values of ``preconditioner`` (an array is accepted too)
PRECONDITIONERS = ("laplace", "adapt", None)
#: accepted values of ``gradient``
GRADIENTS = ("cv", "plain")


class GradientKernel(SGKernel):
    """Shell of the gradient-based kernels (SGLD, SGBD, SGHMC, SGNHT, pSGLD, BAOAB; see the module
    docstring), and the one place documenting the options they all share (``SHARED_OPTIONS``):

    :param preconditioner: ``"laplace"`` (default; as for every kernel, M = the posterior covariance of
        a Laplace approximation and ``step_size`` in its units, posterior sds: here the Laplace
        covariance at the mode found by the warmup — dense for up to ``warmup_options.dense_max``
        coordinates, diagonal above), ``"adapt"``
        (Laplace, then re-estimated from each chain's warmup draws), ``None`` (M = I: step sizes in
        absolute units; give ``step_size``), or an array: per-coordinate scales (d,) (M = diag(scale²))
        or a covariance (d, d).
    :param str gradient: ``"cv"`` (default: control variates around the warmup mode) or ``"plain"`` (the
        mini-batch gradient).
    :param warmup_options: options of the warmup's mode search: a :class:`~numpyro_sg.infer.warmup.WarmupOptions`
        (or a dict of its fields), or a :class:`~numpyro_sg.infer.warmup.ModeFit` computed before (reused as is).
    :param subsample_size: mini-batch size n, overriding the plate's own (an int, or a dict ``{plate_name: n}``
        when there are several plates); the N/n scale follows the size actually used.  Must lie in [1, N].
    :param init_strategy: NumPyro init strategy; the default ``None`` starts every chain at a draw of the
        Laplace approximation at the mode.  An explicit strategy (or ``init_params``) wins.
    :param minibatch_options: the mini-batch gradient's options, a :class:`~numpyro_sg.kernels.options.MinibatchOptions`
        or a dict of its fields (``replace``, ``check_data``, ``estimate_noise``, ``noise_ema_weight``;
        ``None``: the defaults), e.g. ``{"replace": False}``.

    With a default step, n adapts to the warmup's gradient noise (:mod:`numpyro_sg.kernels.noise_plan`).

    Memory per step is O(n·k + d) at any d: the gradient-noise sd τ̂ (when the kernel needs it) comes from
    per-datum gradients only while n·d ≤ 10⁶, else from k ≤ 16 group means (attribute ``noise_groups``,
    :func:`numpyro_sg.infer.minibatch.noise_groups`); the Laplace preconditioner is diagonal above
    ``warmup_options.dense_max`` coordinates (Hutchinson estimate from Hessian-vector products, no d×d matrix).
    """

    #: the keyword arguments every gradient kernel passes to this class's ``__init__``
    SHARED_OPTIONS = ("preconditioner", "gradient", "warmup_options", "subsample_size", "init_strategy",
                      "minibatch_options")

    @moved_options(MINIBATCH_MOVES)
    def __init__(self, model, step_size=None, *, preconditioner="laplace", gradient="cv",
                 warmup_options=None, subsample_size=None, init_strategy=None, minibatch_options=None):
        super().__init__(model, subsample_size=subsample_size, init_strategy=init_strategy,
                         minibatch_options=minibatch_options)
        if not (isinstance(preconditioner, (str, type(None)))):
            preconditioner = np.asarray(preconditioner, dtype=float)
            if preconditioner.ndim not in (1, 2):
                raise ValueError(
                    "preconditioner as an array must be per-coordinate scales (d,) or a "
                    f"covariance (d, d); got shape {preconditioner.shape}."
                )
        else:
            check_choice("preconditioner", preconditioner, PRECONDITIONERS + ("an array",))
        check_choice("gradient", gradient, GRADIENTS)
        self.preconditioner = preconditioner
        self.gradient = gradient
        self._fits = PerDataCache()  # the warmup's ModeFit, once per data set
        if isinstance(warmup_options, ModeFit):
            self._fits.set(warmup_options)
            self.warmup_options = WarmupOptions()
        else:
            self.warmup_options = WarmupOptions.of(warmup_options)
        if step_size is None and preconditioner is None:
            raise ValueError(
                "step_size=None chooses the step size in the units of the preconditioner; with "
                "preconditioner=None give step_size (in the units of the parameters)."
            )
        self.step_size = step_size
        #: groups k of the gradient-noise estimate τ̂ (``None``: per datum at small n·d, else
        #: up to 16 group means; :func:`numpyro_sg.infer.minibatch.noise_groups`); set before ``run``
        self.noise_groups = None
        self.noise_plan = None   #: the defaults' mini-batch size and step, known after ``init``

    @property
    def estimate_noise(self) -> bool:
        """Whether the gradient estimate computes τ̂ (``minibatch_options.estimate_noise``, resolved)."""
        return bool(self.minibatch_options.estimate_noise)

    @property
    def noise_ema_weight(self) -> float:
        """β of the EMA of τ̂ (``minibatch_options.noise_ema_weight``)."""
        return self.minibatch_options.noise_ema_weight

    def _resolve_estimate_noise(self, default: bool, needs: bool = False, why: str = "") -> bool:
        """Fill in ``minibatch_options.estimate_noise`` (``None``: ``default``); a ValueError
        starting with ``why`` when the kernel ``needs`` τ̂ and it was turned off."""
        options = self.minibatch_options
        value = default if options.estimate_noise is None else options.estimate_noise
        if needs and not value:
            raise ValueError(f"{why} estimate_noise=True (minibatch_options={{'estimate_noise': True}}).")
        self.minibatch_options = dataclasses.replace(options, estimate_noise=bool(value))
        return bool(value)

    @classmethod
    def shared(cls, arguments: dict) -> dict:
        """The :data:`SHARED_OPTIONS` among a subclass's ``__init__`` arguments (``locals()``)."""
        return {k: arguments[k] for k in cls.SHARED_OPTIONS}

    @property
    def mode_fit(self) -> ModeFit | None:
        """The warmup's :class:`~numpyro_sg.infer.warmup.ModeFit`, known after ``init`` when the kernel ran one."""
        return self._fits.value

    def use_mode_fit(self, fit: ModeFit):
        """Reuse ``fit``, the warmup's result for the same model and data (e.g. another kernel's
        :attr:`mode_fit`, or :func:`~numpyro_sg.infer.warmup.fit_model_mode`'s), instead of searching
        for the mode again at ``init``; the tuners share one fit among their arms this way."""
        if not isinstance(fit, ModeFit):
            raise TypeError(f"fit must be a numpyro_sg.infer.warmup.ModeFit, got {type(fit).__name__}.")
        self._fits.set(fit)

    def _needs_mode(self, init_params) -> bool:
        if isinstance(self.preconditioner, str) or self.gradient == "cv":
            return True
        return init_params is None and self._init_strategy is None

    def _search_mode(self, info, model_args, model_kwargs):
        fit = find_mode(log_marginal_batcher(self._mb), info, self._unravel, model_args, model_kwargs, self.warmup_options)
        for message in (fit.nonconvergence(), fit.multimodality(self.warmup_options.multimodal_gap)):
            if message:
                warnings.warn(f"{type(self).__name__}: {message}", ConvergenceWarning, stacklevel=4)
        return anchor_gradient(self._mb, fit, self._unravel, model_args, model_kwargs, self.warmup_options.chunk_size)

    def _geometry(self, fit: ModeFit | None, dim: int, dtype):
        """(Preconditioner, Anchor or None) from the options and the warmup's fit."""
        P = self.preconditioner
        precond = fit.preconditioner if isinstance(P, str) else given_preconditioner(P, dim, dtype)
        anchor = Anchor(fit.mode, fit.grad) if self.gradient == "cv" else None
        return precond, anchor

    def _plan_chains(self, key_init, init_params, model_args, model_kwargs, num_chains) -> ChainStart:
        """The gradient kernels' part of :meth:`~numpyro_sg.kernels.base.SGKernel.init`: the plan
        (:meth:`_plan`), the geometry and hyperparameters, and each chain's start — the given
        values, or a draw of the Laplace approximation at the mode, made in the program."""
        self._set_adaptation_schedule()
        info, fit = self._plan(key_init, init_params, model_args, model_kwargs)
        self._plan_noise(fit, model_args, model_kwargs)
        dtype = jnp.result_type(float)
        dim = sum(np.size(v) for v in jax.tree.leaves(info.unconstrained_example()))
        precond, anchor = self._geometry(fit, dim, dtype)
        hyper = self._hyperparameters(dim, precond)
        if init_params is None and (self._init_strategy is not None or fit is None):
            init_params = info.init_values
        laplace, jitter = init_params is None, self.warmup_options.jitter
        start = (fit.mode, fit.preconditioner) if laplace else init_params

        def init_one(key, start, geometry, model_args, model_kwargs):
            flat = laplace_draw(*start, key, jitter) if laplace else ravel_pytree(start)[0].astype(dtype)
            return self._initial_state(flat, key, *geometry, model_args, model_kwargs)

        key = self._program_key("init", num_chains is not None, laplace, str(dtype),
                                tree_signature(info.unconstrained_example()), jitter,
                                arguments=("step_size",))  # (in hyper: one program for any step size)
        return ChainStart(init_one, (start, (hyper, precond, anchor)), (None if laplace else 0, None), key)

    def _plan_noise(self, fit: ModeFit | None, model_args, model_kwargs):
        """Set :attr:`noise_plan` (:func:`~numpyro_sg.kernels.noise_plan.kernel_noise_plan`) and,
        where it changes the mini-batch size or sampling, the mini-batcher."""
        plan = self.noise_plan = kernel_noise_plan(self, fit, stacklevel=6)
        if plan is not None and (plan.subsample_size != plan.requested or plan.replace != self._mb.replace):
            plates = (dataclasses.replace(self._mb.plates[0], subsample_size=plan.subsample_size),)
            self._mb = make_minibatcher(self._model, plates, plan.replace, model_args, model_kwargs)

    DEFAULT_STEP_SIZE: float = None   #: the default ε (SGBD: σ) in the preconditioner's units
    BOUNDED_MOVES = False   #: whether a move's length is bounded whatever the gradient (SGBD)

    def default_step_size(self, plain: bool = False):
        """The step when ``step_size`` is ``None``: the default, times the :attr:`noise_plan`'s scale unless ``plain``."""
        plan = self.noise_plan
        return self.DEFAULT_STEP_SIZE * (1.0 if plain or plan is None else plan.step_scale)

    def slow_chain_remedy(self) -> str | None:
        """:func:`~numpyro_sg.kernels.report.stiff_diagonal_remedy` (a stiff diagonal preconditioner), else where
        the :attr:`noise_plan` shrank the default step :func:`~numpyro_sg.kernels.noise_plan.slow_chain_remedy`."""
        plan, laplace = self.noise_plan, isinstance(self.preconditioner, str) and self.preconditioner == "laplace"
        stiff = stiff_diagonal_remedy(self.mode_fit) if laplace else None
        return stiff or (None if self.step_size is not None or plan is None else slow_chain_remedy(
            plan, self.default_step_size(), self.BOUNDED_MOVES))

    def noise_inflation(self, step_size, noise, curvature=1.0):
        """The variance fraction noise c adds at ``step_size`` on a whitened Gaussian of curvature
        ``curvature`` (:mod:`~numpyro_sg.kernels.noise_plan`); ``None``: unknown."""
        return None

    def _plan(self, key_init, init_params, model_args, model_kwargs):
        """Trace the model once, find its subsample plates, build the mini-batcher and run the
        warmup's mode search when needed: ``(model info, ModeFit or None)``."""
        with warmup_progress(self.warmup_options) as bar:
            return self._plan_steps(bar, key_init, init_params, model_args, model_kwargs)

    def _plan_steps(self, bar, key_init, init_params, model_args, model_kwargs):
        """:meth:`_plan`'s steps, each named on the warmup's progress ``bar``."""
        bar.set_postfix_str("model trace")
        data = auto_view(model_args, model_kwargs)  # eager NumPyro code runs on Explicit meshes too
        with eager_under_trace(key_init):  # structural work stays eager under pmap too
            # without an init strategy the trace's draw only starts the mode search: from the warmup's seed
            default = init_params is None and self._init_strategy is None
            trace_kwargs = dict(rng_key=search_trace_key(key_init, self.warmup_options.seed) if default else key_init,
                                init_strategy=(self._init_strategy or init_to_uniform) if init_params is None else None)
            info = trace_model(self._model, *data, **trace_kwargs)
            bar.set_postfix_str("local latents")
            model = integrate_locals(self._model, info, *data)
            # local latents (found here, or a user's marginalize_locals): sample the globals' marginal
            if model is not self._model or info.latent_in(info.subsample_plates):
                self._model = model
                info = trace_model(model, *data, **trace_kwargs)
            plates = subsample_plates(info, self._subsample_size, check_data=self.minibatch_options.check_data,
                                      model_args=data[0], model_kwargs=data[1])
            if self.estimate_noise and len(plates) > 1:
                raise ValueError(f"{type(self).__name__} with these settings estimates the gradient noise from "
                                 "per-datum gradients, which needs exactly one subsample plate; the model has "
                                 f"{[p.name for p in plates]}.")
        self._mb = make_minibatcher(self._model, plates, self.minibatch_options.replace, model_args, model_kwargs)
        self._deterministic_in_plate = info.deterministic_in(p.name for p in plates)
        _, self._unravel = ravel_pytree(info.unconstrained_example())
        if not self._needs_mode(init_params):
            return info, None
        with eager_under_trace(key_init):  # once per data set (chains of "sequential" reuse it)
            return info, self._fits.get(model_args, model_kwargs, lambda: self._search_mode(info, model_args, model_kwargs))

    def _initial_state(self, flat, key, hyper, precond, anchor, model_args, model_kwargs):
        """One chain's state at the flat point ``flat``: the functional core's
        (:func:`~numpyro_sg.kernels.core.gradient_init`, ĝ on the chain's first mini-batch) with
        the shell's fields (anchor, moments, mini-batch state, key)."""
        key, key_batch, key_idx = random.split(key, 3)
        batch_state = self._mb.init_batch_state(key_batch)
        indices, batch_state = self._mb.draw(key_idx, batch_state)
        estimate = self._estimator(anchor, precond, model_args, model_kwargs)
        state = gradient_init(self.State, self._unravel(flat), estimate, indices, hyper, self._init_fields, precond,
                              self.step_variance)
        return state._replace(anchor=anchor, moments=init_moments(flat.shape[0], precond.kind == "dense", flat.dtype),
                              batch_state=batch_state, rng_key=key)

    # -- warmup adaptation and the end-of-run report --------------------------------------
    #: fractions of num_warmup: moments collected from the first, preconditioner re-estimated
    #: (and moments reset) at the others ("adapt"); moments reset at the end of warmup
    ADAPT_WINDOWS = (0.15, 0.5, 0.85)

    def _set_adaptation_schedule(self):
        W = self._num_warmup
        start, *updates = (int(f * W) for f in self.ADAPT_WINDOWS)
        adapt = isinstance(self.preconditioner, str) and self.preconditioner == "adapt" and W > 0
        self._adapt_at = tuple(u for u in updates if u > start) if adapt else ()
        self._moments_from = start if adapt else W

    def _between_steps(self, state):
        """Re-estimate the preconditioner ("adapt") at its warmup iterations and restart the
        moments there and at the end of warmup (so the report covers the kept draws)."""
        single = is_prng_key(state.rng_key)
        i0 = state.i if single else state.i[0]  # every chain is at the same iteration

        def refit(st):
            return st._replace(precond=adapted_preconditioner(st.precond, st.moments))

        def reset(st):
            return st._replace(moments=jax.tree.map(jnp.zeros_like, st.moments))

        for fn, at in ((refit, self._adapt_at), (reset, self._adapt_at + (self._num_warmup,))):
            if at:
                fn_all = fn if single else jax.vmap(fn)
                state = jax.lax.cond(jnp.isin(i0, jnp.asarray(at)), fn_all, lambda s: s, state)
        return state

    #: the end-of-run report flags draws whose whitened mean is further than this many Laplace
    #: sds from the mode, or whose whitened covariance has eigenvalues outside this range
    MISFIT_OFFSET, MISFIT_EIGENVALUES = 2.0, (0.25, 4.0)

    def convergence_report(self, state) -> list:
        """Causes found in the moments the chains collected over the kept draws, as
        ``(problem, remedy)`` pairs (:mod:`numpyro_sg.kernels.report`): chains that barely move
        (the step size's units), else excursions and the draws' distance from the Laplace fit."""
        fit, m = self._fits.value, getattr(state, "moments", None)
        if fit is None or m is None:
            return []
        d = fit.mode.shape[0]
        counts, means, m2s = chain_moments(m, d)
        if counts.sum() < 50:
            return []
        frozen = frozen_chains(fit.preconditioner, counts, m2s, state.diverging)
        if frozen:
            return [frozen_report(frozen, self.preconditioner, state.step_size)]
        if d > self.warmup_options.dense_max:
            # a diagonal Laplace preconditioner (d > dense_max) ignores the correlations and is shrunk for
            # stability (WarmupOptions.stabilise_diagonal): no posterior approximation to measure the misfit against
            return []
        return (excursion_report(fit, m, state.diverging, bounded=self.BOUNDED_MOVES)
                + misfit_report(fit, counts, means, m2s, (self.MISFIT_OFFSET, self.MISFIT_EIGENVALUES)))

    # -- one iteration ----------------------------------------------------------------------
    def _estimator(self, anchor, precond, model_args, model_kwargs):
        def estimate(z, indices):
            return self._mb.estimate_at(
                self._unravel, ravel_pytree(z)[0], indices, anchor=anchor, noise=self.estimate_noise, precond=precond,
                groups=self.noise_groups, model_args=model_args, model_kwargs=model_kwargs)
        return estimate

    def gradient_estimator(self, state, model_args=(), model_kwargs=None):
        """``estimate(z, indices) -> GradientEstimate``: the stochastic gradient of the model's log
        density that :meth:`step` gives the functional step — at ``z`` (a dict of unconstrained
        values), on the mini-batch ``indices`` (``{plate name: index array}``, e.g. from
        ``kernel.minibatcher.draw``), with one chain's ``state``'s control-variate anchor and
        working frame (τ̂ in it).  Known after ``init``; ``value`` is the mini-batch log density
        estimate and ``grad`` ĝ (flat: ``kernel.unravel(grad)`` is the dict)."""
        return self._estimator(state.anchor, state.precond, model_args, {} if model_kwargs is None else model_kwargs)

    def step(self, state, model_args, model_kwargs):
        """One iteration of one chain (pure): the kernel's functional ``step``
        (:func:`~numpyro_sg.kernels.core.gradient_step`) with the model's gradient estimator
        on the next mini-batch; then the warmup's moments."""
        key, key_batch, key_move = random.split(state.rng_key, 3)
        indices, batch_state = self._mb.draw(key_batch, state.batch_state)
        estimate = self.gradient_estimator(state, model_args, model_kwargs)
        new = self.functional_step(key_move, state, estimate, indices, **self.step_options())
        collect = state.i >= self._moments_from
        return new._replace(moments=update_moments(state.moments, ravel_pytree(new.z)[0], collect),
                            batch_state=batch_state, rng_key=key)

    # -- what a kernel supplies -------------------------------------------------------------
    #: the kernel's functional step: its module's ``step(rng_key, state, estimate, minibatch, **options)``
    functional_step = None
    #: for the guard, ε of a step size that is a length (SGBD's σ ↦ σ²); ``None``: the step size is ε
    step_variance = None

    def step_options(self) -> dict:
        """The keyword options of :attr:`functional_step` (the kernel's settings)."""
        return dict(noise_ema_weight=self.noise_ema_weight)

    def _hyperparameters(self, dim, precond):  # pragma: no cover - abstract
        """The kernel's hyperparameter NamedTuple (validated against the dimension)."""
        raise NotImplementedError

    def _init_fields(self, noise_sd, hyper, dim, dtype):  # pragma: no cover - abstract
        """Kernel-specific state fields at the initial point."""
        raise NotImplementedError
