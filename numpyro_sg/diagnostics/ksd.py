r"""Kernel Stein discrepancy (KSD) of draws with the inverse multi-quadric (IMQ) kernel (SPEC §7).

This module works on **arrays only**: draws x (T, d) and either a score function or the
precomputed scores.  For an ArviZ ``InferenceData`` or a NumPyro ``MCMC`` run use
:func:`numpyro_sg.ksd`, which reads the model and forwards arrays here.

Score s(θ) = ∇ log π(θ).  IMQ base kernel k(x, y) = (c² + ‖x − y‖²)^β (c = 1, β = −½ by
default).  With r = x − y, u = c² + ‖r‖² and dimension d, the Stein kernel is::

    k_π(x, y) = s(x)·s(y)·u^β − 2β·u^(β−1)·s(x)·r + 2β·u^(β−1)·s(y)·r
                − 2β·d·u^(β−1) − 4β(β−1)·u^(β−2)·‖r‖²

and, for draws θ_1 … θ_T::

    KSD = √( (1/T²)·Σ_{t,t'} k_π(θ_t, θ_t') )                       (V-statistic, default)
    KSD_U² = (1/(T(T−1)))·Σ_{t≠t'} k_π(θ_t, θ_t')                   (U-statistic, option).

Per-coordinate form (paper 000, supplement §4.4): k_π = Σ_j k_j with::

    k_j(x, y) = s_j(x)s_j(y)·u^β − 2β·u^(β−1)·s_j(x)·r_j + 2β·u^(β−1)·s_j(y)·r_j
                − 2β·u^(β−1) − 4β(β−1)·u^(β−2)·r_j²,

V_j = (1/T²)·Σ_{t,t'} k_j(θ_t, θ_t') and per-coordinate KSD = Σ_j √V_j.

**Preconditioning (scale-aware by default).**  By default every coordinate is divided by a
per-coordinate scale s_j before the kernel is applied: x → x/s, score → score·s (see
:mod:`numpyro_sg.diagnostics.scales`).  ``preconditioner=None`` gives the papers' raw form
(use it to reproduce their numbers and to compare with SGMCMCJax or stein_thinning).  When
several runs are compared they must share one set of scales: compute them once with
:func:`numpyro_sg.diagnostics.scales.resolve_scales` (or :func:`numpyro_sg.infer.laplace.laplace_scales`)
and pass the array.

**Computation.**  The double sum is computed block by block (a row block of B draws against
all T draws, as matrix products), so memory is O(T·B) and a T×T matrix is never formed.  Work
is in the default JAX float dtype (float32 unless ``jax_enable_x64``); coordinates are centred
first (the kernel is translation invariant), matrix products run at full precision and the
per-block partial sums are accumulated in float64 on the host.
"""

from __future__ import annotations

from functools import partial

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from numpyro_sg.diagnostics.scales import precondition, resolve_scales
from numpyro_sg.diagnostics.validation import (
    as_draws,
    check_kernel_args,
    check_thin,
    draws_and_scores,
    reject_run,
)

__all__ = [
    "imq_stein_kernel",
    "imq_stein_kernel_per_coordinate",
    "signed_sqrt",
    "ksd_sums",
    "ksd",
    "ksd_per_coordinate",
    "stein_kernel_matrix",
    "ksd_u_statistic",
    "default_path_steps",
    "ksd_path",
]

_HIGHEST = lax.Precision.HIGHEST
# Target number of elements of one (row block × columns) matrix: 2**22 float32 = 16 MiB.
_BLOCK_ELEMENTS = 2**22
# what to call instead with an InferenceData or MCMC run
_RUN_ENTRY = "numpyro_sg.ksd"


# --------------------------------------------------------------------------------------------
# Reference Stein kernels (one pair of points)
# --------------------------------------------------------------------------------------------


