"""Subsample plates of a model: discovery, validation of the mini-batch sizes and of the data.

:func:`subsample_plates` validates the subsample plates found by the model trace
(:func:`numpyro_sg.infer.model_info.trace_model`) and the data in them;
:func:`find_subsample_plates` is the public one-call version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sg.infer.model_info import ModelInfo, trace_model


@dataclass(frozen=True)
class SubsamplePlate:
    """A subsample plate of a model.

    ``size`` is the data size N, ``model_subsample_size`` the plate's own ``subsample_size``
    and ``subsample_size`` the size n the kernels actually draw (the kernel's override, if any).
    """

    name: str
    size: int
    model_subsample_size: int
    subsample_size: int

    @property
    def scale(self) -> float:
        """The N/n factor applied to every site inside the plate."""
        return self.size / self.subsample_size


def find_subsample_plates(model: Callable, model_args=(), model_kwargs=None) -> dict:
    """Return ``{plate_name: (N, n)}`` for every plate of ``model`` that subsamples its data.

    The model is traced once, with the first n indices in each subsample plate.  A plate
    declared with ``subsample_size=N`` counts (it runs full-batch until a kernel's
    ``subsample_size`` says otherwise); a plate without ``subsample_size`` does not.

    **Example:**

    .. code-block:: python

        nsg.find_subsample_plates(model, (X, y))   # {'data': (100000, 1000)}
    """
    return dict(trace_model(model, model_args, model_kwargs).subsample_plates)


def resolve_subsample_size(name, size, model_n, override):
    """The mini-batch size n of plate ``name`` (N = ``size``): the kernel's ``override`` (an int
    or ``{plate: n}``) or the plate's own ``model_n``; an error outside [1, N]."""
    if override is None:
        n = model_n
    elif isinstance(override, dict):
        n = override.get(name, model_n)
    else:
        n = override
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"subsample_size for plate '{name}' must be an int, got {n!r}.")
    n = int(n)
    if n < 1 or n > size:
        raise ValueError(
            f"subsample_size={n} for plate '{name}' is outside [1, N] with N={size} "
            f"(the plate's data size)."
        )
    return n


def _first_bad_index(mask: np.ndarray):
    bad = np.argwhere(~mask)
    return tuple(int(i) for i in bad[0]) if len(bad) else None


def _check_finite_array(value, where):
    if isinstance(value, jax.core.Tracer) or not hasattr(value, "dtype"):
        return
    if not jnp.issubdtype(value.dtype, jnp.inexact):
        return
    if isinstance(value, jax.Array) and len(value.sharding.device_set) > 1:
        # on several devices (or processes): reduce where the data live, fetch a scalar
        if bool(jax.jit(lambda x: jnp.all(jnp.isfinite(x)))(value)):
            return
        first = int(jax.jit(lambda x: jnp.argmin(jnp.isfinite(x).reshape(-1)))(value))
        bad = tuple(int(i) for i in np.unravel_index(first, value.shape))
    else:
        mask = np.isfinite(np.asarray(value))
        if mask.all():
            return
        bad = _first_bad_index(mask)
    raise ValueError(
        f"{where} contains non-finite values (NaN or inf), first at index "
        f"{bad}. Remove or impute them before sampling."
    )


def check_data_finite(info: ModelInfo, plates, model_args=(), model_kwargs=None):
    """Raise if the data the kernels will subsample contains non-finite values.

    Checks floating model arguments whose leading axis has a plate's size N (naming the
    argument and the first bad index) and the full arrays passed to ``numpyro.subsample``
    (recorded by the model trace, so observations picked with ``numpyro.subsample(y)`` are
    checked over all N rows).
    """
    sizes = {p.size: p.name for p in plates}
    named = [(f"positional argument {i}", a) for i, a in enumerate(model_args)]
    named += [(f"keyword argument '{k}'", v) for k, v in (model_kwargs or {}).items()]
    for label, arg in named:
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] not in sizes:
                continue
            where = label + (jax.tree_util.keystr(path) if path else "")
            _check_finite_array(
                leaf, f"Model {where} (data of plate '{sizes[jnp.shape(leaf)[0]]}', shape "
                f"{tuple(jnp.shape(leaf))})",
            )
    for k, value in enumerate(info.subsample_data):
        _check_finite_array(value, f"The data passed to numpyro.subsample call {k} (shape "
                            f"{tuple(jnp.shape(value))})")


def subsample_plates(info: ModelInfo, subsample_size=None, *, check_data=True, model_args=(),
                     model_kwargs=None) -> tuple:
    """Validate the subsample plates of a traced model; return a tuple of :class:`SubsamplePlate`.

    Raises a clear error when the model has no subsample plate, when ``subsample_size`` (an
    int, or ``{plate: n}``) is out of range or names an unknown plate, when a latent site sits
    inside a subsample plate, or (``check_data``) when the data are not finite.
    """
    found = info.subsample_plates
    if not found:
        plain = info.plate_names
        raise ValueError(
            "The model has no subsample plate"
            + (f" (its plates {plain} have no subsample_size)" if plain else "")
            + ". Put the likelihood inside "
            "`with numpyro.plate('data', N, subsample_size=n):` and pick the mini-batch with "
            "`numpyro.subsample(X, event_dim=...)`; the kernels then draw their own indices."
        )
    if isinstance(subsample_size, dict):
        unknown = set(subsample_size) - set(found)
        if unknown:
            raise ValueError(
                f"subsample_size names unknown plate(s) {sorted(unknown)}; the model's "
                f"subsample plates are {sorted(found)}."
            )
    elif subsample_size is not None and len(found) > 1:
        raise ValueError(
            f"The model has several subsample plates {sorted(found)}: pass subsample_size as a "
            "dict {plate_name: size}."
        )
    plates = tuple(
        SubsamplePlate(name, size, n, resolve_subsample_size(name, size, n, subsample_size))
        for name, (size, n) in found.items()
    )
    inside = info.latent_in(found)
    if inside:
        name, plate = inside[0]
        raise ValueError(
            f"Latent site '{name}' is inside subsample plate '{plate}': a local (per-group) "
            "latent variable. The gradient kernels (SGLD, SGBD, SGHMC, SGNHT, pSGLD, BAOAB) "
            "integrate local latents out; this sampler does not support them yet: use one "
            "of those kernels, marginalise the local out, or move the site out of the plate."
        )
    if check_data:
        check_data_finite(info, plates, model_args, model_kwargs)
    return plates


def discover_plates(model, model_args, model_kwargs, subsample_size=None, check_data=True):
    """:func:`subsample_plates` of a model traced here (one trace)."""
    info = trace_model(model, model_args, model_kwargs)
    return subsample_plates(info, subsample_size, check_data=check_data, model_args=model_args,
                            model_kwargs=model_kwargs)
