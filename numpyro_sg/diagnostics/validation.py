"""Input checks shared by the Stein diagnostics (KSD, FSSD): draws, scores and options.

Everything here works on plain arrays and functions; nothing imports another ``numpyro_sg``
module.  A check either returns the validated value or raises a ``TypeError`` / ``ValueError``
whose message names the offending argument (and, for non-finite values, its first bad row).
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

STATISTICS = ("v", "u")


def is_run_like(x) -> bool:
    """True for a run rather than an array: an ArviZ ``InferenceData`` (it has ``.posterior``)
    or a NumPyro ``MCMC`` object (it has ``.get_samples``).

    :param x: anything.
    :return: bool.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.validation import is_run_like
    >>> is_run_like(np.zeros((10, 2)))
    False
    """
    return hasattr(x, "posterior") or hasattr(x, "get_samples")


def reject_run(x, name: str, instead: str):
    """Raise a ``TypeError`` if ``x`` is a run (:func:`is_run_like`): ``name`` takes arrays
    and ``instead`` is the function to call with a run.

    :param x: the argument to check.
    :param str name: the function that received ``x`` (for the message).
    :param str instead: the function that accepts a run (for the message).
    :raises TypeError: if ``x`` is an ``InferenceData`` or an ``MCMC`` object.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.validation import reject_run
    >>> reject_run(np.zeros((10, 2)), "ksd_path", "numpyro_sg.ksd")  # arrays pass silently
    """
    if is_run_like(x):
        raise TypeError(
            f"{name} takes arrays (draws x of shape (T, d) and a score); for an InferenceData "
            f"or MCMC object use {instead} (which reads the model) or "
            "numpyro_sg.diagnostics.model_scores."
        )


def _first_bad_row(a: np.ndarray):
    bad = ~np.all(np.isfinite(a), axis=tuple(range(1, a.ndim)))
    return int(np.argmax(bad)) if bad.any() else None


def as_draws(x, name: str = "x") -> np.ndarray:
    """``x`` as a numeric (T, d) numpy array with finite entries.

    :param x: array-like of shape (T, d), T ≥ 1, d ≥ 1.
    :param str name: the argument's name, for the error messages.
    :return: ``np.asarray(x)`` (dtype kept).
    :raises TypeError: for a non-numeric input.
    :raises ValueError: for another number of dimensions, an empty axis or a non-finite entry.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.validation import as_draws
    >>> as_draws([[0.0, 1.0], [2.0, 3.0]]).shape
    (2, 2)
    """
    try:
        a = np.asarray(x)
    except Exception as err:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} must be an array of shape (T, d); got {type(x).__name__}.") from err
    if a.dtype == object or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{name} must be a numeric array of shape (T, d); got dtype {a.dtype}.")
    if a.ndim != 2:
        hint = " (for one coordinate use x.reshape(-1, 1))" if a.ndim == 1 else ""
        raise ValueError(f"{name} must be 2-D with shape (T, d); got shape {a.shape}{hint}.")
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"{name} must have at least one row and one column; got shape {a.shape}.")
    check_finite(a, name)
    return a


def check_finite(a: np.ndarray, name: str):
    """Raise a ``ValueError`` naming ``name`` and its first row with a non-finite entry.

    :param a: array whose first axis indexes rows (draws).
    :param str name: the array's name, for the message.
    :raises ValueError: if any entry is NaN or infinite.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.validation import check_finite
    >>> check_finite(np.ones((3, 2)), "x")  # finite: returns None
    """
    row = _first_bad_row(np.asarray(a))
    if row is not None:
        raise ValueError(
            f"{name} has non-finite values (NaN or inf); first at row {row}: {np.asarray(a)[row]!r}."
        )


def check_thin(thin):
    """``thin`` as a positive int (``None`` → 1).

    :param thin: ``None`` or a positive integer (not a bool).
    :return: int ≥ 1.
    :raises ValueError: otherwise.

    **Example:**

    >>> from numpyro_sg.diagnostics.validation import check_thin
    >>> check_thin(None), check_thin(5)
    (1, 5)
    """
    if thin is None:
        return 1
    if isinstance(thin, bool) or not isinstance(thin, (int, np.integer)) or thin < 1:
        raise ValueError(f"thin must be a positive integer or None, got {thin!r}.")
    return int(thin)


def check_kernel_args(c, beta, statistic="v"):
    """Validate the IMQ kernel parameters and the statistic of a KSD.

    :param float c: IMQ offset; must be positive and finite.
    :param float beta: IMQ exponent; must be negative (β ∈ (−1, 0) detects non-convergence).
    :param str statistic: ``"v"`` (V-statistic) or ``"u"`` (U-statistic), see
        :data:`STATISTICS`.
    :raises ValueError: naming the first invalid argument.

    **Example:**

    >>> from numpyro_sg.diagnostics.validation import check_kernel_args
    >>> check_kernel_args(1.0, -0.5, "u")  # valid: returns None
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be 'v' (V-statistic) or 'u' (U-statistic), got {statistic!r}.")
    if not (np.isfinite(c) and c > 0):
        raise ValueError(f"c must be a positive finite number, got {c!r}.")
    if not (np.isfinite(beta) and beta < 0):
        raise ValueError(f"beta must be negative (the IMQ kernel needs β < 0; β ∈ (−1, 0) detects non-convergence), got {beta!r}.")


