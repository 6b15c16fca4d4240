"""Compilation with the data as arguments of the compiled program, not constants baked into it."""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["jit_with_data"]


def jit_with_data(fn, model_args, model_kwargs):
    """``jax.jit`` of ``fn(*args, model_args, model_kwargs)`` with the data as arguments.

    Array leaves of the model arguments (the data) are passed to the compiled program as
    arguments rather than baked into it as constants (which is slow to compile for large
    data: XLA folds and copies every constant); other leaves stay static.  Returns ``g(*args) = fn(*args, model_args,
    model_kwargs)``.
    """
    leaves, treedef = jax.tree.flatten((model_args, model_kwargs))
    dynamic = [isinstance(x, (np.ndarray, jax.Array)) and np.ndim(x) > 0 for x in leaves]
    arrays = [x for x, d in zip(leaves, dynamic) if d]

    @jax.jit
    def compiled(args, arrays):
        it = iter(arrays)
        args_, kwargs_ = jax.tree.unflatten(treedef, [next(it) if d else x for x, d in zip(leaves, dynamic)])
        return fn(*args, args_, kwargs_)

    return lambda *args: compiled(args, arrays)
