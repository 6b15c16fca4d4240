"""Mini-batch index draws inside ``jit``, O(n) per draw: with replacement, or without replacement
by walking a per-epoch permutation (:class:`BatchState`); and the warmup's fixed rows, drawn once
outside ``jit`` (:func:`random_rows`: no program to compile)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random


class BatchState(NamedTuple):
    """Per-plate state for drawing without replacement: an epoch permutation and a position."""

    perm: Any
    pos: Any


def draw_with_replacement(key, size: int, n: int):
    """n indices uniform on {0..N−1}, with replacement: O(n).

    For N > 2¹⁶ this draws one set of 32 random bits per index and reduces it modulo N — the
    same indices ``random.randint`` returns, without the second set of bits that ``randint``
    draws and then multiplies by a constant that is 0 for such N (XLA does not always remove
    that dead work, and drawing the bits is about half the cost of a cheap SG step).
    """
    if size <= 2**16:
        return random.randint(key, (n,), 0, size, dtype=jnp.int32)
    _, key_bits = random.split(key)
    return (random.bits(key_bits, (n,), jnp.uint32) % jnp.uint32(size)).astype(jnp.int32)


def draw_without_replacement(key, batch: BatchState, n: int):
    """Next n indices of the current epoch's permutation; reshuffle when fewer than n are left.

    O(n) per draw, plus an O(N) permutation once per epoch (amortised O(n)); every row in order
    when n is the whole plate (the exact gradient: an epoch per draw, whose order does not matter).
    """
    size = batch.perm.shape[0]
    if n >= size:
        return jnp.arange(size, dtype=jnp.int32), batch

    def reshuffle(_):
        return BatchState(random.permutation(key, size).astype(jnp.int32), jnp.int32(0))

    batch = jax.lax.cond(batch.pos + n > size, reshuffle, lambda b: b, batch)
    idx = jax.lax.dynamic_slice(batch.perm, (batch.pos,), (n,))
    return idx, BatchState(batch.perm, batch.pos + n)


def numpy_rng(key) -> np.random.Generator:
    """A NumPy generator seeded by a JAX key (raw ``uint32`` or typed): draws made once, outside
    ``jit``, that compile nothing."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    return np.random.default_rng(np.asarray(random.key_data(key) if typed else key, np.uint32))


def random_rows(key, sizes: tuple, rows: int) -> tuple:
    """Per plate size N: ``rows`` rows drawn with replacement, or all N when N ≤ ``rows`` (``int32``
    JAX arrays: NumPyro's ``subsample`` takes no other)."""
    rng = numpy_rng(key)
    return tuple(jnp.asarray((rng.integers(0, N, size=rows) if N > rows else np.arange(N)).astype(np.int32))
                 for N in sizes)

