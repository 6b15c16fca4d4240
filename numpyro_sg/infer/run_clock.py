"""The wall time of a run, read from the sampling loop (NumPyro's ``MCMC`` has no end-of-run hook).

A kernel's ``init`` opens a *segment* (:meth:`RunClock.start`); its ``sample`` stamps the wall
time every :data:`STAMP_EVERY` iterations of the shared counter through a host callback under
``lax.cond`` (about 50 callbacks in a run of 3,000 iterations: no work per iteration on the
host).  A segment's seconds run from the start of ``init`` (the warmup and every compile
included, as for NUTS's ``sampling_time``) to its last iteration, extrapolated from the last two
stamps.  :func:`numpyro_sg.to_inference_data` records them as ``posterior.attrs["sampling_time"]``
when the user gives none; ``chain_method="sequential"`` runs one segment per chain, summed.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax import lax

__all__ = ["RunClock", "STAMP_EVERY", "run_seconds"]

#: iterations between two wall-time stamps of the sampling loop
STAMP_EVERY = 64
#: segments kept (a run of sequential chains opens one per chain)
MAX_SEGMENTS = 64


class RunClock:
    """Wall-time stamps of a kernel's runs: ``[(start, [(iteration, time), …]), …]``."""

    def __init__(self):
        self.segments = []

    def start(self):
        """A new segment, at the start of ``init``."""
        self.segments = self.segments[-(MAX_SEGMENTS - 1):] + [(time.perf_counter(), [])]

    def _record(self, i):
        if self.segments:
            self.segments[-1][1].append((int(np.max(i)), time.perf_counter()))

    def tick(self, i):
        """In the traced loop body: stamp the wall time when ``i`` (the counter before the
        step; the first chain's under vectorised chains) is a multiple of :data:`STAMP_EVERY`."""
        i = i.reshape(-1)[0] if np.ndim(i) else i
        lax.cond(i % STAMP_EVERY == 0, lambda: jax.debug.callback(self._record, i), lambda: None)

    def since_start(self, segments: int = 1) -> float | None:
        """Seconds since the last ``segments`` segments began (``None``: fewer were opened)."""
        segments = max(int(segments), 1)
        return time.perf_counter() - self.segments[-segments][0] if len(self.segments) >= segments else None

    def seconds(self, last_iteration: int, segments: int = 1) -> float | None:
        """Seconds of the last ``segments`` segments, each to ``last_iteration`` (the counter
        after the run), or ``None`` when a segment has fewer than two stamps."""
        total = 0.0
        for start, stamps in self.segments[-segments:] if len(self.segments) >= segments else ():
            if len(stamps) < 2:
                return None
            (i0, t0), (i1, t1) = stamps[-2:]
            rate = (t1 - t0) / max(i1 - i0, 1)
            total += t1 + rate * max(last_iteration - i1, 0) - start
        return total if segments and len(self.segments) >= segments else None


def run_seconds(mcmc) -> float | None:
    """Wall seconds of ``mcmc``'s last run by its kernel's clock (one segment per chain of
    ``chain_method="sequential"``), ``None`` when unknown (not one of this package's kernels)."""
    sampler, state = getattr(mcmc, "sampler", None), getattr(mcmc, "_last_state", None)
    if not hasattr(sampler, "sampling_seconds") or state is None:
        return None
    return sampler.sampling_seconds(state, _segments(mcmc))


def seconds_since_init(mcmc) -> float | None:
    """Wall seconds since ``mcmc``'s last run began its ``init`` (the first chain's under
    ``chain_method="sequential"``): the run and what followed it, when the clock took no stamps
    (JAX's persistent compilation cache on); ``None`` for other kernels."""
    sampler = getattr(mcmc, "sampler", None)
    if not hasattr(sampler, "seconds_since_init"):
        return None
    return sampler.seconds_since_init(_segments(mcmc))


def _segments(mcmc) -> int:
    """The clock's segments of one run: one per chain of ``chain_method="sequential"``."""
    return mcmc.num_chains if getattr(mcmc, "chain_method", None) == "sequential" else 1
