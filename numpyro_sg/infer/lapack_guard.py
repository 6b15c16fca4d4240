"""Batching over draws without a known deadlock of jaxlib < 0.11's CPU LAPACK kernels.

jaxlib 0.10's CPU kernels for batched linear algebra (Cholesky, triangular solves, LU,
eigendecompositions, …) split a batch of more than about 2·10⁵ flops into chunks, schedule the
chunks on XLA's intra-op thread pool and wait for them *from a thread of that pool*.  When as
many such calls run at once as the pool has threads (two on a 2-core machine: XLA runs
independent operations of a program concurrently), every thread waits and the program never
finishes.  jaxlib 0.11 removed that path.  A model whose log density calls LAPACK (a
``MultivariateNormal`` with a ``scale_tril``, say) hits it when its full-data score is
vectorised over many draws: the batch is draws × rows.

:func:`map_over_draws` is ``jax.vmap`` except on that jaxlib on CPU for a function that calls
LAPACK, where it is a sequential ``lax.map`` (the batch is then one draw's).
"""

from __future__ import annotations

from typing import Callable

import jax
import jaxlib

__all__ = ["LAPACK_PRIMITIVES", "lapack_pool_can_deadlock", "uses_lapack", "map_over_draws"]

#: primitives that jaxlib lowers to its CPU LAPACK kernels
LAPACK_PRIMITIVES = frozenset({"cholesky", "triangular_solve", "lu", "lu_pivots_to_permutation", "eigh",
                               "eig", "qr", "householder_product", "geqrf", "geqp3", "orgqr", "svd",
                               "schur", "hessenberg", "tridiagonal", "tridiagonal_solve"})


def lapack_pool_can_deadlock() -> bool:
    """True with jaxlib < 0.11 on a CPU backend (module docstring)."""
    version = tuple(int(p) for p in jaxlib.__version__.split(".")[:2])
    return version < (0, 11) and jax.default_backend() == "cpu"


def _subjaxprs(params):
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jax.extend.core.Jaxpr):
                yield v


def _calls_lapack(jaxpr) -> bool:
    return any(eqn.primitive.name in LAPACK_PRIMITIVES or any(_calls_lapack(j) for j in _subjaxprs(eqn.params))
               for eqn in jaxpr.eqns)


def uses_lapack(fn: Callable, *example_args) -> bool:
    """Whether ``fn(*example_args)`` (arrays or ``jax.ShapeDtypeStruct``) calls a LAPACK kernel."""
    return _calls_lapack(jax.make_jaxpr(fn)(*example_args).jaxpr)


def map_over_draws(fn: Callable, *batched_args):
    """``jax.vmap(fn)(*batched_args)`` over the leading axis, or a sequential ``lax.map`` where
    :func:`lapack_pool_can_deadlock` and ``fn`` calls LAPACK (module docstring)."""
    if lapack_pool_can_deadlock():
        one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), batched_args)
        if uses_lapack(fn, *one):
            return jax.lax.map(lambda a: fn(*a), batched_args)
    return jax.vmap(fn)(*batched_args)
