r"""Hyperparameter tuning by Stein discrepancy: MAMBA, grid search and the 1/N heuristic.

**MAMBA** (Coullon, South & Nemeth (2023), "Efficient and generalizable tuning strategies for
stochastic gradient MCMC", Algorithm 1) is successive halving over *arms*, the Cartesian
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
  sample (median bulk ESS over coordinates), which makes them nearly independent, and
  scored by the U-statistic KSD_U², an unbiased estimate of KSD² of the distribution the arm samples — its bias — with
  no term for autocorrelation.  The ranking key is max(KSD_U², 0) plus its standard error —
  bias² plus Monte Carlo uncertainty, like a mean squared error — so an arm with few
  effective draws (not mixed, or frozen) cannot win by luck.  The standard error is the
  delete-a-block jackknife over contiguous blocks of the draws (Künsch (1989), "The jackknife
  and the bootstrap for general stationary observations"), which holds when the thinning
  leaves autocorrelation.  Arms whose scores are within twice their combined se of the best
  remaining one do not differ detectably in bias; of those no riskier than it (a step size no
  larger, a subsample no smaller), the mixed arm with the most effective draws per second goes
  first (:func:`~numpyro_sg.tuning.scoring.ranked`): noise is no reason to take on bias.
  ``criterion="plain"`` is the paper's KSD (V-statistic of all thinned draws), the kernel
  Stein discrepancy of Gorham & Mackey (2017), "Measuring sample quality with kernels".
* **Scores from mini-batches.**  KSD needs ∇ log π at each scored draw; with the full data
  that is a pass over N rows per draw.  Gradient kernels' draws are scored with control-
  variate estimates on an independent mini-batch per draw (the stochastic Stein discrepancy of
  Gorham, Raj & Mackey (2020), "Stochastic Stein discrepancies"; the U-statistic is
  unbiased under such noise), O(score_subsample) per draw.
* **Arms start where the warmup starts chains.**  The warmup's mode search runs once; every
  arm of a gradient kernel shares its Laplace preconditioner and control-variate anchor and
  starts at its own draw of the Laplace approximation.  :meth:`TuningResult.best_kernel`
  reuses that warmup, so the tuned kernel under ``MCMC`` runs the chain that was scored.
* **The budget is the call's wall time.**  ``time_budget`` covers set-up (the mode search, the
  kernels' ``init``), compilation, chains and scoring; the chains get what is left after
  set-up and the predicted scoring, split over rounds as MAMBA's Algorithm 1 splits T.  The
  breakdown is in :attr:`TuningResult.overhead`.
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
:func:`heuristic_step_size` is the h = 1/N rule of thumb (Brosse, Durmus & Moulines (2018),
"The promises and pitfalls of stochastic gradient Langevin dynamics").

The pieces: :mod:`~numpyro_sg.tuning.arms` (the grid, the kernels),
:mod:`~numpyro_sg.tuning.batches` (vmapped batches of chains),
:mod:`~numpyro_sg.tuning.scoring` (the scorer), :mod:`~numpyro_sg.tuning.preparation`
(checks, shared warmup, compilation), :mod:`~numpyro_sg.tuning.halving` (the tuners) and
:mod:`~numpyro_sg.tuning.result` (:class:`TuningResult`).
"""

from __future__ import annotations

from numpyro_sg.tuning.arms import grid_arms, heuristic_step_size, make_kernels
from numpyro_sg.tuning.batches import make_batches
from numpyro_sg.tuning.halving import grid_search, mamba
from numpyro_sg.tuning.result import TuningResult
from numpyro_sg.tuning.scoring import MIN_ESS, Scorer

__all__ = ["mamba", "grid_search", "heuristic_step_size", "TuningResult", "grid_arms", "MIN_ESS"]

# the names the tuner's pieces had when they lived in one module (tests import them)
_Scorer = Scorer
_make_batches = make_batches
_make_kernels = make_kernels
