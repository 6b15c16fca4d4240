r"""Data sharded over the devices of a JAX mesh: stratified mini-batches and one reduction.

A user places the rows of the data on a mesh (:func:`shard_rows`, i.e.
``jax.device_put(X, NamedSharding(mesh, P("data")))``) and runs ``MCMC(kernel, ...,
jit_model_args=True)`` as usual.  The gradient kernels then build a ``ShardedMinibatcher``
instead of a :class:`~numpyro_sg.infer.minibatch.Minibatcher`
(:func:`~numpyro_sg.infer.sharded_minibatch.make_minibatcher`) and
every evaluation runs under ``jax.shard_map``, shard-locally:

* **stratified mini-batch** — each of the D devices draws n/D of its own N/D rows (with
  replacement).  With strata of equal size the estimator
  ĝ = ∇ log p(θ) + Σ_k (N/n) Σ_{i∈S_k} ∇ log f(x_i | θ) is unbiased and its variance,
  (N²/n)·mean_k σ_k², is at most that of simple random sampling, (N²/n)·σ² (σ² = mean_k σ_k²
  + the variance between the strata's means);
* **one reduction** — each device evaluates its local mini-batch log density (the model sees
  its shard: a plate of size N/D scaled by (N/D)/(n/D) = N/n), its gradient (control variate
  on the same rows, gradient-noise sums), removes (D−1)/D of the prior term each device
  counted, and one ``jax.lax.psum`` of O(d) floats combines them.  The parameters are
  replicated inputs; they are ``jax.lax.pcast(..., to="varying")`` before differentiating,
  or the gradient would be summed over the devices once already;
* **warmup** — the full-data pass (chunks of each shard), the optimizer's mini-batches and the
  Hessian rows (stratified) run the same way; the log density seen by the warmup is a
  ``jax.custom_jvp`` function whose value and gradient come from one reduction, so first and
  second derivatives (Hessian, Hessian-vector products) each cost one all-reduce.

Index arrays of a
:class:`~numpyro_sg.infer.sharded_minibatch.ShardedMinibatcher` are global row numbers laid out in D equal
blocks, block k holding rows of shard k (what its ``draw``, ``full_indices`` and ``random_rows`` return), so
they never move between devices.  The communication pattern (one all-reduce of O(d) floats per
step, no all-gather) is what carries to GPUs and hosts.  Outside the step, one gather remains,
once per run: ``init``'s model trace runs the model eagerly (NumPyro's own code, which finds the
sites, plates and shapes) on one mini-batch drawn by ``numpyro.subsample``, which takes those n
rows of each subsampled array from every shard (on 4 devices with d = 8 and n = 2,000: two
all-reduces, of 16,000 and 2,000 floats).  That is one mini-batch of data once per run,
before the warmup's full-data passes; a shard-local trace would need NumPyro's tracing to
know the mesh, for no measurable gain.
"""

from __future__ import annotations

import contextlib

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.experimental import multihost_utils
from jax.flatten_util import ravel_pytree
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from numpyro import handlers

__all__ = ["shard_rows"]


def shard_rows(x, mesh: Mesh, data_axis="data"):
    """``x`` with its rows (leading axis) split over the ``data_axis`` of ``mesh`` (a name or a
    tuple of names), replicated over the mesh's other axes: ``jax.device_put(x,
    NamedSharding(mesh, P(data_axis)))``.

    >>> import jax, numpy as np
    >>> mesh = jax.make_mesh((1,), ("data",))
    >>> shard_rows(np.ones((4, 2)), mesh).sharding.spec
    P('data',)
    """
    return jax.device_put(x, NamedSharding(mesh, P(data_axis)))


def _row_axes(leaf):
    """The mesh axes the rows of ``leaf`` are split over (a tuple), or ``None``."""
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(leaf, jax.Array) or not isinstance(sharding, NamedSharding) or leaf.ndim == 0:
        return None
    spec = tuple(sharding.spec) + (None,) * leaf.ndim
    if any(s is not None for s in spec[1:leaf.ndim]):
        raise ValueError(
            f"data of shape {leaf.shape} are sharded as {sharding.spec}: only the rows (leading "
            "axis) may be split over the mesh, e.g. NamedSharding(mesh, P('data')).")
    if spec[0] is None:
        return None
    # a mesh of one device counts too: its arrays carry the mesh's axis types (Explicit ones
    # cannot enter the single-device programs), and one shard runs the same code as D
    return spec[0] if isinstance(spec[0], tuple) else (spec[0],)


