r"""SparseAsync on data whose rows are split over the devices of a mesh (GLM fast path).

The whole step runs on every shard (:meth:`~numpyro_sg.infer.sharding.DataShards.replicated`)
with the chain's point and keys replicated, so that every draw and accept/reject decision is
the same everywhere, while the fast path's per-datum constants (offset, observations, the
family's other parameters and, for ``"exact"``/``"async"``, the transposed design) stay
where their rows live: row-split leaves of the state (:func:`state_specs`).  Every sum over
data rows is a ``psum`` (:meth:`~numpyro_sg.kernels.sparse_async.options.Plan.total`):

* STEP 1, MALA / SGLD: the block's log-likelihood and its gradient, 1 + width floats per
  evaluation; the exact Gaussian draw: XᵀWX and XᵀW(y − offset), width² + width floats;
* STEP 2, ``"async"`` / ``"sgld"``: G (and H), J (2J) floats; ``"exact"``: each chosen
  coordinate's conditional ℓ₁ − ℓ₀, one float per coordinate, J in turn.

``variant="sgld"`` draws n/D of each shard's N/D rows (a stratified mini-batch, as the
gradient kernels do, :mod:`~numpyro_sg.infer.sharding`).  The dense path (a model outside the
GLM fast path) evaluates the model itself and is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from numpyro_sg.infer.minibatch import Minibatcher
from numpyro_sg.infer.sharded_minibatch import ShardedMinibatcher
from numpyro_sg.infer.sharding import DataShards
from numpyro_sg.kernels.sparse_async.options import Plan
from numpyro_sg.kernels.sparse_async.setup import GLMConstants
from numpyro_sg.kernels.sparse_async.step import SparseAsyncState


class ShardedPlan(NamedTuple):
    """What one shard's step reads: its ``plan`` (local plate, ``row_axes``), its local
    ``minibatcher`` (``"sgld"``; else ``None``), the ``data`` checks and mesh (a
    :class:`~numpyro_sg.infer.sharded_minibatch.ShardedMinibatcher`) and the state's ``specs``."""

    plan: Plan
    minibatcher: Any
    data: ShardedMinibatcher
    specs: Any


def state_specs(axes: tuple, sgld: bool) -> SparseAsyncState:
    """The partition of a chain's state: replicated but for the per-datum constants, split by
    rows (the design ``Xt`` (p, N) by its columns)."""
    rows = P(axes)
    aux = GLMConstants(prior=P(), offset=rows, y=rows, params=rows, Xt=None if sgld else P(None, axes))
    return SparseAsyncState(*(P() for _ in SparseAsyncState._fields))._replace(aux=aux)


def _placed(constants: GLMConstants, mesh, axes: tuple, sgld: bool) -> GLMConstants:
    """The constants with their per-datum leaves put where their rows live."""
    specs = state_specs(axes, sgld).aux
    return jax.tree.map(lambda spec, x: jax.device_put(x, NamedSharding(mesh, spec)), specs, constants,
                        is_leaf=lambda x: isinstance(x, P))


def shard_plan(plan: Plan, constants, shards: DataShards, model, replace_rows: bool):
    """``(ShardedPlan, constants placed by rows)`` after checking that this SparseAsync splits
    its work over the mesh: the GLM fast path, mini-batch rows drawn with replacement."""
    if not plan.fast:
        raise ValueError(
            "SparseAsync on data split over a mesh runs the GLM fast path (a Gaussian, Bernoulli or "
            "Poisson likelihood through X·β, a Normal spike and slab, θ the only continuous site); "
            "this model takes the dense path. Pass the data unsharded (e.g. jax.device_get(X)).")
    sgld = plan.variant == "sgld"
    if sgld and not replace_rows:
        raise ValueError("sharded data: each device draws its mini-batch rows with replacement; "
                         "replace=False is not supported (minibatch_options).")
    plate = plan.ss.plate if sgld else dataclasses.replace(plan.ss.plate, subsample_size=plan.ss.plate.size)
    data = ShardedMinibatcher(model, (plate,), shards)
    (local,) = data.local_plates
    step_plan = dataclasses.replace(plan, ss=dataclasses.replace(plan.ss, plate=local), row_axes=shards.axes)
    minibatcher = Minibatcher(model, (local,), replace=True) if sgld else None
    sharded = ShardedPlan(step_plan, minibatcher, data, state_specs(shards.axes, sgld))
    return sharded, _placed(constants, shards.mesh, shards.axes, sgld)
