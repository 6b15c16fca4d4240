r"""Hyperparameter tuning by Stein discrepancy: MAMBA, grid search and the 1/N heuristic.

**MAMBA** (paper 002, Algorithm 1; SPEC §8) is successive halving over *arms*, the Cartesian
product of a grid of kernel keyword arguments (step size × subsample size × any other).  With
M arms, a time budget of T seconds and pruning rate η, for rounds i = 0 … ⌊log_η M⌋ − 1:

1. every surviving arm runs for r_i = T / (|S_i|·⌊log_η M⌋) more seconds, *continuing its
   own chain*;
2. each arm is scored by the KSD of its (thinned) draws with full-data scores, or by FSSD;
3. the ⌊|S_i|/η⌋ arms with the lowest score survive.

Choices made here (each documented in ``docs/tuning.md``):

* **The budget is chain time, as in the paper.**  ``time_budget`` T is the total wall time
  spent running chains, split exactly as Algorithm 1 (r_i per arm per round).  Set-up (the
  kernels' ``init``), compilation and scoring come on top: they are measured and reported
  in :attr:`TuningResult.overhead`, and :attr:`TuningResult.elapsed` is the wall time of the
  whole call.  (Full-data scores cost one pass over the data per scored draw, so on big data
  they can rival the chains' time; ``score_draws`` bounds them.)
* **One common KSD scale.**  Every arm, in every round, is scored with one set of
  per-coordinate scales fixed before the first round (the Laplace scales at the mode of the
  full-data posterior by default, or an array), never with each arm's own sd — otherwise
  the scores are not on one scale (SPEC §7).
* **Vectorised arms.**  Arms that differ only in real scalar hyperparameters that the kernel
  holds in its state (``kernel.HYPERPARAMETERS``: ``step_size``, ``temperature``, …) and
  share everything else (the subsample size in particular) run as one ``vmap``-ed batch of
  chains of the kernel's pure ``step``, compiled once; the kernel itself is never modified.  A
  batch serving g arms runs for g·r_i seconds of wall time and each arm is charged 1/g of
  it, so the accounting is the paper's; because a batch costs much less than g separate
  chains, each arm gets more iterations in its share.  After pruning, a batch keeps its
  compiled shape: its slots are refilled with forks of the surviving chains (same state,
  fresh random keys), so no slot idles and nothing is recompiled; an arm's draws are pooled
  over its forks.
* Arms run in a compiled loop over the kernel's step (``lax.fori_loop``, dynamic length) with
  a preallocated buffer of thinned draws: no per-round ``MCMC.run`` recompilation and no host
  callback in the loop.  A chain that diverges (non-finite state or gradient) scores
  ``inf``.

**Grid search** runs every arm for ``time_budget`` seconds (no pruning) and scores it the
same way, or with a user-supplied metric (e.g. held-out log-loss).  :func:`heuristic_step_size` is the
h = 1/N rule of thumb (Brosse et al. 2018).
"""

from __future__ import annotations

import inspect
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jax import lax, random

from numpyro_sg.arviz import attach_ksd as _attach_ksd
from numpyro_sg.arviz import cast_discrete as _cast_discrete
from numpyro_sg.arviz import preconditioner_name as _preconditioner_name
from numpyro_sg.diagnostics.fssd import fssd
from numpyro_sg.diagnostics.ksd import ksd
from numpyro_sg.diagnostics.model_scores import ModelScores, stein_dataset
from numpyro_sg.laplace import laplace_approximation

__all__ = ["mamba", "grid_search", "heuristic_step_size", "TuningResult", "grid_arms"]

