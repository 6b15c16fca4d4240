"""The warmup's last steps (:mod:`~numpyro_sg.infer.warmup`): the Newton refinement of the mode
and the Laplace preconditioner there.

``programs`` is the warmup's set of compiled programs (``numpyro_sg.infer.warmup``): its
Hessian-vector products, Fisher diagonal, gradient-noise and stiffness probes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import random

from numpyro_sg.infer.curvature import dense_or_fallback, positive_curvature, whitened_top_eigenvalue
from numpyro_sg.infer.laplace import NewtonResult, damped_newton, log_density_not_lower, scaled_gradient_not_larger
from numpyro_sg.infer.preconditioner import Preconditioner
from numpyro_sg.infer.warmup_options import WarmupOptions


def newton_refinement(full_vg, x, curvature, options: WarmupOptions, dense: bool, dtype,
                      monte_carlo=False) -> NewtonResult:
    """The Newton refinement (:mod:`~numpyro_sg.infer.warmup`, step 2):
    :func:`~numpyro_sg.infer.laplace.damped_newton` on the full-data ``(log π, ∇ log π)``, the
    trial points rounded to ``dtype``; with ``monte_carlo`` (importance-sampled locals move log π,
    not its gradient) also a step that shrinks the gradient in Laplace sds."""
    tol, sds = options.tolerance if dense else max(options.tolerance, options.diagonal_tolerance), {}

    def neg_hessian(y, _):
        c = np.asarray(curvature(y), np.float64)
        sds["now"] = 1.0 / np.sqrt(positive_curvature(c if c.ndim == 1 else np.diag(c)))
        return c
    accept = lambda old, new: log_density_not_lower(old, new) or (
        monte_carlo and scaled_gradient_not_larger(old, new, sds["now"]))
    return damped_newton(full_vg, x, gradient=lambda s: np.asarray(s[1], np.float64), curvature=neg_hessian,
                         accept=accept, max_steps=options.newton_steps, tolerance=tol,
                         move=lambda y, alpha, step: jnp.asarray(np.asarray(y, np.float64) + alpha * step, dtype))


def diagonal_preconditioner(programs, x, grad, neg_h, key, dtype):
    """Diagonal Laplace preconditioner from −diag H, shrunk for stiffness and gradient-noise
    heat (``WarmupOptions.stabilise_diagonal``, ``max_noise_heat``): ``(P, λ, h)``."""
    options = programs.options
    scale = jnp.asarray(1.0 / np.sqrt(positive_curvature(neg_h)), dtype)
    stiffness = whitened_top_eigenvalue(lambda v: -programs.hvp(x, v), scale, random.fold_in(key, 2))
    shrink = np.sqrt(max(2.0 * stiffness - 1.0, 1.0)) if options.stabilise_diagonal else 1.0
    noise_heat = 0.0
    if options.max_noise_heat is not None and len(programs.mb.plates) == 1:
        noise_heat = programs.noise_heat(x, grad, scale, shrink, key)
        if noise_heat > options.max_noise_heat:
            shrink *= np.sqrt(noise_heat / options.max_noise_heat)
    if options.max_minibatch_stiffness is not None:
        batch_stiffness = programs.minibatch_stiffness(x, scale / jnp.asarray(shrink, dtype), key)
        if batch_stiffness > options.max_minibatch_stiffness:  # sparse rows: shrink to λ_B = 1
            shrink *= np.sqrt(batch_stiffness)
    return Preconditioner(scale=scale / jnp.asarray(shrink, dtype)), stiffness, noise_heat


def mode_preconditioner(programs, x, grad, curvature, dense: bool, key, dtype):
    """The Laplace preconditioner at the mode x: dense from −H (d ≤ ``dense_max``), else diagonal
    from the Fisher or Hutchinson diagonal (``WarmupOptions.diagonal``): ``(P, λ, h)``."""
    options = programs.options
    if dense:
        return dense_or_fallback(curvature(x), dtype), 1.0, 0.0
    if options.diagonal == "fisher" and len(programs.mb.plates) == 1:
        neg_h = programs.fisher_curvature(x, key)
    else:
        neg_h = curvature(x)
    return diagonal_preconditioner(programs, x, grad, neg_h, key, dtype)
