r"""The :class:`ShardedMinibatcher`: a :class:`~numpyro_sg.infer.minibatch.Minibatcher` for data
whose rows are split over the devices of a mesh (:mod:`~numpyro_sg.infer.sharding`).

Same interface, same conventions, evaluated shard-locally with one all-reduce: the kernels' step
(:meth:`ShardedMinibatcher.estimate_at`: ĝ, control variate and gradient-noise sd τ̂ in one
``psum`` of d + 1 floats, 2d + 1 with τ̂), the warmup's full-data pass
(:meth:`~ShardedMinibatcher.full_value_and_grad_fn`) and every derivative of the mini-batch log
density (:meth:`~ShardedMinibatcher.log_density_fn`, a ``jax.custom_jvp`` function).

τ̂ under stratification: device k's estimator ĝ_k = ∇ log p + (N/n) Σ_{i∈S_k} ∇ log f_i has
variance estimated from its n/D per-datum (or per-group) gradients exactly as on one device
(:meth:`~numpyro_sg.infer.minibatch.Minibatcher.value_grad_noise`), the strata are independent,
so τ̂² = Σ_k τ̂_k².
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax import random
from numpyro import handlers
from numpyro.infer.util import potential_energy
from numpyro.primitives import Messenger

from numpyro_sg.infer import full_density
from numpyro_sg.infer.handlers import with_indices
from numpyro_sg.infer.indices import draw_with_replacement
from numpyro_sg.infer.minibatch import Anchor, GradientEstimate, Minibatcher, working_rows
from numpyro_sg.infer.sharding import DataShards, check_not_parallel, find_data_shards


class plate_sizes(Messenger):
    """Handler recording the declared size of every plate the model enters into ``seen``."""

    def __init__(self, fn=None, seen=None):
        self.seen = seen if seen is not None else {}
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate":
            self.seen[msg["name"]] = int(msg["args"][0])


def is_sharded(mb) -> bool:
    """True for a :class:`ShardedMinibatcher` (data split over several devices)."""
    return isinstance(mb, ShardedMinibatcher)


def make_minibatcher(model: Callable, plates, replace: bool, model_args=(), model_kwargs=None,
                     traced: bool = False) -> Minibatcher:
    """The kernels' mini-batcher for these data: a :class:`ShardedMinibatcher` when the data rows
    are split over several devices (:func:`~numpyro_sg.infer.sharding.find_data_shards`), else
    the usual :class:`~numpyro_sg.infer.minibatch.Minibatcher`.

    ``traced``: the kernel's ``init`` runs under a trace over chains (``chain_method=
    "parallel"``), which cannot be combined with a data mesh.
    """
    shards = find_data_shards(model_args, model_kwargs or {}, plates)
    if shards is None:
        # a subsample of every row is the full data, as in NumPyro's plate: not N draws with replacement
        return Minibatcher(model, plates, replace=replace and any(p.subsample_size < p.size for p in plates))
    check_not_parallel(model_args, model_kwargs, traced)
    if not replace:
        raise ValueError("sharded data: each device draws its mini-batch rows with replacement; "
                         "replace=False is not supported (minibatch_options).")
    mb = ShardedMinibatcher(model, plates, shards)
    mb.check_plate_sizes(model_args, model_kwargs or {})
    return mb


class ShardedMinibatcher(Minibatcher):
    """A :class:`~numpyro_sg.infer.minibatch.Minibatcher` over data split into D row shards (see
    the module docstring); index arrays are D blocks of global row numbers, block k in shard k.

    The model must take its plate size from the data (``numpyro.plate("data", X.shape[0], ...)``):
    each shard runs the model on its N/D rows.
    """

    def __init__(self, model: Callable, plates, shards: DataShards):
        super().__init__(model, plates, replace=True)
        self.shards = shards
        D = shards.devices
        self.local_plates = tuple(dataclasses.replace(p, size=p.size // D, subsample_size=p.subsample_size // D)
                                  for p in self.plates)

    def with_plates(self, plates) -> ShardedMinibatcher:
        """The same mini-batcher drawing the mini-batch sizes of ``plates``."""
        return ShardedMinibatcher(self.model, plates, self.shards)

    @property
    def _c(self) -> float:
        """The share (D−1)/D of the prior term each shard removes before the sum."""
        return (self.shards.devices - 1) / self.shards.devices

    # -- indices -------------------------------------------------------------------------
    def init_batch_state(self, rng_key):
        """``None``: every shard draws with replacement."""
        return None

    def _stratified(self, key, n_local: int):
        (plate,) = self.local_plates
        size = plate.size
        return self.shards.blocks(lambda k, s: draw_with_replacement(k, size, n_local) + s * size, key)

    def draw(self, rng_key, batch_state):
        """A stratified mini-batch: n/D rows of each shard, with replacement, drawn where they live."""
        (plate,) = self.local_plates
        return {plate.name: self._stratified(rng_key, plate.subsample_size)}, None

    def full_indices(self):
        """All N rows, block k made on shard k."""
        (plate,) = self.local_plates
        size = plate.size
        rows = self.shards.blocks(lambda _, s: jnp.arange(size, dtype=jnp.int32) + s * size,
                                  random.PRNGKey(0))
        return {plate.name: rows}

    def random_rows(self, rows: int, key) -> dict:
        """``rows`` rows (rounded up to a multiple of D) stratified over the shards, or all of
        them when N ≤ ``rows``."""
        (plate,) = self.plates
        if plate.size <= rows:
            return self.full_indices()
        return {plate.name: self._stratified(key, -(-int(rows) // self.shards.devices))}

    # -- shard-local log densities -------------------------------------------------------
    def _local_indices(self, blocks):
        (plate,) = self.local_plates
        return {plate.name: blocks[plate.name] - self.shards.shard_index() * plate.size}

    def _local_log_density(self, params, blocks, model_args, model_kwargs):
        """This shard's log density on its block of indices, less (D−1)/D of the prior."""
        local = with_indices(self.model, self._local_indices(blocks))
        prior = full_density.prior_log_density_fn(self.model, self.local_plates, model_args, model_kwargs)
        return -potential_energy(local, model_args, model_kwargs, params) - self._c * prior(params)

    def _reduced(self, local_fn: Callable, model_args, model_kwargs) -> Callable:
        """``(params, indices) -> Σ_k local_fn(params, block k, shard k's data)`` whose value and
        gradient come from one all-reduce (a ``jax.custom_jvp`` rule), its second derivatives
        from one more."""
        model_kwargs = model_kwargs or {}

        def reduce(params, indices, with_grad):
            def fn(p, blocks, a, k):
                f = lambda q: local_fn(q, blocks, a, k)  # noqa: E731
                return jax.value_and_grad(f)(p) if with_grad else f(p)

            return self.shards.reduce(fn, params, indices, model_args, model_kwargs)

        def total(params, indices):
            @jax.custom_jvp
            def at(p):
                return reduce(p, indices, False)

            @at.defjvp
            def at_jvp(primals, tangents):
                value, grad = reduce(primals[0], indices, True)
                dots = [jnp.vdot(g, t) for g, t in zip(jax.tree.leaves(grad), jax.tree.leaves(tangents[0]))]
                return value, sum(dots, jnp.zeros_like(value))

            return at(params)

        return total

    def log_density_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``(params, indices) -> log density`` (global block indices), as
        :meth:`~numpyro_sg.infer.minibatch.Minibatcher.log_density_fn`; its value and gradient come
        from one all-reduce, its second derivatives from one more."""
        return self._reduced(self._local_log_density, model_args, model_kwargs)

    def prior_log_density_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``params -> log p(θ)`` (+ log-Jacobian): each shard evaluates it beside its own rows (the
        rows do not enter it) and one all-reduce averages the D equal values (no data move)."""
        D = self.shards.devices

        def local_prior(params, _, a, k):
            return full_density.prior_log_density_fn(self.model, self.local_plates, a, k)(params) / D

        prior = self._reduced(local_prior, model_args, model_kwargs)
        return lambda params: prior(params, {})

    def estimate_at(self, unravel, flat, indices, *, anchor: Anchor | None = None, noise=False,
                    precond=None, groups=None, model_args=(), model_kwargs=None) -> GradientEstimate:
        """The kernels' gradient estimate at the flat point ``flat`` on the stratified mini-batch
        ``indices``: each shard runs :meth:`~numpyro_sg.infer.minibatch.Minibatcher.estimate` on its rows (plain or control
        variate, with τ̂ when ``noise``), one ``psum`` of the value, ĝ (and τ̂²) combines them."""
        model_kwargs = model_kwargs or {}
        self.check_compiled_data(flat, model_args, model_kwargs)
        local_mb = Minibatcher(self.model, self.local_plates, replace=True)
        c = self._c

        def fn(rep, blocks, a, k):
            x, anc, pre = rep
            log_density = local_mb.log_density_fn(a, k)
            prior = local_mb.prior_log_density_fn(a, k)
            est = local_mb.estimate(lambda y, i: log_density(unravel(y), i), x, self._local_indices(blocks),
                                    anchor=anc, noise=noise, to_working=working_rows(pre), groups=groups)
            prior_value, prior_grad = jax.value_and_grad(lambda y: prior(unravel(y)))(x)
            out = {"value": est.value - c * prior_value,
                   "grad": est.grad - c * (prior_grad if anc is None else anc.grad)}
            if noise:
                out["variance"] = est.noise_sd**2
            return out

        out = self.shards.reduce(fn, (flat, anchor, precond), indices, model_args, model_kwargs)
        tau = jnp.sqrt(out["variance"]) if noise else jnp.full_like(flat, jnp.nan)
        return GradientEstimate(out["value"], out["grad"], tau)

    def full_value_and_grad_fn(self, unravel, model_args=(), model_kwargs=None,
                               chunk_size: int = 65536) -> Callable:
        """``x -> (log π(x), ∇ log π(x))`` over all the data: each shard visits its rows in chunks
        of ``chunk_size``; one ``psum`` of d + 1 floats."""
        model_kwargs = model_kwargs or {}
        c = self._c

        def fn(x, _, a, k):
            value, grad = full_density.full_value_and_grad_fn(self.model, self.local_plates, unravel, a, k,
                                                              chunk_size)(x)
            prior = full_density.prior_log_density_fn(self.model, self.local_plates, a, k)
            prior_value, prior_grad = jax.value_and_grad(lambda y: prior(unravel(y)))(x)
            return value - c * prior_value, grad - c * prior_grad

        return lambda x: self.shards.reduce(fn, x, {}, model_args, model_kwargs)

    def fisher_diagonal(self, unravel, x, indices, group_size: int = 8, model_args=(), model_kwargs=None,
                        block: int = 64):
        """The warmup's Fisher diagonal N·Var_i(∇ log f(x_i | θ)) from the stratified rows
        ``indices``: each shard forms the group sums of
        :func:`~numpyro_sg.infer.full_density.fisher_sums` on its block, one ``psum`` of 2d floats
        adds them, and the variance is taken over all D·G groups (``block``/D groups at a time on
        each shard: the groups of one device given the same rows, up to rounding)."""
        model_kwargs = model_kwargs or {}
        (plate,) = self.local_plates
        local_mb = Minibatcher(self.model, self.local_plates, replace=True)
        rows = indices[plate.name].shape[0] // self.shards.devices
        block = max(1, block // self.shards.devices)
        c, B, nb = full_density.fisher_groups(rows, group_size, block)

        def fn(y, blocks, a, k):
            log_density = local_mb.log_density_fn(a, k)
            prior = local_mb.prior_log_density_fn(a, k)
            return full_density.fisher_sums(plate, lambda t, i: log_density(unravel(t), i),
                                            lambda t: prior(unravel(t)), y, self._local_indices(blocks),
                                            group_size, block)

        s1, s2 = self.shards.reduce(fn, x, indices, model_args, model_kwargs)
        return full_density.fisher_from_sums(s1, s2, self.shards.devices * nb * B, self.plates[0].size, c)

    def cv_noise_sd(self, unravel, x, key, anchor: Anchor, model_args=(), model_kwargs=None):
        """τ̂ of the control-variate gradient at ``x`` on one stratified mini-batch
        (:meth:`estimate_at` with the gradient-noise estimate: one all-reduce)."""
        idx, _ = self.draw(key, None)
        return self.estimate_at(unravel, x, idx, anchor=anchor, noise=True, model_args=model_args,
                                model_kwargs=model_kwargs).noise_sd

    # -- checks and what is not sharded -----------------------------------------------------
    def check_compiled_data(self, flat, model_args, model_kwargs):
        """Raise when the data are constants of a compiled program (NumPyro's
        ``jit_model_args=False``): a full copy on every device, the sharding lost."""
        leaves = jax.tree.leaves((model_args, model_kwargs))
        if isinstance(flat, jax.core.Tracer) and any(
                r and not isinstance(x, jax.core.Tracer) for x, r in zip(leaves, self.shards.rows)):
            raise ValueError(
                "sharded data must be arguments of the compiled sampler: run "
                "MCMC(kernel, ..., jit_model_args=True). With jit_model_args=False the data become "
                "constants of the compiled program, a full copy on every device.")

    def check_plate_sizes(self, model_args, model_kwargs):
        """Raise unless the model takes its plate size from the data (each shard sees N/D rows)."""
        (plate,) = self.local_plates
        seen, error = {}, None

        def fn(_, blocks, a, k):
            model = plate_sizes(handlers.seed(with_indices(self.model, self._local_indices(blocks)), 0), seen)
            handlers.trace(model).get_trace(*a, **k)
            return jnp.zeros(())

        try:
            jax.eval_shape(jax.jit(lambda key, a, k: self.shards.reduce(fn, (), self.draw(key, None)[0], a, k)),
                           random.PRNGKey(0), model_args, model_kwargs)
        except Exception as e:  # noqa: BLE001 - the model's own error, unless the plate explains it
            error = e
        if seen.get(plate.name, plate.size) != plate.size:
            raise ValueError(
                f"plate '{plate.name}' has a fixed size {seen[plate.name]}, but each of the "
                f"{self.shards.devices} data shards holds {plate.size} rows: take the plate size "
                f"from the data, numpyro.plate('{plate.name}', X.shape[0], subsample_size=n).") from error
        if error is not None:
            raise error

    def _not_sharded(self, what):
        raise NotImplementedError(
            f"{what} is not available for data split over a mesh: run it on unsharded data.")

    def value_grad_noise(self, *args, **kwargs):
        """Not available on sharded data (the kernels use :meth:`estimate_at`)."""
        self._not_sharded("value_grad_noise (per-datum gradients of a global index set)")

    def score_estimator(self, *args, **kwargs):
        """Not available on sharded data: compute Stein discrepancies on unsharded data."""
        self._not_sharded("The stochastic score estimator of the Stein discrepancies")

    def per_datum_loglik_grads(self, *args, **kwargs):
        """Not available on sharded data."""
        self._not_sharded("per_datum_loglik_grads")
