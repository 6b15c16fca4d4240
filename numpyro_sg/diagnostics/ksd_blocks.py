r"""The blocked double sum Σ_{t,t'} k_π(x_t, x_t') of the IMQ Stein kernel.

The double sum is computed block by block (a row block of B draws against all T draws, as
matrix products), so memory is O(T·B) and a T×T matrix is never formed.  Work is in the
default JAX float dtype (float32 unless ``jax_enable_x64``); coordinates are centred first
(the kernel is translation invariant), matrix products run at full precision and the
per-block partial sums are accumulated in float64 on the host.  The kernel is that of
:mod:`numpyro_sg.diagnostics.stein_kernels`.
"""

from __future__ import annotations

import time
from functools import partial

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

_HIGHEST = lax.Precision.HIGHEST
#: target number of elements of one (row block × columns) matrix: 2**22 float32 = 16 MiB
BLOCK_ELEMENTS = 2**22


def _column_features(cx, cs, per_coordinate):
    """The column draws flattened, X (G·C, d), their squared norms, and the right-hand sides
    that :func:`_block_sums` multiplies by u^(β−1) and u^(β−2)."""
    G, C, d = cx.shape
    X = cx.reshape(G * C, d)
    S = cs.reshape(G * C, d)
    x_sq = jnp.sum(X * X, axis=1)
    sy_y = jnp.sum(S * X, axis=1)
    ones = jnp.ones((G, C, 1), cx.dtype)
    if per_coordinate:
        w_rhs = jnp.concatenate([ones, cx, cs, cs * cx], axis=-1)  # (G, C, 3d+1)
        v_rhs = jnp.concatenate([ones, cx, cx * cx], axis=-1)  # (G, C, 2d+1)
    else:
        w_rhs = jnp.concatenate([ones, cx, cs, sy_y.reshape(G, C, 1)], axis=-1)  # (G, C, 2d+2)
        v_rhs = jnp.concatenate([ones, cx, x_sq.reshape(G, C, 1)], axis=-1)  # (G, C, d+2)
    return X, x_sq, w_rhs, v_rhs


def _block_sums(xb, sb, wb, ib, columns, *, c, beta, per_coordinate, exclude_diagonal):
    """Σ_{t'} k_π (or each k_j) of one row block (B rows) against every column group.

    Σ_{t'} of each term is (kernel matrix) @ (column features): only u^β, u^(β−1), u^(β−2)
    are formed per pair; everything else is a matrix product (B×C) @ (C×features).
    """
    cx, cs, wc, ic, X, x_sq, w_rhs, v_rhs = columns
    G, C, d = cx.shape
    b1, b2 = 2.0 * beta, 4.0 * beta * (beta - 1.0)
    ein = partial(jnp.einsum, precision=_HIGHEST)
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


@partial(jax.jit, static_argnames=("c", "beta", "per_coordinate", "exclude_diagonal"))
def pair_block_sums(rx, rs, rw, ri, cx, cs, cw, ci, *, c, beta, per_coordinate, exclude_diagonal):
    """Sums of k_π (or of each k_j) over (row block b) × (column group g).

    Rows: ``rx``, ``rs`` (R, B, d), weights ``rw`` (R, B), global indices ``ri`` (R, B).
    Columns: ``cx``, ``cs`` (G, C, d), ``cw`` (G, C), ``ci`` (G, C).  Padding has weight 0;
    ``exclude_diagonal`` drops the pairs of equal global index.  Returns (R, G) or, per
    coordinate, (R, G, d).  One row block at a time (``lax.map``): memory O(B·G·C).
    """
    G, C, _ = cx.shape
    X, x_sq, w_rhs, v_rhs = _column_features(cx, cs, per_coordinate)
    columns = (cx, cs, cw.reshape(G * C), ci.reshape(G * C), X, x_sq, w_rhs, v_rhs)

    def one_block(args):
        return _block_sums(*args, columns, c=c, beta=beta, per_coordinate=per_coordinate,
                           exclude_diagonal=exclude_diagonal)

    return lax.map(one_block, (rx, rs, rw, ri))


