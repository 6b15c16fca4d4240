"""Mini-batch machinery: the single home for subsample plates and gradient estimates.

Everything the stochastic-gradient kernels need to know about a model's data lives here:

* :func:`subsample_plates` validates the subsample plates found by the model trace
  (:func:`numpyro_sg.infer.model_info.trace_model`) and the data in them; :func:`find_subsample_plates`
  is the public one-call version;
* :func:`with_indices` runs a model with chosen data indices in its plates (the N/n scale
  follows the length of the index array actually used), :func:`full_data` with all of them;
* :class:`Minibatcher` draws those indices inside ``jit`` in O(n) per iteration (with
  replacement, the default, or without replacement by walking a per-epoch permutation) and
  evaluates the scaled mini-batch log density, its gradient — plain, or with control variates
  around an :class:`Anchor` — and the gradient-noise sd from per-datum gradients, or, at large
  n·d, from the spread of k group-mean gradients (:func:`noise_groups`: memory O(n + k·d)).

Conventions (SPEC §2): log π(θ) = log p(θ) + Σ_i log f(x_i | θ); the mini-batch estimator
ĝ(θ) = ∇ log p(θ) + (N/n) Σ_{i∈S} ∇ log f(x_i | θ) is the gradient of the model's log density
traced with index set S.  The control-variate estimator (Baker et al. 2019) is
ĝ_cv(θ) = ∇ log π(θ̂) + ĝ(θ) − ĝ(θ̂) with the same S, θ̂ the anchor and ∇ log π(θ̂) its
full-data gradient.  The gradient-noise sd of coordinate j is the sd of the estimator,
τ̂_j = (N/√n)·sd_{i∈S}(∂_j log f(x_i | θ)) (of the differences ∂_j log f(x_i|θ) − ∂_j log f(x_i|θ̂)
with control variates), times √(1 − n/N) without replacement.

At large n·d the n×d matrix of per-datum gradients is not affordable (d = 10⁵, n = 1,000:
400 MB per step).  The batch S is then split into k disjoint groups S_1..S_k of m = n/k indices
and each group's estimator g_g = ∇ log p(θ) + (N/m) Σ_{i∈S_g} ∇ log f(x_i | θ) is evaluated
(a ``vmap`` over k index sets: memory O(n + k·d)).  Their mean is ĝ exactly, and
Var(g_g) = N²σ²/m = k·Var(ĝ), so τ̂_j = sd_g(g_{g,j})/√k — the per-datum formula with datum →
group (k = n recovers it).  It has k − 1 degrees of freedom instead of n − 1; the kernels
smooth τ̂ with an EMA over iterations (``noise_ema_weight``), which restores the precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import potential_energy
from numpyro.primitives import Messenger

from numpyro_sg.infer.model_info import ModelInfo, plates_of, trace_model

__all__ = [
    "SubsamplePlate",
    "find_subsample_plates",
    "subsample_plates",
    "resolve_subsample_size",
    "discover_plates",
    "check_data_finite",
    "draw_with_replacement",
    "draw_without_replacement",
    "with_indices",
    "full_data",
    "without_plate_sites",
    "mask_plate_rows",
    "Minibatcher",
    "BatchState",
    "Anchor",
    "GradientEstimate",
    "jit_with_data",
    "noise_groups",
    "MAX_GROUPS",
    "PER_DATUM_MAX",
]

#: the group-mean noise estimate uses at most this many groups (largest divisor of n up to it)
MAX_GROUPS = 16
#: per-datum gradients (exact small-d behaviour) while n·d is at most this (4 MB of float32)
PER_DATUM_MAX = 1_000_000


def noise_groups(n: int, d: int, groups: int | None = None) -> int:
    """Number k of groups the batch of n indices is split into for the gradient-noise sd τ̂.

    ``groups`` forces k (it must divide n).  By default k = n (per-datum gradients, exact)
    while n·d ≤ :data:`PER_DATUM_MAX`; above, the largest divisor of n in [4, MAX_GROUPS]
    (memory O(k·d) instead of O(n·d)); when n has none (e.g. n prime) k = n with a warning-free
    fall-back to per-datum gradients — choose n with a small divisor (any multiple of 4 works).

    >>> noise_groups(1000, 10), noise_groups(1000, 50_000), noise_groups(800, 10**5, 10)
    (1000, 10, 10)
    """
    if groups is not None:
        groups = int(groups)
        if groups < 2 or n % groups:
            raise ValueError(f"noise groups must be ≥ 2 and divide the batch size n={n}; got {groups}.")
        return groups
    if n * d <= PER_DATUM_MAX:
        return n
    for k in range(min(MAX_GROUPS, n), 3, -1):
        if n % k == 0:
            return k
    return n


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

    **Example:**

    .. code-block:: python

        with_indices(model, {"data": jnp.arange(10)})(X, y)   # the first 10 rows, scale N/10
    """

    def __init__(self, fn: Callable | None = None, indices: dict | None = None):
        self.indices = dict(indices or {})
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] in self.indices:
            idx = self.indices[msg["name"]]
            msg["value"] = idx
            msg["args"] = (msg["args"][0], int(jnp.shape(idx)[0]))


