r"""Per-coordinate preconditioning of the Stein diagnostics (scale-aware by default).

The IMQ kernel with c = 1 on raw coordinates ignores the posterior's scale and can rank a
variance-inflated sample above an accurate one.  So, by default, every coordinate is divided
by a scale s_j before the kernel is applied::

    x → x / s,    score → score · s

(the score of the rescaled variable; this is the IMQ kernel with a diagonal preconditioner).
:func:`resolve_scales` turns a ``preconditioner`` option (``"sd"``, ``"laplace"``, an array or
``None``) into the scales, and :func:`precondition` applies them.  When several runs are
compared they must share one set of scales: resolve them once and pass the array.
"""

from __future__ import annotations

import warnings

import numpy as np

from numpyro_sg.infer.laplace import laplace_scales

PRECONDITIONERS = ("sd", "laplace", None)


def sd_scales(x) -> np.ndarray:
    """Per-coordinate sd of the draws (ddof = 0), float64.

    A coordinate whose sd is zero (or not a positive finite number) gets the median of the
    positive sds instead (1 if none is positive), with a warning: rescaling by 0 is undefined.

    :param x: draws, array (T, d).
    :return: float64 array (d,) of positive scales.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.scales import sd_scales
    >>> sd_scales(np.array([[0.0, 1.0], [2.0, 5.0]]))
    array([1., 2.])
    """
    x = np.asarray(x, dtype=np.float64)
    sd = x.std(axis=0)
    bad = ~(np.isfinite(sd) & (sd > 0))
    if bad.any():
        good = sd[~bad]
        fill = float(np.median(good)) if good.size else 1.0
        idx = np.flatnonzero(bad)
        warnings.warn(
            f"preconditioner='sd': coordinates {idx[:10].tolist()}{'…' if idx.size > 10 else ''} "
            f"have zero sd across the draws; using scale {fill:.3g} for them.",
            UserWarning,
            stacklevel=3,
        )
        sd = np.where(bad, fill, sd)
    return sd


def resolve_scales(preconditioner, x, score=None):
    """Per-coordinate scales s (float64 (d,)) for ``preconditioner``, or None for the raw form.

    * ``"sd"``: the sd of the draws ``x`` (see :func:`sd_scales` for zero sds);
    * ``"laplace"``: :func:`numpyro_sg.infer.laplace.laplace_scales` of ``score`` started at the
      mean of ``x``;
    * an array of shape (d,) (or a scalar), positive and finite: used as given;
    * ``None``: no preconditioning.

    The KSD/FSSD then act on x/s with scores score·s (:func:`precondition`).

    :param preconditioner: ``"sd"``, ``"laplace"``, an array of scales or ``None``.
    :param x: draws, array (…, d) (only the last axis is the coordinate).
    :param score: function mapping one point (d,) to ∇ log π there; needed for
        ``"laplace"`` only.
    :return: float64 array (d,), or ``None``.
    :raises ValueError: for an unknown option, ``"laplace"`` without ``score``, or scales of
        the wrong shape or not positive and finite.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.scales import resolve_scales
    >>> x = np.array([[0.0, 1.0], [2.0, 5.0]])
    >>> resolve_scales("sd", x), resolve_scales(2.0, x), resolve_scales(None, x)
    (array([1., 2.]), array([2., 2.]), None)
    """
    x = np.asarray(x)
    d = x.shape[-1]
    if preconditioner is None:
        return None
    if isinstance(preconditioner, str):
        if preconditioner == "sd":
            return sd_scales(x)
        if preconditioner == "laplace":
            if score is None or not callable(score):
                raise ValueError(
                    "preconditioner='laplace' needs the score function (score=...), not only "
                    "precomputed scores; or compute scales with laplace_scales() and pass them."
                )
            return laplace_scales(score, np.asarray(x, np.float64).mean(axis=0))
        raise ValueError(
            f"preconditioner must be 'sd', 'laplace', None or an array of {d} positive scales; "
            f"got {preconditioner!r}."
        )
    try:
        s = np.asarray(preconditioner, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"preconditioner must be 'sd', 'laplace', None or an array of {d} positive scales; "
            f"got {preconditioner!r}."
        ) from err
    if s.ndim == 0:
        s = np.full(d, float(s))
    if s.shape != (d,):
        raise ValueError(f"preconditioner scales must have shape ({d},) (one per coordinate); got shape {s.shape}.")
    if not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError(f"preconditioner scales must be positive and finite; got {s!r}.")
    return s


def precondition(x, s, scales):
    """Draws and scores of the rescaled variable: (x/scales, s·scales), in float64.

    :param x: draws, array (T, d).
    :param s: scores ∇ log π at the draws, array (T, d).
    :param scales: float array (d,) from :func:`resolve_scales`, or ``None`` (no change).
    :return: ``(x, s)``, float64 arrays (T, d).

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.scales import precondition
    >>> x, s = precondition(np.array([[2.0, 4.0]]), np.array([[1.0, 1.0]]), np.array([2.0, 4.0]))
    >>> x.tolist(), s.tolist()
    ([[1.0, 1.0]], [[2.0, 4.0]])
    """
    x = np.asarray(x, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    if scales is None:
        return x, s
    return x / scales, s * scales
