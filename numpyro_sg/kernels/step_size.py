r"""Step sizes: constants, per-coordinate arrays and schedules, as held in a kernel's state.

Convention of the whole package: the Langevin move with step size ε and temperature τ is
θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·τ·I), applied to the working coordinates of the preconditioner
(:mod:`numpyro_sg.infer.preconditioner`).  With the default Laplace preconditioner ε is in
units of the posterior variance (ε = 1 moves about one posterior sd per step); with
``preconditioner=None`` it is in the units of the unconstrained parameters' variance, as in
the papers that define the kernels.

* :func:`resolve_step_size` turns what a user passes into what a state holds;
* :class:`PolynomialSchedule` / :func:`polynomial_schedule` (ε_t = a·(b + t)^(−κ)) and
  :class:`CallableSchedule` (any t ↦ ε_t) are pytrees, so a schedule can live in a state;
* :func:`step_size_at` evaluates the held value at an iteration.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["resolve_step_size", "step_size_at", "polynomial_schedule"]


# -------------------------------------------------------------------------------------------
class PolynomialSchedule(NamedTuple):
    """Decaying step sizes ε_t = a·(b + t)^(−κ) (a pytree: it can live in a kernel state).

    **Example:**

    .. code-block:: python

        schedule = PolynomialSchedule(1e-2, 1.0, 0.55)
        schedule(10)   # 1e-2 · 11^(−0.55)
    """

    a: Any
    b: Any
    kappa: Any

    def __call__(self, t):
        return self.a * (self.b + t) ** (-self.kappa)


@jax.tree_util.register_pytree_node_class
class CallableSchedule:
    """A user's callable t ↦ ε_t, times a ``scale`` held as data (so a tuner can vary it).

    The callable itself is static (it cannot be traced as state); ε_t = scale·fn(t).
    """

    def __init__(self, fn: Callable, scale=1.0):
        self.fn = fn
        self.scale = scale

    def __call__(self, t):
        return self.scale * self.fn(t)

    def tree_flatten(self):
        return (self.scale,), self.fn

    @classmethod
    def tree_unflatten(cls, fn, children):
        return cls(fn, children[0])


def polynomial_schedule(a: float, b: float = 1.0, kappa: float = 0.55) -> PolynomialSchedule:
    """Decaying step sizes ε_t = a·(b + t)^(−κ), κ ∈ (0, 1] (t = 0, 1, … counts warmup too).

    :param float a: scale a > 0.
    :param float b: offset b > 0.
    :param float kappa: decay exponent κ ∈ (0, 1].
    :return: a :class:`PolynomialSchedule` (callable, and a pytree).

    **Example:**

    .. code-block:: python

        kernel = nsg.SGLD(model, nsg.polynomial_schedule(1e-2, 1.0, 0.55),
                          preconditioner=None, gradient="plain")
    """
    if not 0.0 < kappa <= 1.0:
        raise ValueError(f"kappa must lie in (0, 1], got {kappa}.")
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be positive, got a={a}, b={b}.")
    return PolynomialSchedule(float(a), float(b), float(kappa))


def step_size_at(step_size, t, dtype=None):
    """ε_t: a schedule evaluated at iteration ``t``, or the constant (scalar or per coordinate)."""
    value = step_size(t) if callable(step_size) else step_size
    return jnp.asarray(value, dtype=dtype or jnp.result_type(float))


def resolve_step_size(step_size, default, dim: int):
    """A Langevin-family step size as held in a kernel's hyperparameters.

    ``default`` when ``step_size`` is ``None``; a schedule pytree as is; any other callable
    t ↦ ε_t wrapped in a :class:`~numpyro_sg.kernels.moves.CallableSchedule`; otherwise an
    array, a scalar or one entry per unconstrained coordinate (shape ``(dim,)``, checked).
    """
    eps = default if step_size is None else step_size
    if callable(eps) and not isinstance(eps, (PolynomialSchedule, CallableSchedule)):
        eps = CallableSchedule(eps)
    if not callable(eps):
        eps = jnp.asarray(eps, jnp.result_type(float))
        if eps.ndim > 1 or (eps.ndim == 1 and eps.shape != (dim,)):
            raise ValueError(
                f"step_size has shape {eps.shape} but the model has {dim} unconstrained coordinates."
            )
    return eps