class without_plate_sites(Messenger):
    """Handler giving weight 0 to every sample site inside the named plates (the prior alone)."""

    def __init__(self, fn=None, plate_names=()):
        self.plate_names = set(plate_names)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and self.plate_names.intersection(plates_of(msg)):
            msg["scale"] = 0.0


class mask_plate_rows(Messenger):
    """Handler masking rows of a plate: ``mask`` (n,) multiplies the log-likelihood of every
    sample site inside plate ``plate_name`` row by row (False drops the row)."""

    def __init__(self, fn=None, plate_name=None, mask=None):
        self.plate_name = plate_name
        self.mask = mask
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "sample":
            return
        for frame in msg.get("cond_indep_stack", []):
            if frame.name == self.plate_name:
                mask = jnp.reshape(self.mask, jnp.shape(self.mask) + (1,) * (-frame.dim - 1))
                msg["fn"] = msg["fn"].mask(mask)


def full_data(model: Callable, plates) -> Callable:
    """``model`` with every subsample plate in ``plates`` run over all of its data."""
    return with_indices(model, {p.name: jnp.arange(p.size) for p in plates})


# -------------------------------------------------------------------------------------------
# plates: discovery and validation
# -------------------------------------------------------------------------------------------
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
    mask = np.isfinite(np.asarray(value))
    if not mask.all():
        raise ValueError(
            f"{where} contains non-finite values (NaN or inf), first at index "
            f"{_first_bad_index(mask)}. Remove or impute them before sampling."
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
            f"Latent site '{name}' is inside subsample plate '{plate}'. "
            "Local (per-datum) latent variables are not supported by the "
            "stochastic-gradient kernels: marginalise them out or move the site out "
            "of the plate."
        )
    if check_data:
        check_data_finite(info, plates, model_args, model_kwargs)
    return plates


def discover_plates(model, model_args, model_kwargs, subsample_size=None, check_data=True):
    """:func:`subsample_plates` of a model traced here (one trace)."""
    info = trace_model(model, model_args, model_kwargs)
    return subsample_plates(info, subsample_size, check_data=check_data, model_args=model_args,
                            model_kwargs=model_kwargs)


