"""The disk cache of :func:`~numpyro_sg.results.reference.nuts_reference`: keys and atomic writes.

A reference is stored as a netCDF file named by a hash of the model's source, the data's bytes
(shapes and dtypes), the settings and the package versions, written atomically.
"""

from __future__ import annotations

import hashlib
import inspect
import tokenize
from pathlib import Path

import jax
import numpy as np
import numpyro

from numpyro_sg.arviz_compat import to_netcdf
from numpyro_sg.version import __version__ as numpyro_sg_version


def _model_source(model) -> str:
    """The model's source (its ``repr`` when there is none, e.g. a model defined by ``exec``)."""
    try:
        return inspect.getsource(model)
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        return repr(model)


def _data_hash(model_args, model_kwargs) -> str:
    """SHA-256 over the data's bytes, shapes and dtypes (non-array leaves by ``repr``)."""
    h = hashlib.sha256()
    leaves, treedef = jax.tree.flatten((model_args, dict(sorted((model_kwargs or {}).items()))))
    h.update(str(treedef).encode())
    for leaf in leaves:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            arr = np.ascontiguousarray(np.asarray(leaf))
            h.update(f"{arr.shape}{arr.dtype}".encode())
            h.update(arr.tobytes())
        else:
            h.update(repr(leaf).encode())
    return h.hexdigest()


def cache_key(model, model_args, model_kwargs, settings: dict) -> str:
    """The cache file's key: a hash of the model's source, the data, ``settings`` and versions."""
    h = hashlib.sha256()
    h.update(_model_source(model).encode())
    h.update(_data_hash(model_args, model_kwargs).encode())
    h.update(repr(sorted(settings.items())).encode())
    h.update(f"numpyro {numpyro.__version__} numpyro_sg {numpyro_sg_version}".encode())
    return h.hexdigest()[:24]


def key_list(rng_key) -> list:
    """The PRNG key's data as a list (new-style typed keys and raw uint32 keys alike)."""
    if jax.dtypes.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(rng_key)).tolist()
    return np.asarray(rng_key).tolist()


def save(idata, path: Path):
    """Write ``idata`` to ``path`` atomically (a temporary file), record the path; ``idata``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    to_netcdf(idata, tmp)
    tmp.replace(path)
    idata.posterior.attrs["cache_file"] = str(path)
    return idata


# -- comparison -----------------------------------------------------------------------------
