"""SparseAsync's options: their checks (an option that does not apply to the chosen variant is
an error, not silently ignored), and the static :class:`Plan` resolved from them and the model
at ``init``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from jax import lax

from numpyro_sg.infer.options import Options
from numpyro_sg.kernels.options import check_choice, check_positive
from numpyro_sg.spike_slab import SpikeSlab

VARIANTS = ("exact", "async", "sgld")
INNERS = ("auto", "gaussian", "mala")
TAYLORS = (None, "first", "sensitive", "second")
POINTS = (None, "current", "excluded")
FAST_PATHS = ("auto", "glm", "generic")


@dataclass(frozen=True)
class SparseAsyncOptions(Options):
    """The options of :class:`~numpyro_sg.SparseAsync` beyond its direct arguments: its
    ``options`` (``None``, a dict of these fields or an instance), validated on construction
    (whether they apply to the chosen variant is the kernel's check).

    :param str inner: STEP 1 move for ``"exact"``/``"async"``: ``"gaussian"`` (Gaussian
        likelihood with a fixed scale through X·β and a Normal slab), ``"mala"``, or ``"auto"``
        (default: gaussian when it applies, else MALA).  Not an option of ``"sgld"``.
    :param taylor: Q_j of the asynchronous update: ``None`` (default: ``"second"``),
        ``"second"`` (Q = ±½θ_j²·abs(∂²ℓ/∂β_j²), exact for a Gaussian likelihood, one more
        O(n·J) product), ``"first"`` (Q = 0) or ``"sensitive"`` (Q = ½θ_j²G_j², the paper's eq.
        (6)).  The paper's two are accurate only when the spike's precision is at least the
        likelihood's curvature abs(∂²ℓ/∂β_j²) (its prior ρ0 = N with columns scaled to ‖X_j‖² =
        N); with a wider spike they bias the inclusion probabilities (see
        ``docs/sparse_async.md``).
    :param async_point: where G is evaluated: ``None`` or ``"current"`` (default; β = θ·(δ ∨
        1_J), the authors' code) or ``"excluded"`` (the chosen ones off; the paper's eq. (7)).
    :param max_active: static size of the active-set index list of the fast path (an int ≥ 1;
        default ``None``: min(p, 256)); exceeding it is an error that names this option.
    :param str fast_path: ``"auto"`` (default), ``"glm"`` (require the GLM fast path; an error
        says why it does not apply) or ``"generic"`` (dense evaluation of the model).

    >>> SparseAsyncOptions.of({"taylor": "first"}).taylor
    'first'
    """

    inner: str = "auto"
    taylor: str | None = None
    async_point: str | None = None
    max_active: int | None = None
    fast_path: str = "auto"

    LABEL = "SparseAsync option"

    def __post_init__(self):
        check_int("max_active", self.max_active)
        check_choice("inner", self.inner, INNERS)
        check_choice("taylor", self.taylor, TAYLORS)
        check_choice("async_point", self.async_point, POINTS)
        check_choice("fast_path", self.fast_path, FAST_PATHS)
        if self.max_active is not None and self.fast_path == "generic":
            raise ValueError("max_active applies to the GLM fast path; fast_path='generic' turns it off.")


class SparseAsyncSettings(NamedTuple):
    """Everything :class:`~numpyro_sg.SparseAsync`'s constructor was given, as its checks and
    :func:`~numpyro_sg.kernels.sparse_async.setup.make_plan` read it: the direct arguments and
    the fields of :class:`SparseAsyncOptions` (``None``: the default; ``replace`` ``None`` when
    not given)."""

    step_size: Any = None
    variant: str = "async"
    update_size: Any = None
    inner: str = "auto"
    taylor: Any = None
    async_point: Any = None
    max_active: Any = None
    adapt_step_size: Any = None
    target_accept_prob: Any = None
    fast_path: str = "auto"
    subsample_size: Any = None
    replace: Any = None


@dataclass(frozen=True)
class Plan:
    """Static metadata of a kernel, resolved at ``init`` from the options and the model.

    ``row_axes``: the mesh axes the data rows are split over (``None`` on one device); the
    step then runs on every shard's rows (``ss`` sees the local plate) and :meth:`total` sums
    over the shards."""

    ss: SpikeSlab
    variant: str
    inner: str  # "gaussian", "mala" or "sgld"
    taylor: str | None  # None for "exact"
    point: str
    update_size: int  # J
    max_active: int  # m
    buckets: tuple
    fast: bool
    adapt: bool
    target: float
    step_size: float  # initial ε
    effective_name: str
    row_axes: tuple | None = None

    def total(self, x):
        """``x`` (a pytree of sums over this device's data rows) summed over the data shards:
        one ``psum`` over ``row_axes`` on a mesh, ``x`` itself on one device."""
        return x if self.row_axes is None else lax.psum(x, self.row_axes)


def bucket_sizes(m):
    """The static block sizes of the fast path: 8, 16, 32, … below m, then m."""
    sizes, b = [], 8
    while b < m:
        sizes.append(b)
        b *= 2
    sizes.append(m)
    return tuple(sizes)


def check_int(name, value, hint=""):
    """Raise unless ``value`` is None or an int ≥ 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int ≥ 1{hint}, got {value!r}.")


def check_step_options(kind, given: dict, why: str = ""):
    """Raise when options of the MALA / SGLD step are given where STEP 1 has none of them."""
    if kind == "gaussian":
        bad = [k for k, v in given.items() if v is not None]
        if bad:
            raise ValueError(
                f"{', '.join(bad)} appl{'y' if len(bad) > 1 else 'ies'} to a MALA or SGLD step, but "
                f"STEP 1 here is the exact Gaussian draw (inner='gaussian'{why}); pass "
                "inner='mala' to use MALA, or leave them out."
            )
    elif kind == "sgld":
        bad = [k for k in ("adapt_step_size", "target_accept_prob") if given.get(k) is not None]
        if bad:
            raise ValueError(
                f"{', '.join(bad)} appl{'y' if len(bad) > 1 else 'ies'} to the MALA step; the SGLD "
                "step of variant='sgld' is not adapted (its step_size is kept)."
            )
    if given.get("adapt_step_size") is False and given.get("target_accept_prob") is not None:
        raise ValueError("target_accept_prob applies to the adaptation; adapt_step_size=False turns it off.")


def check_step_size(step_size):
    """Raise unless ``step_size`` is None or a positive finite scalar."""
    if isinstance(step_size, str):
        hint = (f"; variant is keyword-only: SparseAsync(model, variant={step_size!r})"
                if step_size in VARIANTS else "")
        raise ValueError(f"step_size (the second positional argument) must be a positive float, "
                         f"got {step_size!r}{hint}.")
    if step_size is not None:
        if np.ndim(step_size) != 0:
            raise ValueError(f"step_size must be a positive float, got {step_size!r}.")
        check_positive("step_size", step_size)


def check_variant_options(o: SparseAsyncSettings):
    """Raise when an option does not apply to the chosen variant."""
    if o.variant != "sgld":
        for name, value in (("subsample_size", o.subsample_size), ("replace", o.replace)):
            if value is not None:
                raise ValueError(f"{name} applies to variant='sgld' (mini-batches); variant="
                                 f"{o.variant!r} uses the full data.")
    elif o.inner != "auto":
        raise ValueError("inner applies to variant='exact' and 'async'; STEP 1 of variant='sgld' "
                         "is an SGLD step (leave inner out).")
    if o.variant == "exact":
        for name, value in (("taylor", o.taylor), ("async_point", o.async_point)):
            if value is not None:
                raise ValueError(f"{name} applies to the asynchronous update (variant='async' or "
                                 "'sgld'); variant='exact' redraws the indicators sequentially "
                                 "from the exact q_j.")


def check_options(o: SparseAsyncSettings):
    """Validate the settings of :class:`~numpyro_sg.SparseAsync` (the fields of its
    :class:`SparseAsyncOptions` are checked on their own already) and their fit to the variant."""
    check_step_size(o.step_size)
    check_choice("variant", o.variant, VARIANTS)
    check_int("update_size", o.update_size, " (and ≤ p)")
    check_choice("adapt_step_size", o.adapt_step_size, (None, True, False))
    if o.target_accept_prob is not None and not 0.0 < o.target_accept_prob < 1.0:
        raise ValueError(f"target_accept_prob must lie in (0, 1), got {o.target_accept_prob!r}.")
    check_variant_options(o)
    kind = "sgld" if o.variant == "sgld" else (o.inner if o.inner != "auto" else None)
    check_step_options(kind, step_options(o))


def step_options(o: SparseAsyncSettings) -> dict:
    """The options of the MALA / SGLD step, by name."""
    return {"step_size": o.step_size, "adapt_step_size": o.adapt_step_size,
            "target_accept_prob": o.target_accept_prob}


def resolve_inner(variant, inner, gaussian_ok, why, family):
    """The STEP 1 move: ``"sgld"``, ``"gaussian"`` or ``"mala"``."""
    if variant == "sgld":
        return "sgld"
    if inner == "gaussian" and not gaussian_ok:
        raise ValueError(
            "inner='gaussian' needs the GLM fast path with a Gaussian likelihood"
            + (f" ({why})" if why else f" (the likelihood family is {family!r})") + "; use inner='mala'."
        )
    if inner == "auto":
        return "gaussian" if gaussian_ok else "mala"
    return inner
