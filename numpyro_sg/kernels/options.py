"""What every kernel's constructor shares: the mini-batch gradient's options
(:class:`MinibatchOptions`), the argument checks whose errors name the argument
(:func:`check_choice`, :func:`check_positive`), and the path of keywords that moved into an
options object (:func:`moved_options`: they still work, with a ``DeprecationWarning``)."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass

import numpy as np

from numpyro_sg.infer.options import Options

__all__ = ["MinibatchOptions"]


def check_choice(name, value, choices):
    """Raise a ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if not any(value is c or (isinstance(value, str) and value == c) for c in choices):
        raise ValueError(f"{name} must be one of {choices}, got {value!r}.")


def check_positive(name, value):
    """Raise a ValueError naming ``name`` unless ``value`` (a number or array) is positive."""
    if not np.all(np.asarray(value) > 0) or not np.all(np.isfinite(np.asarray(value))):
        raise ValueError(f"{name} must be positive and finite, got {value!r}.")


@dataclass(frozen=True)
class MinibatchOptions(Options):
    """How a kernel draws its mini-batches and estimates the gradient's noise: the kernels'
    ``minibatch_options`` (``None``, a dict of these fields or an instance).

    :param bool replace: draw indices with replacement (default; O(n) per iteration) or without
        replacement, walking epochs (a random permutation of the data per epoch).
    :param bool check_data: check at ``init`` that the data to be subsampled are finite
        (default ``True``).
    :param estimate_noise: compute the gradient-noise sd τ̂ from per-datum gradients (about one
        extra gradient evaluation per iteration); ``None`` (default): the kernel's own default —
        only when its variant or step-size adaptation needs τ̂ (SGLD, SGBD, SGHMC), else off.
        Gradient kernels only.
    :param float noise_ema_weight: β ∈ (0, 1] (default 0.1) of the EMA of the gradient-noise sd,
        τ̂⁽ᵏ⁾ = (1−β)·τ̂⁽ᵏ⁻¹⁾ + β·τ̂_k.  Gradient kernels only.

    >>> MinibatchOptions.of({"replace": False})
    MinibatchOptions(replace=False, check_data=True, estimate_noise=None, noise_ema_weight=0.1)
    """

    replace: bool = True
    check_data: bool = True
    estimate_noise: bool | None = None
    noise_ema_weight: float = 0.1

    ARGUMENT = "minibatch_options"
    LABEL = "mini-batch option"

    def __post_init__(self):
        object.__setattr__(self, "replace", bool(self.replace))
        object.__setattr__(self, "check_data", bool(self.check_data))
        if self.estimate_noise is not None:
            object.__setattr__(self, "estimate_noise", bool(self.estimate_noise))
        if not (np.ndim(self.noise_ema_weight) == 0 and 0.0 < self.noise_ema_weight <= 1.0):
            raise ValueError(f"noise_ema_weight must lie in (0, 1], got {self.noise_ema_weight}.")
        object.__setattr__(self, "noise_ema_weight", float(self.noise_ema_weight))


#: the keywords that moved into ``minibatch_options`` (``{old keyword: (argument, field)}``)
MINIBATCH_MOVES = {name: ("minibatch_options", name)
                   for name in ("replace", "check_data", "estimate_noise", "noise_ema_weight")}
#: those of them every kernel takes (ESGLD and SparseAsync take no others)
SAMPLING_MOVES = {name: MINIBATCH_MOVES[name] for name in ("replace", "check_data")}
#: the site keywords of ESGLD and SparseAsync that moved into ``sites``
#: (:class:`~numpyro_sg.spike_slab.SpikeSlabSites`)
SITE_MOVES = {"indicator": ("sites", "indicator"), "coefficient": ("sites", "coefficient"),
              "effective_name": ("sites", "effective"), "inclusion_name": ("sites", "inclusion")}


def with_field(current, field: str, value, old: str, argument: str):
    """The options argument ``current`` (``None``, a dict or an options instance) with ``field``
    set to ``value``, from the keyword ``old``; a ValueError when ``current`` sets it too (a
    dict's key, an instance's field away from its default)."""
    clash = ValueError(f"{old}= and {argument}={{{field!r}: …}} both give {field}: pass it once, "
                       f"in {argument}.")
    if current is None:
        return {field: value}
    if isinstance(current, dict):
        if field in current:
            raise clash
        return {**current, field: value}
    if dataclasses.is_dataclass(current) and not isinstance(current, type):
        spec = {f.name: f for f in dataclasses.fields(current)}
        if field in spec and getattr(current, field) != spec[field].default:
            raise clash
        return dataclasses.replace(current, **{field: value})
    return current  # not options: the constructor's own check says so


def moved_options(moves: dict):
    """Decorator of a kernel's ``__init__`` for keywords that moved into an options object:
    ``moves`` maps each old keyword to ``(argument, field)``.  The wrapper pops the old keywords,
    warns (``DeprecationWarning``, naming the new place) and sets the field in the argument
    (:func:`with_field`: given twice is a ValueError); ``inspect.signature`` shows the new
    signature (``functools.wraps``).  The mapping is kept as the wrapper's ``moved_options``."""
    def decorate(init):
        @functools.wraps(init)
        def wrapper(self, *args, **kwargs):
            for old in [k for k in kwargs if k in moves]:
                argument, field = moves[old]
                warnings.warn(f"{type(self).__name__}({old}=...) is deprecated: pass "
                              f"{argument}={{{field!r}: ...}}.", DeprecationWarning, stacklevel=2)
                kwargs[argument] = with_field(kwargs.get(argument), field, kwargs.pop(old), old, argument)
            return init(self, *args, **kwargs)

        wrapper.moved_options = dict(moves)
        return wrapper

    return decorate
