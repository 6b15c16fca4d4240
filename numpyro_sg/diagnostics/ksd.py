r"""Kernel Stein discrepancy (KSD) with the inverse multi-quadric (IMQ) kernel (SPEC §7).

Score s(θ) = ∇ log π(θ).  IMQ base kernel k(x, y) = (c² + ‖x − y‖²)^β (c = 1, β = −½ by
default).  With r = x − y, u = c² + ‖r‖² and dimension d, the Stein kernel is

    k_π(x, y) = s(x)·s(y)·u^β − 2β·u^(β−1)·s(x)·r + 2β·u^(β−1)·s(y)·r
                − 2β·d·u^(β−1) − 4β(β−1)·u^(β−2)·‖r‖²

and, for draws θ_1 … θ_T,

    KSD = √( (1/T²)·Σ_{t,t'} k_π(θ_t, θ_t') )                       (V-statistic, default)
    KSD_U² = (1/(T(T−1)))·Σ_{t≠t'} k_π(θ_t, θ_t')                   (U-statistic, option).

Per-coordinate form (paper 000, supplement §4.4): k_π = Σ_j k_j with

    k_j(x, y) = s_j(x)s_j(y)·u^β − 2β·u^(β−1)·s_j(x)·r_j + 2β·u^(β−1)·s_j(y)·r_j
                − 2β·u^(β−1) − 4β(β−1)·u^(β−2)·r_j²,

V_j = (1/T²)·Σ_{t,t'} k_j(θ_t, θ_t') and per-coordinate KSD = Σ_j √V_j.

**Preconditioning (scale-aware by default).**  The IMQ kernel with c = 1 on raw coordinates
ignores the posterior's scale and can rank a variance-inflated sample above an accurate one.
By default every coordinate is divided by a per-coordinate scale s_j before the kernel is
applied: x → x/s, score → score·s (the score of the rescaled variable).  ``preconditioner=None``
gives the papers' raw form (use it to reproduce their numbers and to compare with SGMCMCJax or
stein_thinning).  When several runs are compared they must share one set of scales: compute
them once with :func:`resolve_scales` (or :func:`laplace_scales`) and pass the array.

**Computation.**  The double sum is computed block by block (a row block of B draws against
all T draws, as matrix products), so memory is O(T·B) and a T×T matrix is never formed.  Work
is in the default JAX float dtype (float32 unless ``jax_enable_x64``); coordinates are centred
first (the kernel is translation invariant), matrix products run at full precision and the
per-block partial sums are accumulated in float64 on the host.
"""

from __future__ import annotations

from functools import partial
import warnings

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "imq_stein_kernel",
    "imq_stein_kernel_per_coordinate",
    "ksd",
    "ksd_per_coordinate",
    "ksd_path",
    "ksd_sums",
    "resolve_scales",
    "laplace_scales",
    "laplace_approximation",
    "signed_sqrt",
]

PRECONDITIONERS = ("sd", "laplace", None)
STATISTICS = ("v", "u")
_HIGHEST = lax.Precision.HIGHEST
# Target number of elements of one (row block × columns) matrix: 2**22 float32 = 16 MiB.
_BLOCK_ELEMENTS = 2**22


# --------------------------------------------------------------------------------------------
# Reference Stein kernels (one pair of points)
# --------------------------------------------------------------------------------------------


def imq_stein_kernel(x, y, sx, sy, c=1.0, beta=-0.5):
    """IMQ Stein kernel k_π(x, y) for one pair of points (SPEC §7).

    With r = x − y, u = c² + ‖r‖², d = dim x::

        k_π = s(x)·s(y)·u^β − 2β·u^(β−1)·s(x)·r + 2β·u^(β−1)·s(y)·r
              − 2β·d·u^(β−1) − 4β(β−1)·u^(β−2)·‖r‖²

    :param x: point (d,).
    :param y: point (d,).
    :param sx: score ∇ log π(x), shape (d,).
    :param sy: score ∇ log π(y), shape (d,).
    :param float c: IMQ offset c > 0.
    :param float beta: IMQ exponent β < 0.
    :return: scalar k_π(x, y).
    """
    return jnp.sum(imq_stein_kernel_per_coordinate(x, y, sx, sy, c, beta), axis=-1)


