r"""Warmup of the gradient-based kernels: the mode, the Laplace preconditioner, the CV anchor.

Before the chains start (inside the kernel's ``init``, so it counts in ``MCMC.run``'s time),
:func:`find_mode` locates a mode θ̂ of the log posterior on NumPyro's unconstrained space:

1. **stochastic optimisation** — ``optimizer_steps`` Adam steps (optax, cosine-decayed
   learning rate) on mini-batch estimates of ∇ log π, from the unconstrained zero point (the
   chain-0 draw of ``init_to_uniform`` if the log density is not finite there; coordinates
   whose gradient vanishes exactly there — a symmetric saddle, as in matrix factorisation —
   perturbed by ``symmetry_jitter``·ξ);
2. **Newton refinement** — at most ``newton_steps`` damped Newton steps
   θ ← θ + α·(−H)⁻¹·∇ log π(θ) with the exact full-data gradient (one pass over the data in
   chunks of ``chunk_size`` rows: memory O(chunk·d)) and the Hessian H from a random
   subsample of ``hessian_rows`` rows scaled by N/m (exact when N ≤ ``hessian_rows``);
   α is halved until log π does not decrease; converged when every step component is below
   ``tolerance`` Laplace sds (``diagonal_tolerance`` with the diagonal Hessian used above
   ``dense_max`` coordinates).

The result, a :class:`ModeFit`, gives the Laplace covariance Σ̂ = (−H)⁻¹ at the mode as a
:class:`~numpyro_sg.infer.preconditioner.Preconditioner` (a dense square root for up to
``dense_max`` coordinates; above that a diagonal — the likelihood's Fisher diagonal from group
gradients plus a Hutchinson estimate of the prior's Hessian diagonal (Hessian-vector
products), never a d×d matrix — shrunk by √(2λ − 1) where λ is the top eigenvalue
of the whitened −H found by power iteration, so that steps in its units stay stable on coupled
coordinates), and the control-variate anchor (θ̂ and its
full-data gradient).  :func:`starting_points` starts the chains at θ̂ + ``jitter``·L·ξ,
ξ ~ N(0, I) per chain: a draw from the Laplace approximation.

Measured at SPEC §12's prototype scale (logistic regression, d = 20, N = 10⁶): this is what
takes the gradient-based kernels from "never reaches the posterior from NumPyro's default
start" to ξ(σ̂) ≈ 0.05 against NUTS (``docs/warmup.md``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import random
from jax.flatten_util import ravel_pytree

from numpyro.infer import init_to_uniform

from numpyro_sg.infer.laplace import damped_newton_step
from numpyro_sg.infer.minibatch import (
    Anchor,
    Minibatcher,
    draw_with_replacement,
    jit_with_data,
    noise_groups,
    subsample_plates,
)
from numpyro_sg.infer.model_info import ModelInfo, trace_model
from numpyro_sg.infer.preconditioner import Preconditioner, from_working

__all__ = ["WarmupOptions", "ModeFit", "find_mode", "fit_model_mode", "starting_points",
           "laplace_preconditioner", "break_symmetry", "whitened_top_eigenvalue", "noise_heat_of"]


@dataclass(frozen=True)
class WarmupOptions:
    """Settings of the warmup's mode search (see the module docstring).

    :param int optimizer_steps: Adam steps on mini-batches (0 skips the phase); default 500,
        or 2,000 above ``dense_max`` coordinates (where the diagonal Newton refinement cannot
        repair a poor optimum).
    :param float learning_rate: Adam's initial learning rate (cosine-decayed to 1% of it).
    :param batch_size: mini-batch size of the optimizer (default: the plate's n, at least
        1,000, at most N; above ``dense_max`` coordinates also at least enough for
        ``large_d_epochs`` passes over the data, as each parameter of a model with many
        parameters — a row of a factor matrix — is informed by few rows of each batch — but
        at most 16 times the small-d default).
    :param int large_d_epochs: see ``batch_size`` (default 100).
    :param int newton_steps: at most this many full-data Newton steps.
    :param float tolerance: Newton has converged when every step component is below this
        many Laplace sds.
    :param int chunk_size: rows per chunk of the full-data passes.
    :param int hessian_rows: rows of the random subsample the Hessian is computed on.
    :param int dense_max: largest dimension with a dense (Cholesky) preconditioner.
    :param float jitter: chains start at θ̂ + jitter·L·ξ.
    :param int seed: seed of the warmup's own random draws (mini-batches, Hessian rows), so
        that every chain of a run — whatever the chain method — starts from the same mode.
    :param float symmetry_jitter: coordinates whose gradient is exactly 0 at the zero start
        (a symmetric saddle, e.g. the factors of a matrix factorisation) start at
        ``symmetry_jitter``·ξ instead (:func:`break_symmetry`); 0 disables it.
    :param float diagonal_tolerance: above ``dense_max`` coordinates Newton uses the Hessian's
        diagonal only, a preconditioned gradient step that converges slowly on coupled
        coordinates (matrix factorisation); it has converged when every step component is
        below this many Laplace sds (default 0.25: a start well inside the posterior).
    :param int hutchinson_probes: Rademacher probes of the Hutchinson diagonal of the
        preconditioner (above ``dense_max``; the Newton steps use 16); its relative error per
        coordinate is about √(Σ_{l≠j} H_jl² / probes)/|H_jj|.
    :param int fisher_group_size: rows per group of the Fisher diagonal.
    :param str diagonal: the preconditioner's curvature diagonal above ``dense_max`` coordinates:
        ``"fisher"`` (default with one subsample plate: the likelihood's Fisher diagonal
        from group gradients, :meth:`~numpyro_sg.infer.minibatch.Minibatcher.fisher_diagonal`, plus
        a Hutchinson estimate of the prior's alone) or ``"hutchinson"`` (Hutchinson on the
        whole Hessian: noisy for coordinates coupled to many others, which then get too wide
        a scale — on BPMF it underestimated some factors' curvature 16-fold and SGLD
        diverged).  The Newton steps use a 16-probe Hutchinson diagonal either way.
    :param max_noise_heat: above ``dense_max`` coordinates, the diagonal scales are further
        divided by √(h/``max_noise_heat``) when the gradient-noise heat h (see
        :attr:`ModeFit.noise_heat`; τ̂ of the control-variate gradient at ``noise_points``
        draws from the diagonal Laplace approximation, in the working frame) exceeds it.  On
        a sparse model (matrix factorisation: a user's gradient rests on a fraction of a
        rating per batch, scaled by N/n) the mini-batch noise in the working frame is large;
        Langevin-type kernels then run hot, drift away from the anchor, where the
        control-variate noise grows further, and diverge.  ``None`` disables it.
    :param int noise_points: see ``max_noise_heat``.
    :param bool stabilise_diagonal: divide the diagonal Laplace scales by √(2λ − 1), λ the
        top eigenvalue of the whitened −H (power iteration on Hessian-vector products), so
        that a step size in preconditioner units is about as stable along the stiffest
        direction as with a dense preconditioner (λ = 1 for uncoupled coordinates: no change;
        the factor 2λ − 1 rather than λ is a margin for power iteration's underestimate and
        for curvature growing away from the mode — BAOAB's default diverged on BPMF with √λ).
    """

    optimizer_steps: int | None = None
    learning_rate: float = 0.05
    batch_size: int | None = None
    newton_steps: int = 8
    tolerance: float = 1e-3
    chunk_size: int = 65536
    hessian_rows: int = 65536
    dense_max: int = 256
    jitter: float = 1.0
    seed: int = 0
    symmetry_jitter: float = 0.1
    diagonal_tolerance: float = 0.25
    stabilise_diagonal: bool = True
    hutchinson_probes: int = 64
    diagonal: str = "fisher"
    fisher_group_size: int = 32
    large_d_epochs: int = 100
    max_noise_heat: float | None = 0.1
    noise_points: int = 4

    def optimizer_plan(self, d: int, sizes) -> tuple:
        """``(steps, {plate size N: batch size})`` of the Adam phase for a model with d
        coordinates and plates of sizes N (module docstring; defaults depend on d)."""
        large = d > self.dense_max
        steps = self.optimizer_steps if self.optimizer_steps is not None else (2000 if large else 500)
        batches = {}
        for N, n in sizes:
            b = self.batch_size or max(n, 1000)
            if large and self.batch_size is None and steps > 0:  # at most 16 × the default
                b = max(b, min(-(-self.large_d_epochs * N // steps), 16 * b))
            batches[N] = int(min(b, N))
        return steps, batches

    @classmethod
    def of(cls, value) -> "WarmupOptions":
        """``value`` as options: ``None`` (defaults), a dict of fields, or options."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(f"unknown warmup option(s) {sorted(unknown)}; the options are "
                                 f"{[f.name for f in dataclasses.fields(cls)]}.")
            return cls(**value)
        raise TypeError(f"warmup_options must be None, a dict or WarmupOptions; got {value!r}.")


