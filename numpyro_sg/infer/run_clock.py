"""The wall time of a run (NumPyro's ``MCMC`` has no end-of-run hook).

A kernel's ``init`` opens a *segment* (:meth:`RunClock.start`).  Where NumPyro's progress bar
runs the loop from Python, each reading of the state for the bar's text (a few times a second)
stamps the iteration it read and the wall time (:meth:`RunClock.note`): the segment's seconds
run from the start of ``init`` (the warmup and every compile included, as for NUTS's
``sampling_time``) to its last iteration, extrapolated from the last two stamps.  The step itself
holds no host callback, which would cost every iteration of that loop JAX's slow dispatch path.
Without the bar (``progress_bar=False``, or chains in parallel) nothing is stamped, and a run's
seconds are those from the start of ``init`` to the moment they are asked for, once its last
state is computed: the conversion right after the run reads its time, a later one an upper
bound.  :func:`numpyro_sg.to_inference_data` records them as ``posterior.attrs["sampling_time"]``
when the user gives none; ``chain_method="sequential"`` runs one segment per chain, summed.
"""

from __future__ import annotations

import time

import jax
import numpy as np

#: segments kept (a run of sequential chains opens one per chain)
MAX_SEGMENTS = 64


class RunClock:
    """Wall-time stamps of a kernel's runs: ``[(start, [(iteration, time), …]), …]``."""

    def __init__(self):
        self.segments = []

    def start(self):
        """A new segment, at the start of ``init``."""
        self.segments = self.segments[-(MAX_SEGMENTS - 1):] + [(time.perf_counter(), [])]

    def note(self, i):
        """Stamp the wall time with ``i``, the iteration counter read from the state (one per
        chain under vectorised chains)."""
        if self.segments:
            self.segments[-1][1].append((int(np.max(np.asarray(i))), time.perf_counter()))

    def since_start(self, segments: int = 1) -> float | None:
        """Seconds since the last ``segments`` segments began (``None``: fewer were opened)."""
        segments = max(int(segments), 1)
        return time.perf_counter() - self.segments[-segments][0] if len(self.segments) >= segments else None

    def seconds(self, last_iteration: int, segments: int = 1) -> float | None:
        """Seconds of the last ``segments`` segments, each to ``last_iteration`` (the counter
        after the run, extrapolated from the last two stamps, at most to the next segment's
        start, or to now for the last), or ``None`` when a segment has fewer than two stamps."""
        if not segments or len(self.segments) < segments:
            return None
        chosen = self.segments[-segments:]
        ends = [start for start, _ in chosen[1:]] + [time.perf_counter()]  # each ended by then
        total = 0.0
        for (start, stamps), latest in zip(chosen, ends):
            if len(stamps) < 2:
                return None
            (i0, t0), (i1, t1) = stamps[-2:]
            rate = (t1 - t0) / max(i1 - i0, 1)
            total += min(t1 + rate * max(last_iteration - i1, 0), latest) - start
        return total


def run_seconds(mcmc) -> float | None:
    """Wall seconds of ``mcmc``'s last run by its kernel's clock (one segment per chain of
    ``chain_method="sequential"``), ``None`` when unknown (not one of this package's kernels)."""
    sampler, state = getattr(mcmc, "sampler", None), getattr(mcmc, "last_state", None)
    if not hasattr(sampler, "sampling_seconds") or state is None:
        return None
    seconds = sampler.sampling_seconds(state, _segments(mcmc))
    if seconds is None:   # not stamped: the time since init, once the last state is computed
        jax.block_until_ready(state)
        seconds = sampler.seconds_since_init(_segments(mcmc))
    return seconds


def seconds_since_init(mcmc) -> float | None:
    """Wall seconds since ``mcmc``'s last run began its ``init`` (the first chain's under
    ``chain_method="sequential"``): the run and what followed it; ``None`` for other kernels."""
    sampler = getattr(mcmc, "sampler", None)
    if not hasattr(sampler, "seconds_since_init"):
        return None
    return sampler.seconds_since_init(_segments(mcmc))


def _segments(mcmc) -> int:
    """The clock's segments of one run: one per chain of ``chain_method="sequential"``."""
    return mcmc.num_chains if getattr(mcmc, "chain_method", None) == "sequential" else 1
