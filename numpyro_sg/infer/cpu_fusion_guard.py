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

XLA's option ``--xla_cpu_experimental_ynn_fusion_type=`` (no YNNPACK fusion) gives the right
numbers at no measured cost to the kernels' loops.  XLA reads ``XLA_FLAGS`` once, when JAX
creates its CPU backend, so :func:`guard_cpu_fusions`, called when ``numpyro_sg`` is imported,
wraps JAX's CPU backend factory on the affected jaxlib: while the backend is created the
option is appended to ``XLA_FLAGS`` (whatever the user set there before: replaced or
``setdefault`` after the import, as a multi-device recipe does), and the user's value is put
back afterwards.  When JAX had already started (a computation before ``import numpyro_sg``)
without the option, it warns.  Other jaxlib versions, and an ``XLA_FLAGS`` that already names
the option, are left alone.
"""

from __future__ import annotations

import dataclasses
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
            f"(https://github.com/jax-ml/jax/issues/39103), and JAX started before numpyro_sg could "
            f"add '{FLAG}' to XLA_FLAGS. Import numpyro_sg before running anything with JAX, or set "
            f"os.environ['XLA_FLAGS'] to include '{FLAG}' before that, or install jaxlib 0.12 or later.")


def with_flag(factory, environ=os.environ):
    """``factory`` (a JAX backend factory) run with :data:`FLAG` appended to ``XLA_FLAGS``
    unless it names the option, and the variable put back as it was."""
    def create(*args, **kwargs):
        before = environ.get("XLA_FLAGS")
        if FLAG_NAME not in (before or ""):
            environ["XLA_FLAGS"] = ((before or "") + " " + FLAG).strip()
        try:
            return factory(*args, **kwargs)
        finally:
            if before is None:
                environ.pop("XLA_FLAGS", None)
            else:
                environ["XLA_FLAGS"] = before

    create.guarded = True
    return create


def guard_cpu_fusions(environ=os.environ) -> str:
    """Turn the miscompiling CPU fusions off on an affected jaxlib (module docstring).

    Returns what it did: ``"not affected"``, ``"guarded"`` (JAX's CPU backend factory wrapped
    before JAX started, or already), ``"already set"`` (JAX started with ``XLA_FLAGS`` naming
    the option) or ``"too late"`` (JAX started without it: warned).
    """
    if not affected():
        return "not affected"
    from jax._src import xla_bridge  # the backend factories are not public: only on the versions above

    if xla_bridge.backends_are_initialized():
        if FLAG_NAME in environ.get("XLA_FLAGS", ""):
            return "already set"
        warnings.warn(advice(), RuntimeWarning, stacklevel=3)
        return "too late"
    registration = xla_bridge._backend_factories["cpu"]
    if not getattr(registration.factory, "guarded", False):
        xla_bridge._backend_factories["cpu"] = dataclasses.replace(
            registration, factory=with_flag(registration.factory, environ))
    return "guarded"