@dataclass(frozen=True)
class ModeFit:
    """The warmup's result.

    :ivar mode: θ̂, the flat unconstrained mode (d,).
    :ivar grad: the full-data gradient ∇ log π(θ̂) (d,): the control-variate anchor's.
    :ivar log_density: log π(θ̂) (full data, up to a constant).
    :ivar preconditioner: the Laplace :class:`~numpyro_sg.infer.preconditioner.Preconditioner`.
    :ivar converged: whether Newton met its tolerance.
    :ivar newton_steps: Newton steps taken.
    :ivar seconds: wall time of the search.
    :ivar stiffness: λ, the top eigenvalue of the whitened −H for a diagonal preconditioner
        (:func:`whitened_top_eigenvalue`; 1 for a dense one); the diagonal scales were divided
        by √(2λ − 1) (``WarmupOptions.stabilise_diagonal``).
    :ivar noise_heat: h, the 90% quantile over coordinates of τ̂_w²/4 — the extra variance a
        unit Langevin step gets from the control-variate gradient noise, relative to its
        injected noise — with that preconditioner (before ``max_noise_heat`` shrank it).
    """

    mode: Any
    grad: Any
    log_density: float
    preconditioner: Preconditioner
    converged: bool
    newton_steps: int
    seconds: float
    stiffness: float = 1.0
    noise_heat: float = 0.0

    @property
    def scales(self) -> np.ndarray:
        """Laplace sds √diag(Σ̂) per coordinate."""
        P = self.preconditioner
        if P.chol is not None:
            return np.sqrt(np.sum(np.asarray(P.chol, np.float64) ** 2, axis=1))
        return np.asarray(P.scale, np.float64)


