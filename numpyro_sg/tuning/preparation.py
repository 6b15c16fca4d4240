"""Set-up of a tuning call: argument checks, the warmup shared by every arm, where the arms
start, their batches and the scorer, and compiling them."""

from __future__ import annotations

import math
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from jax import random

from numpyro_sg.infer.preconditioner import starting_points
from numpyro_sg.infer.warmup import fit_model_mode
from numpyro_sg.kernels.esgld.warmup import full_model_sds
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.tuning.arms import grid_arms, make_kernels
from numpyro_sg.tuning.batches import Batch, make_batches
from numpyro_sg.tuning.scoring import Scorer

#: the metrics a tuner scores arms by (or a callable)
METRICS = ("ksd", "fssd")
#: the selection rules
CRITERIA = ("ess", "plain")


def check_arguments(grid, eta, metric, criterion, time_budget, thin, score_draws):
    """Validate a tuner's options; return the arms (:func:`~numpyro_sg.tuning.grid_arms`)."""
    arms = grid_arms(grid)
    if not (isinstance(eta, (int, np.integer)) and not isinstance(eta, bool) and eta >= 2):
        raise ValueError(f"eta must be an integer ≥ 2, got {eta!r}.")
    if not (callable(metric) or metric in METRICS):
        raise ValueError(f"metric must be 'ksd', 'fssd' or a callable(samples) -> float; got {metric!r}.")
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}.")
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


def num_halving_rounds(num_arms: int, eta: int, halving: bool, stacklevel: int = 2) -> int:
    """⌊log_η M⌋ rounds of successive halving (at least 1), or 1 without halving; warns when
    successive halving degenerates to a grid search (fewer than η² arms)."""
    M = num_arms
    num_rounds = max(int(math.floor(math.log(M) / math.log(eta) + 1e-9)), 1) if halving else 1
    if halving and num_rounds == 1 and M > 1:
        warnings.warn(
            f"MAMBA with {M} arms and eta = {eta} runs ⌊log_η M⌋ = 1 round: every arm gets the "
            "whole budget's share once and the best wins, i.e. a grid search. Give at least "
            f"eta² = {eta * eta} arms (or a smaller eta) for successive halving.",
            UserWarning, stacklevel=stacklevel + 1,
        )
    return num_rounds


def shared_geometry(probe, model, model_args, model_kwargs):
    """The warmup's ``(ModeFit, Minibatcher, unravel)`` shared by every arm of a gradient
    kernel on a model without discrete latent sites; ``None`` otherwise."""
    if not isinstance(probe, GradientKernel):
        return None
    return fit_model_mode(model, model_args, model_kwargs, probe.warmup_options)


def score_scales(preconditioner, geometry, probe, model, model_args, model_kwargs):
    """The scorer's ``preconditioner``: ``"laplace"`` for a kernel without a shared warmup (ESGLD,
    SparseAsync: a model with an indicator) becomes the Laplace sds of the continuous sites at
    the mode of the full model, every indicator on (each coefficient under its slab: the scale
    of a selected effect), so every kernel tunes with its defaults; anything else is returned
    as given (the scorer checks it)."""
    if not (isinstance(preconditioner, str) and preconditioner == "laplace") or geometry is not None:
        return preconditioner
    options = getattr(probe, "options", None)
    return full_model_sds(model, model_args, model_kwargs, indicator=getattr(options, "indicator", None),
                          coefficient=getattr(options, "coefficient", None))


def starting_states(init_params, geometry, num_arms, rng_key):
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


def build(make_kernel, arms, model_args, model_kwargs, rng_key, *, metric, criterion, thin,
          preconditioner, score_draws, score_subsample, ksd_options, init_params, vectorize):
    """The scorer and the initialised batches of every arm (nothing compiled yet).

    The warmup's mode search runs once (:func:`shared_geometry`), on a probe kernel of the
    first arm; every gradient kernel shares it, and the arms start at their own Laplace draws
    (:func:`starting_states`).

    :return: ``(scorer, batches)``: a :class:`~numpyro_sg.tuning.scoring.Scorer` and a list
        of :class:`~numpyro_sg.tuning.batches.Batch`.
    """
    (probe,) = make_kernels(make_kernel, arms[:1], None)
    model = probe.model
    key_batches, key_init, key_score = random.split(rng_key, 3)
    geometry = shared_geometry(probe, model, model_args, model_kwargs)
    preconditioner = score_scales(preconditioner, geometry, probe, model, model_args, model_kwargs)
    scorer = Scorer(model, model_args, model_kwargs, metric, criterion, preconditioner,
                    score_draws, ksd_options, geometry, score_subsample, key_score)
    kernels = make_kernels(make_kernel, arms, None if geometry is None else geometry[0])
    init_params = starting_states(init_params, geometry, len(arms), key_init)
    batches = make_batches(kernels, arms, vectorize, key_batches, init_params, model_args,
                           model_kwargs, thin)
    scorer.attach(batches[0].kernel, model_args, model_kwargs)
    return scorer, batches


def compile_all(batches, scorer) -> tuple[float, float]:
    """Compile the batches (in parallel threads), the scorer and the output transform.

    The scorer is compiled on throw-away scores of the initial states and timed once more
    (×2: more draws are scored later).

    :return: ``(score_seconds, result_seconds)``: the predicted seconds of one arm's scoring
        and of building the result.
    """
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(Batch.compile, [b.lower() for b in batches]))
    dummy = jax.tree.map(lambda v: np.repeat(np.asarray(v)[:1, None], 8, axis=1), batches[0].state.z)
    if not scorer.scores.discrete_sites:  # distinct draws, so that the dummy is scored (compiled)
        jitter = np.random.default_rng(0).normal
        dummy = {k: v + 1e-3 * jitter(size=v.shape) if k in scorer.scores.continuous_sites else v
                 for k, v in dummy.items()}
    scorer.score([dummy])  # compiles
    t1 = time.perf_counter()
    scorer.score([dummy])
    score_seconds = 2 * (time.perf_counter() - t1)  # per arm-scoring, updated as rounds are scored
    t1 = time.perf_counter()
    scorer.constrained(jax.tree.map(lambda v: v[0], dummy))
    result_seconds = time.perf_counter() - t1 + 0.5  # + the KSD of the winner's draws
    return score_seconds, result_seconds
