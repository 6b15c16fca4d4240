"""What NumPyro's progress bar shows of a kernel's run, and the run clock's stamps it gives.

With its progress bar on (its default), NumPyro runs the sampling loop from Python, one compiled
step per iteration (unless several chains run in parallel), and asks the kernel for the bar's
text after every iteration.  :class:`ProgressText` answers from the state every
:data:`DIAGNOSTICS_INTERVAL` seconds (and at the 1st, 2nd, 4th, … iteration), and each reading
stamps the run clock with the iteration it read (:mod:`~numpyro_sg.infer.run_clock`), which
times the run without any host callback in the step: a step holding one (it carries an effect)
leaves JAX's fast dispatch path (its cost: ``docs/performance.md``, on the progress bar).

NumPyro asks vectorised chains for the text only when the kernel is an *ensemble kernel*; the
kernels say they are one once ``init`` has seen vectorised chains.  NumPyro then starts the
``run`` that follows an ``MCMC.warmup`` with one key for all chains, from which
``SGKernel.sample`` splits one per chain at every iteration.
"""

from __future__ import annotations

import time

import jax.numpy as jnp
from jax import random

#: seconds between two readings of the state for the progress bar's text: each reading waits for
#: the step in flight, which slows a fast kernel read at every iteration (docs/performance.md)
DIAGNOSTICS_INTERVAL = 0.25


class ProgressText:
    """The progress-bar part of :class:`~numpyro_sg.kernels.base.SGKernel` (needs its ``_clock``,
    ``_diagnostics_shown``, ``_diagnostics_calls`` and ``_vectorized``, set by its ``init``)."""

    @property
    def is_ensemble_kernel(self) -> bool:
        """True after an ``init`` of vectorised chains: NumPyro then shows their text too."""
        return bool(getattr(self, "_vectorized", False))

    def _sample_with_one_key(self, state, model_args, model_kwargs):
        """One iteration of vectorised chains given one key for all, as NumPyro gives an
        ensemble kernel's ``run`` after ``MCMC.warmup``: a key per chain split from it, and the
        state keeps one key (the loop's carry keeps its type)."""
        keys = random.split(state.rng_key, jnp.shape(state.i)[0] + 1)
        new = self.sample(state._replace(rng_key=keys[1:]), model_args, model_kwargs)
        return new._replace(rng_key=keys[0])

    def get_diagnostics_str(self, state):
        """The progress bar's text, :meth:`diagnostics_text`, read from ``state`` every
        :data:`DIAGNOSTICS_INTERVAL` seconds and at the 1st, 2nd, 4th, … call since ``init``
        (NumPyro asks at every iteration; a short run still gets two stamps), each reading a
        stamp of the run clock."""
        now, shown = time.monotonic(), self._diagnostics_shown
        self._diagnostics_calls = calls = self._diagnostics_calls + 1
        if shown is None or now - shown[0] >= DIAGNOSTICS_INTERVAL or calls & (calls - 1) == 0:
            shown = self._diagnostics_shown = (now, self.diagnostics_text(state))
            self._clock.note(state.i)
        return shown[1]

    def diagnostics_text(self, state) -> str:
        """The progress bar's text: the mean step size, and DIVERGED once a chain blew up."""
        msg = f"step size {float(jnp.mean(state.step_size)):.2e}"
        if bool(jnp.any(state.diverging)):
            msg += ", DIVERGED"
        return msg