def jit_with_data(fn, model_args, model_kwargs):
    """``jax.jit`` of ``fn(*args, model_args, model_kwargs)`` with the data as arguments.

    Array leaves of the model arguments (the data) are passed to the compiled program as
    arguments rather than baked into it as constants (which is slow to compile for large
    data, SPEC §11); other leaves stay static.  Returns ``g(*args) = fn(*args, model_args,
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


# -------------------------------------------------------------------------------------------
# index drawing
# -------------------------------------------------------------------------------------------
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


# -------------------------------------------------------------------------------------------
# gradient estimates
# -------------------------------------------------------------------------------------------
class Anchor(NamedTuple):
    """The control-variate anchor: a point θ̂ (flat) and the full-data gradient ∇ log π(θ̂)."""

    point: Any
    grad: Any


class GradientEstimate(NamedTuple):
    """A stochastic gradient at a point: ``value`` the mini-batch log density estimate,
    ``grad`` ĝ (flat), ``noise_sd`` τ̂ per coordinate of the working frame (NaN if not
    estimated)."""

    value: Any
    grad: Any
    noise_sd: Any


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
        """All N indices of every plate."""
        return {p.name: jnp.arange(p.size, dtype=jnp.int32) for p in self.plates}

    @property
    def fraction_unsampled(self) -> float:
        """1 − n/N of the (single) plate without replacement, 1 with replacement: the finite
        population correction of the noise variance."""
        if self.replace:
            return 1.0
        (plate,) = self.plates
        return 1.0 - plate.subsample_size / plate.size

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

    def value_grad_noise(self, log_density, params, indices, anchor: Anchor | None = None,
                         to_working: Callable | None = None, groups: int | None = None):
        """Log density, ĝ and the gradient-noise sd τ̂ from per-datum (or per-group) gradients.

        ``log_density(params, indices)`` is a log density as returned by
        :meth:`log_density_fn` (``params`` any pytree; a flat vector when ``anchor`` is given).  Evaluates it on one datum at a time
        (plate index set of size one, scale N), vectorised with ``jax.vmap`` over the n
        indices: O(n·d).  Each such gradient is g_i = ∇ log p(θ) + N ∇ log f(x_i|θ), so
        ĝ = mean_i g_i and τ̂ = sd_i(g_i)/√n = (N/√n)·sd_i(∇ log f(x_i|θ)) (× √(1 − n/N)
        without replacement); the mean of the per-datum values is the mini-batch log
        density.  With an ``anchor`` the per-datum differences g_i(θ) − g_i(θ̂) give the
        control-variate ĝ_cv = ∇ log π(θ̂) + mean_i (g_i(θ) − g_i(θ̂)) and its noise.
        ``to_working`` maps the (n, d) per-datum gradients into the working frame of a
        preconditioner before their sd is taken.  Requires a single subsample plate.

        ``groups`` k (see :func:`noise_groups`; default k = n, per datum): the n indices are
        split into k disjoint groups of n/k and the same formulas apply to the k group
        estimators (τ̂ = sd_g(g_g)/√k): memory O(n + k·d) instead of O(n·d).
        """
        (plate,) = self.plates
        idx = indices[plate.name]
        n = idx.shape[0]
        k = n if groups is None else int(groups)
        if n % k:
            raise ValueError(f"noise groups k={k} must divide the batch size n={n}.")
        idx = idx.reshape(k, n // k)

        def one(p, i):
            value, grad = jax.value_and_grad(log_density)(p, {plate.name: i})
            return value, ravel_pytree(grad)[0]

        def per_datum(p):
            return jax.vmap(lambda i: one(p, i))(idx)

        if anchor is None:
            values, g = per_datum(params)
            ghat = g.mean(0)
        else:  # params flat here: θ and θ̂ in one vectorised evaluation
            values, g2 = jax.vmap(per_datum)(jnp.stack([params, anchor.point]))
            values, g = values[0], g2[0] - g2[1]
            ghat = anchor.grad + g.mean(0)
        value = values.mean()
        g_work = g if to_working is None else to_working(g)
        tau = jnp.std(g_work, axis=0, ddof=1 if k > 1 else 0) / jnp.sqrt(k)
        tau = tau * jnp.sqrt(self.fraction_unsampled)
        return value, ghat, tau

    def estimate(self, flat_log_density, flat, indices, *, anchor: Anchor | None = None,
                 noise: bool = False, to_working: Callable | None = None,
                 groups: int | None = None) -> GradientEstimate:
        """The stochastic gradient at the flat point ``flat`` on the mini-batch ``indices``.

        ``flat_log_density(x, indices)`` takes a flat unconstrained vector.  Plain (``anchor``
        ``None``): ĝ = ∇ of the mini-batch log density.  With an :class:`Anchor`: the
        control-variate ĝ_cv = ∇ log π(θ̂) + ĝ(θ) − ĝ(θ̂) on the same indices (both points in
        one vectorised evaluation).  ``noise=True`` adds τ̂ from per-datum gradients (see
        :meth:`value_grad_noise`, with ``groups`` groups; default :func:`noise_groups`);
        otherwise ``noise_sd`` is NaN.
        """
        if noise:
            (plate,) = self.plates
            k = noise_groups(plate.subsample_size, flat.shape[0], groups)
            value, grad, tau = self.value_grad_noise(
                flat_log_density, flat, indices, anchor=anchor, to_working=to_working, groups=k
            )
            return GradientEstimate(value, grad, tau)
        vg = jax.value_and_grad(flat_log_density)
        if anchor is None:
            value, grad = vg(flat, indices)
        else:
            values, grads = jax.vmap(vg, in_axes=(0, None))(jnp.stack([flat, anchor.point]), indices)
            value, grad = values[0], anchor.grad + grads[0] - grads[1]
        return GradientEstimate(value, grad, jnp.full_like(flat, jnp.nan))

    def score_estimator(self, unravel, anchor: Anchor | None, batch_size: int, model_args=(),
                        model_kwargs=None) -> Callable:
        """``(X (T, d), rng_key) → Ŝ (T, d)``: an unbiased estimate of ∇ log π at each row of X.

        Row t gets its own mini-batch B_t of ``batch_size`` indices per plate (with
        replacement; the plate's full data when N ≤ ``batch_size``, then Ŝ is exact), so the
        noise is independent across rows — what the stochastic Stein discrepancy (Gorham, Raj
        & Mackey 2020) needs.  With an :class:`Anchor` the control-variate form
        ŝ(x) = ∇ log π(θ̂) + ĝ_B(x) − ĝ_B(θ̂) (:meth:`estimate`), whose noise vanishes as x → θ̂;
        without, the plain mini-batch gradient.  Cost O(T·batch_size·d); compiled once, the
        data passed as arguments (:func:`jit_with_data`).
        """
        sizes = {p.name: (p.size, min(int(batch_size), p.size)) for p in self.plates}

        def estimate_all(X, rng_key, model_args, model_kwargs):
            log_density = self.log_density_fn(model_args, model_kwargs)

            def flat_log_density(x, idx):
                return log_density(unravel(x), idx)

            def one(x, key):
                keys = random.split(key, len(sizes))
                idx = {name: draw_with_replacement(k, N, n) if n < N else jnp.arange(N, dtype=jnp.int32)
                       for (name, (N, n)), k in zip(sizes.items(), keys)}
                return self.estimate(flat_log_density, x, idx, anchor=anchor).grad

            return jax.vmap(one)(X, random.split(rng_key, X.shape[0]))

        return jit_with_data(estimate_all, model_args, model_kwargs)

    def prior_log_density_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``params -> log p(θ)`` (+ log-Jacobian): the model with every site inside the
        subsample plates given weight 0 (the plates run on one datum)."""
        model_kwargs = model_kwargs or {}
        names = {p.name for p in self.plates}
        one = {p.name: jnp.arange(1, dtype=jnp.int32) for p in self.plates}

        def prior_log_density(params):
            return -potential_energy(without_plate_sites(with_indices(self.model, one), names),
                                     model_args, model_kwargs, params)

        return prior_log_density

    def fisher_diagonal(self, log_density, prior_log_density, x, indices, group_size: int = 8,
                        block: int = 64):
        """Diagonal of the (centred) Fisher information N·Var_i(∇ log f(x_i | θ)) of the
        likelihood at the flat point ``x``, from the rows ``indices`` (one plate).

        The rows are split into G groups of c = ``group_size``; each group's gradient gives
        its likelihood sum L_g = (c/N)·(ĝ_g − ∇ log p) and Var_g(L_g) = c·Var_i(∇ log f_i)
        (rows drawn at random: cross terms between two rows of a group average out in the
        centred variance), so the estimate is N·Var_g(L_g)/c per coordinate.  Unlike a
        Hutchinson estimate of diag(H) it has no cross-coordinate noise (a coordinate's
        estimate involves only the rows that touch it), so it stays positive and accurate
        for coupled coordinates (matrix factorisation).  Groups are visited ``block`` at a
        time in a ``lax.scan``: memory O(block·d), never O(N·d).  G is rounded down to a
        multiple of ``block`` (all rows when there are fewer than c·block of them).

        ``log_density(x, indices)`` and ``prior_log_density(x)`` take the flat point.
        """
        (plate,) = self.plates
        N = plate.size
        idx = indices[plate.name]
        c = int(max(1, min(group_size, idx.shape[0] // 2)))
        G = idx.shape[0] // c
        B = int(min(block, G))
        nb = G // B
        groups = idx[: nb * B * c].reshape(nb, B, c)
        g_prior = jax.grad(prior_log_density)(x)

        def body(carry, blk):
            s1, s2 = carry
            g = jax.vmap(lambda i: jax.grad(log_density)(x, {plate.name: i}))(blk)
            L = (g - g_prior) * (c / N)
            return (s1 + L.sum(0), s2 + (L**2).sum(0)), None

        zeros = jnp.zeros_like(x)
        (s1, s2), _ = jax.lax.scan(body, (zeros, zeros), groups)
        n_groups = nb * B
        var = (s2 - s1**2 / n_groups) / max(n_groups - 1, 1)
        return N * jnp.maximum(var, 0.0) / c

    def full_value_and_grad_fn(self, unravel, model_args=(), model_kwargs=None,
                               chunk_size: int = 65536) -> Callable:
        """``x -> (log π(x), ∇ log π(x))`` over all the data, for a flat point x.

        With one subsample plate the data are visited in chunks of ``chunk_size`` rows inside
        a ``lax.scan`` (memory O(chunk·d), never O(N·d)); the last chunk is padded and its
        padding masked out.  The prior is evaluated once, as an extra chunk with every row
        masked, and Σ_chunks (C/N)·(chunk log density − prior) + prior is the exact full-data
        log density.  With several plates all data are used at once.
        """
        model_kwargs = model_kwargs or {}
        if len(self.plates) != 1:
            log_density = self.log_density_fn(model_args, model_kwargs)
            full = self.full_indices()
            return jax.value_and_grad(lambda x: log_density(unravel(x), full))
        (plate,) = self.plates
        N = plate.size
        C = int(min(chunk_size, N))
        K = -(-N // C)
        starts = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.arange(K, dtype=jnp.int32) * C])
        include = jnp.arange(K + 1) > 0  # chunk 0: the prior alone (every row masked)

        def chunk_log_density(x, start, inc):
            idx = start + jnp.arange(C, dtype=jnp.int32)
            mask = (idx < N) & inc
            model = mask_plate_rows(with_indices(self.model, {plate.name: jnp.minimum(idx, N - 1)}),
                                    plate.name, mask)
            return -potential_energy(model, model_args, model_kwargs, unravel(x))

        def value_and_grad(x):
            def body(_, chunk):
                return None, jax.value_and_grad(chunk_log_density)(x, *chunk)

            _, (values, grads) = jax.lax.scan(body, None, (starts, include))
            value = values[0] + (C / N) * jnp.sum(values[1:] - values[0])
            grad = grads[0] + (C / N) * jnp.sum(grads[1:] - grads[0], axis=0)
            return value, grad

        return value_and_grad

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
                without_plate_sites(with_indices(self.model, {plate.name: idx[:1]}), names),
                model_args,
                model_kwargs,
                p,
            )

        g_prior = jax.grad(log_prior)(params)

        def one(i):
            return jax.grad(log_density)(params, {plate.name: i[None]})

        g = jax.vmap(one)(idx)
        return jax.tree.map(lambda gi, gp: (gi - gp) / plate.size, g, g_prior)