def laplace_preconditioner(neg_hessian: np.ndarray, dtype=jnp.float32) -> Preconditioner:
    """Dense Laplace preconditioner L with L·Lᵀ = (−H)⁻¹ (−H positive definite, float64 in)."""
    R = np.linalg.cholesky(neg_hessian)  # −H = R·Rᵀ  ⇒  (−H)⁻¹ = R⁻ᵀ·R⁻¹
    L = np.linalg.inv(R).T
    return Preconditioner(chol=jnp.asarray(L, dtype))


def _optimizer_minibatcher(mb: Minibatcher, batches: dict):
    plates = [dataclasses.replace(p, subsample_size=batches[p.size]) for p in mb.plates]
    return Minibatcher(mb.model, plates, replace=True)


def _adam(flat_ld, mb_opt: Minibatcher, start, options: WarmupOptions, key, steps):
    """``optimizer_steps`` Adam steps maximising the mini-batch log density (a ``lax.scan``).

    ``flat_ld(x, indices)`` is the flat mini-batch log density; call inside ``jit``.
    """
    schedule = optax.cosine_decay_schedule(options.learning_rate, max(steps, 1), alpha=0.01)
    opt = optax.adam(schedule)

    def body(carry, k):
        x, state = carry
        idx, _ = mb_opt.draw(k, None)
        g = jax.grad(flat_ld)(x, idx)
        ok = jnp.all(jnp.isfinite(g))
        updates, new_state = opt.update(-jnp.where(ok, g, 0.0), state, x)
        new_x = optax.apply_updates(x, updates)
        return (jnp.where(ok, new_x, x), new_state), None

    (x, _), _ = jax.lax.scan(body, (start, opt.init(start)), random.split(key, steps))
    return x


def _hutchinson_diagonal(hvp, x, key, num_probes=16):
    """diag(H) ≈ mean over Rademacher probes v of v ⊙ (H·v)."""
    probes = random.rademacher(key, (num_probes,) + x.shape, x.dtype)
    return jnp.mean(jax.vmap(lambda v: v * hvp(x, v))(probes), axis=0)


