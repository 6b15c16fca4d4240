r"""Hyperparameter tuning by Stein discrepancy: MAMBA, grid search and the 1/N heuristic.

**MAMBA** (paper 002, Algorithm 1; SPEC §8) is successive halving over *arms*, the Cartesian
product of a grid of kernel keyword arguments (step size × subsample size × any other).  With
M arms, a time budget of T seconds and pruning rate η, for rounds i = 0 … ⌊log_η M⌋ − 1:

1. every surviving arm runs for r_i = T / (|S_i|·⌊log_η M⌋) more seconds, *continuing its
   own chain*;
2. each arm is scored by a Stein discrepancy of its draws;
3. the ⌊|S_i|/η⌋ arms with the lowest score survive.

Choices made here (each measured and documented in ``docs/tuning.md``):

* **A criterion that tracks accuracy** (``criterion="ess"``, default).  The paper's KSD of a
  short run mixes two things: the arm's bias and its Monte Carlo error, which is large for a
  slowly mixing chain — so at short budgets fast-mixing, biased arms win.  Here each arm's
  draws (after a burn-in of half its first round) are thinned to about one per effective
  sample (median bulk ESS over coordinates), which makes them nearly independent, and scored by the U-statistic
  KSD_U², an unbiased estimate of KSD² of the distribution the arm samples — its bias — with
  no term for autocorrelation.  The ranking key is max(KSD_U², 0) plus its standard error —
  bias² plus Monte Carlo uncertainty, like a mean squared error — so an arm with few
  effective draws (not mixed, or frozen) cannot win by luck, and among arms without a
  detectable bias the one with the most effective draws wins.
  ``criterion="plain"`` is the paper's KSD (V-statistic of all thinned draws).
* **Scores from mini-batches.**  KSD needs ∇ log π at each scored draw; with the full data
  that is a pass over N rows per draw.  Gradient kernels' draws are scored with control-
  variate estimates on an independent mini-batch per draw (the stochastic Stein discrepancy of
  Gorham, Raj & Mackey 2020; the U-statistic is unbiased under such noise), O(score_subsample)
  per draw.
* **Arms start where the warmup starts chains.**  The warmup's mode search runs once; every
  arm of a gradient kernel shares its Laplace preconditioner and control-variate anchor and
  starts at its own draw of the Laplace approximation.  :meth:`TuningResult.best_kernel`
  reuses that warmup, so the tuned kernel under ``MCMC`` runs the chain that was scored.
* **The budget is the call's wall time.**  ``time_budget`` covers set-up (the mode search, the
  kernels' ``init``), compilation, chains and scoring; the chains get what is left after
  set-up and the predicted scoring, split over rounds as Algorithm 1 splits T.  The breakdown
  is in :attr:`TuningResult.overhead`.
* **One common KSD scale**: the warmup's Laplace sds (or an array) for every arm and round.
* **Vectorised arms.**  Arms that differ only in real scalar hyperparameters that the kernel
  holds in its state (``kernel.HYPERPARAMETERS``: ``step_size``, ``temperature``, …) and
  share everything else (the subsample size in particular) run as one ``vmap``-ed batch of
  chains of the kernel's pure ``step``, compiled once; the kernel itself is never modified.  A
  batch serving g arms runs for g·r_i seconds of wall time and each arm is charged 1/g of
  it.  After pruning, a batch keeps its compiled shape: its slots are refilled with forks of
  the surviving chains (same state, fresh random keys), so nothing is recompiled.
* Arms run in a compiled loop over the kernel's step (``lax.fori_loop``, dynamic length) with
  a preallocated buffer of thinned draws.  A chain that diverges scores ``inf``.

**Grid search** gives every arm an equal share of the budget (no pruning) and scores it the
same way, or with a user-supplied metric (e.g. held-out log-loss).
:func:`heuristic_step_size` is the h = 1/N rule of thumb (Brosse et al. 2018).
"""

from __future__ import annotations

import inspect
import itertools
import math
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr
from jax import lax, random

from numpyro_sg.results.inference_data import attach_ksd as _attach_ksd
from numpyro_sg.results.inference_data import cast_discrete as _cast_discrete
from numpyro_sg.results.inference_data import preconditioner_name as _preconditioner_name
from numpyro_sg.diagnostics.convergence import bulk_ess
from numpyro_sg.diagnostics.fssd import fssd
from numpyro_sg.diagnostics.ksd import ksd, ksd_u_statistic, signed_sqrt
from numpyro_sg.diagnostics.model_scores import ModelScores
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.infer.minibatch import Anchor
from numpyro_sg.infer.warmup import fit_model_mode, starting_points

__all__ = ["mamba", "grid_search", "heuristic_step_size", "TuningResult", "grid_arms", "MIN_ESS"]

_METRICS = ("ksd", "fssd")
_CRITERIA = ("ess", "plain")
_MAX_CHUNK = 2**15  # iterations per compiled call, at most


def heuristic_step_size(num_data: int) -> float:
    """The rule-of-thumb step size h = 1/N (Brosse et al. 2018; paper 002 §4)."""
    if isinstance(num_data, bool) or not isinstance(num_data, (int, np.integer)) or num_data < 1:
        raise ValueError(f"num_data must be a positive integer, got {num_data!r}.")
    return 1.0 / int(num_data)


def grid_arms(grid: dict) -> list[dict]:
    """The Cartesian product of ``grid`` (``{keyword: list of values}``) as a list of dicts."""
    if not isinstance(grid, dict) or not grid:
        raise ValueError(
            "grid must be a non-empty dict {kernel keyword: list of values}, e.g. "
            "{'step_size': [1e-4, 1e-5], 'subsample_size': [1000, 100]}; got "
            f"{grid!r}."
        )
    names, values = [], []
    for name, vals in grid.items():
        if not isinstance(name, str):
            raise ValueError(f"grid keys must be keyword names (str), got {name!r}.")
        vals = list(vals) if isinstance(vals, (list, tuple, np.ndarray)) else [vals]
        if not vals:
            raise ValueError(f"grid[{name!r}] is empty: give at least one value.")
        names.append(name)
        values.append(vals)
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


