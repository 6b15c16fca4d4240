"""A guard against a CPU miscompilation of jaxlib 0.10.2 and 0.11: wrong results, silently.

From jaxlib 0.10.2, XLA's CPU compiler hands some element-wise products followed by a reduction
to YNNPACK fusions, and some of those compute wrong numbers when the program is vectorised
over several points (``jax.vmap`` of a matrix–vector product followed by a sum:
https://github.com/jax-ml/jax/issues/39103; jaxlib 0.10.1 and 0.12 are right).  This package
vectorises a model's log density over points everywhere: the warmup's multi-start passes, the
chains of ``chain_method="vectorized"``, the diagnostics' full-data scores.  On a beta
regression (a ``Beta`` likelihood on 100,000 rows) the full-data log density of 8 points
evaluated together was wrong by up to 8,600 nats, 99.5 % of the rows off, and the warmup
reported local modes the posterior does not have.

XLA's flag ``--xla_cpu_experimental_ynn_fusion_type=`` (no YNNPACK fusion) gives the right
numbers at no measured cost to the kernels' loops.  XLA reads its flags once, when JAX starts
its first backend, so :func:`guard_cpu_fusions`, called when ``numpyro_sg`` is imported,
appends the flag to the ``XLA_FLAGS`` environment variable on the affected jaxlib before that
happens, and warns when it cannot take effect: JAX had already started (a computation before
``import numpyro_sg``), or ``XLA_FLAGS`` was replaced after the import and before JAX started.
Other jaxlib versions, and machines with ``XLA_FLAGS`` already naming the option, are left alone.
"""

from __future__ import annotations

import os
import warnings

import jaxlib

#: the XLA option that turns the YNNPACK fusions off, and its setting
FLAG_NAME = "--xla_cpu_experimental_ynn_fusion_type"
FLAG = FLAG_NAME + "="
#: jaxlib versions that miscompile: from the first (inclusive) to the fixed one (exclusive)
AFFECTED = ((0, 10, 2), (0, 12, 0))


def affected(version: str = jaxlib.__version__) -> bool:
    """Whether this jaxlib ``version`` is one that miscompiles (:data:`AFFECTED`)."""
    parts = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
    return AFFECTED[0] <= parts < AFFECTED[1]


def advice() -> str:
    """The warning's text: what goes wrong, and the two remedies that work."""
    return (f"jaxlib {jaxlib.__version__} can compute wrong results on CPU for programs vectorised over "
            f"points (the warmup's starts, vectorised chains, full-data scores), silently "
            f"(https://github.com/jax-ml/jax/issues/39103). numpyro_sg adds '{FLAG}' to XLA_FLAGS when "
            f"it is imported, but JAX started without it. Set os.environ['XLA_FLAGS'] to include "
            f"'{FLAG}' before JAX runs anything (before importing numpyro_sg, or by appending to "
            f"XLA_FLAGS rather than replacing it), or install jaxlib 0.12 or later.")


def _warn_unless_set(backend) -> None:
    """Backend start hook: warn when a CPU backend started without the flag."""
    if getattr(backend, "platform", "cpu") == "cpu" and FLAG_NAME not in os.environ.get("XLA_FLAGS", ""):
        warnings.warn(advice(), RuntimeWarning, stacklevel=2)


def guard_cpu_fusions(environ=os.environ) -> str:
    """Turn the miscompiling CPU fusions off on an affected jaxlib (module docstring).

    Returns what it did: ``"not affected"``, ``"already set"`` (``XLA_FLAGS`` names the option),
    ``"set"`` (appended before JAX started; a hook checks the flag is still there when the CPU
    backend starts) or ``"too late"`` (JAX had started: warned).
    """
    if not affected():
        return "not affected"
    if FLAG_NAME in environ.get("XLA_FLAGS", ""):
        return "already set"
    from jax._src import xla_bridge  # the backend start, not public: only on the jaxlib versions above

    if xla_bridge.backends_are_initialized():
        if "cpu" in xla_bridge.backends():
            warnings.warn(advice(), RuntimeWarning, stacklevel=3)
        return "too late"
    environ["XLA_FLAGS"] = (environ.get("XLA_FLAGS", "") + " " + FLAG).strip()
    xla_bridge.register_backend_initialization_hook(_warn_unless_set)
    return "set"