def imq_stein_kernel(x, y, sx, sy, c=1.0, beta=-0.5):
    """IMQ Stein kernel k_π(x, y) for one pair of points (SPEC §7).

    With r = x − y, u = c² + ‖r‖², d = dim x::

        k_π = s(x)·s(y)·u^β − 2β·u^(β−1)·s(x)·r + 2β·u^(β−1)·s(y)·r
              − 2β·d·u^(β−1) − 4β(β−1)·u^(β−2)·‖r‖²

    A plain (unblocked) reference for the blocked sums of :func:`ksd_sums`.

    :param x: point (d,).
    :param y: point (d,).
    :param sx: score ∇ log π(x), shape (d,).
    :param sy: score ∇ log π(y), shape (d,).
    :param float c: IMQ offset c > 0.
    :param float beta: IMQ exponent β < 0.
    :return: scalar k_π(x, y).

    **Example:** at x = y, k_π = ‖s(x)‖²·c^(2β) − 2β·d·c^(2(β−1)), here 1 + 4 + 2 = 7.

    >>> import jax.numpy as jnp
    >>> from numpyro_sg.diagnostics.ksd import imq_stein_kernel
    >>> x, s = jnp.zeros(2), jnp.array([1.0, 2.0])
    >>> float(imq_stein_kernel(x, x, s, s))
    7.0
    """
    return jnp.sum(imq_stein_kernel_per_coordinate(x, y, sx, sy, c, beta), axis=-1)


