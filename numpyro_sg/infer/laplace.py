r"""Damped Newton iterations and the Laplace approximation of a density (no ``numpyro_sg`` imports).

:func:`damped_newton` is the one Newton loop of the package: damped steps
(:func:`damped_newton_step`) with a halving line search (:func:`line_search`) until every step
component is below a tolerance in Laplace sds.  The kernels' warmup runs it on the full-data log
density (:func:`numpyro_sg.infer.warmup.find_mode`); :func:`laplace_approximation` runs it on a
score s(θ) = ∇ log π(θ) given as a JAX function (the Hessian H = ∇² log π is
``jax.jacfwd(score)``) and returns the mode with the Laplace scales √diag((−H)⁻¹) there;
:func:`laplace_scales` returns the scales only.  The diagnostics use the scales as the
``preconditioner="laplace"`` of the KSD and FSSD.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def damped_newton_step(neg_hessian, grad):
    """The Newton step (−H + λI)⁻¹·g towards a mode, with λ = 0 when −H is positive definite
    and otherwise just enough (Levenberg–Marquardt) to make it so; ``neg_hessian`` may be a
    (d, d) matrix or its diagonal (d,).

    :return: ``(step, sd, damped)``: the step, √diag((−H + λI)⁻¹) (the Laplace sds when not
        damped) and whether λ > 0.

    **Example:**

    >>> step, sd, damped = damped_newton_step(np.array([[2.0, 0.0], [0.0, 4.0]]), np.array([1.0, 1.0]))
    >>> step.tolist(), damped
    ([0.5, 0.25], False)
    """
    neg_hessian = np.asarray(neg_hessian, np.float64)
    grad = np.asarray(grad, np.float64)
    if neg_hessian.ndim == 1:
        positive = np.all(neg_hessian > 0)
        lam = 0.0 if positive else -np.min(neg_hessian) + 1e-3 * max(np.max(np.abs(neg_hessian)), 1.0)
        curvature = neg_hessian + lam
        return grad / curvature, 1.0 / np.sqrt(curvature), lam > 0
    eig = np.linalg.eigvalsh(neg_hessian)
    lam = 0.0 if eig[0] > 0 else -eig[0] + 1e-3 * max(abs(eig[-1]), 1.0)
    A = neg_hessian + lam * np.eye(len(grad))
    step = np.linalg.solve(A, grad)
    sd = np.sqrt(np.clip(np.diag(np.linalg.inv(A)), 1e-300, None))
    return step, sd, lam > 0


class NewtonResult(NamedTuple):
    """The end of a :func:`damped_newton` loop.

    :ivar point: the last accepted point.
    :ivar state: ``evaluate(point)``.
    :ivar bool converged: every component of the last Newton step was below the tolerance.
    :ivar int steps: Newton steps taken (the converging one counted).
    :ivar bool stalled: the loop stopped because no damped step passed the line search.
    :ivar bool damped: the last step was damped (−H not positive definite there).
    """

    point: Any
    state: Any
    converged: bool
    steps: int
    stalled: bool
    damped: bool


def _add(point, alpha, step):
    return point + alpha * step


def line_search(evaluate: Callable, accept: Callable, point, state, step, move: Callable = _add,
                halvings: int = 10):
    """``move(point, α, step)`` with α = 1, ½, …, 2^−``halvings`` until
    ``accept(state, evaluate(new point))``.

    :return: ``(new point, its state, True)``, or ``(point, state, False)`` when no α passes.

    **Example:**

    >>> line_search(lambda x: -x**2, lambda old, new: new > old, 1.0, -1.0, -4.0)
    (0.0, -0.0, True)
    """
    alpha = 1.0
    for _ in range(halvings + 1):
        new_point = move(point, alpha, step)
        new_state = evaluate(new_point)
        if accept(state, new_state):
            return new_point, new_state, True
        alpha *= 0.5
    return point, state, False


def log_density_not_lower(old, new) -> bool:
    """A line-search test on ``(log π, ∇ log π)`` states: finite, and log π not lower than the
    old state's (up to a relative 10⁻⁶)."""
    value, grad = new
    return bool(np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
                and float(value) >= float(old[0]) - 1e-6 * abs(float(old[0])))