def _line_search(full_vg, x, value, step, dtype, halvings=10):
    """x + α·step with α = 1, ½, … until log π does not decrease: (x, value, grad, accepted)."""
    alpha = 1.0
    for _ in range(halvings + 1):
        x_new = jnp.asarray(np.asarray(x, np.float64) + alpha * step, dtype)
        v, g = full_vg(x_new)
        if np.isfinite(float(v)) and np.all(np.isfinite(np.asarray(g))) and float(v) >= float(value) - 1e-6 * abs(float(value)):
            return x_new, v, g, True
        alpha *= 0.5
    return x, value, full_vg(x)[1], False


_TRACE = False


def whitened_top_eigenvalue(neg_hvp, scale, key, num_iterations: int = 60) -> float:
    """Largest eigenvalue of S·(−H)·S, S = diag(``scale``), by power iteration on
    Hessian-vector products ``neg_hvp(v) = −H·v`` (d-vectors only, never a d×d matrix).

    With S the diagonal Laplace scales (−H)_jj^(−1/2) the whitened matrix has unit diagonal, so
    its top eigenvalue λ ≥ 1; λ ≫ 1 means strongly coupled coordinates (the conditional sds
    are much wider than the posterior along some direction), where a step size in units of
    the diagonal scales is unstable.
    """
    v = random.normal(key, scale.shape, scale.dtype)
    v = v / jnp.linalg.norm(v)
    lam = 1.0
    for _ in range(num_iterations):
        w = scale * neg_hvp(scale * v)
        lam = float(jnp.vdot(v, w))
        if _TRACE:
            print("power", lam)
        norm = jnp.linalg.norm(w)
        if not np.isfinite(float(norm)) or float(norm) == 0.0:
            return 1.0
        v = w / norm
    return max(lam, 1.0)


def noise_heat_of(tau_working) -> float:
    """h = 90% quantile over coordinates of τ_w²/4: the variance a Langevin step of unit size
    (ε = 1 in the working frame) gets from gradient noise of sd τ_w, (ε/2)²·τ_w², relative to
    its injected variance ε."""
    return float(np.quantile(np.asarray(tau_working, np.float64) ** 2 / 4.0, 0.9))


def _cv_noise_sd(mb: Minibatcher, flat_ld, y, key, anchor_point, anchor_grad):
    """τ̂ of the control-variate gradient at ``y`` on one random batch (group means at large
    n·d)."""
    (plate,) = mb.plates
    n = plate.subsample_size
    idx = {plate.name: draw_with_replacement(key, plate.size, n)}
    k = noise_groups(n, y.shape[0])
    return mb.value_grad_noise(flat_ld, y, idx, anchor=Anchor(anchor_point, anchor_grad), groups=k)[2]


def _positive(curvature):
    """Curvatures made positive: non-positive or non-finite entries get the median positive one."""
    good = np.isfinite(curvature) & (curvature > 0)
    fill = float(np.median(curvature[good])) if good.any() else 1.0
    return np.where(good, curvature, fill)


def _dense_or_fallback(neg_h, dtype):
    """Dense Laplace preconditioner, or (−H not positive definite) a diagonal one from |diag H|."""
    try:
        return laplace_preconditioner(neg_h, dtype)
    except np.linalg.LinAlgError:
        return Preconditioner(scale=jnp.asarray(1.0 / np.sqrt(_positive(np.diag(neg_h))), dtype))


def break_symmetry(x, grad, key, scale):
    """x + ``scale``·ξ (ξ ~ N(0, I)) in the coordinates where ``grad`` is exactly 0, x elsewhere.

    At the zero point a model with a product of parameters (matrix factorisation, U·Vᵀ) sits
    on a saddle where the gradient of every factor vanishes exactly by symmetry, and gradient
    ascent never leaves it; perturbing those coordinates (and only those, so a model whose
    gradient is non-zero everywhere starts exactly at zero as before) breaks the symmetry.
    """
    xi = random.normal(key, x.shape, x.dtype)
    return jnp.where(grad == 0, x + scale * xi, x)


def _start(full_vg, info: ModelInfo, unravel_dim, dtype, key=None, scale=0.1):
    """The unconstrained zero point (its exact-zero-gradient coordinates perturbed,
    :func:`break_symmetry`), or chain 0's initial draw where log π is not finite there."""
    zero = jnp.zeros(unravel_dim, dtype)
    value, grad = full_vg(zero)
    if np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad))):
        if key is None or scale == 0 or not np.any(np.asarray(grad) == 0):
            return zero
        return break_symmetry(zero, grad, key, scale)
    if info.init_values is None:
        raise ValueError(
            "the warmup's mode search starts at the unconstrained zero point, where the model's "
            "log density is not finite; pass init_strategy= (e.g. numpyro.infer.init_to_uniform) "
            "so the search can start from its draw."
        )
    first = {k: v[0] if jnp.ndim(v) > len(info.sites[k].unconstrained_shape) else v
             for k, v in info.init_values.items()}
    return ravel_pytree(first)[0].astype(dtype)