@dataclass(frozen=True)
class DataShards:
    """Where the data live: the ``mesh``, the mesh ``axes`` the rows are split over, the number
    of shards D, and for each leaf of ``(model_args, model_kwargs)`` whether it is an array
    argument of the compiled programs (``dynamic``) and whether its rows are split (``rows``)."""

    mesh: Any
    axes: tuple
    devices: int
    dynamic: tuple
    rows: tuple

    def _split(self, model_args, model_kwargs):
        leaves, treedef = jax.tree.flatten((model_args, model_kwargs))
        if len(leaves) != len(self.dynamic):
            raise ValueError("the model arguments changed structure since the kernel's init.")
        arrays = [x for x, d in zip(leaves, self.dynamic) if d]
        specs = [P(self.axes) if r else P() for d, r in zip(self.dynamic, self.rows) if d]

        def rebuild(local):
            it = iter(local)
            return jax.tree.unflatten(treedef, [next(it) if d else x for x, d in zip(leaves, self.dynamic)])

        return arrays, specs, rebuild

    def reduce(self, fn: Callable, replicated, sharded, model_args, model_kwargs):
        """``psum`` over the data axes of ``fn(replicated, sharded, model_args, model_kwargs)``
        evaluated on every shard (one all-reduce of the flattened result).

        ``replicated`` (a pytree, the same on every device) has its float leaves
        ``pcast`` to varying before ``fn`` sees them; ``sharded`` (a pytree of arrays whose
        leading axis is split over the data axes, e.g. index blocks) arrives as the local
        block; the model arguments as the local shard of the data.
        """
        arrays, specs, rebuild = self._split(model_args, model_kwargs)
        holder = {}

        def body(rep, blocks, local):
            rep = jax.tree.map(self.varying, rep)
            args, kwargs = rebuild(local)
            flat, holder["unravel"] = ravel_pytree(fn(rep, blocks, args, kwargs))
            return jax.lax.psum(flat, self.axes)

        in_specs = (jax.tree.map(lambda _: P(), replicated),
                    jax.tree.map(lambda _: P(self.axes), sharded), specs)
        out = jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=P())(
            replicated, sharded, arrays)
        return holder["unravel"](out)

    def on_each_shard(self, fn: Callable, replicated, model_args, model_kwargs):
        """``fn(replicated, model_args, model_kwargs)`` on every shard's local data, for a result
        that does not depend on the data rows (e.g. the constrained values of the parameters):
        no communication."""
        arrays, specs, rebuild = self._split(model_args, model_kwargs)

        def body(rep, local):
            return fn(rep, *rebuild(local))

        in_specs = (jax.tree.map(lambda _: P(), replicated), specs)
        return jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=P())(replicated, arrays)

    def replicated(self, fn: Callable, state, model_args, model_kwargs, state_specs=P()):
        """``fn(state, model_args, model_kwargs)`` run on every shard's local data with the same
        ``state`` (e.g. a whole sampler step: same keys, same decisions everywhere), which must
        come out the same on every device: ``fn`` sums its row sums over the data axes itself
        (``jax.lax.psum``), and differentiates only what does not involve the rows' sums.
        ``state_specs`` (a prefix of ``state``; default replicated) may split some per-datum
        leaves of the state by rows too (e.g. ``P(data_axes)``), which ``fn`` then sees as its
        shard's block and returns the same way.  No communication but ``fn``'s own reductions."""
        arrays, specs, rebuild = self._split(model_args, model_kwargs)

        def body(s, local):
            return fn(s, *rebuild(local))

        # check_vma off: a replicated value must not be pcast (its gradients would be psum'd)
        return jax.shard_map(body, mesh=self.mesh, in_specs=(state_specs, specs), out_specs=state_specs,
                             check_vma=False)(state, arrays)

    def varying(self, x):
        """``x`` marked as differing between the data shards (float leaves only)."""
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            return jax.lax.pcast(x, self.axes, to="varying")
        return x

    def shard_index(self):
        """This device's shard number k (inside ``shard_map``)."""
        return jax.lax.axis_index(self.axes)

    def blocks(self, fn: Callable, key):
        """A global index array of D blocks, block k = ``fn(key folded with k, k)`` (int32 rows
        of shard k), built on the devices that own them (no communication)."""
        def body(key):
            k = self.shard_index()
            return fn(random.fold_in(key, k), k)

        return jax.shard_map(body, mesh=self.mesh, in_specs=P(), out_specs=P(self.axes))(key)