def scaled_gradient_not_larger(old, new, scale) -> bool:
    """A line-search test on ``(log π, ∇ log π)`` states for a log π whose value is noisier
    than its gradient (a Monte Carlo marginal whose draws move with θ, while its gradient holds
    them fixed): finite, and ‖scale·∇ log π‖ not larger than the old state's (up to 10⁻⁶)."""
    value, grad = new
    size = lambda g: float(np.linalg.norm(np.asarray(scale, np.float64) * np.asarray(g, np.float64)))
    return bool(np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad)))
                and size(grad) <= size(old[1]) * (1.0 + 1e-6))


def damped_newton(evaluate: Callable, point, *, gradient: Callable, curvature: Callable,
                  accept: Callable, max_steps: int, tolerance: float, move: Callable = _add,
                  polish: bool = False, halvings: int = 10) -> NewtonResult:
    r"""Damped Newton iterations θ ← θ + α·(−H + λI)⁻¹·g towards a mode.

    Each iteration takes ``(step, sd, damped) =``
    :func:`damped_newton_step`\ ``(curvature(θ, state), gradient(state))``; it has converged
    when the step is not damped and every ``|step_j| ≤ tolerance·sd_j`` (with ``polish`` the
    converging step is taken too); otherwise α = 1, ½, … is chosen by :func:`line_search`
    with ``accept(old state, new state)``, and the loop stops (``stalled``) when none passes.

    :param evaluate: θ → state (e.g. ``(log π, ∇ log π)``); called once per trial point.
    :param gradient: state → g = ∇ log π (d,).
    :param curvature: ``(θ, state)`` → −H, a (d, d) matrix or its diagonal (d,).
    :param accept: ``(old state, new state)`` → whether a trial point is accepted.
    :param int max_steps: at most this many Newton steps.
    :param float tolerance: in units of the Laplace sds ``sd``.
    :param move: ``(θ, α, step)`` → the trial point (default θ + α·step).
    :return: a :class:`NewtonResult`.

    **Example:** one step reaches the mode of a Gaussian, the second sees it has converged.

    >>> A = np.array([[2.0, 0.5], [0.5, 1.0]])
    >>> res = damped_newton(lambda x: -A @ (x - 1.0), np.zeros(2), gradient=lambda g: g,
    ...                     curvature=lambda x, g: A, accept=lambda old, new: True,
    ...                     max_steps=10, tolerance=1e-6)
    >>> res.point.round(6).tolist(), res.converged, res.steps
    ([1.0, 1.0], True, 2)
    """
    state = evaluate(point)
    damped = False
    for taken in range(1, max_steps + 1):
        step, sd, damped = damped_newton_step(curvature(point, state), gradient(state))
        if not damped and np.all(np.abs(step) <= tolerance * sd):
            if polish:
                point = move(point, 1.0, step)
                state = evaluate(point)
            return NewtonResult(point, state, True, taken, False, damped)
        point, state, accepted = line_search(evaluate, accept, point, state, step, move, halvings)
        if not accepted:
            return NewtonResult(point, state, False, taken, True, damped)
    return NewtonResult(point, state, False, max_steps, False, damped)


def laplace_scales(score, init, num_steps: int = 50, tol: float = 1e-4) -> np.ndarray:
    r"""Laplace scales √diag((−H)⁻¹) at the mode of π, H = ∇² log π there.

    The second element of :func:`laplace_approximation` (same arguments, same errors): the
    per-coordinate sds of the Gaussian approximation of π at its mode, used as the
    ``preconditioner="laplace"`` scales of the KSD and FSSD.

    :param score: function of one point (d,) returning ∇ log π there (JAX-differentiable).
    :param init: start point of the mode search, shape (d,).
    :param int num_steps: maximal number of damped Newton steps.
    :param float tol: convergence tolerance, in units of the Laplace sd.
    :return: float64 array (d,) of positive scales.
    :raises ValueError: as :func:`laplace_approximation`.

    **Example:**

    >>> import jax.numpy as jnp
    >>> from numpyro_sg.infer.laplace import laplace_scales
    >>> sd = jnp.array([0.5, 2.0])
    >>> laplace_scales(lambda z: -z / sd**2, jnp.ones(2)).round(3)
    array([0.5, 2. ])
    """
    return laplace_approximation(score, init, num_steps, tol)[1]