@dataclass
class TuningResult:
    """What :func:`mamba` and :func:`grid_search` return.

    ``best_params`` the winning arm's keyword arguments (``make_kernel(**best_params)`` is the
    tuned kernel; :meth:`best_kernel` builds it reusing the tuner's warmup); ``idata`` its
    chain as an ``arviz.InferenceData`` (its thinned draws pooled into one chain, KSD of the
    draws it was scored on in ``sample_stats``); ``rounds`` a ``DataFrame`` with one row per
    (round, arm): ``round``, ``arm``, the arm's hyperparameters, ``iterations`` (run in that
    round), ``draws`` (kept so far, burn-in excluded), ``seconds`` (charged in that round),
    ``ess`` (bulk effective sample size of those draws), ``ksd`` (signed √KSD_U² of the
    ESS-thinned draws, or the plain KSD), ``se`` (its standard error, KSD² units), ``score``
    (the ranking key; ``inf`` for a diverged chain), ``mixed`` (ESS ≥ :data:`MIN_ESS`),
    ``diverged`` and ``kept``; ``elapsed`` the wall time of the whole call (the budget);
    ``scales`` the common per-coordinate KSD scales (``None``: raw form); ``arms`` every
    arm's hyperparameters; ``overhead`` the seconds spent outside the chains (``setup``: the
    warmup's mode search and the kernels' ``init``; ``compile``; ``score``; ``result``:
    building ``idata``).  ``rounds["seconds"].sum()`` is the chain time.  ``batches`` lists
    the arms that ran as one vectorised batch; ``eta`` and ``num_rounds`` the halving
    schedule (``eta`` is ``None`` for a grid search); ``criterion`` the selection rule;
    ``ess_per_iteration`` the winner's effective draws per iteration (see
    :meth:`suggested_num_samples`).
    """

    best_params: dict
    idata: Any
    rounds: pd.DataFrame
    elapsed: float
    scales: Any = None
    arms: list = field(default_factory=list)
    overhead: dict = field(default_factory=dict)
    batches: list = field(default_factory=list)
    eta: int | None = None
    num_rounds: int = 1
    criterion: str = "ess"
    time_budget: float = math.nan
    make_kernel: Callable | None = field(default=None, repr=False)
    mode_fit: Any = field(default=None, repr=False)
    ess_per_iteration: float = math.nan

    def suggested_num_samples(self, ess: float = 400.0) -> int:
        """``num_samples`` for about ``ess`` effective draws (one chain) with the winning arm:
        ``ess`` divided by the winner's effective draws per iteration in the tuner (its bulk
        ESS over the iterations behind its scored draws; ``criterion="ess"`` only).  MAMBA
        compares arms at equal *time*, so a cheap, slowly mixing arm (small mini-batch, small
        step) can win; it then needs more iterations than a user might guess."""
        if not (self.ess_per_iteration > 0):
            raise ValueError("the winner's effective draws per iteration are unknown (criterion='plain').")
        return int(math.ceil(ess / self.ess_per_iteration))

    def best_kernel(self):
        """A fresh kernel with the winning hyperparameters, ``make_kernel(**best_params)``,
        reusing the tuner's warmup (mode, Laplace preconditioner, control-variate anchor) so
        its ``init`` does not search for the mode again.  Run it with ``MCMC`` as any kernel."""
        kernel = self.make_kernel(**self.best_params)
        if self.mode_fit is not None and isinstance(kernel, GradientKernel):
            kernel.use_mode_fit(self.mode_fit)
        return kernel

    def __repr__(self):
        return (
            f"TuningResult(best_params={self.best_params}, elapsed={self.elapsed:.1f} s of "
            f"{self.time_budget:g} s, {len(self.arms)} arms, {self.num_rounds} round(s), "
            f"eta={self.eta}, criterion={self.criterion!r})"
        )


# -------------------------------------------------------------------------------------------
# arms and batches
# -------------------------------------------------------------------------------------------
def _is_real_scalar(value) -> bool:
    if isinstance(value, (bool, np.bool_)) or callable(value):
        return False
    if isinstance(value, (float, np.floating)):
        return True
    return isinstance(value, (jnp.ndarray, np.ndarray)) and np.ndim(value) == 0 and np.issubdtype(
        np.asarray(value).dtype, np.floating
    )


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        if isinstance(a, (np.ndarray, jnp.ndarray)) or isinstance(b, (np.ndarray, jnp.ndarray)):
            return np.shape(a) == np.shape(b) and bool(np.all(np.asarray(a) == np.asarray(b)))
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are different
        return False


def _vectorisable(kernels: list, arms: list[dict]) -> tuple:
    """Names of the hyperparameters by which these kernels may differ inside one batch.

    Only names among the kernel's state hyperparameters (``kernel.HYPERPARAMETERS``, e.g.
    ``step_size`` and ``temperature``) with real scalar values qualify; every other instance
    attribute must be equal across the kernels.  Returns ``()`` when the kernels cannot share
    a batch.
    """
    state_names = getattr(kernels[0], "HYPERPARAMETERS", ())
    names = tuple(
        n for n in arms[0]
        if n in state_names and all(_is_real_scalar(a[n]) for a in arms)
    )
    first = vars(kernels[0])
    for other in kernels[1:]:
        attrs = vars(other)
        if set(attrs) != set(first):
            return ()
        for key, value in first.items():
            if key not in names and not _same(value, attrs[key]):
                return ()
    return names


