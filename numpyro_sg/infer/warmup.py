r"""Warmup of the gradient-based kernels: the mode, the Laplace preconditioner, the CV anchor.

Before the chains start (inside the kernel's ``init``, so it counts in ``MCMC.run``'s time),
:func:`find_mode` locates a mode θ̂ of the log posterior on NumPyro's unconstrained space:

0. **multi-start** — ``num_starts`` short Adam ascents (the usual start below, the init
   strategy's draw, uniform and prior draws); the best end point by log density (on the
   Hessian's ``hessian_rows`` rows, scaled by N/m: exact up to that N, above it m rows a point,
   not N) is the start of step 1 (:mod:`~numpyro_sg.infer.multistart`: multimodal posteriors);
1. **stochastic optimisation** — ``optimizer_steps`` Adam steps (optax, cosine-decayed
   learning rate) on mini-batch estimates of ∇ log π, from the unconstrained zero point (the
   chain-0 draw of ``init_to_uniform`` if the log density is not finite there; coordinates
   whose gradient vanishes exactly there — a symmetric saddle, as in matrix factorisation —
   perturbed by ``symmetry_jitter``·ξ);
2. **Newton refinement** — at most ``newton_steps`` damped Newton steps
   θ ← θ + α·(−H)⁻¹·∇ log π(θ) (:func:`~numpyro_sg.infer.laplace.damped_newton`) with the exact
   full-data gradient (one pass in chunks of ``chunk_size`` rows: memory O(chunk·d)) and the
   Hessian H from a random subsample of ``hessian_rows`` rows scaled by N/m (exact when N ≤
   ``hessian_rows``); α is halved until log π does not decrease; converged when every step
   component is below ``tolerance`` Laplace sds (``diagonal_tolerance`` with the diagonal Hessian
   above ``dense_max`` coordinates, where no step is taken from an optimizer's end within it in
   root mean square by the preconditioner's diagonal: :func:`~numpyro_sg.infer.refinement.diagonal_refinement`).

The result, a :class:`ModeFit`, gives the Laplace covariance Σ̂ = (−H)⁻¹ at the mode as a
:class:`~numpyro_sg.infer.preconditioner.Preconditioner` (dense up to ``dense_max``
coordinates; above, a Fisher/Hutchinson diagonal shrunk for stiffness: :class:`WarmupOptions`),
the control-variate anchor (θ̂ and its full-data gradient) and, up to ``dense_max`` coordinates, the
gradient noise of one row and the gradient's steepness at the Laplace draws (:attr:`ModeFit.row_noise`, :attr:`ModeFit.drift_ratio`):
the kernels' defaults' mini-batch size and step (:mod:`numpyro_sg.kernels.noise_plan`); chains start at θ̂ + ``jitter``·L·ξ.
``centre="variational"`` replaces steps 0–2 by a mean-field fit (:mod:`~numpyro_sg.infer.variational`).
"""

from __future__ import annotations

import dataclasses
import time
from functools import cached_property, partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.infer import init_to_uniform

from numpyro_sg.infer.curvature import (columns_within_memory, dense_or_fallback, hessian_from_products,
                                        hutchinson_diagonal, noise_heat_of, whitened_top_eigenvalue)
from numpyro_sg.infer.fit_store import stored_fit
from numpyro_sg.infer.jit_data import jit_with_data, on_device
from numpyro_sg.infer.lapack_guard import map_over_draws
from numpyro_sg.infer.minibatch import Anchor, Minibatcher
from numpyro_sg.infer.model_info import ModelInfo, trace_model
from numpyro_sg.infer.noise import laplace_row_noise, row_noise_covariance
from numpyro_sg.infer.sharded_minibatch import is_sharded
from numpyro_sg.infer.multistart import (EXACT_ASCENT_MAX, best_ends, explore_starts, first_round_concave,
                                         first_chain_draw, flat_prior_draws, padded_rows, rises_to_mode, start_ascents,
                                         start_candidates, usual_start)
