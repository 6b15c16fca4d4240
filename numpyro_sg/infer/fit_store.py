"""The warmup's fits kept for the life of the process, by model, settings and data.

A new kernel on the same model and data (SGHMC after SGLD, a re-executed notebook cell that
keeps its arrays, a test's second kernel) would run the same deterministic mode search again:
:func:`~numpyro_sg.infer.warmup.find_mode` looks its result up here first.  An entry is found
only when everything the search reads is the same:

* the settings: the model (a function by identity, a marginal of local latents by value),
  its plates, the parameters' structure, the warmup options, the float type and the backend;
* the search's fall-back start, the init strategy's chain-0 draw, by value;
* the data, leaf by leaf: a NumPy array by its content (SHA-256 of its bytes, its cost in
  ``docs/performance.md``: an array changed in place is new data), a JAX array (immutable) by identity, held
  weakly (a freed array's entry is dropped), a :class:`~numpyro_sg.infer.disk_rows.NpyRows`
  file by its path, size and modification time, a Python scalar by value.

Data it cannot key (traced values under ``jit``/``pmap``, arrays spread over several processes,
whose processes must all search together, other objects) are never stored;
``kernel.reset_warmup()`` empties the store.  The store keeps the
:data:`STORE_SIZE` most recently used fits (each a few vectors of the model's dimension).
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections import OrderedDict
from typing import Callable

import jax
import numpy as np

from numpyro_sg.infer.disk_rows import NpyRows

#: how many fits the process keeps (least recently used dropped first)
STORE_SIZE = 8
_STORE: OrderedDict = OrderedDict()   # key -> (weak references to the JAX leaves, fit)


def weak_refs(leaves) -> list:
    """Weak references to the array leaves (a freed array's id cannot then be mistaken for a
    new one's), the other leaves as they are."""
    return [_WeakLeaf(x) if _weakable(x) else x for x in leaves]


def same_objects(kept, leaves) -> bool:
    """Whether ``leaves`` are the very objects :func:`weak_refs` was given."""
    return len(kept) == len(leaves) and all(
        (k() if isinstance(k, _WeakLeaf) else k) is x for k, x in zip(kept, leaves))


def stored_fit(settings: tuple, start, model_args, model_kwargs, compute: Callable) -> tuple:
    """``(fit, found)``: the fit stored for these ``settings``, fall-back ``start`` (a pytree of
    arrays or None) and data (``found=True``), or ``compute()``'s result, stored when the data
    can be keyed (module docstring)."""
    data = _data_key(model_args, model_kwargs)
    try:
        key = (settings, _content(jax.tree.leaves(start)), data and data[0])
        hash(key)
    except TypeError:   # an unhashable setting: no store
        data = None
    if data is None:
        return compute(), False
    kept = _STORE.get(key)
    if kept is not None and same_objects(kept[0], data[1]):
        _STORE.move_to_end(key)
        return kept[1], True
    fit = compute()
    _STORE[key] = (weak_refs(data[1]), fit)
    while len(_STORE) > STORE_SIZE:
        _STORE.popitem(last=False)
    return fit, False


def clear_store():
    """Forget every stored fit (``kernel.reset_warmup()`` calls it: its next search runs)."""
    _STORE.clear()


def _data_key(model_args, model_kwargs):
    """``(key, JAX leaves)`` of the data, or None when some leaf cannot be keyed."""
    tree = (model_args, model_kwargs or {})
    leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: isinstance(x, NpyRows))
    parts, arrays = [], []
    for x in leaves:
        if isinstance(x, jax.core.Tracer) or (isinstance(x, jax.Array) and not x.is_fully_addressable):
            return None
        if isinstance(x, jax.Array):
            parts.append(("jax", id(x), x.shape, str(x.dtype)))
            arrays.append(x)
        elif isinstance(x, np.ndarray) and not x.dtype.hasobject:
            parts.append(("numpy", x.shape, x.dtype.str, _sha256(x)))
        elif isinstance(x, NpyRows):
            stat = os.stat(x.path)
            parts.append(("npy", os.path.realpath(x.path), stat.st_size, stat.st_mtime_ns))
        elif x is None or isinstance(x, (bool, int, float, complex, str, np.generic)):
            parts.append(("value", type(x).__name__, x))
        else:
            return None
    return (treedef, tuple(parts)), arrays


def _content(leaves) -> tuple:
    """The leaves of a small pytree (the fall-back start) by value."""
    return tuple((np.shape(x), str(np.result_type(x)), _sha256(np.asarray(x))) for x in leaves)


def _sha256(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).reshape(-1).view(np.uint8)).hexdigest()


class _WeakLeaf(weakref.ref):
    """A weak reference to an array leaf of the data."""


def _weakable(x) -> bool:
    return isinstance(x, (np.ndarray, jax.Array)) and not isinstance(x, jax.core.Tracer)
