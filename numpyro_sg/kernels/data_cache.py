"""The kernels' one caching rule: a value computed once per data set (:class:`PerDataCache`)."""

from __future__ import annotations

from typing import Callable

import jax

from numpyro_sg.infer.fit_store import same_objects, weak_refs


class PerDataCache:
    """The kernels' one caching rule: a value computed once per data set.

    ``cache.get(model_args, model_kwargs, compute)`` returns the value computed for the same
    data (the same array objects, compared with ``is``) or calls ``compute()`` and keeps its
    result; under a trace (``chain_method="parallel"``) nothing is kept.  A kernel run again on
    the same arrays (the next chain of ``chain_method="sequential"``, a second ``MCMC.run``)
    thus reuses its structure and warmup; new data recompute them.  ``cache.set(value)`` stores
    a value for any data (e.g. a warmup result the user passes in).

    >>> import numpy as np
    >>> cache, X = PerDataCache(), np.ones(3)
    >>> cache.get((X,), {}, lambda: "computed"), cache.get((X,), {}, lambda: "again")
    ('computed', 'computed')
    >>> cache.get((np.ones(3),), {}, lambda: "new data")
    'new data'
    """

    def __init__(self):
        self._leaves, self.value = None, None

    def get(self, model_args, model_kwargs, compute: Callable):
        """The value for these data, computed by ``compute()`` on a miss."""
        leaves = jax.tree.leaves((model_args, model_kwargs))
        if self.value is not None and (self._leaves is None or same_objects(self._leaves, leaves)):
            return self.value
        self.value = compute()
        traced = any(isinstance(x, jax.core.Tracer) for x in leaves)
        self._leaves = None if traced else weak_refs(leaves)
        if traced:  # nothing is kept for data seen only as tracers
            value, self.value = self.value, None
            return value
        return self.value

    def set(self, value):
        """Keep ``value`` for any data (until :meth:`get` sees data after a miss)."""
        self._leaves, self.value = None, value

    def clear(self):
        """Forget the value (the next :meth:`get` computes it)."""
        self._leaves, self.value = None, None