from numpyro_sg.infer.plates import subsample_plates
from numpyro_sg.infer.programs import placement_key, tree_signature
from numpyro_sg.infer.preconditioner import Preconditioner
from numpyro_sg.infer.progress import warmup_progress
from numpyro_sg.infer.refinement import (diagonal_preconditioner, diagonal_refinement, newton_refinement,
                                         variational_fit)
from numpyro_sg.infer.sharding import auto_view
from numpyro_sg.infer.variational import adam_ascent, variational_adam
from numpyro_sg.infer.warmup_options import ModeFit, WarmupOptions


class _WarmupPrograms:
    """The compiled programs of one warmup, each built on first use with the data as arguments
    (:func:`~numpyro_sg.infer.jit_data.jit_with_data`); ``rows`` are the Hessian's rows."""

    def __init__(self, mb: Minibatcher, unravel, model_args, model_kwargs, options: WarmupOptions,
                 rows: dict, signature=None, dtype=None):
        self.mb, self.unravel, self.options, self.rows, self.dtype = mb, unravel, options, rows, dtype
        self.hessian_block = None   # columns of H per Hessian-vector block (dense_curvature)
        self.last_curvature = (None, None)   # (the point's bytes, −H there): dense_curvature
        self.data = on_device(model_args, model_kwargs)   # copied once, not at every program's call
        # what every program computes besides its arguments (the rows follow from the options)
        self.key = ("warmup", mb.model, mb.plates, mb.replace, placement_key(mb), signature, options)
        self.monte_carlo = bool(getattr(mb.model, "sampled", False))  # locals integrated by draws (numpyro_sg.locals)
        self.passes, self.pass_seconds = 0, float("inf")   # passes over all the data so far, the fastest's seconds
    def _jit(self, fn, *name):
        """``fn`` compiled with the data as arguments, shared by every warmup of the same
        model, plates, parameter structure and options (``name``: the program and its static
        settings; ``fn`` closes over no array but ``rows``)."""
        return jit_with_data(fn, *self.data, key=self.key + name, name=name[0])

    def adam_plan(self, d: int) -> tuple:
        """The Adam phases' ``(steps, batch sizes)`` (:meth:`WarmupOptions.optimizer_plan`); a group
        whose locals are integrated by Monte Carlo costs tens of rows: such a plate takes the kernel's n."""
        return self.options.optimizer_plan(d, [(p.size, p.subsample_size) for p in self.mb.plates],
                                           min_batch=1 if self.monte_carlo else 1000)

    def log_density(self, args, kwargs):
        """``(x, indices) -> log density`` of a flat point x."""
        log_density = self.mb.log_density_fn(args, kwargs)
        return lambda x, idx: log_density(self.unravel(x), idx)

    def prior(self, args, kwargs):
        """``x -> log p(x)`` of a flat point x."""
        prior = self.mb.prior_log_density_fn(args, kwargs)
        return lambda x: prior(self.unravel(x))

    def full_value_and_grad(self, x):
        """(log π(x), ∇ log π(x)) over all the data (in chunks): one of :attr:`passes`, timed (:attr:`pass_seconds`)."""
        chunk, tick = self.options.chunk_size, time.perf_counter()
        self.passes += 1
        out = jax.block_until_ready(self._jit(lambda x, a, k: self.mb.full_value_and_grad_fn(self.unravel, a, k, chunk)(x),
                                              "full_value_and_grad")(x))
        self.pass_seconds = min(self.pass_seconds, time.perf_counter() - tick)   # (the first one compiles)
        return out

    def full_value_and_grad_many(self, xs):
        """(log π, ∇ log π) at each row of xs (S, d) in one pass over the data (chunks of ``chunk_size``/S rows:
        the memory of one pass); like :meth:`adam_many`, in small groups (:func:`map_over_draws`)."""
        chunk = max(1024, self.options.chunk_size // xs.shape[0])
        self.passes += 1
        values = lambda ys, a, k: map_over_draws(self.mb.full_value_and_grad_fn(self.unravel, a, k, chunk), ys)
        return self._jit(values, "full_value_and_grad_many", chunk)(xs)

    def value_and_grad_many(self, xs):
        """(log π, ∇ log π) at each row of xs (S, d) on the Hessian's rows: exact where they are all the data
        (:meth:`full_value_and_grad_many`), else log p(x) + (N/m)·Σ_{i∈rows} log f_i(x), a point at a time (the memory
        of one Hessian-vector product), xs padded to a round of starts (one program): m rows a point, not N."""
        values = lambda ys, a, k: jax.lax.map(jax.value_and_grad(lambda y: self.log_density(a, k)(y, self.rows)), ys)
        k, padded = len(xs), padded_rows(np.asarray(xs, self.dtype), max(len(xs), self.round_width))
        out = self.full_value_and_grad_many(padded) if self.exact_rows else self._jit(values, "rows_value_and_grad_many")(padded)
        return tuple(a[:k] for a in out)

    def on_full_scale(self, starts: tuple, x, value: float, grad, gap: float, width: int, screen=None) -> tuple:
        """The starts' ``(values, gradients, ends)`` of :meth:`value_and_grad_many` on the full-data scale by
        control variates at the mode x, L̂ the estimate on the rows: log π(x) + L̂(end) − L̂(x) − (∇L̂(x) −
        ∇ log π(x))·(end − x) and ∇L̂(end) − ∇L̂(x) + ∇ log π(x).  Where that cannot be trusted, the end gets its
        exact value and gradient (one batched pass per ``width`` of them): estimated more than ``gap`` nats from
        log π(x) and not explained by the quadratic model, ``screen(g)`` (½·gᵀΣ̂g) within 10 % + ``gap`` of it.
        A GLM's ends, 200–430 nats below at N = 10⁶ (20–30 sds away), are so explained (errors 1–3 %);
        a local mode, exact gradient 0, is not (the rows' gradient there is their noise, ½·d·N/m nats)."""
        if self.exact_rows or len(starts[0]) == 0:
            return starts
        v_x, g_x = (np.asarray(a, np.float64)[0] for a in self.value_and_grad_many(np.asarray(x)[None]))
        ends, grad = np.asarray(starts[2]), np.asarray(grad, np.float64)
        finite = np.isfinite(np.asarray(starts[0], np.float64))   # an end whose log π is not finite stays so
        with np.errstate(invalid="ignore", over="ignore"):
            values = np.where(finite, np.asarray(starts[0], np.float64) + (float(value) - v_x)
                              - (ends.astype(np.float64) - x) @ (g_x - grad), -np.inf)
            grads = np.where(finite[:, None], np.asarray(starts[1], np.float64) - g_x + grad, np.inf)
        below = float(value) - values
        far = np.flatnonzero([np.isfinite(G) and abs(G) > gap and not (
            screen is not None and abs(screen(g) - G) <= 0.1 * abs(G) + gap) for g, G in zip(grads, below)])
        for lo in range(0, len(far), width):
            idx = far[lo:lo + width]
            exact = self.full_value_and_grad_many(padded_rows(ends[idx], width))
            v, g = (np.asarray(a, np.float64)[:len(idx)] for a in exact)
            ok = np.isfinite(v) & np.all(np.isfinite(g), axis=1)
            values[idx], grads[idx] = np.where(ok, v, -np.inf), np.where(ok[:, None], g, np.inf)
        return values, grads, ends

    @property
    def round_width(self) -> int:
        """Starts run at a time (one program's width)."""
        return max(1, min(self.options.starts_per_round, self.options.num_starts))

    @property
    def exact_rows(self) -> bool:
        """Whether the Hessian's rows are all the data (every plate no larger than ``hessian_rows``)."""
        return all(p.size <= self.options.hessian_rows for p in self.mb.plates)

    @cached_property
    def hvp_block(self):
        """``(y, V) -> (H(y)·v for the rows v of V)`` on the Hessian's rows (V = I: H(y))."""
        return self._jit(lambda y, V, a, k: jax.vmap(lambda v: jax.jvp(
            jax.grad(lambda t: self.log_density(a, k)(t, self.rows)), (y,), (v,))[1])(V), "hvp_block")

    def dense_curvature(self, y):
        """−H(y), symmetrised, float64 (d, d), in blocks of columns whose temporaries fit in
        ``HESSIAN_MEMORY`` bytes (:func:`~numpyro_sg.infer.curvature.hessian_from_products`); the last point's is
        kept (read-only): Newton's converged point is the preconditioner's, its Hessian computed once."""
        point, d = np.asarray(y).tobytes(), y.shape[0]
        if self.last_curvature[0] == point:
            return self.last_curvature[1]
        if self.hessian_block is None:   # all columns at once up to 64 coordinates
            self.hessian_block = d if d <= 64 else columns_within_memory(
                self.hvp_block.temp_bytes(y, jnp.zeros((1, d), y.dtype)), d)
        H = hessian_from_products(lambda V: self.hvp_block(y, V), d, self.hessian_block, y.dtype)
        (neg_h := -0.5 * (H + H.T)).setflags(write=False)
        self.last_curvature = (point, neg_h)
        return neg_h

    def curvatures(self, ys, key):
        """−H at each row of ys, float64: (S, d, d) by :meth:`dense_curvature` (the Newton refinement's program:
        a locals model compiles no other) up to ``EXACT_ASCENT_MAX`` coordinates, else (S, d) diagonals."""
        if ys.shape[1] > EXACT_ASCENT_MAX:
            return np.stack([self.diagonal_curvature(y, key) for y in ys])
        return np.stack([self.dense_curvature(jnp.asarray(y)) for y in np.asarray(ys)])

    def diagonal_curvature(self, y, key, num_probes: int = 16):
        """−diag H(y) by :func:`~numpyro_sg.infer.curvature.hutchinson_diagonal`, float64."""
        probes = random.rademacher(key, (num_probes,) + y.shape, y.dtype)
        return -np.asarray(hutchinson_diagonal(lambda v: self.hvp_block(y, v[None])[0], probes), np.float64)

    def adam_many(self, xs, keys, steps: int, rate: float, batches: dict):
        """``steps`` Adam steps at initial learning rate ``rate`` from each row of xs, on mini-batches of sizes
        ``batches`` (:func:`~numpyro_sg.infer.variational.adam_ascent`, vectorised; ``steps`` and ``rate`` are
        arguments of the program: the multi-start ascents and the main phase share it when their batch sizes agree)."""
        plates = [dataclasses.replace(p, subsample_size=batches[p.size]) for p in self.mb.plates]
        mb_opt = self.mb.with_plates(plates)
        adam = self._jit(lambda xs, keys, n, r, a, k: map_over_draws(lambda x, key: adam_ascent(
            self.log_density(a, k), mb_opt, x, r, key, n), xs, keys), "adam_many", tuple(plates))
        return adam(xs, keys, np.int32(steps), np.asarray(rate, xs.dtype))

    def prior_draws(self, model, key, n: int):
        """n flat prior draws of ``model`` in one program (:func:`~numpyro_sg.infer.multistart.
        flat_prior_draws`; data on an Explicit-axes mesh through its Auto-axes view)."""
        return jit_with_data(lambda key, a, k: flat_prior_draws(model, a, k, key, n, self.dtype),
                             *auto_view(*self.data), key=self.key + ("prior_draws", model, n))(key)

    def variational(self, x, key, steps: int, batches: dict):
        """Mean-field Gaussian fit from mean x: ``(mean, sds)`` (:func:`variational_adam`)."""
        plates = [dataclasses.replace(p, subsample_size=batches[p.size]) for p in self.mb.plates]
        mb_opt, rate = self.mb.with_plates(plates), self.options.variational_learning_rate
        fit = self._jit(lambda x, key, a, k: variational_adam(self.log_density(a, k), mb_opt, x, rate,
                                                              key, steps), "variational", steps, tuple(plates))
        return fit(x, key)

    def fisher_curvature(self, x, key):
        """−diag H(x) as the likelihood's Fisher diagonal minus the prior's Hutchinson diagonal
        (one subsample plate), float64."""
        group_size = self.options.fisher_group_size
        fisher = self._jit(lambda y, a, k: self.mb.fisher_diagonal(self.unravel, y, self.rows, group_size, a, k),
                           "fisher")
        prior_hvp = self._jit(lambda y, v, a, k: jax.jvp(jax.grad(self.prior(a, k)), (y,), (v,))[1],
                              "prior_hvp")
        probes = random.rademacher(key, (self.options.hutchinson_probes,) + x.shape, x.dtype)
        prior = hutchinson_diagonal(lambda v: prior_hvp(x, v), probes)
        return np.asarray(fisher(x), np.float64) - np.asarray(prior, np.float64)

    def minibatch_stiffness(self, x, scale, key, batches: int = 2) -> float:
        """λ_B: the top eigenvalue of S·(−H_B)·S, H_B the Hessian of the kernels' mini-batch log
        density at x (its likelihood scaled by N/n), largest over ``batches`` mini-batches."""
        hvp = self._jit(lambda y, v, idx, a, k: -jax.jvp(jax.grad(lambda t: self.log_density(a, k)(t, idx)),
                                                          (y,), (v,))[1], "minibatch_hvp")
        draws = [self.mb.draw(random.fold_in(key, 30 + b), self.mb.init_batch_state(random.fold_in(key, 40 + b)))[0]
                 for b in range(batches)]
        return max(whitened_top_eigenvalue(lambda v, idx=idx: hvp(x, v, idx), scale, random.fold_in(key, 50))
                   for idx in draws)

    def row_noise(self, x, precond: Preconditioner, key) -> tuple:
        """:attr:`ModeFit.row_noise`, ``row_kick`` and ``drift_ratio`` (:func:`~numpyro_sg.infer.noise.laplace_row_noise`)."""
        (plate,) = self.mb.plates
        covariance = self._jit(lambda y, anchor, frame, a, k: row_noise_covariance(
            self.log_density(a, k), plate.name, self.rows[plate.name], y, anchor, frame), "row_noise_covariance")
        return laplace_row_noise(covariance, lambda ys: self.value_and_grad_many(ys)[1], x, precond, key,
                                 self.options.noise_points)

    def noise_heat(self, x, grad, scale, shrink, key) -> float:
        """:func:`~numpyro_sg.infer.curvature.noise_heat_of` the control-variate gradient noise
        (anchor x) at ``noise_points`` draws x + scale·ξ, in the frame of scale/``shrink``."""
        noise_sd = self._jit(lambda y, key, anchor, a, k: self.mb.cv_noise_sd(
            self.unravel, y, key, Anchor(*anchor), a, k), "noise_sd")
        points = [x + scale * random.normal(random.fold_in(key, 10 + j), x.shape, scale.dtype)
                  for j in range(self.options.noise_points)]
        tau = np.sqrt(np.mean([np.asarray(noise_sd(p, random.fold_in(key, 20 + j), (x, grad)), np.float64) ** 2
                               for j, p in enumerate(points)], axis=0))
        return noise_heat_of(tau * np.asarray(scale, np.float64) / shrink)


def find_mode(mb: Minibatcher, info: ModelInfo, unravel, model_args=(), model_kwargs=None,
              options: WarmupOptions | None = None) -> ModeFit:
    """Mode of the log posterior, Laplace preconditioner and CV anchor (module docstring), or
    the fit found in the process's store for the same model, settings and data
    (:mod:`~numpyro_sg.infer.fit_store`; its ``seconds`` are then the lookup's).

    ``mb``: the kernel's Minibatcher (model and plates); ``info``: the model's ModelInfo (its
    chain-0 initial values are the fall-back start); ``unravel``: flat vector → unconstrained
    params; ``model_args``, ``model_kwargs``: the data; ``options``: :class:`WarmupOptions`
    (defaults when omitted).  A kernel's result is ``kernel.mode_fit`` after ``MCMC.run``.
    """
    start_time = time.perf_counter()
    dtype = jnp.result_type(float)
    d = ravel_pytree(info.unconstrained_example())[0].shape[0]
    options = (options or WarmupOptions()).resolved(d, local_latents=hasattr(mb.model, "sampled"))  # a MarginalModel
    key_opt, key_hess, key_probe = random.split(random.PRNGKey(options.seed), 3)
    rows = mb.random_rows(options.hessian_rows, key_hess)
    programs = _WarmupPrograms(mb, unravel, model_args, model_kwargs or {}, options, rows,
                               tree_signature(info.unconstrained_example()), dtype)
    fit_fn = variational_fit if options.centre == "variational" else _mode_fit
    search = partial(fit_fn, programs, info, d, dtype, key_opt, key_probe, start_time)
    settings = programs.key + (info.model, str(np.dtype(dtype)), jax.default_backend(), str(jax.config.jax_default_device))
    fit, found = stored_fit(settings, first_chain_draw(info, dtype), model_args, model_kwargs, search)
    return dataclasses.replace(fit, seconds=time.perf_counter() - start_time, data_passes=0) if found else fit


def _mode_fit(programs: _WarmupPrograms, info: ModelInfo, d: int, dtype, key_opt, key_probe,
              start_time) -> ModeFit:
    """The warmup's mode search, Newton steps and Laplace fit (module docstring)."""
    options, dense = programs.options, d <= programs.options.dense_max
    with warmup_progress(options) as bar:
        bar.reset(total=3 + options.newton_steps)
        bar.set_description("warmup: mode search")
        newton_first = hasattr(programs.mb.model, "sampled") and options.newton_first(d, programs.adam_plan(d)[1])
        x, starts = _optimise(programs, info, d, dtype, key_opt, key_probe, bar, adam=not newton_first)
        raw_curvature = programs.dense_curvature if dense else lambda y: programs.diagonal_curvature(y, key_probe)

        def curvature(y):
            bar.update(1)
            return raw_curvature(y)

        def refine(y):
            bar.set_postfix_str("Newton")
            return (newton_refinement(programs.full_value_and_grad, y, curvature, options, dense, dtype,
                                      programs.monte_carlo), None) if dense else \
                diagonal_refinement(programs, y, curvature, dtype, key_probe)   # (and −diag H for the preconditioner)
        newton, neg_h = refine(x)
        if newton_first and not newton.converged:   # short of the mode: the Adam phases, then Newton again
            x, starts = _optimise(programs, info, d, dtype, key_opt, key_probe, bar)
            newton, neg_h = refine(x)
        (x, (value, grad)) = newton.point, newton.state
        bar.set_postfix_str("preconditioner")
        precond, stiffness, noise_heat = (dense_or_fallback(curvature(x), dtype), 1.0, 0.0) if dense else \
            diagonal_preconditioner(programs, x, grad, neg_h, key_probe, dtype)
        row_noise = row_kick = drift = None
        if (dense and options.max_noise_inflation is not None and len(programs.mb.plates) == 1
                and not programs.monte_carlo and not is_sharded(programs.mb)):
            bar.set_postfix_str("gradient noise")
            row_noise, row_kick, drift = programs.row_noise(x, precond, random.fold_in(key_probe, 7))
        L = np.asarray(precond.chol, np.float64) if precond.chol is not None else None  # Σ̂ = L·Lᵀ
        screen = None if L is None else (lambda g: 0.5 * np.sum((L.T @ g) ** 2))
        starts = programs.on_full_scale(starts, np.asarray(x, np.float64), value, grad, options.multimodal_gap,
                                        options.starts_per_round, screen)
        rising = partial(rises_to_mode, programs.value_and_grad_many, np.asarray(x), width=programs.round_width)
        ascents = start_ascents(*starts, lambda ys: programs.curvatures(ys, key_probe), float(value),
                                options.multimodal_gap, screen, rising)
    return ModeFit(
        mode=jnp.asarray(x, dtype), grad=jnp.asarray(grad, dtype), log_density=float(value), preconditioner=precond,
        converged=newton.converged, newton_steps=newton.steps, seconds=time.perf_counter() - start_time,
        stiffness=float(stiffness), noise_heat=float(noise_heat), start_log_densities=tuple(float(v) for v in starts[0]),
        start_ascents=ascents, row_noise=row_noise, row_kick=row_kick, drift_ratio=drift, data_passes=programs.passes,
        gradient_seconds=programs.pass_seconds)


def _optimise(programs: _WarmupPrograms, info: ModelInfo, d: int, dtype, key_opt, key_probe, bar, adam=True):
    """The start and the stochastic optimisation (module docstring, step 1) after the multi-start
    phase (the usual start alone without ``adam``: :meth:`WarmupOptions.newton_first`):
    ``(point, (the starts' end log densities, full-data gradients, end points))``; the main
    Adam phase continues the ``starts_per_round`` best ends (the best one where the two phases'
    batch sizes differ) and keeps the best by full-data log density.  The usual start's check (log π
    finite, gradients exactly 0) is made on the rows that value the ends: no pass over all the data."""
    options, (steps, batches), width = programs.options, programs.adam_plan(d), programs.round_width
    steps = steps if adam else 0
    multi = options.num_starts > 1 and options.start_steps > 0 and steps > 0
    vg = programs.full_value_and_grad if programs.exact_rows or not multi else (
        lambda y: [a[0] for a in programs.value_and_grad_many(np.asarray(y)[None])])
    x = usual_start(vg, info, d, dtype, random.fold_in(key_probe, 1), options.symmetry_jitter)
    values, grads, ends, best = (), (), (), np.asarray(x)[None]
    if multi:
        bar.set_postfix_str(f"starts 0/{options.num_starts}")
        starts = start_candidates(x, info, partial(programs.prior_draws, info.model), options.num_starts, width,
                                  random.fold_in(key_opt, 3))
        small = options.start_batches(d, batches)
        settled = partial(first_round_concave, curvature=lambda y: programs.dense_curvature(jnp.asarray(y))
                          ) if options.settle_early and options.num_starts > width else None  # one round: nothing to settle
        values, grads, ends = explore_starts(
            starts, lambda xs, keys: programs.adam_many(xs, keys, options.start_steps,
                                                        options.start_learning_rate, small),
            programs.value_and_grad_many, random.fold_in(key_opt, 4), width, settled,
            lambda done, total: bar.set_postfix_str(f"starts {done}/{total}"))
        best = best_ends(values, ends, width) if np.any(np.isfinite(values)) else starts[0]
        width = width if small == batches else 1  # one program for both phases, else the best alone
    bar.update(1)
    if steps > 0:
        bar.set_postfix_str("optimizer")
        best = np.asarray(programs.adam_many(padded_rows(best[:width], width), random.split(key_opt, width), steps,
                                             options.learning_rate, batches))
        top = np.asarray(programs.value_and_grad_many(best)[0], np.float64) if width > 1 else np.zeros(1)
        best = best[[int(np.argmax(np.where(np.isfinite(top), top, -np.inf)))]]
    bar.update(1)
    return jnp.asarray(best[0], dtype), (values, grads, ends)


def fit_model_mode(model, model_args=(), model_kwargs=None, options: WarmupOptions | None = None):
    """The warmup of a model on its data without a kernel: ``(ModeFit, Minibatcher, unravel)``.

    What a gradient kernel's ``init`` runs (:func:`find_mode` on the model's subsample
    plates), for callers that share one fit among many kernels (the tuners' arms) and need
    the model's :class:`~numpyro_sg.infer.minibatch.Minibatcher` and flat → params ``unravel``.
    """
    info = trace_model(model, model_args, model_kwargs, init_strategy=init_to_uniform, rng_key=random.PRNGKey(0))
    plates = subsample_plates(info, None, model_args=model_args, model_kwargs=model_kwargs)
    mb = Minibatcher(model, plates)
    _, unravel = ravel_pytree(info.unconstrained_example())
    return find_mode(mb, info, unravel, model_args, model_kwargs, options), mb, unravel
