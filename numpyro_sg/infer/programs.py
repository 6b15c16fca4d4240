"""Compile once per shape: the package's compiled programs, cached by what they compute.

A kernel's ``init`` (its first-gradient program) and the warmup's mode search
(:mod:`~numpyro_sg.infer.warmup`: full-data gradient, Adam, Hessian, …) build their compiled
programs through :func:`cached_program`, keyed by what the program computes — the model
function, the subsample plates and their sizes, the structure (shapes, dtypes) of the
parameters, the settings — never by the data's values: the data are arguments of every
program (:func:`~numpyro_sg.infer.jit_data.jit_with_data`).  A second ``MCMC.run``, a new
kernel on data of the same shapes, or the arms of :func:`numpyro_sg.mamba` thus reuse the
programs ``jax.jit`` compiled the first time, in the same process.

Across processes, :func:`enable_compilation_cache` switches on JAX's persistent compilation
cache (a directory of compiled executables keyed by the program's text), for every program
compiled in the process — NumPyro's collection loop included; setting the environment
variable ``NUMPYRO_SG_COMPILATION_CACHE`` to a directory does the same when ``numpyro_sg`` is
imported.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Callable

import jax
import numpy as np

#: environment variable: a directory for JAX's persistent compilation cache, enabled at import
CACHE_ENV = "NUMPYRO_SG_COMPILATION_CACHE"
#: programs kept in the process (least recently used dropped first).  Each compiled XLA CPU
#: executable holds memory mappings of its own; with 256 kept, a long process (a test suite, a
#: notebook running many kernels) reached the kernel's limit (vm.max_map_count, 65,530) and
#: crashed in XLA's compiler
MAX_PROGRAMS = 32

_programs: OrderedDict = OrderedDict()
_lock = threading.Lock()


def tree_signature(tree) -> tuple:
    """``(treedef, ((shape, dtype) per leaf))`` of a pytree: what a program traced on it depends
    on, without the values.

    >>> import numpy as np
    >>> tree_signature({"a": np.zeros((2, 3), np.float32)})[1]
    (((2, 3), 'float32'),)
    """
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(np.shape(x)), str(x.dtype if hasattr(x, "dtype") else np.result_type(x)))
                          for x in leaves)


def placement_key(minibatcher) -> tuple:
    """Where a mini-batcher's programs run: its class and, for sharded data, the mesh, axes and
    shard count (a program built for one mesh must not be reused on another)."""
    return type(minibatcher).__name__, repr(getattr(minibatcher, "shards", None))


def cached_program(key, build: Callable):
    """The program ``build()`` returns, built once per ``key`` in the process.

    ``key`` must determine everything the program computes except its arguments (model,
    plates, parameter structure, settings); a ``key`` that cannot be hashed disables the cache
    (``build()`` is called).  The program is typically a ``jax.jit``-ed function, which itself
    compiles once per shape of its arguments.

    >>> calls = []
    >>> p = cached_program(("doc-example", 1), lambda: calls.append(1) or (lambda x: x + 1))
    >>> q = cached_program(("doc-example", 1), lambda: calls.append(1) or (lambda x: x + 2))
    >>> p is q, len(calls)
    (True, 1)
    """
    try:
        hash(key)
    except TypeError:
        return build()
    with _lock:
        program = _programs.get(key)
        if program is not None:
            _programs.move_to_end(key)
            return program
    program = build()
    with _lock:
        program = _programs.setdefault(key, program)
        while len(_programs) > MAX_PROGRAMS:
            _programs.popitem(last=False)
    return program


def num_programs() -> int:
    """Number of programs held by :func:`cached_program`."""
    return len(_programs)


def clear_programs():
    """Forget every program held by :func:`cached_program` (they compile again on next use)."""
    with _lock:
        _programs.clear()


def enable_compilation_cache(path=None, *, min_compile_time_secs: float = 0.0) -> str:
    """Switch on JAX's persistent compilation cache in the directory ``path``.

    Every program compiled afterwards in the process — ours and NumPyro's collection loop — is
    stored there and read back instead of compiled again, by this process (a new ``MCMC``
    object re-jits NumPyro's loop: the compilation then becomes a read) and by later ones.
    ``path`` defaults to ``$NUMPYRO_SG_COMPILATION_CACHE`` or ``~/.cache/numpyro_sg/jax-<JAX
    version>`` (one directory per JAX version: two versions must never share one).
    ``min_compile_time_secs`` (JAX's own default is 1 s) is the shortest compilation worth
    storing: 0 stores every program, the mode search's are each well under a second.

    Equivalent to setting JAX's options ``jax_compilation_cache_dir`` and
    ``jax_persistent_cache_min_compile_time_secs``; returns the directory.  Entries are keyed by
    the program's text and the device; give each JAX installation its own ``path`` (a cache
    written by another JAX version crashed a reader in our tests).
    """
    path = path or os.environ.get(CACHE_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "numpyro_sg", f"jax-{jax.__version__}")
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
