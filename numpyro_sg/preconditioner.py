r"""The preconditioner of the gradient-based kernels: an affine change of coordinates.

The kernels move a *working* vector u related to the flat unconstrained parameters θ by
θ = θ₀ + L·u, with the preconditioner M = L·Lᵀ.  A Langevin step in u with step size ε,

.. math:: u' = u + \tfrac{\varepsilon}{2}\,L^\top \hat g(\theta) + \sqrt{\varepsilon\tau}\,\xi,

is the preconditioned step θ' = θ + (ε/2)·M·ĝ(θ) + N(0, ε·τ·M) on θ.  With M the posterior
covariance (the Laplace covariance at the mode, ``preconditioner="laplace"``), ε is
dimensionless: ε = 1 moves about one posterior sd per iteration along every direction.

:class:`Preconditioner` is a pytree with exactly one of three forms: identity (both fields
``None``), diagonal (``scale``: L = diag(scale)) or dense (``chol``: a (d, d) square root L).
The form is static structure (it decides the shapes), the values are data, so a state holding
a preconditioner can be ``vmap``-ed over chains or tuning arms.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

__all__ = [
    "Preconditioner",
    "identity_preconditioner",
    "to_working",
    "from_working",
    "rows_to_working",
    "working_sd",
]


class Preconditioner(NamedTuple):
    """M = L·Lᵀ with L = diag(``scale``) (diagonal), ``chol`` (dense) or I (both ``None``).

    ``kind`` is ``"identity"``, ``"diagonal"`` or ``"dense"``.

    **Example:**

    .. code-block:: python

        P = Preconditioner(scale=jnp.array([0.1, 2.0]))
        to_working(P, jnp.array([1.0, 1.0]))   # Lᵀ g = [0.1, 2.0]
    """

    scale: Any = None
    chol: Any = None

    @property
    def kind(self) -> str:
        if self.chol is not None:
            return "dense"
        return "identity" if self.scale is None else "diagonal"


def identity_preconditioner() -> Preconditioner:
    """M = I: the kernels' plain, unpreconditioned form."""
    return Preconditioner()


def to_working(P: Preconditioner, g):
    """Lᵀ·g: a gradient with respect to θ as a gradient with respect to u (θ = θ₀ + L·u)."""
    if P.chol is not None:
        return P.chol.T @ g
    return g if P.scale is None else P.scale * g


def from_working(P: Preconditioner, du):
    """L·du: an increment of u as an increment of θ."""
    if P.chol is not None:
        return P.chol @ du
    return du if P.scale is None else P.scale * du


def rows_to_working(P: Preconditioner, G):
    """Each row g_i of G (n, d) mapped to Lᵀ·g_i (per-datum gradients into the working frame)."""
    if P.chol is not None:
        return G @ P.chol
    return G if P.scale is None else G * P.scale


def working_sd(P: Preconditioner, dtype=jnp.float32):
    """Per-coordinate sd of θ implied by M = L·Lᵀ taken as a covariance (√diag M), or ``None``."""
    if P.chol is not None:
        return jnp.sqrt(jnp.sum(P.chol * P.chol, axis=1))
    return None if P.scale is None else jnp.asarray(P.scale, dtype)
