"""The warmup's last steps (:mod:`~numpyro_sg.infer.warmup`): the Newton refinement of the mode
and the Laplace preconditioner there; the mean-field alternative (:func:`variational_fit`).

``programs`` is the warmup's set of compiled programs (``numpyro_sg.infer.warmup``): its
Hessian-vector products, Fisher diagonal, gradient-noise and stiffness probes.
"""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np
from jax import random

from numpyro_sg.infer.curvature import positive_curvature, whitened_top_eigenvalue
from numpyro_sg.infer.laplace import NewtonResult, damped_newton, log_density_not_lower, scaled_gradient_not_larger
from numpyro_sg.infer.multistart import usual_start
from numpyro_sg.infer.preconditioner import Preconditioner
from numpyro_sg.infer.warmup_options import ModeFit, WarmupOptions


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
    stiffness = whitened_top_eigenvalue(lambda v: -programs.hvp_block(x, v[None])[0], scale, random.fold_in(key, 2))
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


def preconditioner_diagonal(programs, x, curvature, key) -> np.ndarray:
    """−diag H at x for the diagonal preconditioner (above ``dense_max`` coordinates): the
    likelihood's Fisher diagonal plus the prior's (``WarmupOptions.diagonal="fisher"``, one
    subsample plate), else ``curvature(x)`` (Hutchinson on the Hessian's rows), float64."""
    if programs.options.diagonal == "fisher" and len(programs.mb.plates) == 1:
        return programs.fisher_curvature(x, key)
    return np.asarray(curvature(x), np.float64)


def within_tolerance(grad, neg_h, tolerance: float) -> bool:
    """Whether a point with gradient ``grad`` is within ``tolerance`` Laplace sds of the mode in
    root mean square over coordinates, by the curvature diagonal ``neg_h``: the Newton step
    g_j/c_j is g_j/√c_j sds, and √(Σ_j g_j²/c_j / d) ≤ ``tolerance``.  (At a draw of the diagonal
    Laplace approximation Σ_j g_j²/c_j has mean d: the point is well inside the posterior.)"""
    g = np.asarray(grad, np.float64)
    c = positive_curvature(np.asarray(neg_h, np.float64))
    return bool(np.all(np.isfinite(g)) and np.mean(g ** 2 / c) <= tolerance ** 2)


def diagonal_refinement(programs, x, curvature, dtype, key):
    """The Newton refinement above ``dense_max`` coordinates: ``(NewtonResult, −diag H at its
    point for the preconditioner)``.  None when the optimizer's end x is already within
    ``diagonal_tolerance`` sds of the mode by the preconditioner's diagonal
    (:func:`within_tolerance`): a network's 16-probe Hutchinson diagonal is indefinite in a fifth
    of its coordinates (digits classifier, 3,760 weights), and 8 Newton steps on it raised log π
    by 0.02 nats and never met the per-coordinate test, where the Fisher diagonal put the
    optimizer's end at 0.07 sds (root mean square)."""
    options = programs.options
    neg_h = preconditioner_diagonal(programs, x, curvature, key)
    state = programs.full_value_and_grad(x)
    if within_tolerance(state[1], neg_h, options.diagonal_tolerance):
        return NewtonResult(point=x, state=state, converged=True, steps=0, stalled=False, damped=False), neg_h
    newton = newton_refinement(programs.full_value_and_grad, x, curvature, options, False, dtype, programs.monte_carlo)
    return newton, preconditioner_diagonal(programs, newton.point, curvature, key)


def variational_fit(programs, info, d: int, dtype, key_opt, key_probe, start_time) -> ModeFit:
    """The warmup with ``centre="variational"``: the mean-field fit's mean is the centre and
    anchor, its sds (stabilised as the Laplace ones) the diagonal preconditioner."""
    options, (_, batches) = programs.options, programs.adam_plan(d)
    x = usual_start(programs.full_value_and_grad, info, d, dtype, random.fold_in(key_probe, 1), options.symmetry_jitter)
    mean, sd = programs.variational(x, key_opt, options.variational_steps, batches)
    value, grad = programs.full_value_and_grad(mean)
    precond, stiffness, noise_heat = diagonal_preconditioner(
        programs, mean, grad, 1.0 / np.asarray(sd, np.float64) ** 2, key_probe, dtype)
    return ModeFit(mode=jnp.asarray(mean, dtype), grad=jnp.asarray(grad, dtype), log_density=float(value), preconditioner=precond,
                   converged=bool(np.isfinite(float(value))), newton_steps=0, seconds=time.perf_counter() - start_time,
                   stiffness=float(stiffness), noise_heat=float(noise_heat), data_passes=programs.passes,
                   gradient_seconds=programs.pass_seconds)