def default_block(T: int, width: int) -> int:
    """Rows per block so that one (rows × width) matrix has about 2**22 entries (16 MiB in
    float32), kept within [8, 256] rows (larger blocks measured slower on CPU)."""
    b = BLOCK_ELEMENTS // max(width, 1)
    b = int(min(max(b, 8), 256))
    b -= b % 8
    return max(8, min(b, -(-T // 8) * 8))


def check_block(block_size):
    """``block_size`` validated: a positive integer, or ``None`` (the default size)."""
    if block_size is None:
        return None
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer or None, got {block_size!r}.")
    return int(block_size)


def to_device(x, s):
    """Draws (centred: the kernel is translation invariant, and centring reduces
    cancellation) and scores as JAX arrays of the default float dtype."""
    dtype = jnp.result_type(float)
    x = np.asarray(x, np.float64)
    x = x - x.mean(axis=0)  # translation invariance: centring reduces cancellation
    return jnp.asarray(x, dtype), jnp.asarray(np.asarray(s, np.float64), dtype)


def ksd_sums(x, s, *, c=1.0, beta=-0.5, per_coordinate=False, exclude_diagonal=False, block_size=None):
    """Σ_{t,t'} k_π(x_t, x_t') (float) or the (d,) vector of Σ_{t,t'} k_j, for arrays x, s (T, d).

    No preconditioning or validation here (see :func:`~numpyro_sg.diagnostics.ksd.ksd`);
    ``exclude_diagonal`` drops t = t' (the U-statistic numerator).  Blocked over rows: memory O(T·block_size).

    :param x: draws, array (T, d).
    :param s: scores ∇ log π at the draws, array (T, d).
    :param float c: IMQ offset c > 0.
    :param float beta: IMQ exponent β < 0.
    :param bool per_coordinate: return the (d,) sums of each k_j instead of the sum of k_π.
    :param bool exclude_diagonal: leave out the pairs t = t'.
    :param int block_size: rows per block (default: about 2²² pair entries per block, at most
        256 rows).
    :return: float, or float64 array (d,) when ``per_coordinate``.

    **Example:** one draw, so the sum is k_π(x, x) of
    :func:`~numpyro_sg.diagnostics.stein_kernels.imq_stein_kernel`.

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.ksd import ksd_sums
    >>> x, s = np.zeros((1, 2)), np.array([[1.0, 2.0]])
    >>> ksd_sums(x, s), ksd_sums(x, s, per_coordinate=True).tolist()
    (7.0, [2.0, 5.0])
    """
    T, d = x.shape
    B = check_block(block_size) or default_block(T, T)
    B = min(B, T)
    R = -(-T // B)
    pad = R * B - T
    xj, sj = to_device(x, s)
    xp = jnp.pad(xj, ((0, pad), (0, 0)))
    sp = jnp.pad(sj, ((0, pad), (0, 0)))
    wp = jnp.pad(jnp.ones(T, xj.dtype), (0, pad))
    ip = jnp.arange(R * B)
    out = pair_block_sums(
        xp.reshape(R, B, d), sp.reshape(R, B, d), wp.reshape(R, B), ip.reshape(R, B),
        xp[None], sp[None], wp[None], ip[None],
        c=float(c), beta=float(beta), per_coordinate=bool(per_coordinate),
        exclude_diagonal=bool(exclude_diagonal),
    )
    out = np.asarray(out, dtype=np.float64)  # (R, 1) or (R, 1, d): float64 accumulation
    return out.sum(axis=(0, 1)) if per_coordinate else float(out.sum())


def normalise(total, T, statistic):
    """The V-statistic total/T² (``statistic="v"``) or the U-statistic total/(T(T−1)) (NaN
    for T < 2), in float64."""
    if statistic == "v":
        return np.asarray(total, np.float64) / T**2
    if T < 2:
        return np.full(np.shape(total), np.nan)
    return np.asarray(total, np.float64) / (T * (T - 1))


def chain_pair_sums(x, s, *, c=1.0, beta=-0.5, exclude_diagonal=False, block_size=None, seconds=None):
    """Σ k_j over the draws of every pair of chains, per coordinate: the per-chain, pooled and
    per-coordinate KSDs of a run from one pass over its pairs.

    Row blocks hold one chain's draws each; the columns are grouped by chain, so block (a, b)
    of the pair matrix lands in ``out[a, b]``.  Σ_j out[a, b, j] is the Σ k_π of those pairs.
    The row blocks are summed in at least 16 calls (or one a block); with ``seconds`` the time
    of the second call is projected to all of them, and the work stops when the projection
    exceeds ``seconds`` by a fifth.

    :param x: draws, array (chains, T, d) (already preconditioned).
    :param s: their scores, array (chains, T, d).
    :param float c: IMQ offset c > 0.
    :param float beta: IMQ exponent β < 0.
    :param bool exclude_diagonal: leave out the pairs t = t' (the U-statistic numerator).
    :param int block_size: rows per block (default: about 2²² entries per block matrix).
    :param seconds: a time budget, or ``None``.
    :return: ``(sums, projected)``: float64 array (chains, chains, d), or ``None`` when the
        budget would be exceeded; and the projected seconds of the whole pass (NaN unknown).

    **Example:** one chain of one draw: the k_j of :func:`ksd_sums`.

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.ksd_blocks import chain_pair_sums
    >>> chain_pair_sums(np.zeros((1, 1, 2)), np.array([[[1.0, 2.0]]]))[0].tolist()
    [[[2.0, 5.0]]]
    """
    C, T, d = x.shape
    B = check_block(block_size) or default_block(T, C * max(T, (6 * d + 2) // 4))  # ≤ 64 MiB a feature matrix
    per_chain = -(-T // min(B, T))               # row blocks per chain
    if block_size is None:                       # the same count of blocks, least padding
        B = -(-T // per_chain)
        B += -B % 8 if B > 8 else 0
    B = min(B, T)
    Tp = per_chain * B
    xj, sj = to_device(x.reshape(C * T, d), s.reshape(C * T, d))
    pad = ((0, 0), (0, Tp - T), (0, 0))
    xp, sp = jnp.pad(xj.reshape(C, T, d), pad), jnp.pad(sj.reshape(C, T, d), pad)
    wp = jnp.pad(jnp.ones((C, T), xj.dtype), pad[:2])
    ip = jnp.arange(C * Tp).reshape(C, Tp)
    R = C * per_chain
    per_call = max(k for k in range(1, max(R // 16, 1) + 1) if R % k == 0)   # at least 16 calls
    calls = R // per_call
    rows = [a.reshape((R, B) + a.shape[2:]) for a in (xp, sp, wp, ip)]
    run = partial(pair_block_sums, c=float(c), beta=float(beta), per_coordinate=True,
                  exclude_diagonal=bool(exclude_diagonal))
    start, parts, projected = time.perf_counter(), [], float("nan")
    for k in range(calls):
        part = slice(k * per_call, (k + 1) * per_call)
        parts.append(np.asarray(run(*(a[part] for a in rows), xp, sp, wp, ip), np.float64))
        if k == 0:
            first = time.perf_counter()
        elif k == 1:
            projected = first - start + (time.perf_counter() - first) * (calls - 1)
            if seconds is not None and projected > 1.2 * seconds:   # (a restart costs a compilation)
                return None, projected
    out = np.concatenate(parts)                  # (R, C, d)
    return out.reshape(C, per_chain, C, d).sum(axis=1), projected
