"""The NumPyro ``MCMCKernel`` shell shared by every stochastic-gradient kernel.

:class:`SGKernel` is the thin NumPyro shell around a kernel's pure step: the ``MCMCKernel``
contract (``init``, ``sample``, ``postprocess_fn``, fields, diagnostics string), vectorised
chains (``sample`` ``vmap``-s the pure :meth:`SGKernel.step` over chains), the divergence
report, and the shared options (``subsample_size``, ``init_strategy``, ``minibatch_options``).
Every kernel flags a blown-up chain through :func:`numpyro_sg.kernels.guard.guarded_update`
(``diverging``, collected by NumPyro by default, and the iteration in ``guard.diverged_at``); the :class:`DivergenceWarning` naming the
chains and iterations (:meth:`SGKernel.divergence_message`) comes after the run, from
:func:`numpyro_sg.check_convergence`, :func:`numpyro_sg.to_inference_data` and
:func:`numpyro_sg.posterior_summary`.  The step holds no host callback: the run clock takes its
stamps when NumPyro's progress bar reads the state (:mod:`~numpyro_sg.kernels.progress`).

The gradient-based kernels share one more layer, :class:`~numpyro_sg.kernels.gradient.GradientKernel`
(warmup, preconditioner, gradient estimate, guard).  Convergence is checked at the points the
package owns: :func:`numpyro_sg.check_convergence` and :func:`numpyro_sg.to_inference_data`
(NumPyro's ``MCMC`` has no public end-of-run hook); a kernel adds its own findings through
:meth:`SGKernel.convergence_report`.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.mcmc import MCMCKernel
from numpyro.infer.util import constrain_fn
from numpyro.util import is_prng_key

from numpyro_sg.infer.fit_store import clear_store
from numpyro_sg.infer.jit_data import is_data
from numpyro_sg.infer.lapack_guard import map_over_draws
from numpyro_sg.infer.minibatch import Minibatcher, full_data, jit_with_data, with_indices
from numpyro_sg.infer.programs import placement_key
from numpyro_sg.infer.run_clock import RunClock
from numpyro_sg.infer.model_info import structure_only
from numpyro_sg.infer.sharded_minibatch import is_sharded
from numpyro_sg.infer.sharding import auto_view, check_not_parallel
from numpyro_sg.kernels.chain_start import ChainStart, split_init_key
from numpyro_sg.kernels.data_cache import PerDataCache
from numpyro_sg.kernels.guard import diverged_iterations
from numpyro_sg.kernels.options import SAMPLING_MOVES, MinibatchOptions, moved_options
from numpyro_sg.kernels.progress import ProgressText
from numpyro_sg.kernels.step_size import step_size_at

__all__ = ["SGKernel", "EmbeddedDataWarning"]


#: the kernels warn (:class:`EmbeddedDataWarning`) when NumPyro's loop would compile more data
#: than this into its program as constants (``MCMC(..., jit_model_args=False)``, the default)
EMBEDDED_DATA_WARN_BYTES = 16 * 2**20

class EmbeddedDataWarning(UserWarning):
    """The data are compile-time constants of NumPyro's sampling loop (``MCMC``'s default
    ``jit_model_args=False``): slow to compile at every run; pass ``jit_model_args=True``."""


def embedded_data_bytes(state, model_args, model_kwargs) -> int:
    """Bytes of data that a program tracing ``state`` would hold as constants: the concrete
    array leaves of the model arguments when the state is traced (else 0)."""
    if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(state)):
        return 0
    return sum(int(np.size(x)) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves((model_args, model_kwargs))
               if is_data(x) and not isinstance(x, jax.core.Tracer))


def program_settings(obj, skip=()) -> tuple | None:
    """The hashable description of an object's settings (its instance attributes but ``skip``)
    for the key of a compiled program (:func:`~numpyro_sg.infer.programs.cached_program`):
    small arrays by value, functions by identity (but an instance attribute shadowing a method
    is skipped); ``None`` when some attribute has no such description (no caching then)."""
    out = []
    for name, value in sorted(vars(obj).items()):
        if name in skip or (callable(value) and callable(getattr(type(obj), name, None))):
            continue  # (an instance's override of a method, e.g. a timing wrapper, is no setting)
        if isinstance(value, np.ndarray) and value.size <= 4096:
            value = ("array", value.shape, value.dtype.str, value.tobytes())
        try:
            hash(value)
        except TypeError:
            return None
        out.append((name, value))
    return tuple(out)


class SGKernel(ProgressText, MCMCKernel):
    """Base class of the stochastic-gradient kernels (not used directly).  The options below are
    those every kernel takes; the gradient kernels' shared options, these among them, are documented
    together in :class:`~numpyro_sg.kernels.gradient.GradientKernel`.

    :param model: a NumPyro model whose likelihood sits in a subsample plate
        (``numpyro.plate(name, N, subsample_size=n)`` with ``numpyro.subsample`` inside).
    :param subsample_size: mini-batch size n, overriding the plate's own (an int, or a dict
        ``{plate_name: n}`` when there are several plates); the N/n scale follows the size
        actually used.  Must lie in [1, N].
    :param init_strategy: NumPyro per-site initialisation strategy; ``None`` for the kernel's
        default (see each kernel).
    :param minibatch_options: how the mini-batches are drawn and checked: a
        :class:`~numpyro_sg.kernels.options.MinibatchOptions` or a dict of its fields
        (``replace``, ``check_data``; the gradient kernels also take ``estimate_noise`` and
        ``noise_ema_weight``); ``None`` for the defaults.  The keywords ``replace=`` and
        ``check_data=`` still work, deprecated.
    """

    State: type = None  # the kernel's state NamedTuple
    #: names of the hyperparameters held in ``state.hyper`` (see :meth:`replace_hyperparameters`)
    HYPERPARAMETERS: tuple = ()

    @moved_options(SAMPLING_MOVES)
    def __init__(self, model: Callable, *, subsample_size=None, init_strategy=None, minibatch_options=None):
        if not callable(model):
            raise TypeError(f"`model` must be a NumPyro model (a callable), got {model!r}.")
        self._model = model
        self._subsample_size = subsample_size
        self._init_strategy = init_strategy
        #: the :class:`~numpyro_sg.kernels.options.MinibatchOptions` in effect
        self.minibatch_options = MinibatchOptions.of(minibatch_options)
        self._mb = None
        self._unravel = None
        self._num_warmup = 0
        self._sample_fn = None
        self._deterministic_in_plate = True
        self._warned_embedded = False
        self._clock = RunClock()
        self._diagnostics_shown = None   # (time, text) of the progress bar's last reading
        self._diagnostics_calls = 0      # NumPyro's requests for it since init
        self._vectorized = False

    # -- NumPyro's MCMCKernel contract -----------------------------------------------------
    @property
    def model(self):
        return self._model

    @property
    def sample_field(self):
        return "z"

    @property
    def default_fields(self):
        return ("z", "diverging")

    @property
    def minibatcher(self) -> Minibatcher:
        """The :class:`~numpyro_sg.infer.minibatch.Minibatcher` built at ``init``."""
        return self._mb

    @property
    def plates(self):
        """The subsample plates (with the sizes actually drawn), known after ``init``."""
        return None if self._mb is None else self._mb.plates

    def unravel(self, flat):
        """A flat unconstrained vector (the kernels' working order) as the dict of
        unconstrained site values (known after ``init``)."""
        return self._unravel(flat)

    @property
    def deterministic_in_plate(self) -> bool:
        """True when a deterministic site of the model sits in a subsample plate (known after
        ``init``): post-processing then runs the plate over the full data."""
        return self._deterministic_in_plate

    def sample(self, state, model_args, model_kwargs):
        """One iteration of every chain: :meth:`step`, ``vmap``-ed for vectorised chains."""
        model_kwargs = {} if model_kwargs is None else model_kwargs
        self._warn_embedded_data(state, model_args, model_kwargs)
        if is_prng_key(state.rng_key) and jnp.ndim(state.i):  # chains given one key (after MCMC.warmup)
            return self._sample_with_one_key(state, model_args, model_kwargs)
        state = self._between_steps(state)
        if is_prng_key(state.rng_key):
            new = self.step(state, model_args, model_kwargs)
        else:  # chain_method="vectorized": the kernel vmaps itself (maps where LAPACK could deadlock)
            new = map_over_draws(lambda chain: self.step(chain, model_args, model_kwargs), state)
        return new

    #: instance attributes that are no setting of the compiled programs (caches, ``init``'s products)
    NOT_SETTINGS = ("_fits", "_mb", "_unravel", "_sample_fn", "_warned_embedded", "_clock", "_diagnostics_shown",
                    "_diagnostics_calls", "_vectorized", "noise_plan")

    def _program_key(self, *parts, arguments=()):
        """Key of one of this kernel's compiled programs (:func:`~numpyro_sg.infer.programs.
        cached_program`): class, model, subsample plates and settings (known after ``_plan``)
        but ``arguments`` (settings the program reads only from its arguments), and ``parts``;
        ``None`` (no sharing) when a setting has no hashable description."""
        settings = program_settings(self, self.NOT_SETTINGS + tuple(arguments))
        if settings is None:
            return None
        return (type(self), self._model, self._mb.plates, self._mb.replace, placement_key(self._mb),
                settings) + parts

    def _warn_embedded_data(self, state, model_args, model_kwargs):
        """Warn once when the data would be compiled into the caller's program as constants."""
        if getattr(self, "_warned_embedded", False):
            return
        nbytes = embedded_data_bytes(state, model_args, model_kwargs)
        if nbytes > EMBEDDED_DATA_WARN_BYTES:
            self._warned_embedded = True
            warnings.warn(
                f"{type(self).__name__}: the data ({nbytes / 2**20:.0f} MB) become constants of "
                "the compiled sampling loop, because MCMC's jit_model_args=False closes over "
                "them: compiling then takes seconds longer, at every run. Pass "
                "MCMC(..., jit_model_args=True) to give them to the loop as arguments (NumPyro "
                "then traces every model argument: bind Python settings such as sizes with "
                "functools.partial(model, ...) rather than passing them to run).",
                EmbeddedDataWarning, stacklevel=3,
            )

    def reset_warmup(self):
        """Forget what this kernel keeps from its last ``init`` on the same data — the warmup's
        mode search (mode, Laplace preconditioner, control-variate anchor; for SparseAsync the
        model's structure) — so that the next ``MCMC.run`` computes them afresh.

        A kernel run again on the same data arrays (the same objects: a second ``MCMC.run``,
        the next chain of ``chain_method="sequential"``) with the same settings reuses them,
        and new data recompute them; call this after changing the data's values in place, or
        to drop a fit passed with ``use_mode_fit``/``warmup_options``.  It also empties the
        process's store of warmup fits (:mod:`~numpyro_sg.infer.fit_store`), which other
        kernels on the same model and data would otherwise reuse.
        """
        clear_store()
        for value in vars(self).values():
            if isinstance(value, PerDataCache):
                value.clear()

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        """NumPyro's ``init``: the one initialisation path of every kernel.

        Keep ``num_warmup``; refuse data placed for ``chain_method="parallel"``; split the
        chains' keys; let the kernel family plan its chains (:meth:`_plan_chains`: the model
        trace, the mini-batcher, the warmup or the structure search, every chain's start); then
        build every chain's state in one compiled program, ``vmap``-ed over vectorised chains.
        """
        model_kwargs = {} if model_kwargs is None else model_kwargs
        self._start_init(num_warmup, rng_key)
        check_not_parallel(model_args, model_kwargs, isinstance(rng_key, jax.core.Tracer))
        batched, rng_key, key_init = split_init_key(rng_key)
        start = self._plan_chains(key_init, init_params, model_args, model_kwargs,
                                  jnp.shape(rng_key)[0] if batched else None)
        init_one = start.init_one
        if batched:
            init_one = jax.vmap(init_one, in_axes=(0,) + tuple(start.chain_axes) + (None, None))
        data = auto_view(model_args, model_kwargs) if start.view else (model_args, model_kwargs)
        state = jit_with_data(init_one, *data, key=start.program_key)(rng_key, *start.args)
        self._sample_fn = self.sample
        return state

    def _plan_chains(self, key_init, init_params, model_args, model_kwargs, num_chains) -> ChainStart:  # pragma: no cover
        """The family's part of :meth:`init` (``num_chains`` ``None`` for one chain)."""
        raise NotImplementedError

    def _start_init(self, num_warmup, rng_key):
        """What every ``init`` does first: keep ``num_warmup`` and whether the chains are
        vectorised (a batch of keys), open a segment of the run clock."""
        self._num_warmup = int(num_warmup)
        self._vectorized = rng_key is not None and not is_prng_key(rng_key)
        self._clock.start()
        self._diagnostics_shown, self._diagnostics_calls = None, 0

    def sampling_seconds(self, state, segments: int = 1) -> float | None:
        """Wall seconds of the last run ending in ``state`` (``mcmc.last_state``), from the start
        of ``init``; ``segments`` runs (one per chain of ``chain_method="sequential"``) summed;
        ``None`` when not stamped (:mod:`~numpyro_sg.infer.run_clock`)."""
        return self._clock.seconds(int(np.max(np.asarray(state.i))), segments)

    def seconds_since_init(self, segments: int = 1) -> float | None:
        """Wall seconds since the last ``segments`` runs' ``init`` began (``None`` before any)."""
        return self._clock.since_start(segments)

    def step(self, state, model_args, model_kwargs):  # pragma: no cover - abstract
        """One iteration of one chain: a pure function of the state and the data."""
        raise NotImplementedError

    def _between_steps(self, state):
        """Occasional work on all chains at once before a step (default: none), e.g. the
        warmup's preconditioner adaptation; runs under ``lax.cond`` on the shared counter."""
        return state

    def replace_hyperparameters(self, state, **values):
        """The state with hyperparameters (``state.hyper`` fields, e.g. ``step_size``) replaced.

        Works on one chain's state, or on a batch of states (vectorised chains) with values
        carrying the batch axis first; this is how :func:`numpyro_sg.mamba` runs arms with
        different values as one batch.  Fields derived from the hyperparameters (e.g. SGBD's
        current σ) are recomputed.
        """
        unknown = set(values) - set(state.hyper._fields)
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no hyperparameter(s) {sorted(unknown)} in its state; "
                f"it has {list(state.hyper._fields)}."
            )
        values = {k: jnp.asarray(v, jnp.result_type(float)) for k, v in values.items()}

        def one(st, vals):
            return self._refresh(st._replace(hyper=st.hyper._replace(**vals)))

        return one(state, values) if is_prng_key(state.rng_key) else jax.vmap(one)(state, values)

    def _refresh(self, state):
        """Recompute state fields derived from the hyperparameters after
        :meth:`replace_hyperparameters`: ε at the state's iteration from ``hyper.step_size``,
        in the shape the state holds it (a kernel adds its other derived fields)."""
        eps = step_size_at(state.hyper.step_size, state.i, state.step_size.dtype)
        return state._replace(step_size=jnp.broadcast_to(eps, jnp.shape(state.step_size)))

    def postprocess_fn(self, model_args, model_kwargs):
        """Constrained values (deterministic sites included) of a draw ``z``, for every kernel:
        the kernel's :meth:`_constrain` on the model run over the full data when a deterministic
        site sits in a subsample plate, else on one datum per plate (so post-processing a draw
        costs O(d) rather than O(N·d)); on data split over a mesh, on each shard's first row
        (no data move; a deterministic site in the plate is refused there).  The identity
        before ``init``."""
        model_kwargs = {} if model_kwargs is None else model_kwargs
        plates, shards = self._draw_plates(), self._data_shards()
        if plates is None:
            return lambda z: z
        if self._deterministic_in_plate and plates:
            if shards is not None:
                raise ValueError("a deterministic site inside the subsample plate (one value per "
                                 "datum) is not available on data split over a mesh.")
            model = full_data(self._model, plates)
        else:
            model = with_indices(self._model, {p.name: jnp.arange(1, dtype=jnp.int32) for p in plates})

        def postprocess(z, model_args, model_kwargs):
            with structure_only():   # (a marginal's integral is no part of a draw)
                return self._constrain(z, model, model_args, model_kwargs)

        if shards is not None:
            return lambda z: shards.on_each_shard(postprocess, z, model_args, model_kwargs)
        return partial(postprocess, model_args=model_args, model_kwargs=model_kwargs)

    def _draw_plates(self):
        """The subsample plates a draw's post-processing runs (``None`` before ``init``)."""
        return None if self._mb is None else tuple(self._mb.plates)

    def _data_shards(self):
        """The :class:`~numpyro_sg.infer.sharding.DataShards` of data split over a mesh, else ``None``."""
        return self._mb.shards if is_sharded(self._mb) else None

    def _constrain(self, z, model, model_args, model_kwargs):
        """A draw ``z`` (unconstrained values) in the constrained space of ``model``, with its
        deterministic sites (the kernel adds what its state holds besides)."""
        return constrain_fn(model, model_args, model_kwargs, z, return_deterministic=True)

    def convergence_report(self, state) -> list:
        """Problems of a finished run beyond R̂, ESS and drift (default: none): sentences, or
        ``(problem, remedy)`` pairs naming a cause, whose remedy then replaces the generic ones
        (``(problem, remedy, True)`` when the cause also explains why the chains disagree).

        :func:`numpyro_sg.check_convergence` and :func:`numpyro_sg.to_inference_data` ask the
        ``MCMC``'s sampler for them, given ``mcmc.last_state``.
        """
        return []

    def slow_chain_remedy(self) -> str | None:
        """The remedies for chains that did not converge when no cause was found, where the
        generic ones (:data:`~numpyro_sg.diagnostics.convergence.GENERIC_REMEDY`) would mislead
        (default: ``None``, the generic ones)."""
        return None

    def diverged_at(self, state) -> dict:
        """``{chain: iteration}`` of the diverged chains of a run's final ``state`` (e.g.
        ``mcmc.last_state``): :func:`~numpyro_sg.kernels.guard.diverged_iterations`."""
        return diverged_iterations(state)

    def describe_iteration(self, k) -> str:
        """A 1-based iteration ``k`` (warmup included) in words: warmup or sampling draw index."""
        if k is None:
            return "an unrecorded iteration"
        if k <= self._num_warmup:
            return f"warmup iteration {k} of {self._num_warmup}"
        return f"iteration {k}, i.e. sampling draw index {k - self._num_warmup - 1}"

    def divergence_message(self, state) -> str | None:
        """The :class:`DivergenceWarning` text for a run's final ``state`` naming each diverged
        chain and the iteration of its blow-up; ``None`` when no chain diverged."""
        where = self.diverged_at(state)
        if not where:
            return None
        chains = "; ".join(f"chain {c} at {self.describe_iteration(k)}" for c, k in where.items())
        return (
            f"{type(self).__name__}: the chain diverged ({chains}): the parameters, the log "
            "density or the stochastic gradient became non-finite or exploded. The chain is "
            "frozen at its last state before the blow-up and its 'diverging' field is True from "
            "there on; reduce step_size."
        )