_METRICS = ("ksd", "fssd")
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

    ``best_params`` the winning arm's keyword arguments; ``idata`` its chain as an
    ``arviz.InferenceData`` (all its thinned draws, KSD on the common scale in
    ``sample_stats``); ``rounds`` a ``DataFrame`` with one row per (round, arm): ``round``,
    ``arm``, the arm's hyperparameters, ``iterations`` (run in that round), ``draws`` (kept so
    far), ``seconds`` (charged in that round), ``score`` (after that round; ``inf`` for a
    diverged chain), ``diverged`` and ``kept``; ``elapsed`` the wall time of the whole call;
    ``scales`` the common per-coordinate KSD scales (``None``: raw form); ``arms`` every
    arm's hyperparameters; ``overhead`` the seconds spent outside the chains (``setup``:
    the kernels' ``init`` and the Laplace scales; ``compile``; ``score``; ``result``:
    building ``idata``).  ``rounds["seconds"].sum()`` is the chain time.  ``batches`` lists
    the arms that ran as one vectorised batch.
    """

    best_params: dict
    idata: Any
    rounds: pd.DataFrame
    elapsed: float
    scales: Any = None
    arms: list = field(default_factory=list)
    overhead: dict = field(default_factory=dict)
    batches: list = field(default_factory=list)

    def __repr__(self):
        return (
            f"TuningResult(best_params={self.best_params}, elapsed={self.elapsed:.1f} s, "
            f"{len(self.arms)} arms, {self.rounds['round'].nunique()} round(s))"
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
        self._compiled = None
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

    def compile(self):
        """Compile for the current batch shape; return the seconds it took."""
        start = time.perf_counter()
        fn = self._chunk_fn()
        self._compiled = fn.lower(
            self.state, jnp.int32(0), self.model_args, self.model_kwargs
        ).compile()
        return time.perf_counter() - start

    def run(self, seconds: float):
        """Run every chain of the batch for about ``seconds`` of wall time in total.

        Returns (iterations per chain, wall seconds, thinned draws {site: (slots, draws, …)}).
        """
        spent, iters, pieces = 0.0, 0, []
        while True:
            left = seconds - spent
            if self.seconds_per_iteration is None:
                n = 2 * self.thin
            else:
                n = int(left / self.seconds_per_iteration)
                n = min(n - n % self.thin, _MAX_CHUNK)
            if n < self.thin or (self.seconds_per_iteration is not None and left <= 0):
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


def _make_batches(make_kernel, arms, vectorize, rng_key, init_params, model_args, model_kwargs, thin):
    kernels = []
    for i, arm in enumerate(arms):
        try:
            kernels.append(make_kernel(**arm))
        except TypeError as err:
            raise ValueError(
                f"make_kernel(**{arm}) failed for arm {i}: {err}. Every grid keyword must be an "
                "argument of the kernel factory (e.g. step_size, subsample_size, variant)."
            ) from err
        if not hasattr(kernels[-1], "step") or not hasattr(kernels[-1], "replace_hyperparameters"):
            raise TypeError(
                f"make_kernel must return a numpyro_sg kernel (SGLD, SGBD, ESGLD, …); got "
                f"{type(kernels[-1]).__name__}."
            )
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
class _Scorer:
    """Scores the thinned draws of an arm: KSD/FSSD with full-data scores, or a user metric."""

    def __init__(self, model, model_args, model_kwargs, metric, preconditioner, score_draws,
                 ksd_options, need_laplace):
        self.metric = metric
        self.score_draws = score_draws
        self.ksd_options = dict(ksd_options or {})
        self.postprocess = None  # set by attach() once a kernel is initialised
        self.scores = ModelScores(model, model_args, model_kwargs)
        self.mode = self.laplace_scales = None
        if need_laplace or (isinstance(preconditioner, str) and preconditioner == "laplace"):
            self.mode, self.laplace_scales = self._laplace()
        self.scales = self._scales(preconditioner)

    def attach(self, kernel, model_args, model_kwargs):
        """Use ``kernel``'s ``postprocess_fn`` to constrain draws (after its ``init``)."""
        self.postprocess = jax.jit(jax.vmap(kernel.postprocess_fn(model_args, model_kwargs)))

    def _laplace(self):
        """(mode, scales) of the full-data posterior, by damped Newton from 0, else from a
        random point in (−2, 2) (as ``init_to_uniform``) on the unconstrained space."""
        try:
            score_fn = self.scores.score_fn()
        except ValueError as err:
            raise ValueError(
                f"the Laplace approximation (preconditioner='laplace', init_params='laplace') "
                f"needs a model without discrete latent sites ({err}); pass an array of scales "
                "or None, and init_params=None."
            ) from err
        starts = [np.zeros(self.scores.dim), np.random.default_rng(0).uniform(-2, 2, self.scores.dim)]
        for k, start in enumerate(starts):
            try:
                return laplace_approximation(score_fn, start)
            except ValueError:
                if k == len(starts) - 1:
                    raise

    def laplace_draws(self, num, rng_key) -> list:
        """``num`` unconstrained starting points {site: value} drawn from N(mode, diag(s²))."""
        z = np.asarray(random.normal(rng_key, (num, self.scores.dim)), float)
        flat = self.mode + z * self.laplace_scales
        return [self.scores._unravel(jnp.asarray(f, jnp.result_type(float))) for f in flat]

    def _scales(self, preconditioner):
        if preconditioner is None:
            return None
        if isinstance(preconditioner, str):
            if preconditioner == "laplace":
                return self.laplace_scales
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

    def unconstrained(self, z_draws):
        """(x (T, dim), discrete {site: (T, …)}) from kernel states: no constrain round trip."""
        T = jax.tree.leaves(z_draws)[0].shape[0]
        x = np.concatenate(
            [np.asarray(z_draws[n], float).reshape(T, -1) for n in self.scores.continuous_sites], axis=1
        )
        discrete = {n: np.asarray(z_draws[n]) for n in self.scores.discrete_sites}
        return x, discrete

    def score(self, z_draws) -> float:
        """Score (lower is better) of an arm's thinned draws, at most ``score_draws`` of them."""
        keep = _even(jax.tree.leaves(z_draws)[0].shape[0], self.score_draws)
        z_draws = jax.tree.map(lambda v: np.asarray(v)[keep], z_draws)
        if callable(self.metric):
            return float(self.metric(self.constrained(z_draws)))
        x, discrete = self.unconstrained(z_draws)
        if not np.all(np.isfinite(x)):
            return math.inf
        s = self.scores.score(x, discrete)
        if not np.all(np.isfinite(s)):
            return math.inf
        if self.metric == "fssd":
            return float(fssd(x, scores=s, preconditioner=self.scales, **self.ksd_options))
        return float(ksd(x, scores=s, preconditioner=self.scales, **self.ksd_options))