def find_data_shards(model_args, model_kwargs, plates) -> DataShards | None:
    """The :class:`DataShards` of the model arguments, or ``None`` when no data array has its rows
    placed on a mesh axis (the usual single-device path then runs unchanged; rows placed on a
    mesh of one device give one shard, so the recipe for D devices runs on one as well).

    Raises a clear error for layouts the kernels cannot sample: data split over different
    meshes or axes, several subsample plates, a split array whose rows are not the plate's
    N rows, or N (or a plate's mini-batch size n) not divisible by the number of shards.
    """
    leaves = jax.tree.leaves((model_args, model_kwargs))
    axes = [_row_axes(x) for x in leaves]
    split = [(x, a) for x, a in zip(leaves, axes) if a is not None]
    if not split:
        return None
    meshes = {(tuple(d.id for d in x.sharding.mesh.devices.flat), x.sharding.mesh.axis_names, a)
              for x, a in split}
    if len(meshes) > 1:
        raise ValueError("the data arrays are split over different meshes or mesh axes; place them "
                         "all with the same NamedSharding(mesh, P(data_axis)).")
    if len(plates) != 1:
        raise ValueError(f"sharded data need a model with exactly one subsample plate; it has "
                         f"{[p.name for p in plates]}.")
    (plate,) = plates
    mesh, data_axes = split[0][0].sharding.mesh, split[0][1]
    D = int(np.prod([mesh.shape[a] for a in data_axes]))
    for x, _ in split:
        if x.shape[0] != plate.size:
            raise ValueError(f"an array of shape {x.shape} is split over the devices but plate "
                             f"'{plate.name}' has N = {plate.size} rows; split only the data rows.")
    if plate.size % D:
        raise ValueError(f"N = {plate.size} rows do not split evenly over {D} devices: trim (or pad "
                         f"and mask) the data to a multiple of {D} rows.")
    if plate.subsample_size % D:
        raise ValueError(f"the mini-batch size n = {plate.subsample_size} is not a multiple of the "
                         f"{D} data shards (each draws n/D of its own rows): choose subsample_size "
                         f"= {D * max(1, round(plate.subsample_size / D))}.")
    dynamic = tuple(isinstance(x, (np.ndarray, jax.Array)) and np.ndim(x) > 0 for x in leaves)
    return DataShards(mesh, tuple(data_axes), D, dynamic, tuple(a is not None for a in axes))


def check_not_parallel(model_args, model_kwargs, traced: bool):
    """Raise when the kernel's ``init`` runs under a trace over chains (``traced``:
    ``chain_method="parallel"``, one chain per device) on data split over a mesh."""
    if traced and any(_row_axes(x) is not None for x in jax.tree.leaves((model_args, model_kwargs))):
        raise ValueError(
            "chain_method='parallel' runs one chain per device and cannot also split the data "
            "over the devices of a mesh: use chain_method='vectorized' (all chains on the data "
            "mesh) or 'sequential'.")


def eager_under_trace(rng_key):
    """``jax.ensure_compile_time_eval()`` when ``init`` runs under a trace over chains
    (``chain_method="parallel"``: ``rng_key`` is a tracer), so that the structural work and the
    warmup run eagerly there too; otherwise nothing.  Outside a trace the context is not
    needed, and it would fold every constant of the warmup's programs eagerly while they are
    traced (one small compiled program per operation)."""
    return jax.ensure_compile_time_eval() if isinstance(rng_key, jax.core.Tracer) else contextlib.nullcontext()


def auto_view(model_args, model_kwargs):
    """The model arguments with every array on an Explicit-axes mesh put on the same devices with
    Auto axes (no copy: the same buffers), so that eager NumPyro code (model traces,
    ``numpyro.subsample``'s gather) runs on them; other leaves unchanged."""
    def view(x):
        sharding = getattr(x, "sharding", None)
        if not isinstance(x, jax.Array) or not isinstance(sharding, NamedSharding):
            return x
        mesh = sharding.mesh
        if all(t == AxisType.Auto for t in mesh.axis_types):
            return x
        auto = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
        return jax.device_put(x, NamedSharding(auto, sharding.spec))

    return jax.tree.map(view, (model_args, model_kwargs))


def spans_processes(model_args, model_kwargs) -> bool:
    """Whether some data array spans devices of other processes (``jax.distributed``): no one
    process can fetch it."""
    return any(isinstance(x, jax.Array) and not x.is_fully_addressable
               for x in jax.tree.leaves((model_args, model_kwargs)))


def agreed_by_all(flag: bool, model_args, model_kwargs) -> bool:
    """``flag`` as process 0 has it, on every process, when the data span processes (whose every
    program is collective, so all must take the same branch: a loop one process leaves early
    would leave the others waiting forever); else ``flag`` unchanged."""
    if not spans_processes(model_args, model_kwargs):
        return bool(flag)
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


class without_global_observations(handlers.Messenger):
    """Observed values that span several processes replaced by an empty array (ArviZ reads the
    observations into ``observed_data``; such data stay where they are)."""

    def process_message(self, msg):
        value = msg.get("value")
        if msg["type"] == "sample" and msg["is_observed"] and isinstance(value, jax.Array) \
                and not value.is_fully_addressable:
            msg["value"] = np.zeros((0,), value.dtype)
