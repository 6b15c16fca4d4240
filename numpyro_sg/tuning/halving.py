"""The tuners: MAMBA's successive halving (:func:`mamba`) and grid search (:func:`grid_search`).

MAMBA is Algorithm 1 of Coullon, South & Nemeth (2023), "Efficient and generalizable tuning
strategies for stochastic gradient MCMC"; the choices made here are described in the
docstring of :mod:`numpyro_sg.tuning`.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from typing import Callable

import jax
import numpy as np
import pandas as pd
from jax import random

from numpyro_sg.tuning.preparation import build, check_arguments, compile_all, num_halving_rounds
from numpyro_sg.tuning.result import TuningResult, arm_idata
from numpyro_sg.tuning.scoring import num_draws, ranked, unscored


class _Rounds:
    """The mutable state of a tuning call's rounds: every arm's draws, charged seconds and
    latest score, the arms still alive and the rows of ``TuningResult.rounds``."""

    def __init__(self, arms, batches, scorer, *, eta, halving, num_rounds, thin, deadline,
                 score_seconds, result_seconds):
        self.arms, self.batches, self.scorer = arms, batches, scorer
        self.eta, self.halving, self.num_rounds, self.thin = eta, halving, num_rounds, thin
        self.deadline = deadline
        self.score_seconds, self.result_seconds = score_seconds, result_seconds
        M = len(arms)
        self.pieces: dict[int, list] = {i: [] for i in range(M)}  # {site: (chains, draws, …)}
        self.charged = np.zeros(M)
        self.alive = list(range(M))
        self.rows, self.results = [], {}
        self.score_time = 0.0

    def share(self, rnd: int) -> float:
        """Chain seconds per surviving arm in round ``rnd``: the wall time left, less the
        scoring still to come, split over the rounds left as Algorithm 1 splits T:
        r_i = (chain time of the round)/|S_i| per arm."""
        alive, left = self.alive, self.num_rounds - rnd
        if self.halving:
            to_score = sum(max(len(alive) // self.eta ** j, 1) for j in range(left))
        else:
            to_score = len(self.arms)
        chain_left = (self.deadline - time.perf_counter() - 1.2 * self.score_seconds * to_score
                      - self.result_seconds)
        return max(chain_left, 0.0) / (left * len(alive))

    def run_chains(self, rnd: int, live) -> dict:
        """Run every live batch for its arms' share; return the iterations per arm."""
        share, iterations = self.share(rnd), {}
        for batch in live:
            iters, wall, new = batch.run(share * len(batch.arm_ids), min_iterations=50 * self.thin)
            for arm in batch.arm_ids:
                mine = np.flatnonzero(batch.owner == arm)
                iterations[arm] = iters * len(mine)
                self.charged[arm] += wall / len(batch.arm_ids)
                if new is not None:
                    z = jax.tree.map(lambda v: v[mine], new)
                    if rnd == 0:  # the first half of each chain's first round: burn-in
                        n = jax.tree.leaves(z)[0].shape[1]
                        z = jax.tree.map(lambda v: v[:, n // 2:], z)
                    self.pieces[arm].append(z)
        return iterations

    def score(self, live):
        """Score every arm of the live batches (``inf`` for a diverged or empty one)."""
        t0 = time.perf_counter()
        for batch in live:
            for arm in batch.arm_ids:
                if batch.diverged(arm):
                    self.results[arm] = unscored("diverged: a chain's state or gradient became non-finite")
                elif not self.pieces[arm]:
                    self.results[arm] = unscored("no draws: its share of the budget ran no iterations")
                else:
                    self.results[arm] = self.scorer.score(self.pieces[arm])
        elapsed = time.perf_counter() - t0
        self.score_time += elapsed
        self.score_seconds = elapsed / max(len(self.alive), 1)

    def record(self, rnd: int, iterations: dict, survivors) -> None:
        """One row of ``TuningResult.rounds`` per arm alive in round ``rnd``."""
        for arm in self.alive:
            r = self.results[arm]
            self.rows.append({
                "round": rnd, "arm": arm, **self.arms[arm],
                "iterations": iterations.get(arm, 0),
                "draws": num_draws(self.pieces[arm]),
                "seconds": self.charged[arm] - sum(x["seconds"] for x in self.rows if x["arm"] == arm),
                "ess": r["ess"], "ksd": r["ksd"], "se": r["se"], "score": r["score"],
                "mixed": r["mixed"], "diverged": r["diverged"], "reason": r["reason"],
                "kept": arm in survivors,
            })

    def play(self, rnd: int, rng_key) -> None:
        """Round ``rnd``: run, score, keep the best ⌊|S_i|/η⌋ arms (the best one without
        halving; best first by :func:`~numpyro_sg.tuning.scoring.ranked`) and refill the
        batches' slots with forks of the survivors."""
        live = [b for b in self.batches if any(a in self.alive for a in b.arm_ids)]
        iterations = self.run_chains(rnd, live)
        self.score(live)
        order = ranked(self.alive, self.results, self.charged, self.arms)
        survivors = order[: max(len(self.alive) // self.eta, 1)] if self.halving else order[:1]
        self.record(rnd, iterations, survivors)
        self.alive = survivors
        fork_keys = random.split(random.fold_in(rng_key, rnd + 1), len(live))
        for batch, key in zip(live, fork_keys):
            members = [a for a in batch.arm_ids if a in self.alive]
            if members and members != batch.arm_ids:
                batch.keep(members, key)
        self.batches = [b for b in self.batches if any(a in self.alive for a in b.arm_ids)]


def _result(rounds: _Rounds, *, start_all, overhead, batch_arms, make_kernel, metric, criterion,
            time_budget) -> TuningResult:
    """The :class:`TuningResult` of the finished rounds (the winner's ``idata`` built here)."""
    best = rounds.alive[0]
    pieces, result = rounds.pieces[best], rounds.results[best]
    if not pieces or math.isinf(result["score"]):
        why = sorted({r["reason"] for r in rounds.results.values()})
        raise RuntimeError(
            "no arm could be scored (" + "; ".join(why) + "); widen the grid towards smaller "
            "step sizes or raise time_budget."
        )
    t0 = time.perf_counter()
    idata = arm_idata(rounds.scorer, pieces, result["stein"], rounds.charged[best], metric, criterion)
    overhead["result"] = time.perf_counter() - t0
    scorer, thin = rounds.scorer, rounds.thin
    return TuningResult(
        best_params=dict(rounds.arms[best]), idata=idata, rounds=pd.DataFrame(rounds.rows),
        elapsed=time.perf_counter() - start_all, scales=scorer.scales, arms=rounds.arms,
        overhead=overhead, batches=batch_arms, eta=rounds.eta if rounds.halving else None,
        num_rounds=rounds.num_rounds, criterion=criterion, time_budget=float(time_budget),
        make_kernel=make_kernel, mode_fit=scorer.fit,
        ess_per_iteration=float(result["ess"]) / (thin * max(num_draws(pieces), 1)),
    )


def _warn_if_setup_ate_the_budget(time_budget, setup_seconds, stacklevel):
    if time_budget - setup_seconds < 0.25 * time_budget:
        warnings.warn(
            f"time_budget = {time_budget:g} s, but set-up (the warmup's mode search and "
            f"compilation) took {setup_seconds:.1f} s: the arms get little or no chain "
            "time and the call overruns. Raise time_budget.",
            UserWarning, stacklevel=stacklevel + 1,
        )


def _tune(make_kernel, grid, *, model_args, model_kwargs, time_budget, eta, metric, criterion,
          thin, rng_key, preconditioner, score_draws, score_subsample, ksd_options, init_params,
          vectorize, halving):
    """The body of :func:`mamba` (``halving=True``) and :func:`grid_search`."""
    start_all = time.perf_counter()
    deadline = start_all + time_budget
    criterion = criterion if criterion is not None else "ess" if isinstance(metric, str) and metric == "ksd" else "plain"
    arms = check_arguments(grid, eta, metric, criterion, time_budget, thin, score_draws)
    model_args = tuple(model_args)
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    if rng_key is None:
        raise ValueError("rng_key is required: pass a jax.random.PRNGKey.")
    num_rounds = num_halving_rounds(len(arms), eta, halving, stacklevel=3)
    scorer, batches = build(
        make_kernel, arms, model_args, model_kwargs, rng_key, metric=metric, criterion=criterion,
        thin=thin, preconditioner=preconditioner, score_draws=score_draws,
        score_subsample=score_subsample, ksd_options=ksd_options, init_params=init_params,
        vectorize=vectorize,
    )
    batch_arms = [list(b.arm_ids) for b in batches]
    overhead = {"setup": time.perf_counter() - start_all, "compile": 0.0, "score": 0.0}
    t0 = time.perf_counter()
    score_seconds, result_seconds = compile_all(batches, scorer)
    overhead["compile"] = time.perf_counter() - t0
    _warn_if_setup_ate_the_budget(time_budget, time.perf_counter() - start_all, stacklevel=3)
    rounds = _Rounds(arms, batches, scorer, eta=eta, halving=halving, num_rounds=num_rounds,
                     thin=thin, deadline=deadline, score_seconds=score_seconds,
                     result_seconds=result_seconds)
    for rnd in range(num_rounds):
        rounds.play(rnd, rng_key)
        if rnd + 1 < num_rounds and time.perf_counter() >= deadline:
            warnings.warn(
                f"time_budget = {time_budget:g} s ran out after round {rnd + 1} of {num_rounds}: "
                "the best arm so far is kept. Raise time_budget for the remaining rounds.",
                UserWarning, stacklevel=3,
            )
            rounds.num_rounds = rnd + 1  # the result reports the rounds played
            break
    overhead["score"] = rounds.score_time
    return _result(rounds, start_all=start_all, overhead=overhead, batch_arms=batch_arms,
                   make_kernel=make_kernel, metric=metric, criterion=criterion,
                   time_budget=time_budget)



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
        predicted scoring, goes to the chains (split over the rounds as MAMBA's Algorithm 1
        splits T in :func:`mamba`, equally in :func:`grid_search`).  When the budget runs
        out before the last round (a slow set-up), the remaining rounds are skipped with a
        warning and the best arm so far wins (``num_rounds`` reports the rounds played).
    :param metric: ``"ksd"`` (default), ``"fssd"``, or a callable ``f(samples) -> float``
        (lower is better) given the constrained thinned draws ``{site: (T, …)}`` — e.g.
        :func:`~numpyro_sg.held_out_score`, a held-out log-loss, ECE or error rate (``"fssd"``
        and callables are scored with ``criterion="plain"``).
    :param str criterion: ``None`` (default): ``"ess"`` for the KSD, else ``"plain"``.
        ``"ess"``: max(KSD_U², 0) of each arm's draws thinned to
        one per effective sample, plus its standard error — an estimate of the arm's bias that does
        not punish slow mixing, where an arm with few effective draws pays through its
        standard error; ``"plain"``: the KSD of Coullon, South & Nemeth (2023) (V-statistic,
        full-data scores) of all thinned draws, which at short budgets ranks fast-mixing
        biased arms first.
    :param int thin: keep every ``thin``-th iteration (Coullon, South & Nemeth (2023) thin
        by 10).
    :param rng_key: ``jax.random.PRNGKey`` (required).
    :param preconditioner: the one common KSD/FSSD scale for every arm: ``"laplace"``
        (default: the warmup's Laplace sds at the mode of the full-data posterior), an array
        of per-coordinate scales, or ``None`` (the papers' raw form).  For kernels without a
        shared warmup (ESGLD, SparseAsync) ``"laplace"`` takes the Laplace sds of the continuous
        sites at the mode of the full model, every indicator on.
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
          time_budget: float = 30.0, eta: int = 3, metric="ksd", criterion: str | None = None,
          thin: int = 10, rng_key=None, preconditioner="laplace", score_draws: int | None = 500,
          score_subsample: int = 1000, ksd_options: dict | None = None, init_params="laplace",
          vectorize: bool = True) -> TuningResult:
    """MAMBA: successive halving over a grid of kernel hyperparameters, scored by KSD.

    Algorithm 1 of Coullon, South & Nemeth (2023), "Efficient and generalizable tuning
    strategies for stochastic gradient MCMC": for i = 0 … ⌊log_η M⌋ − 1 every surviving arm
    runs r_i = T_chains/(|S_i|·⌊log_η M⌋) more seconds of chain time continuing its chain, is
    scored on its draws with one common scale, and the ⌊|S_i|/η⌋ best survive (see
    :mod:`numpyro_sg.tuning`).  A grid of fewer than η² arms gives one round — a grid search —
    and a warning.  Step sizes follow each kernel's own convention: ``step_size`` is in the
    preconditioner's units (posterior sds with the default Laplace preconditioner); with
    ``preconditioner=None, gradient="plain"`` it is the paper's absolute step h.

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
                time_budget: float = 30.0, metric="ksd", criterion: str | None = None, thin: int = 10,
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