def _even(num: int, at_most: int | None) -> np.ndarray:
    if at_most is None or num <= at_most:
        return np.arange(num)
    return np.unique(np.round(np.linspace(0, num - 1, at_most)).astype(int))


# -------------------------------------------------------------------------------------------
# the tuners
# -------------------------------------------------------------------------------------------
def _check_common(grid, eta, metric, time_budget, thin, score_draws):
    arms = grid_arms(grid)
    if not (isinstance(eta, (int, np.integer)) and not isinstance(eta, bool) and eta >= 2):
        raise ValueError(f"eta must be an integer ≥ 2, got {eta!r}.")
    if not (callable(metric) or metric in _METRICS):
        raise ValueError(f"metric must be 'ksd', 'fssd' or a callable(samples) -> float; got {metric!r}.")
    if not (np.isfinite(time_budget) and time_budget > 0):
        raise ValueError(f"time_budget must be a positive number of seconds, got {time_budget!r}.")
    if isinstance(thin, bool) or not isinstance(thin, (int, np.integer)) or thin < 1:
        raise ValueError(f"thin must be a positive integer, got {thin!r}.")
    if score_draws is not None and (not isinstance(score_draws, (int, np.integer)) or score_draws < 2):
        raise ValueError(f"score_draws must be an integer ≥ 2 or None, got {score_draws!r}.")
    return arms