def find_mode(mb: Minibatcher, info: ModelInfo, unravel, model_args=(), model_kwargs=None,
              options: WarmupOptions | None = None) -> ModeFit:
    """Mode of the log posterior, Laplace preconditioner and CV anchor (module docstring).

    :param mb: the kernel's :class:`~numpyro_sg.infer.minibatch.Minibatcher` (model and plates).
    :param info: the model's :class:`~numpyro_sg.infer.model_info.ModelInfo` (its chain-0 initial
        values are the fall-back start).
    :param unravel: flat vector → unconstrained params dict.
    :param model_args: the model's positional arguments (the data).
    :param model_kwargs: its keyword arguments.
    :param options: :class:`WarmupOptions` (default settings when omitted).
    :return: a :class:`ModeFit`.

    **Example:**

    .. code-block:: python

        kernel = nsg.SGLD(model)
        MCMC(kernel, num_warmup=1000, num_samples=2000).run(key, X, y)
        kernel.mode_fit.mode, kernel.mode_fit.scales     # what the warmup found
    """
    options = options or WarmupOptions()
    model_kwargs = model_kwargs or {}
    start_time = time.perf_counter()
    dtype = jnp.result_type(float)
    d = ravel_pytree(info.unconstrained_example())[0].shape[0]
    key_opt, key_hess, key_probe = random.split(random.PRNGKey(options.seed), 3)
    sub = {p.name: draw_with_replacement(random.fold_in(key_hess, k), p.size, options.hessian_rows)
           if p.size > options.hessian_rows else jnp.arange(p.size, dtype=jnp.int32)
           for k, p in enumerate(mb.plates)}

    def flat_log_density(args, kwargs):
        log_density = mb.log_density_fn(args, kwargs)
        return lambda x, idx: log_density(unravel(x), idx)

    def flat_prior(args, kwargs):
        prior = mb.prior_log_density_fn(args, kwargs)
        return lambda x: prior(unravel(x))

    # the data are arguments of the compiled programs, not constants baked into them
    full_vg = jit_with_data(
        lambda x, a, k: mb.full_value_and_grad_fn(unravel, a, k, options.chunk_size)(x),
        model_args, model_kwargs,
    )
    x = _start(full_vg, info, d, dtype, random.fold_in(key_probe, 1), options.symmetry_jitter)
    steps, batches = options.optimizer_plan(d, [(p.size, p.subsample_size) for p in mb.plates])
    if steps > 0:
        mb_opt = _optimizer_minibatcher(mb, batches)
        adam = jit_with_data(
            lambda x, key, a, k: _adam(flat_log_density(a, k), mb_opt, x, options, key, steps),
            model_args, model_kwargs,
        )
        x = adam(x, key_opt)
    value, grad = full_vg(x)
    if d <= options.dense_max:
        hess = jit_with_data(lambda y, a, k: jax.hessian(lambda t: flat_log_density(a, k)(t, sub))(y),
                             model_args, model_kwargs)

        def curvature(y):
            H = np.asarray(hess(y), np.float64)
            return -0.5 * (H + H.T)
    else:
        hvp = jit_with_data(
            lambda y, v, a, k: jax.jvp(jax.grad(lambda t: flat_log_density(a, k)(t, sub)), (y,), (v,))[1],
            model_args, model_kwargs,
        )

        def curvature(y):
            return -np.asarray(_hutchinson_diagonal(hvp, y, key_probe), np.float64)


    converged, taken = False, 0
    while taken < options.newton_steps:
        taken += 1
        curv = curvature(x)
        step, sd, damped = damped_newton_step(curv, np.asarray(grad, np.float64))
        tol = options.tolerance if curv.ndim == 2 else max(options.tolerance, options.diagonal_tolerance)
        if not damped and np.all(np.abs(step) <= tol * sd):
            converged = True
            break
        x, value, grad, ok = _line_search(full_vg, x, value, step, dtype)
        if not ok:
            break
    if (d > options.dense_max and options.diagonal == "fisher" and len(mb.plates) == 1):
        fisher = jit_with_data(
            lambda y, a, k: mb.fisher_diagonal(flat_log_density(a, k), flat_prior(a, k), y, sub,
                                               group_size=options.fisher_group_size),
            model_args, model_kwargs)
        prior_hvp = jit_with_data(
            lambda y, v, a, k: jax.jvp(jax.grad(flat_prior(a, k)), (y,), (v,))[1],
            model_args, model_kwargs)
        prior = _hutchinson_diagonal(prior_hvp, x, key_probe, options.hutchinson_probes)
        neg_h = np.asarray(fisher(x), np.float64) - np.asarray(prior, np.float64)
    else:
        neg_h = curvature(x)
    stiffness, noise_heat = 1.0, 0.0
    if neg_h.ndim == 2:
        precond = _dense_or_fallback(neg_h, dtype)
    else:
        scale = jnp.asarray(1.0 / np.sqrt(_positive(neg_h)), dtype)
        stiffness = whitened_top_eigenvalue(lambda v: -hvp(x, v), scale, random.fold_in(key_probe, 2))
        shrink = np.sqrt(max(2.0 * stiffness - 1.0, 1.0)) if options.stabilise_diagonal else 1.0
        if options.max_noise_heat is not None and len(mb.plates) == 1:
            noise_sd = jit_with_data(
                lambda y, key, a, k: _cv_noise_sd(mb, flat_log_density(a, k), y, key, x, grad),
                model_args, model_kwargs)
            points = [x + scale * random.normal(random.fold_in(key_probe, 10 + j), x.shape, dtype)
                      for j in range(options.noise_points)]
            tau = np.sqrt(np.mean([np.asarray(noise_sd(p, random.fold_in(key_probe, 20 + j)), np.float64) ** 2
                                   for j, p in enumerate(points)], axis=0))
            noise_heat = noise_heat_of(tau * np.asarray(scale, np.float64) / shrink)
            if noise_heat > options.max_noise_heat:
                shrink *= np.sqrt(noise_heat / options.max_noise_heat)
        precond = Preconditioner(scale=scale / jnp.asarray(shrink, dtype))
    return ModeFit(
        mode=jnp.asarray(x, dtype), grad=jnp.asarray(grad, dtype), log_density=float(value),
        preconditioner=precond, converged=converged, newton_steps=taken,
        seconds=time.perf_counter() - start_time, stiffness=float(stiffness),
        noise_heat=float(noise_heat),
    )


