"""Mini-batch machinery: the single home for subsample plates in ``numpyro_sg``.

Everything the stochastic-gradient kernels need to know about a model's data lives here:

* :func:`find_subsample_plates` discovers the subsample plates of a model and their ``(N, n)``;
* :func:`with_indices` runs a model with chosen data indices in its plates (the N/n scale
  follows the length of the index array actually used);
* :class:`Minibatcher` draws those indices inside ``jit`` in O(n) per iteration (with
  replacement, the default, or without replacement by walking a per-epoch permutation) and
  evaluates the scaled mini-batch log density, its gradient, the full-data log density and
  score, and per-datum gradients on NumPyro's unconstrained space.

Conventions (SPEC §2): log π(θ) = log p(θ) + Σ_i log f(x_i | θ); the mini-batch estimator
ĝ(θ) = ∇ log p(θ) + (N/n) Σ_{i∈S} ∇ log f(x_i | θ) is the gradient of the model's log density
traced with index set S.  The gradient-noise sd of coordinate j is the sd of the estimator,
τ̂_j = (N/√n)·sd_{i∈S}(∂_j log f(x_i | θ)), times √(1 − n/N) without replacement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.distributions.distribution import validation_enabled
from numpyro.handlers import seed, trace
from numpyro.infer.util import potential_energy
from numpyro.primitives import Messenger

__all__ = [
    "SubsamplePlate",
    "find_subsample_plates",
    "discover_plates",
    "draw_with_replacement",
    "draw_without_replacement",
    "with_indices",
    "full_data",
    "deterministic_in_plates",
    "Minibatcher",
    "BatchState",
]


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


class with_indices(Messenger):
    """Handler: run ``fn`` with the given data indices in its plates.

    ``indices`` maps plate names to integer index arrays.  The plate's ``subsample_size`` is
    set to the length of the array, so NumPyro scales every site in the plate by
    N/len(indices) without a size-mismatch warning.
    """

    def __init__(self, fn: Callable | None = None, indices: dict | None = None):
        self.indices = dict(indices or {})
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] in self.indices:
            idx = self.indices[msg["name"]]
            msg["value"] = idx
            msg["args"] = (msg["args"][0], int(jnp.shape(idx)[0]))


class _without_plate_sites(Messenger):
    """Handler giving weight 0 to every sample site inside the named plates."""

    def __init__(self, fn=None, plate_names=()):
        self.plate_names = set(plate_names)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and self.plate_names.intersection(_plates_of(msg)):
            msg["scale"] = 0.0


def full_data(model: Callable, plates) -> Callable:
    """``model`` with every subsample plate in ``plates`` run over all of its data."""
    return with_indices(model, {p.name: jnp.arange(p.size) for p in plates})


class _first_indices(Messenger):
    """Handler filling every subsample plate with indices 0..n−1 (skips NumPyro's O(N) draw)."""

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["value"] is None:
            msg["value"] = jnp.arange(msg["args"][1])


def _trace_model(model, model_args, model_kwargs, rng_seed=0):
    # Distribution validation off: bad data must reach our checks, which name the argument.
    with validation_enabled(False):
        return trace(_first_indices(seed(model, rng_seed=rng_seed))).get_trace(
            *model_args, **(model_kwargs or {})
        )


def _plates_of(site) -> list[str]:
    return [frame.name for frame in site.get("cond_indep_stack", [])]


def _subsample_plates_in(tr) -> dict:
    """``{name: (N, n)}`` for the plates of a trace declared with a ``subsample_size``.

    A plate declared with ``subsample_size=N`` counts (it runs full-batch until a kernel's
    ``subsample_size`` says otherwise); a plate without ``subsample_size`` does not, since the
    model then indexes its data directly.
    """
    out = {}
    for name, site in tr.items():
        if site["type"] == "plate" and site["args"][1] is not None:
            out[name] = (int(site["args"][0]), int(site["args"][1]))
    return out


def find_subsample_plates(model: Callable, model_args=(), model_kwargs=None) -> dict:
    """Return ``{plate_name: (N, n)}`` for every plate of ``model`` that subsamples its data.

    The model is traced once, with the first n indices in each subsample plate.
    """
    return _subsample_plates_in(_trace_model(model, model_args, model_kwargs))


def _resolve_subsample_size(name, size, model_n, override):
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


def _leading_dim_is_plate(site, plate_name):
    for frame in site.get("cond_indep_stack", []):
        if frame.name == plate_name:
            return frame.dim
    return None


def _first_bad_index(mask: np.ndarray):
    bad = np.argwhere(~mask)
    return tuple(int(i) for i in bad[0]) if len(bad) else None


def _check_data_finite(model, plates, model_args, model_kwargs):
    """Raise if the data the kernels will subsample contains non-finite values.

    Checks (1) floating model arguments whose leading axis has a plate's size N, (2) the
    observed values of every site inside a subsample plate, over the full data.
    """
    sizes = {p.size: p.name for p in plates}
    named = [(f"positional argument {i}", a) for i, a in enumerate(model_args)]
    named += [(f"keyword argument '{k}'", v) for k, v in (model_kwargs or {}).items()]
    for label, arg in named:
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            if isinstance(leaf, jax.core.Tracer):
                continue
            if not hasattr(leaf, "dtype") or not jnp.issubdtype(leaf.dtype, jnp.inexact):
                continue
            if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] not in sizes:
                continue
            mask = np.isfinite(np.asarray(leaf))
            if not mask.all():
                where = label + (jax.tree_util.keystr(path) if path else "")
                raise ValueError(
                    f"Model {where} (data of plate '{sizes[jnp.shape(leaf)[0]]}', shape "
                    f"{tuple(jnp.shape(leaf))}) contains non-finite values (NaN or inf), first "
                    f"at index {_first_bad_index(mask)}. Remove or impute them before sampling."
                )
    tr = _trace_model(full_data(model, plates), model_args, model_kwargs)
    names = {p.name for p in plates}
    for name, site in tr.items():
        if site["type"] != "sample" or not site["is_observed"]:
            continue
        if not names.intersection(_plates_of(site)):
            continue
        value = site["value"]
        if isinstance(value, jax.core.Tracer) or not jnp.issubdtype(
            jnp.result_type(value), jnp.inexact
        ):
            continue
        mask = np.isfinite(np.asarray(value))
        if not mask.all():
            raise ValueError(
                f"Observed site '{name}' contains non-finite values (NaN or inf), first at "
                f"index {_first_bad_index(mask)}. Remove or impute them before sampling."
            )