def laplace_approximation(score, init, num_steps: int = 50, tol: float = 1e-4):
    r"""Mode of π and Laplace scales √diag((−H)⁻¹) there, H = ∇² log π = ``jax.jacfwd(score)``.

    The mode is found by :func:`damped_newton` on the score started at ``init`` (e.g. the mean
    of the draws): θ ← θ + α·(−H + λI)⁻¹·s(θ), λ = 0 while −H is positive definite (else just
    enough to make it so), α halved (up to 10 times) until ‖s‖ does not increase (an error
    if no α does).  Converged when every Newton step component is below ``tol`` times that
    coordinate's Laplace sd (that last step is taken too).

    :param score: function of one point (d,) returning ∇ log π there (JAX-differentiable).
    :param init: start point, shape (d,).
    :param int num_steps: maximal number of Newton steps.
    :param float tol: convergence tolerance, in units of the Laplace sd.
    :return: ``(mode, scales)``, float64 arrays (d,) (the scales positive).
    :raises ValueError: if the iteration does not converge in ``num_steps`` steps, produces
        non-finite values, or the Hessian at the mode is not negative definite.

    **Example:** a Gaussian N(μ, diag(σ²)) has its mode at μ and Laplace scales σ.

    >>> import jax.numpy as jnp
    >>> from numpyro_sg.infer.laplace import laplace_approximation
    >>> mu, sd = jnp.array([1.0, -2.0]), jnp.array([0.5, 2.0])
    >>> mode, scales = laplace_approximation(lambda z: -(z - mu) / sd**2, jnp.zeros(2))
    >>> mode.round(3), scales.round(3)
    (array([ 1., -2.]), array([0.5, 2. ]))
    """
    theta = np.asarray(init, dtype=np.float64)
    if theta.ndim != 1:
        raise ValueError(f"init must be a point of shape (d,), got shape {theta.shape}.")
    res = damped_newton(
        _score_and_hessian(score, theta.shape), theta, gradient=lambda gh: gh[0],
        curvature=_finite_curvature, accept=_score_not_larger, max_steps=num_steps,
        tolerance=tol, polish=True,
    )
    if not res.converged:
        norm = np.linalg.norm(res.state[0])
        if res.stalled:
            why = ("; the Hessian there is not negative definite (log π has no mode near the start)"
                   if res.damped else "")
            raise ValueError(
                f"laplace_scales: no damped Newton step reduced ‖score‖ = {norm:.3g} at "
                f"θ = {res.point!r}{why}. Pass scales explicitly or use preconditioner='sd'."
            )
        raise ValueError(
            f"laplace_scales: damped Newton did not converge in {num_steps} steps "
            f"(last ‖score‖ = {norm:.3g}); pass scales explicitly or use "
            "preconditioner='sd'."
        )
    return res.point, _scales_at_mode(-res.state[1])


def _score_and_hessian(score, shape):
    """θ → (s(θ), H(θ)) in float64, H symmetrised; an error if s does not keep θ's shape."""
    dtype = jnp.result_type(float)
    score_j = jax.jit(score)
    hess_j = jax.jit(jax.jacfwd(score))

    def grad_hess(t):
        tj = jnp.asarray(t, dtype=dtype)
        g = np.asarray(score_j(tj), dtype=np.float64)
        h = np.asarray(hess_j(tj), dtype=np.float64)
        if g.shape != shape or h.shape != shape * 2:
            raise ValueError(
                f"score must map a point of shape {shape} to the same shape; got {g.shape}."
            )
        return g, 0.5 * (h + h.T)

    return grad_hess


def _finite_curvature(theta, grad_hess):
    g, h = grad_hess
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
        raise ValueError(f"laplace_scales: non-finite score or Hessian at θ = {theta!r}.")
    return -h


def _score_not_larger(old, new):
    return bool(np.all(np.isfinite(new[0])) and np.linalg.norm(new[0]) <= np.linalg.norm(old[0]) * (1 + 1e-6))


def _scales_at_mode(neg_h):
    """√diag((−H)⁻¹) from −H at the mode; an error unless −H is positive definite."""
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
    return scales