def fit_model_mode(model, model_args=(), model_kwargs=None, options: WarmupOptions | None = None):
    """The warmup of a model on its data without a kernel: ``(ModeFit, Minibatcher, unravel)``.

    What a gradient kernel's ``init`` runs (:func:`find_mode` on the model's subsample
    plates), for callers that share one fit among many kernels (the tuners' arms) and need
    the model's :class:`~numpyro_sg.infer.minibatch.Minibatcher` and flat → params ``unravel``.
    """
    info = trace_model(model, model_args, model_kwargs, init_strategy=init_to_uniform,
                       rng_key=random.PRNGKey(0))
    plates = subsample_plates(info, None, model_args=model_args, model_kwargs=model_kwargs)
    mb = Minibatcher(model, plates)
    _, unravel = ravel_pytree(info.unconstrained_example())
    return find_mode(mb, info, unravel, model_args, model_kwargs, options), mb, unravel


def starting_points(init_params, fit: ModeFit | None, rng_key, batched, unravel, jitter: float = 1.0):
    """Initial unconstrained params of the chains.

    ``init_params`` (the user's, or the init strategy's draws) win; otherwise each chain starts
    at θ̂ + ``jitter``·L·ξ, ξ ~ N(0, I) drawn from the chain's key (a draw from the Laplace
    approximation N(θ̂, Σ̂) for ``jitter=1``).
    """
    if init_params is not None:
        return init_params
    if fit is None:
        raise ValueError("no starting point: give init_params or init_strategy, or run the warmup.")

    def one(key):
        xi = random.normal(random.fold_in(key, 7), fit.mode.shape, fit.mode.dtype)
        return unravel(fit.mode + jitter * from_working(fit.preconditioner, xi))

    return jax.vmap(one)(rng_key) if batched else one(rng_key)