class _Batch:
    """Chains of one or several arms that share a kernel (up to state hyperparameters).

    The arms' hyperparameter values live in the batched state (``kernel.
    replace_hyperparameters``) and every chain advances by the kernel's pure ``step``,
    ``vmap``-ed over the batch: the kernel object is never modified.
    """

    def __init__(self, arm_ids, kernels, arms, names, rng_key, init_params, model_args,
                 model_kwargs, thin):
        self.arm_ids = list(arm_ids)  # surviving arms of this batch
        self.owner = np.asarray(arm_ids)  # the arm each chain (slot) of the batch serves
        self.kernel = kernels[0]
        self.thin = thin
        self.model_args, self.model_kwargs = model_args, model_kwargs
        keys = random.split(rng_key, len(arms))
        state = self.kernel.init(keys, 0, init_params, model_args, model_kwargs)
        if names:
            values = {n: jnp.asarray([a[n] for a in arms], jnp.result_type(float)) for n in names}
            state = self.kernel.replace_hyperparameters(state, **values)
        self.state = state
        self._lowered = self._compiled = None
        self.seconds_per_iteration = None

    def _chunk_fn(self):
        kernel, thin = self.kernel, self.thin
        buffer_len = _MAX_CHUNK // thin

        def chunk(state, n_steps, model_args, model_kwargs):
            vstep = jax.vmap(kernel.step, in_axes=(0, None, None))
            buf0 = jax.tree.map(
                lambda z: jnp.zeros((z.shape[0], buffer_len) + z.shape[1:], z.dtype), state.z
            )

            def body(i, carry):
                st, buf = carry
                st = vstep(st, model_args, model_kwargs)
                k = (i + 1) // thin - 1

                def write(b):
                    return jax.tree.map(lambda bb, z: bb.at[:, k].set(z), b, st.z)

                buf = lax.cond((i + 1) % thin == 0, write, lambda b: b, buf)
                return st, buf

            return lax.fori_loop(0, n_steps, body, (state, buf0))

        return jax.jit(chunk)

    def lower(self):
        """Trace the batch's chunk program for its shape (the model is traced here, in the
        calling thread); :meth:`compile` it next."""
        self._lowered = self._chunk_fn().lower(self.state, jnp.int32(0), self.model_args, self.model_kwargs)
        return self

    def compile(self):
        """XLA-compile the lowered program (thread-safe: batches compile in parallel)."""
        self._compiled = self._lowered.compile()
        self._lowered = None
        return self

    def run(self, seconds: float, min_iterations: int = 0):
        """Run every chain of the batch for about ``seconds`` of wall time in total, and at
        least ``min_iterations`` iterations (a multiple of ``thin``).

        Returns (iterations per chain, wall seconds, thinned draws {site: (slots, draws, …)}).
        """
        spent, iters, pieces = 0.0, 0, []
        min_iterations = -(-int(min_iterations) // self.thin) * self.thin
        while True:
            left = seconds - spent
            if self.seconds_per_iteration is None:
                n = 2 * self.thin
            else:
                n = max(int(left / self.seconds_per_iteration), min_iterations - iters)
                n = min(n - n % self.thin, _MAX_CHUNK)
            if n < self.thin or (self.seconds_per_iteration is not None and left <= 0 and iters >= min_iterations):
                break
            start = time.perf_counter()
            self.state, buf = self._compiled(
                self.state, jnp.int32(n), self.model_args, self.model_kwargs
            )
            buf = jax.device_get(jax.tree.map(lambda b: b[:, : n // self.thin], buf))
            dt = time.perf_counter() - start
            pieces.append(buf)
            spent += dt
            iters += n
            self.seconds_per_iteration = spent / iters
        if pieces:
            draws = jax.tree.map(lambda *b: np.concatenate(b, axis=1), *pieces)
        else:
            draws = None
        return iters, spent, draws

    def diverged(self, arm) -> bool:
        """True when a chain serving ``arm`` diverged (non-finite state or gradient) or was
        frozen otherwise (SparseAsync's active-set ``overflow``)."""
        div = np.asarray(self.state.diverging).reshape(-1)
        div = div | np.asarray(getattr(self.state, "overflow", False)).reshape(-1)
        return bool(np.any(div[self.owner == arm]))

    def keep(self, arm_ids, rng_key):
        """Serve only ``arm_ids``: every slot is refilled with a fork of a surviving chain.

        Slot j goes to survivor j mod s and continues from that arm's current state with a
        fresh random key, so the compiled shape (and program) is kept.  Each survivor gets
        ⌊slots/s⌋ chains (equal shares); the draws of the slots left over are dropped.
        """
        slots, s = len(self.owner), len(arm_ids)
        current = {a: int(np.flatnonzero(self.owner == a)[0]) for a in arm_ids}
        src = np.asarray([current[arm_ids[j % s]] for j in range(slots)])
        state = jax.tree.map(lambda x: x[src], self.state)
        self.state = state._replace(rng_key=random.split(rng_key, slots))
        # every survivor gets ⌊slots/s⌋ chains; leftover slots run but their draws are dropped
        owner = self.owner[src]
        owner[(slots // s) * s:] = -1
        self.owner = owner
        self.arm_ids = list(arm_ids)


def _make_kernels(make_kernel, arms, fit):
    """One kernel per arm (the warmup's ``fit`` shared by every gradient kernel)."""
    kernels = []
    for i, arm in enumerate(arms):
        try:
            kernel = make_kernel(**arm)
        except TypeError as err:
            raise ValueError(
                f"make_kernel(**{arm}) failed for arm {i}: {err}. Every grid keyword must be an "
                "argument of the kernel factory (e.g. step_size, subsample_size, variant)."
            ) from err
        if not hasattr(kernel, "step") or not hasattr(kernel, "replace_hyperparameters"):
            raise TypeError(
                f"make_kernel must return a numpyro_sg kernel (SGLD, SGBD, ESGLD, …); got "
                f"{type(kernel).__name__}."
            )
        if fit is not None:
            kernel.use_mode_fit(fit)
        kernels.append(kernel)
    return kernels


def _make_batches(kernels, arms, vectorize, rng_key, init_params, model_args, model_kwargs, thin):
    groups: list[tuple] = []  # (arm indices, names of the values by which they differ)
    if vectorize:
        by_key: dict = {}
        for i, arm in enumerate(arms):
            state_names = getattr(kernels[i], "HYPERPARAMETERS", ())
            key = repr(sorted((k, repr(v)) for k, v in arm.items() if k not in state_names))
            by_key.setdefault((type(kernels[i]).__name__, key), []).append(i)
        for members in by_key.values():
            names = _vectorisable([kernels[i] for i in members], [arms[i] for i in members])
            if len(members) > 1 and names:
                groups.append((members, names))
            else:
                groups.extend(([i], ()) for i in members)
    else:
        groups = [([i], ()) for i in range(len(arms))]
    keys = random.split(rng_key, len(groups))
    batches = []
    for (members, names), key in zip(groups, keys):
        if init_params is None:
            inits = None
        elif isinstance(init_params, list):  # one dict per arm
            inits = jax.tree.map(lambda *v: jnp.stack(v), *[init_params[i] for i in members])
        else:
            inits = jax.tree.map(
                lambda v: jnp.broadcast_to(jnp.asarray(v), (len(members),) + jnp.shape(v)), init_params
            )
        batches.append(
            _Batch(members, [kernels[i] for i in members], [arms[i] for i in members], names, key,
                   inits, model_args, model_kwargs, thin)
        )
    return batches


# -------------------------------------------------------------------------------------------
# scoring
# -------------------------------------------------------------------------------------------
#: arms with fewer effective draws than this are reported as not mixed (``rounds["mixed"]``)
MIN_ESS = 20


class _Scorer:
    """Scores the thinned draws of an arm (lower is better).

    ``criterion="ess"``: the U-statistic KSD² of the arm's draws thinned to about one draw per
    effective sample (so the draws are nearly independent and KSD_U² estimates the bias part,
    KSD² of the distribution the arm samples, without a penalty for autocorrelation), plus its
    standard error; stochastic control-variate scores when the warmup's fit is known (a
    gradient kernel), else full-data scores.  ``criterion="plain"``: paper 002's V-statistic
    KSD (or FSSD, or the user's metric) of all thinned draws with full-data scores.
    """

    def __init__(self, model, model_args, model_kwargs, metric, criterion, preconditioner,
                 score_draws, ksd_options, geometry, score_subsample, rng_key):
        self.metric, self.criterion = metric, criterion
        self.score_draws = score_draws
        self.ksd_options = dict(ksd_options or {})
        self.postprocess = None  # set by attach() once a kernel is initialised
        self.scores = ModelScores(model, model_args, model_kwargs)
        self.fit = None if geometry is None else geometry[0]
        self.rng_key = rng_key
        self._stochastic = None
        if geometry is not None and criterion == "ess" and not self.scores.discrete_sites:
            fit, mb, unravel = geometry
            self._stochastic = mb.score_estimator(unravel, Anchor(fit.mode, fit.grad), score_subsample,
                                                  model_args, model_kwargs)
        self.scales = self._scales(preconditioner)

    @property
    def score_kind(self) -> str:
        """How the draws' scores are computed (stored in the result's attrs)."""
        return "stochastic (control variates)" if self._stochastic is not None else "full data"

    def attach(self, kernel, model_args, model_kwargs):
        """Use ``kernel``'s ``postprocess_fn`` to constrain draws (after its ``init``)."""
        self.postprocess = jax.jit(jax.vmap(kernel.postprocess_fn(model_args, model_kwargs)))

    def _scales(self, preconditioner):
        if preconditioner is None:
            return None
        if isinstance(preconditioner, str):
            if preconditioner == "laplace":
                if self.fit is None:
                    raise ValueError(
                        "preconditioner='laplace' uses the warmup's Laplace scales, which only the "
                        "gradient kernels (SGLD, SGBD, …) on models without discrete latent sites "
                        "have; pass an array of per-coordinate scales or None."
                    )
                return self.fit.scales
            raise ValueError(
                f"preconditioner must be 'laplace', an array of per-coordinate scales or None; "
                f"got {preconditioner!r}. ('sd' would scale every arm by its own sd, and "
                "scores on different scales cannot be compared.)"
            )
        scales = np.asarray(preconditioner, float)
        if scales.ndim == 0:
            scales = np.full(self.scores.dim, float(scales))
        if scales.shape != (self.scores.dim,) or not np.all(np.isfinite(scales) & (scales > 0)):
            raise ValueError(
                f"preconditioner scales must be {self.scores.dim} positive finite numbers (one "
                f"per unconstrained coordinate {self.scores.coordinate_names}); got {scales!r}."
            )
        return scales

    def constrained(self, z_draws) -> dict:
        """Constrained draws {site: (T, …)} of unconstrained kernel states (T, …), in blocks."""
        T = jax.tree.leaves(z_draws)[0].shape[0]
        out = []
        for start in range(0, T, 256):
            block = jax.tree.map(lambda v: v[start:start + 256], z_draws)
            n = jax.tree.leaves(block)[0].shape[0]
            if n < 256:  # fixed block shape: one compilation
                block = jax.tree.map(lambda v: np.pad(v, [(0, 256 - n)] + [(0, 0)] * (v.ndim - 1), mode="edge"), block)
            out.append(jax.tree.map(lambda v: np.asarray(v)[:n], self.postprocess(block)))
        return jax.tree.map(lambda *v: np.concatenate(v), *out)

    def coordinates(self, z_draws):
        """(x (T, dim), discrete {site: (T, …)}) of kernel states (T, …): the states' own
        unconstrained values for a model without discrete sites; otherwise the output draws
        (``postprocess_fn``: e.g. fresh spike values for excluded coefficients) unconstrained."""
        T = jax.tree.leaves(z_draws)[0].shape[0]
        if not self.scores.discrete_sites:
            x = np.concatenate(
                [np.asarray(z_draws[n], float).reshape(T, -1) for n in self.scores.continuous_sites], axis=1
            )
            return x, {}
        continuous, discrete = self.scores.split(self.constrained(z_draws))
        return self.scores.unconstrain({**continuous, **discrete}), discrete

    def _score_points(self, x, discrete):
        if self._stochastic is not None:
            # one compiled shape: pad to score_draws (or the next power of two) rows
            T = x.shape[0]
            rows = self.score_draws or 1 << max(T - 1, 1).bit_length()
            padded = np.pad(x, [(0, max(rows - T, 0)), (0, 0)], mode="edge")
            self.rng_key, key = random.split(self.rng_key)
            return np.asarray(self._stochastic(jnp.asarray(padded, jnp.result_type(float)), key), float)[:T]
        return self.scores.score(x, discrete)

    def score(self, pieces) -> dict:
        """Score an arm from its draws: a list of kernel-state dicts {site: (chains, draws, …)}.

        Returns ``score`` (the ranking key), ``ksd`` (the reported KSD: signed √KSD_U² for
        ``criterion="ess"``), ``se`` (its standard error, in KSD² units), ``ess``, ``mixed``
        and ``stein`` ((x, scores) of the scored draws, for the result).
        """
        if self.criterion == "plain":
            return self._score_plain(pieces)
        flat, ess = [], 0.0
        for z in pieces:
            c, n = jax.tree.leaves(z)[0].shape[:2]
            x, discrete = self.coordinates(jax.tree.map(lambda v: np.asarray(v).reshape((c * n,) + v.shape[2:]), z))
            if not np.all(np.isfinite(x)):
                return _unscored(diverged=True)
            e = bulk_ess(x.reshape(c, n, -1), quantile=0.5) if n >= 8 else 0.0
            ess += e
            lag = max(int(round(c * n / max(e, 1.0))), 1)  # one kept draw per effective draw
            keep = (np.arange(c)[:, None] * n + np.arange(0, n, lag)[None, :]).reshape(-1)
            flat.append((x[keep], {k: v[keep] for k, v in discrete.items()}))
        x = np.concatenate([f[0] for f in flat])
        discrete = {k: np.concatenate([f[1][k] for f in flat]) for k in self.scores.discrete_sites}
        keep = _even(x.shape[0], self.score_draws)
        x, discrete = x[keep], {k: v[keep] for k, v in discrete.items()}
        if x.shape[0] < 2:
            return {**_unscored(), "ess": ess}
        s = self._score_points(x, discrete)
        if not np.all(np.isfinite(s)):
            return _unscored(diverged=True)
        options = {k: v for k, v in self.ksd_options.items() if k in ("c", "beta")}
        u, se = ksd_u_statistic(x, s, preconditioner=self.scales, **options)
        return {"score": max(u, 0.0) + se, "ksd": float(signed_sqrt(u)), "se": se, "ess": ess,
                "mixed": ess >= MIN_ESS, "diverged": False, "stein": (x, s)}

    def _score_plain(self, pieces) -> dict:
        z = _pooled(pieces)
        keep = _even(jax.tree.leaves(z)[0].shape[0], self.score_draws)
        z = jax.tree.map(lambda v: v[keep], z)
        if callable(self.metric):
            value = float(self.metric(self.constrained(z)))
            return {"score": value, "ksd": np.nan, "se": np.nan, "ess": np.nan, "mixed": True,
                    "diverged": False, "stein": None}
        x, discrete = self.coordinates(z)
        if not np.all(np.isfinite(x)):
            return _unscored(diverged=True)
        s = self.scores.score(x, discrete)
        if not np.all(np.isfinite(s)):
            return _unscored(diverged=True)
        fn = fssd if self.metric == "fssd" else ksd
        value = float(fn(x, scores=s, preconditioner=self.scales, **self.ksd_options))
        return {"score": value, "ksd": value if self.metric == "ksd" else np.nan, "se": np.nan,
                "ess": np.nan, "mixed": True, "diverged": False, "stein": (x, s)}


def _pooled(pieces) -> dict:
    """An arm's draws {site: (chains, draws, …)} (a list of pieces) as one sequence {site: (T, …)}."""
    return jax.tree.map(lambda *v: np.concatenate([np.asarray(b).reshape((-1,) + b.shape[2:]) for b in v]),
                        *pieces)


def _num_draws(pieces) -> int:
    """Kept draws of an arm, over its pieces and chains."""
    return int(sum(np.prod(jax.tree.leaves(z)[0].shape[:2]) for z in pieces))


def _unscored(diverged: bool = False) -> dict:
    """The score of a diverged arm (non-finite draws or scores), or of one without draws to score."""
    return {"score": math.inf, "ksd": math.inf, "se": np.nan, "ess": 0.0, "mixed": False,
            "diverged": diverged, "stein": None}


def _even(num: int, at_most: int | None) -> np.ndarray:
    if at_most is None or num <= at_most:
        return np.arange(num)
    return np.unique(np.round(np.linspace(0, num - 1, at_most)).astype(int))


# -------------------------------------------------------------------------------------------
# the tuners
# -------------------------------------------------------------------------------------------
def _check_common(grid, eta, metric, criterion, time_budget, thin, score_draws):
    arms = grid_arms(grid)
    if not (isinstance(eta, (int, np.integer)) and not isinstance(eta, bool) and eta >= 2):
        raise ValueError(f"eta must be an integer ≥ 2, got {eta!r}.")
    if not (callable(metric) or metric in _METRICS):
        raise ValueError(f"metric must be 'ksd', 'fssd' or a callable(samples) -> float; got {metric!r}.")
    if criterion not in _CRITERIA:
        raise ValueError(f"criterion must be one of {_CRITERIA}, got {criterion!r}.")
    if criterion == "ess" and metric != "ksd":
        raise ValueError(
            f"criterion='ess' scores arms by KSD; metric={metric!r} needs criterion='plain'."
        )
    if not (np.isfinite(time_budget) and time_budget > 0):
        raise ValueError(f"time_budget must be a positive number of seconds, got {time_budget!r}.")
    if isinstance(thin, bool) or not isinstance(thin, (int, np.integer)) or thin < 1:
        raise ValueError(f"thin must be a positive integer, got {thin!r}.")
    if score_draws is not None and (not isinstance(score_draws, (int, np.integer)) or score_draws < 2):
        raise ValueError(f"score_draws must be an integer ≥ 2 or None, got {score_draws!r}.")
    return arms


def _shared_geometry(probe, model, model_args, model_kwargs):
    """The warmup's ``(ModeFit, Minibatcher, unravel)`` shared by every arm of a gradient
    kernel on a model without discrete latent sites; ``None`` otherwise."""
    if not isinstance(probe, GradientKernel):
        return None
    return fit_model_mode(model, model_args, model_kwargs, probe.warmup_options)


def _starts(init_params, geometry, num_arms, rng_key):
    """Where the arms start: one Laplace draw θ̂ + L·ξ each (``"laplace"`` with a fit), each
    kernel's own init (``None``, or ``"laplace"`` without a fit), or the user's dict."""
    if isinstance(init_params, str):
        if init_params != "laplace":
            raise ValueError(f"init_params must be 'laplace', None or a dict of site values; got {init_params!r}.")
        if geometry is None:
            return None
        fit, _, unravel = geometry
        starts = starting_points(None, fit, random.split(rng_key, num_arms), True, unravel)
        return [jax.tree.map(lambda v: v[i], starts) for i in range(num_arms)]
    return init_params


def _tune(make_kernel, grid, *, model_args, model_kwargs, time_budget, eta, metric, criterion,
          thin, rng_key, preconditioner, score_draws, score_subsample, ksd_options, init_params,
          vectorize, halving):
    start_all = time.perf_counter()
    deadline = start_all + time_budget
    arms = _check_common(grid, eta, metric, criterion, time_budget, thin, score_draws)
    model_args = tuple(model_args)
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    if rng_key is None:
        raise ValueError("rng_key is required: pass a jax.random.PRNGKey.")
    M = len(arms)
    num_rounds = max(int(math.floor(math.log(M) / math.log(eta) + 1e-9)), 1) if halving else 1
    if halving and num_rounds == 1 and M > 1:
        warnings.warn(
            f"MAMBA with {M} arms and eta = {eta} runs ⌊log_η M⌋ = 1 round: every arm gets the "
            "whole budget's share once and the best wins, i.e. a grid search. Give at least "
            f"eta² = {eta * eta} arms (or a smaller eta) for successive halving.",
            UserWarning, stacklevel=3,
        )
    (probe,) = _make_kernels(make_kernel, arms[:1], None)
    model = probe.model
    key_batches, key_init, key_score = random.split(rng_key, 3)
    geometry = _shared_geometry(probe, model, model_args, model_kwargs)
    scorer = _Scorer(model, model_args, model_kwargs, metric, criterion, preconditioner,
                     score_draws, ksd_options, geometry, score_subsample, key_score)
    kernels = _make_kernels(make_kernel, arms, None if geometry is None else geometry[0])
    init_params = _starts(init_params, geometry, M, key_init)
    batches = _make_batches(kernels, arms, vectorize, key_batches, init_params, model_args,
                            model_kwargs, thin)
    batch_arms = [list(b.arm_ids) for b in batches]
    scorer.attach(batches[0].kernel, model_args, model_kwargs)
    overhead = {"setup": time.perf_counter() - start_all, "compile": 0.0, "score": 0.0}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(_Batch.compile, [b.lower() for b in batches]))
    # compile the scorer and the output transform on the initial states (throw-away scores),
    # and time one scoring (×2: more draws are scored later)
    dummy = jax.tree.map(lambda v: np.repeat(np.asarray(v)[:1, None], 8, axis=1), batches[0].state.z)
    scorer.score([dummy])  # compiles
    t1 = time.perf_counter()
    scorer.score([dummy])
    score_seconds = 2 * (time.perf_counter() - t1)  # per arm-scoring, updated as rounds are scored
    t1 = time.perf_counter()
    scorer.constrained(jax.tree.map(lambda v: v[0], dummy))
    result_seconds = time.perf_counter() - t1 + 0.5  # + the KSD of the winner's draws
    overhead["compile"] = time.perf_counter() - t0
    setup_end = time.perf_counter()
    if deadline - setup_end < 0.25 * time_budget:
        warnings.warn(
            f"time_budget = {time_budget:g} s, but set-up (the warmup's mode search and "
            f"compilation) took {setup_end - start_all:.1f} s: the arms get little or no chain "
            "time and the call overruns. Raise time_budget.",
            UserWarning, stacklevel=3,
        )

    pieces: dict[int, list] = {i: [] for i in range(M)}  # kernel states {site: (chains, draws, …)}
    charged = np.zeros(M)
    alive = list(range(M))
    rows, results = [], {}
    for rnd in range(num_rounds):
        live = [b for b in batches if any(a in alive for a in b.arm_ids)]
        # the wall time left, less the scoring still to come, split over the rounds left as
        # Algorithm 1 splits T: r_i = (chain time of the round)/|S_i| per arm
        to_score = sum(max(len(alive) // eta ** j, 1) for j in range(num_rounds - rnd)) if halving else M
        chain_left = deadline - time.perf_counter() - 1.2 * score_seconds * to_score - result_seconds
        share = max(chain_left, 0.0) / ((num_rounds - rnd) * len(alive))
        iters_this_round = {}
        for batch in live:
            iters, wall, new = batch.run(share * len(batch.arm_ids), min_iterations=50 * thin)
            for arm in batch.arm_ids:
                mine = np.flatnonzero(batch.owner == arm)
                iters_this_round[arm] = iters * len(mine)
                charged[arm] += wall / len(batch.arm_ids)
                if new is not None:
                    z = jax.tree.map(lambda v: v[mine], new)
                    if rnd == 0:  # the first half of each chain's first round: burn-in
                        n = jax.tree.leaves(z)[0].shape[1]
                        z = jax.tree.map(lambda v: v[:, n // 2:], z)
                    pieces[arm].append(z)
        t0 = time.perf_counter()
        for batch in live:
            for arm in batch.arm_ids:
                if batch.diverged(arm) or not pieces[arm]:
                    results[arm] = _unscored(diverged=batch.diverged(arm))
                else:
                    results[arm] = scorer.score(pieces[arm])
        elapsed_scoring = time.perf_counter() - t0
        overhead["score"] += elapsed_scoring
        score_seconds = elapsed_scoring / max(len(alive), 1)
        order = sorted(alive, key=lambda a: (results[a]["score"], a))
        survivors = order[: max(len(alive) // eta, 1)] if halving else order[:1]
        for arm in alive:
            r = results[arm]
            rows.append({
                "round": rnd, "arm": arm, **arms[arm],
                "iterations": iters_this_round.get(arm, 0),
                "draws": _num_draws(pieces[arm]),
                "seconds": charged[arm] - sum(x["seconds"] for x in rows if x["arm"] == arm),
                "ess": r["ess"], "ksd": r["ksd"], "se": r["se"], "score": r["score"],
                "mixed": r["mixed"], "diverged": r["diverged"], "kept": arm in survivors,
            })
        alive = survivors
        fork_keys = random.split(random.fold_in(rng_key, rnd + 1), len(live))
        for batch, key in zip(live, fork_keys):
            members = [a for a in batch.arm_ids if a in alive]
            if members and members != batch.arm_ids:
                batch.keep(members, key)
        batches = [b for b in batches if any(a in alive for a in b.arm_ids)]
    best = alive[0]
    if not pieces[best] or math.isinf(results[best]["score"]):
        raise RuntimeError(
            "every arm diverged or produced no draws within the budget; widen the grid towards "
            "smaller step sizes or raise time_budget."
        )
    t0 = time.perf_counter()
    idata = _arm_idata(scorer, pieces[best], results[best]["stein"], charged[best], metric, criterion)
    overhead["result"] = time.perf_counter() - t0
    return TuningResult(
        best_params=dict(arms[best]), idata=idata, rounds=pd.DataFrame(rows),
        elapsed=time.perf_counter() - start_all, scales=scorer.scales, arms=arms,
        overhead=overhead, batches=batch_arms, eta=eta if halving else None, num_rounds=num_rounds,
        criterion=criterion, time_budget=float(time_budget), make_kernel=make_kernel,
        mode_fit=scorer.fit, ess_per_iteration=float(results[best]["ess"]) / (thin * max(_num_draws(pieces[best]), 1)),
    )


def _arm_idata(scorer: _Scorer, pieces, stein, seconds, metric, criterion):
    """InferenceData of one arm's thinned draws (its chains pooled into one) and the KSD of
    the draws it was scored on, on the common scale."""
    import arviz as az

    z = _pooled(pieces)
    samples = scorer.constrained(z)
    idata = az.from_dict(posterior={k: v[None] for k, v in samples.items()})
    idata.posterior.attrs["sampling_time"] = float(seconds)
    _cast_discrete(idata, scorer.scores.discrete_sites)
    if stein is not None:
        x, s = stein
        dims = ("chain", "draw", "coordinate")
        stein_ds = xr.Dataset(
            {"unconstrained": (dims, x[None]), "score": (dims, s[None])},
            coords={"chain": [0], "draw": np.arange(x.shape[0]), "coordinate": scorer.scores.coordinate_names,
                    "site": ("coordinate", scorer.scores.coordinate_sites)},
        )
        options = {k: v for k, v in scorer.ksd_options.items() if k in ("c", "beta", "statistic", "block_size")}
        _attach_ksd(idata, stein_ds, scorer.scales, "array" if scorer.scales is not None else None, options)
        idata.sample_stats.attrs["ksd_preconditioner"] = (
            "common (tuner)" if scorer.scales is not None else _preconditioner_name(None)
        )
        idata.sample_stats.attrs["ksd_scores"] = scorer.score_kind
    idata.posterior.attrs["tuning_metric"] = metric if isinstance(metric, str) else "callable"
    idata.posterior.attrs["tuning_criterion"] = criterion
    return idata


_DOC_ARGS = """
    :param make_kernel: a callable returning a ``numpyro_sg`` kernel for keyword arguments
        (the grid's), e.g. ``functools.partial(nsg.SGLD, model)``.
    :param dict grid: ``{keyword: list of values}``; the arms are the Cartesian product
        (e.g. ``{"step_size": [3.0, 1.0, 0.3, 0.1], "subsample_size": [1000, 100]}``).
    :param model_args: the model's positional arguments (the data).
    :param model_kwargs: the model's keyword arguments.
    :param float time_budget: the wall time of the whole call in seconds: the warmup's mode
        search, set-up, compilation, chains and scoring (the breakdown is in
        :attr:`TuningResult.overhead`).  Set-up comes first; the time left, less the
        predicted scoring, goes to the chains (split as Algorithm 1 splits T in
        :func:`mamba`, equally in :func:`grid_search`).
    :param metric: ``"ksd"`` (default), ``"fssd"``, or a callable ``f(samples) -> float``
        (lower is better) given the constrained thinned draws ``{site: (T, …)}`` — e.g. a
        held-out log-loss (``"fssd"`` and callables need ``criterion="plain"``).
    :param str criterion: ``"ess"`` (default): max(KSD_U², 0) of each arm's draws thinned to
        one per effective sample, plus its standard error — an estimate of the arm's bias that does
        not punish slow mixing, where an arm with few effective draws pays through its
        standard error; ``"plain"``: paper 002's KSD (V-statistic, full-data scores) of all thinned
        draws, which at short budgets ranks fast-mixing biased arms first.
    :param int thin: keep every ``thin``-th iteration (paper 002 thins by 10).
    :param rng_key: ``jax.random.PRNGKey`` (required).
    :param preconditioner: the one common KSD/FSSD scale for every arm: ``"laplace"``
        (default: the warmup's Laplace sds at the mode of the full-data posterior), an array
        of per-coordinate scales, or ``None`` (the papers' raw form).  Models with discrete
        latent sites (ESGLD, SparseAsync) have no Laplace fit: give an array or ``None``.
    :param score_draws: each arm is scored on at most this many draws (default 500).
    :param int score_subsample: with ``criterion="ess"`` a gradient kernel's draws are scored
        with stochastic control-variate scores (the stochastic Stein discrepancy), each on its
        own mini-batch of this many rows per plate (default 1,000; exact when N is smaller);
        otherwise scores use the full data.
    :param dict ksd_options: options of :func:`numpyro_sg.ksd` (``c``, ``beta``, …) or of
        :func:`numpyro_sg.fssd`.
    :param init_params: where the chains start: ``"laplace"`` (default: as the warmup starts
        chains, each arm at its own draw θ̂ + L·ξ of the Laplace approximation at the mode,
        found once and shared by every arm together with the preconditioner and the
        control-variate anchor; kernels without a warmup — ESGLD, SparseAsync — start at their
        own init), ``None`` (each kernel's own init: its ``init_strategy`` if given), or a
        dict of unconstrained site values for every arm.
    :param bool vectorize: run arms that differ only in hyperparameters the kernel holds in its
        state (``kernel.HYPERPARAMETERS``, e.g. ``step_size``, ``temperature``) as one vmapped
        batch (default True).
    :return: a :class:`TuningResult`.
"""


def _shared_parameters(fn):
    """Append the parameters :func:`mamba` and :func:`grid_search` share to ``fn``'s docstring."""
    own = inspect.cleandoc(fn.__doc__)
    head, _, tail = own.partition("**Example:**")
    fn.__doc__ = head.rstrip() + "\n\n" + inspect.cleandoc(_DOC_ARGS) + "\n\n**Example:**" + tail
    return fn


@_shared_parameters
def mamba(make_kernel: Callable, grid: dict, model_args=(), model_kwargs=None, *,
          time_budget: float = 30.0, eta: int = 3, metric="ksd", criterion: str = "ess",
          thin: int = 10, rng_key=None, preconditioner="laplace", score_draws: int | None = 500,
          score_subsample: int = 1000, ksd_options: dict | None = None, init_params="laplace",
          vectorize: bool = True) -> TuningResult:
    """MAMBA: successive halving over a grid of kernel hyperparameters, scored by KSD.

    Paper 002, Algorithm 1: for i = 0 … ⌊log_η M⌋ − 1 every surviving arm runs
    r_i = T_chains/(|S_i|·⌊log_η M⌋) more seconds of chain time continuing its chain, is
    scored on its draws with one common scale, and the ⌊|S_i|/η⌋ best survive (see the module
    docstring).  A grid of fewer than η² arms gives one round — a grid search — and a warning.
    Step sizes follow each kernel's own convention (SGLD: θ' = θ + (ε/2)·M·ĝ + N(0, ε·M), M
    its preconditioner: by default the Laplace covariance, so ε is in posterior sds²; with
    ``preconditioner=None`` ε is paper 002's h).

    :param int eta: pruning rate η ≥ 2 (default 3).

    **Example:**

    .. code-block:: python

        res = nsg.mamba(functools.partial(nsg.SGLD, model),
                        {"step_size": [10.0, 1.0, 0.1, 0.01], "subsample_size": [10_000, 1_000, 100]},
                        (X, y), time_budget=20, rng_key=jax.random.PRNGKey(0))
        res.best_params, res.rounds, res.idata
        n = res.suggested_num_samples(ess=400)        # its ESS per iteration in the tuner
        MCMC(res.best_kernel(), num_warmup=n // 10, num_samples=n).run(key, X, y)
    """
    return _tune(**locals(), halving=True)


@_shared_parameters
def grid_search(make_kernel: Callable, grid: dict, model_args=(), model_kwargs=None, *,
                time_budget: float = 30.0, metric="ksd", criterion: str = "ess", thin: int = 10,
                rng_key=None, preconditioner="laplace", score_draws: int | None = 500,
                score_subsample: int = 1000, ksd_options: dict | None = None,
                init_params="laplace", vectorize: bool = True) -> TuningResult:
    """Grid search: every arm runs for an equal share of ``time_budget`` and the best score wins.

    Same interface and scoring as :func:`mamba` (one round, no pruning); with
    ``vectorize=True`` arms differing only in state hyperparameters share a batch and
    each is charged its share of the batch's wall time.

    **Example:**

    .. code-block:: python

        res = nsg.grid_search(functools.partial(nsg.SGLD, model), {"step_size": [0.2, 0.5, 1.0]},
                              (X, y), time_budget=10, rng_key=jax.random.PRNGKey(0))
    """
    return _tune(**locals(), eta=3, halving=False)
