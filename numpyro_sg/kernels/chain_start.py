"""The pieces of the one initialisation path of every kernel (:meth:`~numpyro_sg.kernels.base.SGKernel.init`):
the chains' keys and what a kernel family's plan returns."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import random
from numpyro.util import is_prng_key


def split_init_key(rng_key):
    """``(batched, chain_key, init_key)``: a key, or a batch of keys (``chain_method=
    "vectorized"``), split into the chain's key and the key for the initial values."""
    if rng_key is None:
        raise ValueError("rng_key is required: pass a jax.random.PRNGKey (or a batch of keys).")
    batched = not is_prng_key(rng_key)
    if batched:
        keys = jax.vmap(lambda k: random.split(k, 2))(rng_key)
        return True, keys[:, 0], keys[:, 1]
    rng_key, key_init = random.split(rng_key)
    return False, rng_key, key_init


class ChainStart(NamedTuple):
    """What a kernel family's plan (``_plan_chains``) gives :meth:`~numpyro_sg.kernels.base.SGKernel.init`.

    ``init_one(chain_key, *args, model_args, model_kwargs)`` builds one chain's state;
    ``chain_axes`` says, per entry of ``args``, whether it carries the chains' axis (0) or is
    shared (``None``) when the chains are vectorised; ``program_key`` shares the compiled
    program between runs (:func:`~numpyro_sg.infer.jit_data.jit_with_data`); ``view`` runs it
    on the data's :func:`~numpyro_sg.infer.sharding.auto_view`.
    """

    init_one: Callable
    args: tuple
    chain_axes: tuple
    program_key: Any = None
    view: bool = False


def search_trace_key(key_init, seed: int):
    """A key of ``key_init``'s shape and type made from ``seed`` alone, for the model trace whose
    draw only starts the warmup's mode search (no init strategy): the search, and so its result
    in the process's store, then depends on the model, data and warmup options, not on the
    run's key.  ``key_init`` itself when traced (``chain_method="parallel"``)."""
    if isinstance(key_init, jax.core.Tracer):
        return key_init
    if jnp.issubdtype(key_init.dtype, jax.dtypes.prng_key):
        return jnp.broadcast_to(random.key(seed, impl=random.key_impl(key_init)), key_init.shape)
    fixed = random.PRNGKey(seed)
    return jnp.broadcast_to(fixed, key_init.shape) if fixed.shape[-1:] == key_init.shape[-1:] else key_init
