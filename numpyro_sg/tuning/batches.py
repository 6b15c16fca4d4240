"""Arms run as batches of chains: arms that differ only in hyperparameters the kernel holds in
its state share one ``vmap``-ed, compiled program of the kernel's pure ``step``."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random

from numpyro_sg.infer.lapack_guard import map_over_draws
from numpyro_sg.infer.run_clock import RunClock
from numpyro_sg.kernels.data_cache import PerDataCache

#: iterations per compiled call, at most
MAX_CHUNK = 2**15


def _is_real_scalar(value) -> bool:
    if isinstance(value, (bool, np.bool_)) or callable(value):
        return False
    if isinstance(value, (float, np.floating)):
        return True
    return isinstance(value, (jnp.ndarray, np.ndarray)) and np.ndim(value) == 0 and np.issubdtype(
        np.asarray(value).dtype, np.floating
    )


def _same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, PerDataCache) and isinstance(b, PerDataCache):  # a kernel's warmup cache
        return _same(a.value, b.value)
    if isinstance(a, RunClock) and isinstance(b, RunClock):  # wall-time stamps, no setting
        return True
    try:
        if isinstance(a, (np.ndarray, jnp.ndarray)) or isinstance(b, (np.ndarray, jnp.ndarray)):
            return np.shape(a) == np.shape(b) and bool(np.all(np.asarray(a) == np.asarray(b)))
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are different
        return False


def _without(value, names):
    """An options object (a dataclass, e.g. ESGLD's settings holding ``temperature``) as its
    fields but ``names``, the hyperparameters held in the state, by which the arms may differ;
    any other value as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple((f.name, _without(getattr(value, f.name), names))
                     for f in dataclasses.fields(value) if f.name not in names)
    return value


def vectorisable(kernels: list, arms: list[dict]) -> tuple:
    """Names of the hyperparameters by which these kernels may differ inside one batch.

    Only names among the kernel's state hyperparameters (``kernel.HYPERPARAMETERS``, e.g.
    ``step_size`` and ``temperature``) with real scalar values qualify; every other instance
    attribute must be equal across the kernels (an options object's fields but these names).
    Returns ``()`` when the kernels cannot share a batch.

    :param kernels: the arms' kernels (one per arm).
    :param arms: the arms' keyword dicts.
    :return: a tuple of hyperparameter names (empty: no shared batch).
    """
    state_names = getattr(kernels[0], "HYPERPARAMETERS", ())
    names = tuple(
        n for n in arms[0]
        if n in state_names and all(_is_real_scalar(a[n]) for a in arms)
    )
    first = vars(kernels[0])
    for other in kernels[1:]:
        attrs = vars(other)
        if set(attrs) != set(first):
            return ()
        for key, value in first.items():
            if key not in names and not _same(_without(value, names), _without(attrs[key], names)):
                return ()
    return names


class Batch:
    """Chains of one or several arms that share a kernel (up to state hyperparameters).

    The arms' hyperparameter values live in the batched state (``kernel.
    replace_hyperparameters``) and every chain advances by the kernel's pure ``step``,
    ``vmap``-ed over the batch: the kernel object is never modified.
    """

    def __init__(self, arm_ids, kernels, arms, names, rng_key, init_params, model_args,
                 model_kwargs, thin):
        self.arm_ids = list(arm_ids)  # surviving arms of this batch
        self.owner = np.asarray(arm_ids)  # the arm each chain (slot) of the batch serves
        self.kernel = kernels[0]
        self.thin = thin
        self.model_args, self.model_kwargs = model_args, model_kwargs
        keys = random.split(rng_key, len(arms))
        state = self.kernel.init(keys, 0, init_params, model_args, model_kwargs)
        if names:
            values = {n: jnp.asarray([a[n] for a in arms], jnp.result_type(float)) for n in names}
            state = self.kernel.replace_hyperparameters(state, **values)
        self.state = state
        self._lowered = self._compiled = None
        self.seconds_per_iteration = None

    def _chunk_fn(self):
        kernel, thin = self.kernel, self.thin
        buffer_len = MAX_CHUNK // thin

        def chunk(state, n_steps, model_args, model_kwargs):
            buf0 = jax.tree.map(
                lambda z: jnp.zeros((z.shape[0], buffer_len) + z.shape[1:], z.dtype), state.z
            )

            def body(i, carry):
                st, buf = carry
                # every arm's step (arms in small groups where LAPACK could deadlock: lapack_guard)
                st = map_over_draws(lambda arm: kernel.step(arm, model_args, model_kwargs), st)
                k = (i + 1) // thin - 1

                def write(b):
                    return jax.tree.map(lambda bb, z: bb.at[:, k].set(z), b, st.z)

                buf = lax.cond((i + 1) % thin == 0, write, lambda b: b, buf)
                return st, buf

            return lax.fori_loop(0, n_steps, body, (state, buf0))

        return jax.jit(chunk)

    def lower(self):
        """Trace the batch's chunk program for its shape (the model is traced here, in the
        calling thread); :meth:`compile` it next."""
        self._lowered = self._chunk_fn().lower(self.state, jnp.int32(0), self.model_args, self.model_kwargs)
        return self

    def compile(self):
        """XLA-compile the lowered program (thread-safe: batches compile in parallel)."""
        self._compiled = self._lowered.compile()
        self._lowered = None
        return self

    def run(self, seconds: float, min_iterations: int = 0):
        """Run every chain of the batch for about ``seconds`` of wall time in total, and at
        least ``min_iterations`` iterations (a multiple of ``thin``).

        Returns (iterations per chain, wall seconds, thinned draws {site: (slots, draws, …)}).
        """
        spent, iters, pieces = 0.0, 0, []
        min_iterations = -(-int(min_iterations) // self.thin) * self.thin
        while True:
            left = seconds - spent
            if self.seconds_per_iteration is None:
                n = 2 * self.thin
            else:
                n = max(int(left / self.seconds_per_iteration), min_iterations - iters)
                n = min(n - n % self.thin, MAX_CHUNK)
            if n < self.thin or (self.seconds_per_iteration is not None and left <= 0 and iters >= min_iterations):
                break
            start = time.perf_counter()
            self.state, buf = self._compiled(
                self.state, jnp.int32(n), self.model_args, self.model_kwargs
            )
            buf = jax.device_get(jax.tree.map(lambda b: b[:, : n // self.thin], buf))
            dt = time.perf_counter() - start
            pieces.append(buf)
            spent += dt
            iters += n
            self.seconds_per_iteration = spent / iters
        if pieces:
            draws = jax.tree.map(lambda *b: np.concatenate(b, axis=1), *pieces)
        else:
            draws = None
        return iters, spent, draws

    def diverged(self, arm) -> bool:
        """True when a chain serving ``arm`` diverged (non-finite state or gradient) or was
        frozen otherwise (SparseAsync's active-set ``overflow``)."""
        div = np.asarray(self.state.diverging).reshape(-1)
        div = div | np.asarray(getattr(self.state, "overflow", False)).reshape(-1)
        return bool(np.any(div[self.owner == arm]))

    def keep(self, arm_ids, rng_key):
        """Serve only ``arm_ids``: every slot is refilled with a fork of a surviving chain.

        Slot j goes to survivor j mod s and continues from that arm's current state with a
        fresh random key, so the compiled shape (and program) is kept.  Each survivor gets
        ⌊slots/s⌋ chains (equal shares); the draws of the slots left over are dropped.
        """
        slots, s = len(self.owner), len(arm_ids)
        current = {a: int(np.flatnonzero(self.owner == a)[0]) for a in arm_ids}
        src = np.asarray([current[arm_ids[j % s]] for j in range(slots)])
        state = jax.tree.map(lambda x: x[src], self.state)
        self.state = state._replace(rng_key=random.split(rng_key, slots))
        # every survivor gets ⌊slots/s⌋ chains; leftover slots run but their draws are dropped
        owner = self.owner[src]
        owner[(slots // s) * s:] = -1
        self.owner = owner
        self.arm_ids = list(arm_ids)


def lifted(arm: dict, state_names) -> dict:
    """An arm's keywords with the state hyperparameters given inside an options dict lifted to
    the top (``options={"temperature": t}`` → ``temperature``; ``rmsprop={"alpha": a}`` →
    ``alpha``), so that such arms share a batch too."""
    out = {}
    for key, value in arm.items():
        if isinstance(value, dict) and any(field in state_names for field in value):
            out.update({f: v for f, v in value.items() if f in state_names})
            rest = {f: v for f, v in value.items() if f not in state_names}
            if rest:
                out[key] = rest
        else:
            out[key] = value
    return out


def make_batches(kernels, arms, vectorize, rng_key, init_params, model_args, model_kwargs, thin):
    """The arms grouped into :class:`Batch` es (initialised kernel states, not yet compiled).

    With ``vectorize``, arms of one kernel class whose other keywords are equal and whose
    kernels differ only in state hyperparameters (:func:`vectorisable`; also given inside an
    options dict, :func:`lifted`) share a batch; every other arm gets its own.

    :param kernels: one kernel per arm.
    :param arms: the arms' keyword dicts.
    :param bool vectorize: group arms into shared batches.
    :param rng_key: a ``jax.random.PRNGKey``, split over the batches.
    :param init_params: ``None`` (the kernels' own init), a list of one dict of unconstrained
        site values per arm, or one dict for every arm.
    :param model_args: the model's positional arguments.
    :param model_kwargs: the model's keyword arguments.
    :param int thin: keep every ``thin``-th iteration.
    :return: a list of :class:`Batch`.
    """
    groups: list[tuple] = []  # (arm indices, names of the values by which they differ)
    arms = [lifted(arm, getattr(kernel, "HYPERPARAMETERS", ())) for arm, kernel in zip(arms, kernels)]
    if vectorize:
        by_key: dict = {}
        for i, arm in enumerate(arms):
            state_names = getattr(kernels[i], "HYPERPARAMETERS", ())
            key = repr(sorted((k, repr(v)) for k, v in arm.items() if k not in state_names))
            by_key.setdefault((type(kernels[i]).__name__, key), []).append(i)
        for members in by_key.values():
            names = vectorisable([kernels[i] for i in members], [arms[i] for i in members])
            if len(members) > 1 and names:
                groups.append((members, names))
            else:
                groups.extend(([i], ()) for i in members)
    else:
        groups = [([i], ()) for i in range(len(arms))]
    keys = random.split(rng_key, len(groups))
    batches = []
    for (members, names), key in zip(groups, keys):
        if init_params is None:
            inits = None
        elif isinstance(init_params, list):  # one dict per arm
            inits = jax.tree.map(lambda *v: jnp.stack(v), *[init_params[i] for i in members])
        else:
            inits = jax.tree.map(
                lambda v: jnp.broadcast_to(jnp.asarray(v), (len(members),) + jnp.shape(v)), init_params
            )
        batches.append(
            Batch(members, [kernels[i] for i in members], [arms[i] for i in members], names, key,
                   inits, model_args, model_kwargs, thin)
        )
    return batches