def _tune(make_kernel, grid, *, model_args, model_kwargs, time_budget, eta, metric, thin,
          rng_key, preconditioner, score_draws, ksd_options, init_params, vectorize, halving):
    start_all = time.perf_counter()
    arms = _check_common(grid, eta, metric, time_budget, thin, score_draws)
    model_args = tuple(model_args)
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    if rng_key is None:
        raise ValueError("rng_key is required: pass a jax.random.PRNGKey.")
    M = len(arms)
    num_rounds = max(int(math.floor(math.log(M) / math.log(eta) + 1e-9)), 1) if halving else 1

    laplace_init = isinstance(init_params, str)
    if laplace_init and init_params != "laplace":
        raise ValueError(f"init_params must be None, 'laplace' or a dict of site values; got {init_params!r}.")
    try:
        probe = make_kernel(**arms[0])
    except TypeError as err:
        raise ValueError(
            f"make_kernel(**{arms[0]}) failed: {err}. Every grid keyword must be an argument of "
            "the kernel factory (e.g. step_size, subsample_size, variant)."
        ) from err
    model = getattr(probe, "model", None)
    if model is None:
        raise TypeError(f"make_kernel must return a numpyro_sg kernel; got {type(probe).__name__}.")
    key_batches, key_init = random.split(rng_key)
    scorer = _Scorer(model, model_args, model_kwargs, metric, preconditioner, score_draws,
                     ksd_options, need_laplace=laplace_init)
    if laplace_init:
        init_params = scorer.laplace_draws(M, key_init)
    batches = _make_batches(make_kernel, arms, vectorize, key_batches, init_params, model_args,
                            model_kwargs, thin)
    batch_arms = [list(b.arm_ids) for b in batches]
    scorer.attach(batches[0].kernel, model_args, model_kwargs)

    overhead = {"setup": time.perf_counter() - start_all, "compile": 0.0, "score": 0.0}
    draws: dict[int, list] = {i: [] for i in range(M)}
    charged = np.zeros(M)
    alive = list(range(M))
    rows = []
    scores = {}
    for rnd in range(num_rounds):
        live = [b for b in batches if any(a in alive for a in b.arm_ids)]
        for batch in live:  # once per batch: pruning keeps the compiled shape
            if batch._compiled is None:
                overhead["compile"] += batch.compile()
        # chain seconds per arm this round: r_i = T/(|S_i|·⌊log_η M⌋) (grid search: T each)
        share = time_budget / (len(alive) * num_rounds) if halving else time_budget
        iters_this_round = {}
        for batch in live:
            iters, wall, new = batch.run(share * len(batch.arm_ids))
            for arm in batch.arm_ids:
                iters_this_round[arm] = iters * int(np.sum(batch.owner == arm))
                charged[arm] += wall / len(batch.arm_ids)
                if new is not None:
                    mine = np.flatnonzero(batch.owner == arm)
                    draws[arm].append(jax.tree.map(
                        lambda v: v[mine].reshape((-1,) + v.shape[2:]), new))
        t0 = time.perf_counter()
        for batch in live:
            for arm in batch.arm_ids:
                if batch.diverged(arm) or not draws[arm]:
                    scores[arm] = math.inf
                else:
                    z = jax.tree.map(lambda *v: np.concatenate(v), *draws[arm])
                    scores[arm] = scorer.score(z)
        overhead["score"] += time.perf_counter() - t0
        order = sorted(alive, key=lambda a: (scores[a], a))
        survivors = order[: max(len(alive) // eta, 1)] if halving else order
        for arm in alive:
            rows.append({
                "round": rnd, "arm": arm, **arms[arm],
                "iterations": iters_this_round.get(arm, 0),
                "draws": int(sum(jax.tree.leaves(d)[0].shape[0] for d in draws[arm])),
                "seconds": charged[arm] - sum(r["seconds"] for r in rows if r["arm"] == arm),
                "score": scores[arm],
                "diverged": bool(np.isinf(scores[arm])),
                "kept": arm in survivors,
            })
        alive = survivors
        fork_keys = random.split(random.fold_in(rng_key, rnd + 1), len(live))
        for batch, key in zip(live, fork_keys):
            members = [a for a in batch.arm_ids if a in alive]
            if members and members != batch.arm_ids:
                batch.keep(members, key)
        batches = [b for b in batches if any(a in alive for a in b.arm_ids)]
    best = min(alive, key=lambda a: (scores[a], a))
    if not draws[best] or math.isinf(scores[best]):
        raise RuntimeError(
            "every arm diverged or produced no draws within the budget; widen the grid towards "
            "smaller step sizes or raise time_budget."
        )
    t0 = time.perf_counter()
    idata = _arm_idata(scorer, draws[best], charged[best], metric)
    overhead["result"] = time.perf_counter() - t0
    return TuningResult(
        best_params=dict(arms[best]), idata=idata, rounds=pd.DataFrame(rows),
        elapsed=time.perf_counter() - start_all, scales=scorer.scales, arms=arms,
        overhead=overhead, batches=batch_arms,
    )


def _arm_idata(scorer: _Scorer, pieces, seconds, metric):
    """InferenceData of one arm's thinned draws, with KSD on the common scale."""
    import arviz as az

    z = jax.tree.map(lambda *v: np.concatenate(v), *pieces)
    samples = scorer.constrained(z)
    idata = az.from_dict(posterior={k: v[None] for k, v in samples.items()})
    idata.posterior.attrs["sampling_time"] = float(seconds)
    _cast_discrete(idata, scorer.scores.discrete_sites)
    stein = stein_dataset({k: v[None] for k, v in samples.items()}, scorer.scores, scorer.score_draws)
    options = {k: v for k, v in scorer.ksd_options.items() if k in ("c", "beta", "statistic", "block_size")}
    precond = "array" if scorer.scales is not None else None
    _attach_ksd(idata, stein, scorer.scales, precond, options)
    idata.sample_stats.attrs["ksd_preconditioner"] = (
        "common (tuner)" if scorer.scales is not None else _preconditioner_name(None)
    )
    idata.sample_stats.attrs["tuning_metric"] = metric if isinstance(metric, str) else "callable"
    return idata


_DOC_ARGS = """
    :param make_kernel: a callable returning a ``numpyro_sg`` kernel for keyword arguments
        (the grid's), e.g. ``lambda **kw: nsg.SGLD(model, **kw)`` or
        ``functools.partial(nsg.SGBD, model)``.
    :param dict grid: ``{keyword: list of values}``; the arms are the Cartesian product
        (e.g. ``{"step_size": [1e-3, 1e-4], "subsample_size": [1000, 100]}``).
    :param model_args: the model's positional arguments (the data).
    :param model_kwargs: the model's keyword arguments.
    :param float time_budget: chain seconds: in :func:`mamba` the total over all arms and
        rounds (the paper's T), in :func:`grid_search` per arm.  Set-up, compilation and
        scoring come on top (see :attr:`TuningResult.overhead`).
    :param metric: ``"ksd"`` (default), ``"fssd"``, or a callable ``f(samples) -> float``
        (lower is better) given the constrained thinned draws ``{site: (T, …)}`` — e.g. a
        held-out log-loss.
    :param int thin: keep every ``thin``-th iteration (paper 002 thins by 10).
    :param rng_key: ``jax.random.PRNGKey`` (required).
    :param preconditioner: the one common KSD/FSSD scale for every arm: ``"laplace"``
        (default: √diag((−H)⁻¹) at the mode of the full-data posterior, found by damped
        Newton from 0 on the unconstrained space), an array of per-coordinate scales, or
        ``None`` (the papers' raw form).
    :param score_draws: each arm is scored on at most this many evenly spaced thinned draws
        (default 500; ``None`` for all). Each costs one full-data gradient per draw.
    :param dict ksd_options: options of :func:`numpyro_sg.ksd` (``c``, ``beta``, …) or of
        :func:`numpyro_sg.fssd`.
    :param init_params: where the chains start: ``None`` (default: each kernel's
        ``init_strategy``), ``"laplace"`` (each arm from its own draw of the Laplace
        approximation N(mode, diag(s²)) of the full-data posterior on the unconstrained space —
        near the posterior, so short rounds compare the arms' stationary behaviour rather than
        how fast they leave a poor start; paper 002 starts its samplers near the MAP), or a
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
          time_budget: float = 30.0, eta: int = 3, metric="ksd", thin: int = 10, rng_key=None,
          preconditioner="laplace", score_draws: int | None = 500, ksd_options: dict | None = None,
          init_params=None, vectorize: bool = True) -> TuningResult:
    """MAMBA: successive halving over a grid of kernel hyperparameters, scored by KSD/FSSD.

    Paper 002, Algorithm 1: for i = 0 … ⌊log_η M⌋ − 1 every surviving arm runs
    r_i = T/(|S_i|·⌊log_η M⌋) more seconds of chain time continuing its chain, is scored on
    its thinned draws with full-data scores and one common scale, and the ⌊|S_i|/η⌋ best
    survive (see the module docstring for vectorised arms and the overheads).  Step sizes
    follow each kernel's own convention (SGLD: θ' = θ + (ε/2)·M·ĝ + N(0, ε·M), M its
    preconditioner; paper 002's h is ε with M = I).

    :param int eta: pruning rate η ≥ 2 (default 3).

    **Example:**

    .. code-block:: python

        res = nsg.mamba(functools.partial(nsg.SGLD, model, preconditioner=None, gradient="plain"),
                        {"step_size": [1e-4, 1e-5, 1e-6], "subsample_size": [10_000, 1_000]},
                        (X, y), time_budget=60, rng_key=jax.random.PRNGKey(0))
        res.best_params, res.rounds, res.idata
    """
    return _tune(**locals(), halving=True)


@_shared_parameters
def grid_search(make_kernel: Callable, grid: dict, model_args=(), model_kwargs=None, *,
                time_budget: float = 30.0, metric="ksd", thin: int = 10, rng_key=None,
                preconditioner="laplace", score_draws: int | None = 500,
                ksd_options: dict | None = None, init_params=None, vectorize: bool = True) -> TuningResult:
    """Grid search: every arm runs for ``time_budget`` seconds and the lowest score wins.

    Same interface and scoring as :func:`mamba` (one round, no pruning); with
    ``vectorize=True`` arms differing only in state hyperparameters share a batch and
    each is charged its share of the batch's wall time.

    **Example:**

    .. code-block:: python

        res = nsg.grid_search(functools.partial(nsg.SGLD, model), {"step_size": [0.2, 0.5, 1.0]},
                              (X, y), time_budget=5, rng_key=jax.random.PRNGKey(0))
    """
    return _tune(**locals(), eta=3, halving=False)