def imq_stein_kernel_per_coordinate(x, y, sx, sy, c=1.0, beta=-0.5):
    """Per-coordinate IMQ Stein kernel (k_1, …, k_d)(x, y) (paper 000, supplement §4.4).

    With r = x − y, u = c² + ‖r‖²::

        k_j = s_j(x)s_j(y)·u^β − 2β·u^(β−1)·s_j(x)·r_j + 2β·u^(β−1)·s_j(y)·r_j
              − 2β·u^(β−1) − 4β(β−1)·u^(β−2)·r_j²

    so that Σ_j k_j = :func:`imq_stein_kernel`.

    :return: array (d,) of k_j(x, y).
    """
    x, y, sx, sy = (jnp.asarray(a) for a in (x, y, sx, sy))
    r = x - y
    r2 = jnp.sum(r * r, axis=-1, keepdims=True)
    u = c**2 + r2
    return (
        sx * sy * u**beta
        - 2 * beta * u ** (beta - 1) * sx * r
        + 2 * beta * u ** (beta - 1) * sy * r
        - 2 * beta * u ** (beta - 1)
        - 4 * beta * (beta - 1) * u ** (beta - 2) * r * r
    )


def signed_sqrt(value):
    """sign(v)·√|v|, elementwise: how a negative U-statistic is reported (see :func:`ksd`)."""
    value = np.asarray(value, dtype=np.float64)
    return np.sign(value) * np.sqrt(np.abs(value))


# --------------------------------------------------------------------------------------------
# Validation helpers (shared with fssd.py)
# --------------------------------------------------------------------------------------------


def is_run_like(x) -> bool:
    """True for an ArviZ ``InferenceData`` (``.posterior``) or an MCMC object (``.get_samples``)."""
    return hasattr(x, "posterior") or hasattr(x, "get_samples")


def _first_bad_row(a: np.ndarray):
    bad = ~np.all(np.isfinite(a), axis=tuple(range(1, a.ndim)))
    return int(np.argmax(bad)) if bad.any() else None


def as_draws(x, name: str = "x") -> np.ndarray:
    """``x`` as a float (T, d) numpy array with finite entries, else a ValueError saying why."""
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
    """Raise ValueError naming ``name`` and its first row with a non-finite entry."""
    row = _first_bad_row(np.asarray(a))
    if row is not None:
        raise ValueError(
            f"{name} has non-finite values (NaN or inf); first at row {row}: {np.asarray(a)[row]!r}."
        )


def check_thin(thin):
    """``thin`` as a positive int (None → 1)."""
    if thin is None:
        return 1
    if isinstance(thin, bool) or not isinstance(thin, (int, np.integer)) or thin < 1:
        raise ValueError(f"thin must be a positive integer or None, got {thin!r}.")
    return int(thin)


def compute_scores(score, x, batch_size: int = 256) -> np.ndarray:
    """Apply ``score`` (a function of one point (d,)) to every row of ``x``, vmapped in blocks of
    ``batch_size`` rows and jitted; return a (T, d) numpy array (checked finite)."""
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
    """Validated, thinned (T, d) draws and their (T, d) scores (computed from ``score`` when
    ``scores`` is not given).  Exactly one of ``score`` and ``scores`` must be given."""
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


def check_kernel_args(c, beta, statistic="v"):
    """Validate the IMQ parameters (c > 0, β < 0) and the statistic ("v" or "u")."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be 'v' (V-statistic) or 'u' (U-statistic), got {statistic!r}.")
    if not (np.isfinite(c) and c > 0):
        raise ValueError(f"c must be a positive finite number, got {c!r}.")
    if not (np.isfinite(beta) and beta < 0):
        raise ValueError(f"beta must be negative (the IMQ kernel needs β < 0; β ∈ (−1, 0) detects non-convergence), got {beta!r}.")


# --------------------------------------------------------------------------------------------
# Preconditioner
# --------------------------------------------------------------------------------------------


def sd_scales(x) -> np.ndarray:
    """Per-coordinate sd of the draws (ddof = 0), float64.

    A coordinate whose sd is zero (or not a positive finite number) gets the median of the
    positive sds instead (1 if none is positive), with a warning: rescaling by 0 is undefined.
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