def imq_stein_kernel_per_coordinate(x, y, sx, sy, c=1.0, beta=-0.5):
    """Per-coordinate IMQ Stein kernel (k_1, …, k_d)(x, y) (paper 000, supplement §4.4).

    With r = x − y, u = c² + ‖r‖²::

        k_j = s_j(x)s_j(y)·u^β − 2β·u^(β−1)·s_j(x)·r_j + 2β·u^(β−1)·s_j(y)·r_j
              − 2β·u^(β−1) − 4β(β−1)·u^(β−2)·r_j²

    so that Σ_j k_j = :func:`imq_stein_kernel`.  The parameters are those of
    :func:`imq_stein_kernel`.

    :return: array (d,) of k_j(x, y).

    **Example:**

    >>> import jax.numpy as jnp
    >>> from numpyro_sg.diagnostics.ksd import imq_stein_kernel_per_coordinate
    >>> x, s = jnp.zeros(2), jnp.array([1.0, 2.0])
    >>> imq_stein_kernel_per_coordinate(x, x, s, s).tolist()
    [2.0, 5.0]
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
    """sign(v)·√|v|, elementwise, in float64: how a negative U-statistic is reported (see
    :func:`ksd`).

    :param value: array-like of squared values.
    :return: float64 numpy array of the same shape.

    **Example:**

    >>> from numpyro_sg.diagnostics.ksd import signed_sqrt
    >>> signed_sqrt([4.0, -9.0]).tolist()
    [2.0, -3.0]
    """
    value = np.asarray(value, dtype=np.float64)
    return np.sign(value) * np.sqrt(np.abs(value))


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

    :param x: draws, array (T, d).
    :param s: scores ∇ log π at the draws, array (T, d).
    :param float c: IMQ offset c > 0.
    :param float beta: IMQ exponent β < 0.
    :param bool per_coordinate: return the (d,) sums of each k_j instead of the sum of k_π.
    :param bool exclude_diagonal: leave out the pairs t = t'.
    :param int block_size: rows per block (default: about 2²² pair entries per block, at most
        256 rows).
    :return: float, or float64 array (d,) when ``per_coordinate``.

    **Example:** one draw, so the sum is k_π(x, x) of :func:`imq_stein_kernel`.

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.ksd import ksd_sums
    >>> x, s = np.zeros((1, 2)), np.array([[1.0, 2.0]])
    >>> ksd_sums(x, s), ksd_sums(x, s, per_coordinate=True).tolist()
    (7.0, [2.0, 5.0])
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



def ksd(x, score=None, *, scores=None, c=1.0, beta=-0.5, preconditioner="sd", per_coordinate=False,
        statistic="v", thin=None, block_size=None):
    """Kernel Stein discrepancy of draws ``x`` (an array) from π, IMQ kernel (SPEC §7).

    KSD = √((1/T²)·Σ_{t,t'} k_π(θ_t, θ_t')) (V-statistic), with k_π the IMQ Stein kernel
    (:func:`imq_stein_kernel`) applied after preconditioning x → x/s, score → score·s.
    ``per_coordinate=True`` returns paper 000's form Σ_j √V_j, V_j = (1/T²)·Σ_{t,t'} k_j.

    ``statistic="u"`` uses KSD_U² = (1/(T(T−1)))·Σ_{t≠t'} k_π, unbiased for KSD² but possibly
    negative when the draws fit π well; it is reported as the signed root sign(KSD_U²)·√|KSD_U²|
    (so it can be negative, and orders samples as KSD_U² does); per coordinate each term is a
    signed root.  T = 1 gives NaN for the U-statistic.

    This is the array form; :func:`numpyro_sg.ksd` takes arrays too (and forwards them here)
    as well as an ArviZ ``InferenceData`` or an MCMC run.  The parameters below are shared by
    :func:`ksd_per_coordinate`, :func:`ksd_path` and :func:`numpyro_sg.ksd`.

    :param x: draws, array (T, d).
    :param score: function mapping one point (d,) to ∇ log π there; applied to the draws in
        jitted, vmapped blocks.  Give this or ``scores``.
    :param scores: precomputed scores ∇ log π(x_t), array (T, d).
    :param float c: IMQ offset c > 0 (default 1).
    :param float beta: IMQ exponent β < 0 (default −½).
    :param preconditioner: ``"sd"`` (default: per-coordinate sd of the draws scored),
        ``"laplace"`` (needs ``score``), an array of (d,) positive scales, or ``None`` (the
        papers' raw form); see :func:`numpyro_sg.diagnostics.scales.resolve_scales`.
    :param bool per_coordinate: return Σ_j √V_j instead of √(Σ_j V_j).
    :param str statistic: ``"v"`` (V-statistic, default) or ``"u"`` (U-statistic).
    :param int thin: keep every ``thin``-th draw before scoring.
    :param int block_size: rows per block (default: about 2²² pair entries per block, at most
        256 rows).
    :return: float.
    :raises TypeError: for an ``InferenceData`` or MCMC run (use :func:`numpyro_sg.ksd`).
    :raises ValueError: for invalid draws, scores or options.

    **Example:** exact draws from N(0, I) score lower against N(0, I) than against N(1, I).

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.ksd import ksd
    >>> x = np.random.default_rng(0).normal(size=(1000, 2))
    >>> good = ksd(x, lambda z: -z)
    >>> bad = ksd(x, lambda z: -(z - 1.0))
    >>> bool(good < bad)
    True
    """
    reject_run(x, "numpyro_sg.diagnostics.ksd.ksd", _RUN_ENTRY)
    sq = _squared_terms(
        x, score, scores, c=c, beta=beta, preconditioner=preconditioner,
        per_coordinate=per_coordinate, statistic=statistic, thin=thin, block_size=block_size,
    )
    return float(np.sum(signed_sqrt(sq))) if per_coordinate else float(signed_sqrt(sq))


def ksd_per_coordinate(x, score=None, *, scores=None, c=1.0, beta=-0.5, preconditioner="sd",
                       statistic="v", thin=None, block_size=None):
    """The per-coordinate terms √V_j of paper 000's KSD, an array (d,) whose sum is
    ``ksd(..., per_coordinate=True)``.

    V_j = (1/T²)·Σ_{t,t'} k_j(θ_t, θ_t') with k_j :func:`imq_stein_kernel_per_coordinate`,
    after preconditioning.  With ``statistic="u"`` each term is the signed root of the
    U-statistic (see :func:`ksd`).  Note the coordinates interact through u = c² + ‖r‖², so
    a term is not the KSD of that coordinate's marginal.

    The parameters (``x``, ``score``, ``scores``, ``c``, ``beta``, ``preconditioner``,
    ``statistic``, ``thin``, ``block_size``) are those of :func:`ksd`.

    :return: float64 numpy array (d,).

    **Example:** the second coordinate of these draws is off by one sd.

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.ksd import ksd, ksd_per_coordinate
    >>> x = np.random.default_rng(0).normal(size=(1000, 2))
    >>> terms = ksd_per_coordinate(x, lambda z: -(z - np.array([0.0, 1.0])))
    >>> bool(terms[1] > terms[0])
    True
    >>> bool(np.isclose(terms.sum(), ksd(x, lambda z: -(z - np.array([0.0, 1.0])), per_coordinate=True)))
    True
    """
    reject_run(x, "ksd_per_coordinate", _RUN_ENTRY)
    sq = _squared_terms(
        x, score, scores, c=c, beta=beta, preconditioner=preconditioner, per_coordinate=True,
        statistic=statistic, thin=thin, block_size=block_size,
    )
    return signed_sqrt(sq)


def stein_kernel_matrix(x, s, *, c=1.0, beta=-0.5) -> np.ndarray:
    """The T×T matrix K_{tt'} = k_π(x_t, x_t') of :func:`imq_stein_kernel`, from Gram matrices.

    With G = x·xᵀ, A = s·xᵀ (A_{ij} = s_i·x_j) and ‖r_ij‖² = G_ii + G_jj − 2G_ij:
    s_i·r_ij = A_ii − A_ij, s_j·r_ij = A_ji − A_jj, so every term of k_π is a matrix
    expression: O(T²·d) work, O(T² + T·d) memory, float64 on the host (x centred first).
    For the few hundred draws a tuner scores; :func:`ksd_sums` is the blocked form for many.

    :param x: draws (T, d) (already preconditioned).
    :param s: their scores (T, d).
    :return: float64 array (T, T).
    """
    x = np.asarray(x, np.float64)
    s = np.asarray(s, np.float64)
    x = x - x.mean(axis=0)
    d = x.shape[1]
    G = x @ x.T
    A = s @ x.T
    g = np.diag(G)
    a = np.diag(A)
    r2 = np.maximum(g[:, None] + g[None, :] - 2.0 * G, 0.0)
    u = c**2 + r2
    sx_r = a[:, None] - A             # s_i·(x_i − x_j)
    sy_r = A.T - a[None, :]           # s_j·(x_i − x_j)
    return ((s @ s.T) * u**beta - 2 * beta * u ** (beta - 1) * sx_r + 2 * beta * u ** (beta - 1) * sy_r
            - 2 * beta * d * u ** (beta - 1) - 4 * beta * (beta - 1) * u ** (beta - 2) * r2)


def ksd_u_statistic(x, s, *, c=1.0, beta=-0.5, preconditioner=None) -> tuple[float, float]:
    """KSD_U² = (1/(T(T−1)))·Σ_{t≠t'} k_π(x_t, x_t') and its standard error.

    Unbiased for KSD²(q) when the draws are independent from q, even when the scores are
    unbiased *stochastic* estimates with independent noise per draw (the stochastic Stein
    discrepancy of Gorham, Raj & Mackey 2020: k_π is linear in each of s(x), s(y), and the
    diagonal, the only term where the noise enters squared, is left out).  The standard error
    is the U-statistic's (Hoeffding): se² = 4·Var_t(h_t)/T + 2·mean_{t≠t'}(k_π²)/(T(T−1)),
    h_t = (1/(T−1))·Σ_{t'≠t} k_π(x_t, x_t').

    :param x: draws (T, d), T ≥ 2.
    :param s: scores at the draws (T, d), exact or stochastic.
    :param preconditioner: an array of (d,) scales (x → x/scale, s → s·scale) or ``None``.
    :return: ``(KSD_U², se)``, floats (KSD_U² may be negative).

    **Example:** exact draws from N(0, I) score ≈ 0 (within a few se) against N(0, I) and
    clearly positive against N(1, I).

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.ksd import ksd_u_statistic
    >>> x = np.random.default_rng(0).normal(size=(400, 2))
    >>> u0, se0 = ksd_u_statistic(x, -x)
    >>> u1, se1 = ksd_u_statistic(x, -(x - 1.0))
    >>> bool(abs(u0) < 3 * se0 and u1 > 10 * se1)
    True
    """
    check_kernel_args(c, beta, "u")
    x = np.asarray(x, np.float64)
    s = np.asarray(s, np.float64)
    if x.ndim != 2 or x.shape != s.shape or x.shape[0] < 2:
        raise ValueError(f"x and s must have one shape (T, d) with T ≥ 2; got {x.shape} and {s.shape}.")
    if preconditioner is not None:
        x, s = precondition(x, s, np.asarray(preconditioner, np.float64))
    T = x.shape[0]
    K = stein_kernel_matrix(x, s, c=c, beta=beta)
    np.fill_diagonal(K, 0.0)
    u = K.sum() / (T * (T - 1))
    h = K.sum(axis=1) / (T - 1)
    var = 4.0 * h.var() / T + 2.0 * (K**2).sum() / (T * (T - 1)) / (T * (T - 1))
    return float(u), float(np.sqrt(var))


# --------------------------------------------------------------------------------------------
# KSD path (KSD of the first k draws for several k, one pass)
# --------------------------------------------------------------------------------------------


def default_path_steps(T: int, num_steps: int = 20) -> np.ndarray:
    """About ``num_steps`` evenly spaced draw counts T/num_steps, 2T/num_steps, …, T.

    :param int T: number of draws.
    :param int num_steps: number of counts wanted (fewer when T < num_steps: duplicates are
        dropped).
    :return: sorted, unique int64 array of counts in [1, T], ending with T.

    **Example:**

    >>> from numpyro_sg.diagnostics.ksd import default_path_steps
    >>> default_path_steps(100, 4).tolist()
    [25, 50, 75, 100]
    """
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


def ksd_path(x, score=None, *, scores=None, steps=None, num_steps=20, c=1.0, beta=-0.5,
             preconditioner="sd", per_coordinate=False, statistic="v", thin=None, block_size=None):
    """KSD of the first k draws, for several k, in one blocked pass (a KSD-versus-time path).

    The draws are cut into segments at the requested steps (and into pieces of at most
    ``block_size``); one pass computes the (segments × segments) matrix of block-pair sums
    of k_π (or of each k_j), and a 2-D cumulative sum gives Σ_{t,t'<k} at every step k.
    Cost: one KSD of all T draws; memory O(T·block + segments²·d).

    **One scale for the whole path**: with ``preconditioner="sd"`` the scales are the sd of
    *all* (thinned) draws, not of the first k, so every point of the path is on the same
    scale; ``"laplace"`` and arrays are likewise fixed.  The value at k = T therefore equals
    ``ksd`` of all draws.

    The other parameters (``x``, ``score``, ``scores``, ``c``, ``beta``, ``preconditioner``,
    ``per_coordinate``, ``statistic``, ``thin``, ``block_size``) are those of :func:`ksd`,
    applied at each step.

    :param steps: draw counts k (1 ≤ k ≤ T, counted in ``x`` before thinning; the value at k
        uses the thinned draws among the first k).  Default: ``num_steps`` evenly spaced
        counts up to T (:func:`default_path_steps`).
    :param int num_steps: number of default steps.
    :return: (steps, ksd): int64 array of the steps and float64 array of the KSD values
        (NaN for the U-statistic where fewer than 2 draws are used).

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.ksd import ksd, ksd_path
    >>> x = np.random.default_rng(0).normal(size=(1000, 2))
    >>> steps, values = ksd_path(x, scores=-x, num_steps=4)
    >>> steps.tolist()
    [250, 500, 750, 1000]
    >>> bool(np.isclose(values[-1], ksd(x, scores=-x)))
    True
    """
    reject_run(x, "ksd_path", _RUN_ENTRY)
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