def compute_scores(score, x, batch_size: int = 256) -> np.ndarray:
    """``score`` applied to every row of ``x``: the (T, d) scores ∇ log π(x_t).

    The function is mapped over the rows with ``lax.map`` in batches of ``batch_size`` rows
    (vectorised within a batch) and jitted afresh on each call (no cache, so that closures
    holding a full data set are not kept alive).

    :param score: function mapping one point (d,) to ∇ log π there, an array (d,).
    :param x: draws, a numpy array (T, d).
    :param int batch_size: rows per vectorised batch (clipped to [1, T]).
    :return: numpy array (T, d), checked finite.
    :raises TypeError: if ``score`` is not callable.
    :raises ValueError: if the scores have another shape than ``x`` or are not finite.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.validation import compute_scores
    >>> x = np.arange(6.0).reshape(3, 2)
    >>> compute_scores(lambda z: -z, x).tolist()
    [[-0.0, -1.0], [-2.0, -3.0], [-4.0, -5.0]]
    """
    if not callable(score):
        raise TypeError(f"score must be a callable mapping a point (d,) to ∇log π; got {type(score).__name__}.")
    xj = jnp.asarray(x, dtype=jnp.result_type(float))
    batch_size = int(max(1, min(batch_size, x.shape[0])))
    # jitted afresh per call (no cache: a cache would keep score closures, often holding the
    # full data set, alive); the compile is small next to the O(T²) KSD itself
    s = np.asarray(jax.jit(lambda z: lax.map(score, z, batch_size=batch_size))(xj))
    if s.shape != x.shape:
        raise ValueError(
            f"score must map a point of shape ({x.shape[1]},) to an array of the same shape; "
            f"applied to x of shape {x.shape} it returned shape {s.shape}."
        )
    check_finite(s, "scores (score evaluated at the draws)")
    return s


def draws_and_scores(x, score=None, scores=None, thin=None, batch_size: int = 256):
    """Validated, thinned draws and their scores: the common first step of the KSD and FSSD.

    Exactly one of ``score`` and ``scores`` must be given.  With ``score`` the draws are
    thinned first and only the kept rows are scored (:func:`compute_scores`); with ``scores``
    both arrays are thinned alike.

    :param x: draws, array (T, d) (:func:`as_draws`).
    :param score: function mapping one point (d,) to ∇ log π there.
    :param scores: precomputed scores, array (T, d).
    :param int thin: keep every ``thin``-th row (:func:`check_thin`).
    :param int batch_size: rows per batch when scoring.
    :return: ``(x, s)``, numpy arrays (⌈T/thin⌉, d).
    :raises ValueError: if neither or both of ``score`` and ``scores`` are given, or an input
        is invalid.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.validation import draws_and_scores
    >>> x = np.arange(8.0).reshape(4, 2)
    >>> x2, s2 = draws_and_scores(x, scores=-x, thin=2)
    >>> x2.tolist(), s2.tolist()
    ([[0.0, 1.0], [4.0, 5.0]], [[-0.0, -1.0], [-4.0, -5.0]])
    """
    thin = check_thin(thin)
    x = as_draws(x, "x")
    if (score is None) == (scores is None):
        raise ValueError("give exactly one of score (a function of one point) and scores (a (T, d) array).")
    if scores is not None:
        s = np.asarray(scores)
        if s.shape != x.shape:
            raise ValueError(f"scores must have the same shape as x; got scores {s.shape} for x {x.shape}.")
        check_finite(s, "scores")
        return x[::thin], s[::thin]
    x = x[::thin]
    return x, compute_scores(score, x, batch_size)
