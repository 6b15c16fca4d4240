r"""Laplace approximation of a density from its score alone (no ``numpyro_sg`` imports).

Given the score s(θ) = ∇ log π(θ) as a JAX function, :func:`laplace_approximation` finds the
mode of π by damped Newton steps (the Hessian H = ∇² log π is ``jax.jacfwd(score)``) and returns
it with the Laplace scales √diag((−H)⁻¹) there; :func:`laplace_scales` returns the scales only.
The diagnostics use the scales as the ``preconditioner="laplace"`` of the KSD and FSSD (SPEC §7),
and the kernels' warm-up can use the mode and scales to start and precondition a chain.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "damped_newton_step",
    "laplace_approximation",
    "laplace_scales",
]


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
        step, sd, damped = damped_newton_step(-h, g)
        concave = not damped
        if concave and np.all(np.abs(step) <= tol * sd):
            theta = theta + step
            g, h = grad_hess(theta)
            break
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
