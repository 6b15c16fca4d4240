r"""The inverse multi-quadric (IMQ) Stein kernel of one pair of points, and its T×T matrix.

Score s(θ) = ∇ log π(θ).  IMQ base kernel k(x, y) = (c² + ‖x − y‖²)^β (c = 1, β = −½ by
default; Gorham & Mackey (2017), "Measuring sample quality with kernels").  With r = x − y,
u = c² + ‖r‖² and dimension d, the Stein kernel is::

    k_π(x, y) = s(x)·s(y)·u^β − 2β·u^(β−1)·s(x)·r + 2β·u^(β−1)·s(y)·r
                − 2β·d·u^(β−1) − 4β(β−1)·u^(β−2)·‖r‖²

and its per-coordinate form (the supplement of Song, Sun, Ye & Liang (2020), "Extended
stochastic gradient MCMC for large-scale Bayesian variable selection") is k_π = Σ_j k_j.
These are plain references; :mod:`numpyro_sg.diagnostics.ksd_blocks` sums them blockwise.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def imq_stein_kernel(x, y, sx, sy, c=1.0, beta=-0.5):
    """IMQ Stein kernel k_π(x, y) for one pair of points (Gorham & Mackey 2017).

    With r = x − y, u = c² + ‖r‖², d = dim x::

        k_π = s(x)·s(y)·u^β − 2β·u^(β−1)·s(x)·r + 2β·u^(β−1)·s(y)·r
              − 2β·d·u^(β−1) − 4β(β−1)·u^(β−2)·‖r‖²

    A plain (unblocked) reference for the blocked sums of :func:`~numpyro_sg.diagnostics.ksd.ksd_sums`.

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
    """Per-coordinate IMQ Stein kernel (k_1, …, k_d)(x, y) (Song, Sun, Ye & Liang 2020, supplement).

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
    :func:`~numpyro_sg.diagnostics.ksd.ksd`).

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



def stein_kernel_matrix(x, s, *, c=1.0, beta=-0.5) -> np.ndarray:
    """The T×T matrix K_{tt'} = k_π(x_t, x_t') of :func:`imq_stein_kernel`, from Gram matrices.

    With G = x·xᵀ, A = s·xᵀ (A_{ij} = s_i·x_j) and ‖r_ij‖² = G_ii + G_jj − 2G_ij:
    s_i·r_ij = A_ii − A_ij, s_j·r_ij = A_ji − A_jj, so every term of k_π is a matrix
    expression: O(T²·d) work, O(T² + T·d) memory, float64 on the host (x centred first).
    For the few hundred draws a tuner scores; :func:`~numpyro_sg.diagnostics.ksd.ksd_sums` is the blocked form for many.

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