def discover_plates(model, model_args, model_kwargs, subsample_size=None, check_data=True):
    """Find and validate the subsample plates used by the kernels.

    Returns a tuple of :class:`SubsamplePlate`.  Raises a clear error when the model has no
    subsample plate, when ``subsample_size`` is out of range or names an unknown plate, when a
    latent site sits inside a subsample plate, or (``check_data``) when the data are not finite.
    """
    tr = _trace_model(model, model_args, model_kwargs)
    found = _subsample_plates_in(tr)
    if not found:
        plain = [name for name, site in tr.items() if site["type"] == "plate"]
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
        SubsamplePlate(name, size, n, _resolve_subsample_size(name, size, n, subsample_size))
        for name, (size, n) in found.items()
    )
    for name, site in tr.items():
        if site["type"] == "sample" and not site["is_observed"]:
            inside = set(_plates_of(site)) & set(found)
            if inside:
                raise ValueError(
                    f"Latent site '{name}' is inside subsample plate '{sorted(inside)[0]}'. "
                    "Local (per-datum) latent variables are not supported by the "
                    "stochastic-gradient kernels: marginalise them out or move the site out "
                    "of the plate."
                )
    if check_data:
        _check_data_finite(model, plates, model_args, model_kwargs)
    return plates


def deterministic_in_plates(model, plates, model_args=(), model_kwargs=None) -> bool:
    """True when a deterministic site of ``model`` sits inside one of the subsample ``plates``
    (its value then depends on which data the plate holds)."""
    names = {p.name for p in plates}
    tr = _trace_model(model, model_args, model_kwargs)
    return any(
        site["type"] == "deterministic" and names.intersection(_plates_of(site))
        for site in tr.values()
    )


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

    O(n) per draw, plus an O(N) permutation once per epoch (amortised O(n)).
    """
    size = batch.perm.shape[0]

    def reshuffle(_):
        return BatchState(random.permutation(key, size).astype(jnp.int32), jnp.int32(0))

    batch = jax.lax.cond(batch.pos + n > size, reshuffle, lambda b: b, batch)
    idx = jax.lax.dynamic_slice(batch.perm, (batch.pos,), (n,))
    return idx, BatchState(batch.perm, batch.pos + n)


class Minibatcher:
    """Index drawing and (mini-batch / full-data / per-datum) log densities for one model.

    All log densities are on NumPyro's unconstrained space and include the Jacobian of the
    constraining transforms, exactly as NumPyro's ``potential_energy`` (whose negative they are).
    The object holds only static metadata, so it is safe to build under ``pmap``/``vmap``.
    """

    def __init__(self, model: Callable, plates, replace: bool = True):
        self.model = model
        self.plates = tuple(plates)
        self.replace = bool(replace)

    # -- indices ---------------------------------------------------------------------------
    def init_batch_state(self, rng_key):
        """Batch state (one :class:`BatchState` per plate without replacement, else ``None``)."""
        if self.replace:
            return None
        keys = random.split(rng_key, len(self.plates))
        return {
            p.name: BatchState(random.permutation(k, p.size).astype(jnp.int32), jnp.int32(0))
            for p, k in zip(self.plates, keys)
        }

    def draw(self, rng_key, batch_state):
        """Draw one mini-batch of indices per plate: ``(indices, new_batch_state)``."""
        keys = random.split(rng_key, len(self.plates))
        indices, new_state = {}, {} if batch_state is not None else None
        for p, k in zip(self.plates, keys):
            if self.replace:
                indices[p.name] = draw_with_replacement(k, p.size, p.subsample_size)
            else:
                idx, new_state[p.name] = draw_without_replacement(
                    k, batch_state[p.name], p.subsample_size
                )
                indices[p.name] = idx
        return indices, new_state

    def full_indices(self):
        return {p.name: jnp.arange(p.size, dtype=jnp.int32) for p in self.plates}

    # -- log densities ---------------------------------------------------------------------
    def log_density_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``(params, indices) -> log density`` on the unconstrained space.

        With mini-batch indices this is log p(θ) + (N/n)·Σ_{i∈S} log f(x_i|θ) (+ log-Jacobian);
        with :meth:`full_indices` it is the exact full-data log posterior (up to a constant).
        """
        model_kwargs = model_kwargs or {}

        def log_density(params, indices):
            return -potential_energy(
                with_indices(self.model, indices), model_args, model_kwargs, params
            )

        return log_density

    def value_grad_noise(self, log_density, params, indices):
        """Log density, ĝ and the gradient-noise sd τ̂ from per-datum gradients (flat).

        ``log_density(params, indices)`` is a log density as returned by
        :meth:`log_density_fn` (``params`` any pytree).  Evaluates it on one datum at a time
        (plate index set of size one, scale N), vectorised with ``jax.vmap`` over the n indices: O(n·d).  Each
        such gradient is g_i = ∇ log p(θ) + N ∇ log f(x_i|θ), so ĝ = mean_i g_i and
        τ̂ = sd_i(g_i)/√n = (N/√n)·sd_i(∇ log f(x_i|θ)) (× √(1 − n/N) without replacement);
        the mean of the per-datum values is the mini-batch log density.  Gradients come back
        raveled to flat vectors.  Requires a single subsample plate.
        """
        (plate,) = self.plates
        idx = indices[plate.name]
        n = idx.shape[0]

        def one(i):
            value, grad = jax.value_and_grad(log_density)(params, {plate.name: i[None]})
            return value, ravel_pytree(grad)[0]

        values, g = jax.vmap(one)(idx)
        tau = jnp.std(g, axis=0, ddof=1 if n > 1 else 0) / jnp.sqrt(n)
        if not self.replace:
            tau = tau * jnp.sqrt(1.0 - n / plate.size)
        return values.mean(), g.mean(0), tau

    def per_datum_loglik_grads(self, params, indices, model_args=(), model_kwargs=None):
        """Gradients ∇_θ log f(x_i | θ) of each datum's log-likelihood, shape (n, …) per site.

        O(n·d): the per-datum model gradient g_i = ∇ log p(θ) + N ∇ log f(x_i|θ) is computed by
        ``vmap`` over one-datum index sets, and the prior part removed.
        """
        model_kwargs = model_kwargs or {}
        log_density = self.log_density_fn(model_args, model_kwargs)
        (plate,) = self.plates
        idx = indices[plate.name]
        names = {plate.name}

        def log_prior(p):  # the same density with every site inside the plate given weight 0
            return -potential_energy(
                _without_plate_sites(with_indices(self.model, {plate.name: idx[:1]}), names),
                model_args,
                model_kwargs,
                p,
            )

        g_prior = jax.grad(log_prior)(params)

        def one(i):
            return jax.grad(log_density)(params, {plate.name: i[None]})

        g = jax.vmap(one)(idx)
        return jax.tree.map(lambda gi, gp: (gi - gp) / plate.size, g, g_prior)