def laplace_scales(score, init, num_steps: int = 50, tol: float = 1e-4) -> np.ndarray:
    r"""Laplace scales √diag((−H)⁻¹) at the mode of π: :func:`laplace_approximation`'s scales."""
    return laplace_approximation(score, init, num_steps, tol)[1]


def laplace_approximation(score, init, num_steps: int = 50, tol: float = 1e-4):
    r"""Mode of π and Laplace scales √diag((−H)⁻¹) there, H = ∇² log π = ``jax.jacfwd(score)``.

    The mode is found by damped Newton steps on the score started at ``init`` (e.g. the mean
    of the draws): θ ← θ + α·(−H + λI)⁻¹·s(θ), λ = 0 while −H is positive definite (else just
    enough to make it so), α halved (up to 10 times) until ‖s‖ does not increase (an error
    if no α does).  Converged
    when every Newton step component is below ``tol`` times that coordinate's Laplace sd.

    :param score: function of one point (d,) returning ∇ log π there (JAX-differentiable).
    :param init: start point, shape (d,).
    :param int num_steps: maximal number of Newton steps.
    :param float tol: convergence tolerance, in units of the Laplace sd.
    :return: ``(mode, scales)``, float64 arrays (d,) (the scales positive).
    :raises ValueError: if the iteration does not converge in ``num_steps`` steps, produces
        non-finite values, or the Hessian at the mode is not negative definite.
    """
    theta = np.asarray(init, dtype=np.float64)
    if theta.ndim != 1:
        raise ValueError(f"init must be a point of shape (d,), got shape {theta.shape}.")
    dtype = jnp.result_type(float)
    score_j = jax.jit(score)
    hess_j = jax.jit(jax.jacfwd(score))

    def grad_hess(t):
        tj = jnp.asarray(t, dtype=dtype)
        g = np.asarray(score_j(tj), dtype=np.float64)
        h = np.asarray(hess_j(tj), dtype=np.float64)
        if g.shape != theta.shape or h.shape != theta.shape * 2:
            raise ValueError(
                f"score must map a point of shape {theta.shape} to the same shape; got {g.shape}."
            )
        return g, 0.5 * (h + h.T)

    g, h = grad_hess(theta)
    for _ in range(num_steps):
        if not (np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
            raise ValueError(f"laplace_scales: non-finite score or Hessian at θ = {theta!r}.")
        neg_h = -h
        eig = np.linalg.eigvalsh(neg_h)
        concave = eig[0] > 0
        if concave:
            step = np.linalg.solve(neg_h, g)
            sd = np.sqrt(np.diag(np.linalg.inv(neg_h)))
            if np.all(np.abs(step) <= tol * sd):
                theta = theta + step
                g, h = grad_hess(theta)
                break
        else:  # Levenberg–Marquardt damping: just enough to make −H + λI positive definite
            lam = -eig[0] + 1e-3 * max(abs(eig[-1]), 1.0)
            step = np.linalg.solve(neg_h + lam * np.eye(theta.size), g)
        norm0 = np.linalg.norm(g)
        alpha, accepted = 1.0, False
        for _ in range(11):
            g_new, h_new = grad_hess(theta + alpha * step)
            if np.all(np.isfinite(g_new)) and np.linalg.norm(g_new) <= norm0 * (1 + 1e-6):
                accepted = True
                break
            alpha *= 0.5
        if not accepted:
            why = (
                "; the Hessian there is not negative definite (log π has no mode near the start)"
                if not concave
                else ""
            )
            raise ValueError(
                f"laplace_scales: no damped Newton step reduced ‖score‖ = {norm0:.3g} at "
                f"θ = {theta!r}{why}. Pass scales explicitly or use preconditioner='sd'."
            )
        theta = theta + alpha * step
        g, h = g_new, h_new
    else:
        raise ValueError(
            f"laplace_scales: damped Newton did not converge in {num_steps} steps "
            f"(last ‖score‖ = {np.linalg.norm(g):.3g}); pass scales explicitly or use "
            "preconditioner='sd'."
        )
    neg_h = -h
    try:
        chol = np.linalg.cholesky(neg_h)
    except np.linalg.LinAlgError:
        chol = None
    if chol is None or not np.all(np.isfinite(neg_h)):
        raise ValueError(
            "laplace_scales: the Hessian of log π at the mode is not negative definite "
            f"(eigenvalues of −H: {np.linalg.eigvalsh(neg_h)[:5]!r}…); the Laplace scales are "
            "undefined. Use preconditioner='sd' or pass scales."
        )
    inv_chol = np.linalg.inv(chol)
    scales = np.sqrt(np.sum(inv_chol**2, axis=0))  # diag((L Lᵀ)⁻¹) = column sums of (L⁻¹)²
    if not np.all(np.isfinite(scales) & (scales > 0)):
        raise ValueError(f"laplace_scales: non-positive or non-finite scales {scales!r}.")
    return theta, scales


def resolve_scales(preconditioner, x, score=None):
    """Per-coordinate scales s (float64 (d,)) for ``preconditioner``, or None for the raw form.

    * ``"sd"``: the sd of the draws ``x`` (see :func:`sd_scales` for zero sds);
    * ``"laplace"``: :func:`laplace_scales` of ``score`` started at the mean of ``x``;
    * an array of shape (d,) (or a scalar), positive and finite: used as given;
    * ``None``: no preconditioning.

    The KSD/FSSD then act on x/s with scores score·s.
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
    """(x/scales, s·scales) in float64; unchanged when ``scales`` is None."""
    x = np.asarray(x, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    if scales is None:
        return x, s
    return x / scales, s * scales


# --------------------------------------------------------------------------------------------
# Blocked core
# --------------------------------------------------------------------------------------------


@partial(jax.jit, static_argnames=("c", "beta", "per_coordinate", "exclude_diagonal"))
def _pair_block_sums(rx, rs, rw, ri, cx, cs, cw, ci, *, c, beta, per_coordinate, exclude_diagonal):
    """Sums of k_π (or of each k_j) over (row block b) × (column group g).

    Rows: ``rx``, ``rs`` (R, B, d), weights ``rw`` (R, B), global indices ``ri`` (R, B).
    Columns: ``cx``, ``cs`` (G, C, d), ``cw`` (G, C), ``ci`` (G, C).  Padding has weight 0.
    Returns (R, G) or, per coordinate, (R, G, d).  One row block at a time: memory O(B·G·C).
    """
    G, C, d = cx.shape
    X = cx.reshape(G * C, d)
    S = cs.reshape(G * C, d)
    wc = cw.reshape(G * C)
    ic = ci.reshape(G * C)
    x_sq = jnp.sum(X * X, axis=1)
    sy_y = jnp.sum(S * X, axis=1)
    b1, b2 = 2.0 * beta, 4.0 * beta * (beta - 1.0)
    ones = jnp.ones((G, C, 1), cx.dtype)
    if per_coordinate:
        w_rhs = jnp.concatenate([ones, cx, cs, cs * cx], axis=-1)  # (G, C, 3d+1)
        v_rhs = jnp.concatenate([ones, cx, cx * cx], axis=-1)  # (G, C, 2d+1)
    else:
        w_rhs = jnp.concatenate([ones, cx, cs, sy_y.reshape(G, C, 1)], axis=-1)  # (G, C, 2d+2)
        v_rhs = jnp.concatenate([ones, cx, x_sq.reshape(G, C, 1)], axis=-1)  # (G, C, d+2)
    ein = partial(jnp.einsum, precision=_HIGHEST)

    def one_block(args):
        # Σ_{t'} of each term as (kernel matrix) @ (column features): only u^β, u^(β−1), u^(β−2)
        # are formed per pair; everything else is a matrix product (B×C) @ (C×features).
        xb, sb, wb, ib = args
        B = xb.shape[0]
        mask = wb[:, None] * wc[None, :]
        if exclude_diagonal:
            mask = mask * (ib[:, None] != ic[None, :])
        xy = jnp.matmul(xb, X.T, precision=_HIGHEST)
        r2 = jnp.maximum(jnp.sum(xb * xb, axis=1)[:, None] + x_sq[None, :] - 2.0 * xy, 0.0)
        u = c**2 + r2
        a = (lax.rsqrt(u) if beta == -0.5 else jnp.exp(beta * jnp.log(u))) * mask  # u^β
        w = a / u  # u^(β−1)
        v = w / u  # u^(β−2)
        a3, w3, v3 = (m.reshape(B, G, C) for m in (a, w, v))
        AS = ein("bgc,gcj->bgj", a3, cs)
        WR = ein("bgc,gcj->bgj", w3, w_rhs)
        VR = ein("bgc,gcj->bgj", v3, v_rhs)
        xr, sr = xb[:, None, :], sb[:, None, :]
        W1, WX, WS = WR[..., :1], WR[..., 1 : 1 + d], WR[..., 1 + d : 1 + 2 * d]
        V1, VX = VR[..., :1], VR[..., 1 : 1 + d]
        if per_coordinate:
            WSX, VX2 = WR[..., 1 + 2 * d :], VR[..., 1 + d :]
            kj = (
                sr * AS
                - b1 * sr * (xr * W1 - WX)  # −2β·u^(β−1)·s_j(x)·r_j
                + b1 * (xr * WS - WSX)  # +2β·u^(β−1)·s_j(y)·r_j
                - b1 * W1
                - b2 * (xr * xr * V1 - 2.0 * xr * VX + VX2)  # −4β(β−1)·u^(β−2)·r_j²
            )
            return jnp.sum(kj, axis=0)
        W_syy, V_ysq = WR[..., 1 + 2 * d], VR[..., 1 + d]
        x2 = jnp.sum(xb * xb, axis=1)[:, None]
        sx_x = jnp.sum(sb * xb, axis=1)[:, None]
        k = (
            jnp.sum(sr * AS, axis=-1)
            - b1 * (sx_x * W1[..., 0] - jnp.sum(sr * WX, axis=-1))  # −2β·u^(β−1)·s(x)·r
            + b1 * (jnp.sum(xr * WS, axis=-1) - W_syy)  # +2β·u^(β−1)·s(y)·r
            - b1 * d * W1[..., 0]
            - b2 * (x2 * V1[..., 0] - 2.0 * jnp.sum(xr * VX, axis=-1) + V_ysq)  # −4β(β−1)·u^(β−2)·‖r‖²
        )
        return jnp.sum(k, axis=0)

    return lax.map(one_block, (rx, rs, rw, ri))


def _default_block(T: int, width: int) -> int:
    """Rows per block so that one (rows × width) matrix has about 2**22 entries (16 MiB in
    float32), kept within [8, 256] rows (larger blocks measured slower on CPU)."""
    b = _BLOCK_ELEMENTS // max(width, 1)
    b = int(min(max(b, 8), 256))
    b -= b % 8
    return max(8, min(b, -(-T // 8) * 8))


def _check_block(block_size):
    if block_size is None:
        return None
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer or None, got {block_size!r}.")
    return int(block_size)


def _to_device(x, s):
    dtype = jnp.result_type(float)
    x = np.asarray(x, np.float64)
    x = x - x.mean(axis=0)  # translation invariance: centring reduces cancellation
    return jnp.asarray(x, dtype), jnp.asarray(np.asarray(s, np.float64), dtype)


def ksd_sums(x, s, *, c=1.0, beta=-0.5, per_coordinate=False, exclude_diagonal=False, block_size=None):
    """Σ_{t,t'} k_π(x_t, x_t') (float) or the (d,) vector of Σ_{t,t'} k_j, for arrays x, s (T, d).

    No preconditioning or validation here (see :func:`ksd`); ``exclude_diagonal`` drops t = t'
    (the U-statistic numerator).  Blocked over rows: memory O(T·block_size).
    """
    T, d = x.shape
    B = _check_block(block_size) or _default_block(T, T)
    B = min(B, T)
    R = -(-T // B)
    pad = R * B - T
    xj, sj = _to_device(x, s)
    xp = jnp.pad(xj, ((0, pad), (0, 0)))
    sp = jnp.pad(sj, ((0, pad), (0, 0)))
    wp = jnp.pad(jnp.ones(T, xj.dtype), (0, pad))
    ip = jnp.arange(R * B)
    out = _pair_block_sums(
        xp.reshape(R, B, d), sp.reshape(R, B, d), wp.reshape(R, B), ip.reshape(R, B),
        xp[None], sp[None], wp[None], ip[None],
        c=float(c), beta=float(beta), per_coordinate=bool(per_coordinate),
        exclude_diagonal=bool(exclude_diagonal),
    )
    out = np.asarray(out, dtype=np.float64)  # (R, 1) or (R, 1, d): float64 accumulation
    return out.sum(axis=(0, 1)) if per_coordinate else float(out.sum())


def _normalise(total, T, statistic):
    if statistic == "v":
        return np.asarray(total, np.float64) / T**2
    if T < 2:
        return np.full(np.shape(total), np.nan)
    return np.asarray(total, np.float64) / (T * (T - 1))


def _squared_terms(x, score, scores, *, c, beta, preconditioner, per_coordinate, statistic, thin, block_size):
    """Validated, preconditioned (1/T²)Σk_π (or its U version); (d,) when per-coordinate."""
    check_kernel_args(c, beta, statistic)
    block_size = _check_block(block_size)
    x, s = draws_and_scores(x, score, scores, thin, batch_size=block_size or 256)
    scales = resolve_scales(preconditioner, x, score)
    x, s = precondition(x, s, scales)
    total = ksd_sums(
        x, s, c=c, beta=beta, per_coordinate=per_coordinate,
        exclude_diagonal=(statistic == "u"), block_size=block_size,
    )
    return _normalise(total, x.shape[0], statistic)


def _reject_run(x, name):
    if is_run_like(x):
        raise TypeError(
            f"{name} takes arrays (draws x of shape (T, d) and a score); for an InferenceData "
            "or MCMC object use numpyro_sg.ksd (which reads the model) or "
            "numpyro_sg.diagnostics.model_scores."
        )


_KSD_DOC_PARAMS = """
    :param x: draws, array (T, d).
    :param score: function mapping one point (d,) to ∇ log π there; applied to the draws in
        jitted, vmapped blocks.  Give this or ``scores``.
    :param scores: precomputed scores ∇ log π(x_t), array (T, d).
    :param float c: IMQ offset c > 0 (default 1).
    :param float beta: IMQ exponent β < 0 (default −½).
    :param preconditioner: ``"sd"`` (default: per-coordinate sd of the draws scored),
        ``"laplace"`` (needs ``score``), an array of (d,) positive scales, or ``None`` (the
        papers' raw form); see :func:`resolve_scales`.
    :param str statistic: ``"v"`` (V-statistic, default) or ``"u"`` (U-statistic).
    :param int thin: keep every ``thin``-th draw before scoring.
    :param int block_size: rows per block (default: about 2²² pair entries per block, at most
        256 rows).
"""


def ksd(
    x,
    score=None,
    *,
    scores=None,
    c=1.0,
    beta=-0.5,
    preconditioner="sd",
    per_coordinate=False,
    statistic="v",
    thin=None,
    block_size=None,
    model=None,
    model_args=(),
    model_kwargs=None,
    **kwargs,
):
    """Kernel Stein discrepancy of draws ``x`` from π, IMQ kernel (SPEC §7).  Returns a float.

    KSD = √((1/T²)·Σ_{t,t'} k_π(θ_t, θ_t')) (V-statistic), with k_π the IMQ Stein kernel
    (:func:`imq_stein_kernel`) applied after preconditioning x → x/s, score → score·s.
    ``per_coordinate=True`` returns paper 000's form Σ_j √V_j, V_j = (1/T²)·Σ_{t,t'} k_j.

    ``statistic="u"`` uses KSD_U² = (1/(T(T−1)))·Σ_{t≠t'} k_π, unbiased for KSD² but possibly
    negative when the draws fit π well; it is reported as the signed root sign(KSD_U²)·√|KSD_U²|
    (so it can be negative, and orders samples as KSD_U² does); per coordinate each term is a
    signed root.  T = 1 gives NaN for the U-statistic.

    If ``x`` is an ArviZ ``InferenceData`` or an MCMC object, the scores come from the model:
    the call is forwarded to ``numpyro_sg.diagnostics.model_scores.ksd_of_run`` with ``model``,
    ``model_args``, ``model_kwargs`` and ``kwargs``.
    """ + _KSD_DOC_PARAMS + """    :param bool per_coordinate: return Σ_j √V_j instead of √(Σ_j V_j).
    :return: float.
    """
    if is_run_like(x):
        from numpyro_sg.diagnostics.model_scores import ksd_of_run

        return ksd_of_run(
            x, model=model, model_args=model_args, model_kwargs=model_kwargs, c=c, beta=beta,
            preconditioner=preconditioner, per_coordinate=per_coordinate, statistic=statistic,
            thin=thin, block_size=block_size, **kwargs,
        )
    if kwargs:
        raise TypeError(f"ksd() got unexpected keyword arguments {sorted(kwargs)} for array input.")
    sq = _squared_terms(
        x, score, scores, c=c, beta=beta, preconditioner=preconditioner,
        per_coordinate=per_coordinate, statistic=statistic, thin=thin, block_size=block_size,
    )
    return float(np.sum(signed_sqrt(sq))) if per_coordinate else float(signed_sqrt(sq))


def ksd_per_coordinate(
    x,
    score=None,
    *,
    scores=None,
    c=1.0,
    beta=-0.5,
    preconditioner="sd",
    statistic="v",
    thin=None,
    block_size=None,
):
    """The per-coordinate terms √V_j of paper 000's KSD, an array (d,) whose sum is
    ``ksd(..., per_coordinate=True)``.

    V_j = (1/T²)·Σ_{t,t'} k_j(θ_t, θ_t') with k_j :func:`imq_stein_kernel_per_coordinate`,
    after preconditioning.  With ``statistic="u"`` each term is the signed root of the
    U-statistic (see :func:`ksd`).  Note the coordinates interact through u = c² + ‖r‖², so
    a term is not the KSD of that coordinate's marginal.
    """ + _KSD_DOC_PARAMS + """    :return: numpy array (d,).
    """
    _reject_run(x, "ksd_per_coordinate")
    sq = _squared_terms(
        x, score, scores, c=c, beta=beta, preconditioner=preconditioner, per_coordinate=True,
        statistic=statistic, thin=thin, block_size=block_size,
    )
    return signed_sqrt(sq)


# --------------------------------------------------------------------------------------------
# KSD path (KSD of the first k draws for several k, one pass)
# --------------------------------------------------------------------------------------------


def default_path_steps(T: int, num_steps: int = 20) -> np.ndarray:
    """About ``num_steps`` evenly spaced draw counts T/num_steps, 2T/num_steps, …, T."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}.")
    steps = np.round(np.linspace(T / num_steps, T, num_steps)).astype(np.int64)
    return np.unique(np.clip(steps, 1, T))


def _segments(boundaries, T, B):
    """Cut [0, T) at ``boundaries`` and into pieces of at most B; return the piece ends."""
    cuts = sorted({int(b) for b in boundaries} | {T})
    ends, start = [], 0
    for cut in cuts:
        while cut - start > B:
            start += B
            ends.append(start)
        if cut > start:
            ends.append(cut)
            start = cut
    return np.asarray(ends)


def ksd_path(
    x,
    score=None,
    *,
    scores=None,
    steps=None,
    num_steps=20,
    c=1.0,
    beta=-0.5,
    preconditioner="sd",
    per_coordinate=False,
    statistic="v",
    thin=None,
    block_size=None,
):
    """KSD of the first k draws, for several k, in one blocked pass (a KSD-versus-time path).

    The draws are cut into segments at the requested steps (and into pieces of at most
    ``block_size``); one pass computes the (segments × segments) matrix of block-pair sums
    of k_π (or of each k_j), and a 2-D cumulative sum gives Σ_{t,t'<k} at every step k.
    Cost: one KSD of all T draws; memory O(T·block + segments²·d).

    **One scale for the whole path**: with ``preconditioner="sd"`` the scales are the sd of
    *all* (thinned) draws, not of the first k, so every point of the path is on the same
    scale; ``"laplace"`` and arrays are likewise fixed.  The value at k = T therefore equals
    ``ksd`` of all draws.

    :param steps: draw counts k (1 ≤ k ≤ T, counted in ``x`` before thinning; the value at k
        uses the thinned draws among the first k).  Default: ``num_steps`` evenly spaced
        counts up to T (:func:`default_path_steps`).
    :param int num_steps: number of default steps.
    """ + _KSD_DOC_PARAMS + """    :param bool per_coordinate: paper 000's form Σ_j √V_j at each step.
    :return: (steps, ksd): int64 array of the steps and float64 array of the KSD values
        (NaN for the U-statistic where fewer than 2 draws are used).
    """
    _reject_run(x, "ksd_path")
    check_kernel_args(c, beta, statistic)
    block_size = _check_block(block_size)
    thin_ = check_thin(thin)
    T_full = as_draws(x, "x").shape[0]
    if steps is None:
        steps = default_path_steps(T_full, num_steps)
    else:
        steps = np.asarray(steps)
        if steps.ndim != 1 or steps.size == 0 or not np.issubdtype(steps.dtype, np.integer):
            raise ValueError(f"steps must be a non-empty 1-D array of integers; got {steps!r}.")
        if steps.min() < 1 or steps.max() > T_full:
            raise ValueError(f"steps must lie in [1, T] = [1, {T_full}]; got range [{steps.min()}, {steps.max()}].")
        steps = steps.astype(np.int64)
    x, s = draws_and_scores(x, score, scores, thin_, batch_size=block_size or 256)
    T, d = x.shape
    scales = resolve_scales(preconditioner, x, score)
    x, s = precondition(x, s, scales)
    counts = -(-steps // thin_)  # thinned draws among the first k: ceil(k / thin)

    B = block_size or (_default_block(T, T) if not per_coordinate else None)
    if B is None:  # per coordinate: the einsum output (B, G, 6d+2) also counts
        n_guess = -(-T // _default_block(T, T)) + len(counts)
        B = _default_block(T, max(T, n_guess * (6 * d + 2)))
    # the (segments × segments [× d]) float64 output is kept below ~256 MB: at most
    # √(3.2e7/d) segments, so pieces grow past B for very long chains
    max_seg = int(np.sqrt(3.2e7 / (d if per_coordinate else 1)))
    B = max(min(B, T), -(-T // max(max_seg - len(counts), 1)))
    ends = _segments(counts[counts > 0], T, B)
    starts = np.concatenate([[0], ends[:-1]])
    Bseg = int(np.max(ends - starts))
    idx = starts[:, None] + np.arange(Bseg)[None, :]
    valid = idx < ends[:, None]
    idx = np.where(valid, idx, 0)
    xj, sj = _to_device(x, s)
    gx, gs = xj[idx], sj[idx]
    gw = jnp.asarray(valid, xj.dtype)
    gi = jnp.asarray(np.where(valid, idx, -1))
    out = _pair_block_sums(
        gx, gs, gw, gi, gx, gs, gw, gi, c=float(c), beta=float(beta),
        per_coordinate=bool(per_coordinate), exclude_diagonal=(statistic == "u"),
    )
    out = np.asarray(out, dtype=np.float64)  # (n_seg, n_seg[, d])
    cum = np.cumsum(np.cumsum(out, axis=0), axis=1)
    seg_of = {int(e): i for i, e in enumerate(ends)}
    vals = np.empty(len(steps))
    for m, k in enumerate(counts):
        total = cum[seg_of[int(k)], seg_of[int(k)]]
        sq = _normalise(total, int(k), statistic)
        vals[m] = np.sum(signed_sqrt(sq)) if per_coordinate else float(signed_sqrt(sq))
    return steps, vals
