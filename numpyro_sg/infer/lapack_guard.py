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
LAPACK, where it is a ``lax.map`` over groups of points, each group's calls a quarter of that
size (one point at a time when one point's call is already that large).  Every program that
evaluates a model at several parameter points uses it: full-data scores of draws, the warmup's
multi-start passes and ascents, vectorised chains and tuning arms; the warmup's per-row
gradients, where each row evaluates the whole model, use :func:`map_in_batches`.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jaxlib

#: primitives that jaxlib lowers to its CPU LAPACK kernels
LAPACK_PRIMITIVES = frozenset({"cholesky", "triangular_solve", "lu", "lu_pivots_to_permutation", "eigh",
                               "eig", "qr", "householder_product", "geqrf", "geqp3", "orgqr", "svd",
                               "schur", "hessenberg", "tridiagonal", "tridiagonal_solve"})


#: rough flops of one batched LAPACK call kept by :func:`map_over_draws`: a quarter of the
#: size above which jaxlib 0.10 spreads the batch over the thread pool
SAFE_BATCH_FLOPS = 50_000


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


def _call_flops(eqn) -> int:
    """Rough flops of one LAPACK call: its largest operand's size times the matrix order."""
    order = eqn.invars[0].aval.shape[-1] if eqn.invars[0].aval.shape else 1
    return max(math.prod(v.aval.shape) for v in eqn.invars) * order


def lapack_flops(jaxpr) -> int:
    """The largest LAPACK call of ``jaxpr`` (sub-programs included) in rough flops; 0 if none."""
    return max((max([_call_flops(eqn) if eqn.primitive.name in LAPACK_PRIMITIVES else 0,
                     *(lapack_flops(j) for j in _subjaxprs(eqn.params))]) for eqn in jaxpr.eqns), default=0)


def uses_lapack(fn: Callable, *example_args) -> bool:
    """Whether ``fn(*example_args)`` (arrays or ``jax.ShapeDtypeStruct``) calls a LAPACK kernel."""
    return lapack_flops(jax.make_jaxpr(fn)(*example_args).jaxpr) > 0


def map_over_draws(fn: Callable, *batched_args):
    """``jax.vmap(fn)(*batched_args)`` over the leading axis, or, where
    :func:`lapack_pool_can_deadlock` and ``fn`` calls LAPACK, a ``lax.map`` over groups of
    points small enough that each batched call stays below :data:`SAFE_BATCH_FLOPS` (one point
    at a time when one point's call alone is that large; module docstring)."""
    if lapack_pool_can_deadlock():
        # one point's calls: the batched program's over the batch size (traced on the arguments
        # themselves, whose types keep their sharding: a sliced shape would lose it)
        size = jax.tree.leaves(batched_args)[0].shape[0]
        flops = lapack_flops(jax.make_jaxpr(jax.vmap(fn))(*batched_args).jaxpr) // max(size, 1)
        per_group = max(1, SAFE_BATCH_FLOPS // flops) if flops else None
        if per_group is not None and per_group < size:
            return jax.lax.map(lambda a: fn(*a), batched_args, batch_size=per_group if per_group > 1 else None)
    return jax.vmap(fn)(*batched_args)


def map_in_batches(fn: Callable, xs, batch_size: int):
    """``jax.lax.map(fn, xs, batch_size=batch_size)``, the batch cut as :func:`map_over_draws`
    cuts it where :func:`lapack_pool_can_deadlock` and ``fn`` calls LAPACK (the warmup's
    per-row gradients: each row evaluates the whole model, its prior's solves included); ``fn``
    is traced once, on one element, whichever path is taken."""
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(jax.tree.map(lambda a: a[0], xs))
    flops = lapack_flops(closed.jaxpr) if lapack_pool_can_deadlock() else 0
    if flops:
        batch_size = min(batch_size, max(1, SAFE_BATCH_FLOPS // flops))
    run, structure = jax.extend.core.jaxpr_as_fun(closed), jax.tree.structure(shapes)
    one = lambda x: jax.tree.unflatten(structure, run(*jax.tree.leaves(x)))
    return jax.lax.map(one, xs, batch_size=batch_size if batch_size > 1 else None)
