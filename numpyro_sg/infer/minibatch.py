"""Mini-batch gradient estimates: the :class:`Minibatcher` of a model and its subsample plates.

:class:`Minibatcher` draws mini-batch indices inside ``jit`` in O(n) per iteration (with
replacement, the default, or without replacement by walking a per-epoch permutation:
:mod:`~numpyro_sg.infer.indices`) and evaluates the scaled mini-batch log density, its gradient —
plain, or with control variates around an :class:`Anchor` — and the gradient-noise sd from
per-datum gradients, or, at large n·d, from the spread of k group-mean gradients
(:func:`noise_groups`: memory O(n + k·d)).  The plates themselves are found and checked in
:mod:`~numpyro_sg.infer.plates`, the model is pointed at chosen rows by the handlers of
:mod:`~numpyro_sg.infer.handlers`, and full-data densities live in
:mod:`~numpyro_sg.infer.full_density`.

Conventions: log π(θ) = log p(θ) + Σ_i log f(x_i | θ); the mini-batch estimator
ĝ(θ) = ∇ log p(θ) + (N/n) Σ_{i∈S} ∇ log f(x_i | θ) is the gradient of the model's log density
traced with index set S.  The control-variate estimator (Baker, Fearnhead, Fox & Nemeth (2019),
'Control variates for stochastic gradient MCMC') is
ĝ_cv(θ) = ∇ log π(θ̂) + ĝ(θ) − ĝ(θ̂) with the same S, θ̂ the anchor and ∇ log π(θ̂) its
full-data gradient.  The gradient-noise sd of coordinate j is the sd of the estimator,
τ̂_j = (N/√n)·sd_{i∈S}(∂_j log f(x_i | θ)) (of the differences ∂_j log f(x_i|θ) − ∂_j log f(x_i|θ̂)
with control variates), times √(1 − n/N) without replacement.

At large n·d the n×d matrix of per-datum gradients is not affordable (d = 10⁵, n = 1,000:
400 MB per step).  The batch S is then split into k disjoint groups S_1..S_k of m = n/k indices
and each group's estimator g_g = ∇ log p(θ) + (N/m) Σ_{i∈S_g} ∇ log f(x_i | θ) is evaluated
(a ``vmap`` over k index sets: memory O(n + k·d)).  Their mean is ĝ exactly, and
Var(g_g) = N²σ²/m = k·Var(ĝ), so τ̂_j = sd_g(g_{g,j})/√k — the per-datum formula with datum →
group (k = n recovers it).  It has k − 1 degrees of freedom instead of n − 1; the kernels
smooth τ̂ with an EMA over iterations (``noise_ema_weight``), which restores the precision.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import potential_energy

from numpyro_sg.infer import full_density
from numpyro_sg.infer.handlers import (  # noqa: F401
    full_data,
    likelihood_only,
    with_indices,
    without_plate_sites,
)
from numpyro_sg.infer.indices import BatchState, draw_with_replacement, draw_without_replacement, random_rows
from numpyro_sg.infer.jit_data import jit_with_data
from numpyro_sg.infer.noise import MAX_GROUPS, PER_DATUM_MAX, group_noise_sd, noise_groups  # noqa: F401
from numpyro_sg.infer.preconditioner import Preconditioner, rows_to_working
from numpyro_sg.infer.plates import (  # noqa: F401
    SubsamplePlate,
    check_data_finite,
    discover_plates,
    find_subsample_plates,
    subsample_plates,
)


def working_rows(precond: Preconditioner | None) -> Callable | None:
    """Rows (n, d) of gradients → the working frame of ``precond`` (``None``: unchanged)."""
    if precond is None:
        return None
    return lambda G: rows_to_working(precond, G)


class Anchor(NamedTuple):
    """The control-variate anchor of every kernel: a point θ̂ (flat), the full-data gradient at
    θ̂ of the part of the log density the mini-batches estimate, and optionally its full-data
    Hessian for a second-order control variate.

    The gradient kernels anchor the whole log density (``grad`` = ∇ log π(θ̂), ``hess`` ``None``);
    ESGLD anchors a GLM log-likelihood in the effective coefficients β (``point`` β̂, ``grad``
    g = Σ_i x_i·ℓ'_i(η̂_i), ``hess`` H = Σ_i x_i x_iᵀ·ℓ''_i(η̂_i)), its prior being exact.
    """

    point: Any
    grad: Any
    hess: Any = None


class GradientEstimate(NamedTuple):
    """A stochastic gradient at a point: ``value`` the mini-batch log density estimate,
    ``grad`` ĝ (flat), ``noise_sd`` τ̂ per coordinate of the working frame (NaN if not
    estimated)."""

    value: Any
    grad: Any
    noise_sd: Any


class Minibatcher:
    """Index drawing and (mini-batch / full-data / per-datum) log densities for one model.

    All log densities are on NumPyro's unconstrained space and include the Jacobian of the
    constraining transforms, exactly as NumPyro's ``potential_energy`` (whose negative they are).
    The object holds only static metadata, so it is safe to build under ``pmap``/``vmap``.
    """

    def __init__(self, model: Callable, plates, replace: bool = True):
        self.model = model
        self.plates = tuple(plates)
        self.replace = bool(replace)

    # -- indices ---------------------------------------------------------------------------
    def init_batch_state(self, rng_key):
        """Batch state (one :class:`BatchState` per plate without replacement, else ``None``)."""
        if self.replace:
            return None
        keys = random.split(rng_key, len(self.plates))
        return {
            p.name: BatchState(random.permutation(k, p.size).astype(jnp.int32), jnp.int32(0))
            for p, k in zip(self.plates, keys)
        }

    def draw(self, rng_key, batch_state):
        """Draw one mini-batch of indices per plate: ``(indices, new_batch_state)``."""
        keys = random.split(rng_key, len(self.plates))
        indices, new_state = {}, {} if batch_state is not None else None
        for p, k in zip(self.plates, keys):
            if self.replace:
                indices[p.name] = draw_with_replacement(k, p.size, p.subsample_size)
            else:
                idx, new_state[p.name] = draw_without_replacement(
                    k, batch_state[p.name], p.subsample_size
                )
                indices[p.name] = idx
        return indices, new_state

    def full_indices(self):
        """All N indices of every plate."""
        return {p.name: jnp.arange(p.size, dtype=jnp.int32) for p in self.plates}

    def with_plates(self, plates) -> Minibatcher:
        """The same model's mini-batcher with other plate sizes, drawing with replacement."""
        return Minibatcher(self.model, plates, replace=True)

    def random_rows(self, rows: int, key) -> dict:
        """A random subsample of ``rows`` rows per plate, with replacement (all of them when
        N ≤ ``rows``)."""
        drawn = random_rows(key, tuple(p.size for p in self.plates), rows)
        return {p.name: idx for p, idx in zip(self.plates, drawn)}

    @property
    def fraction_unsampled(self) -> float:
        """1 − n/N of the (single) plate without replacement, 1 with replacement: the finite
        population correction of the noise variance."""
        if self.replace:
            return 1.0
        (plate,) = self.plates
        return 1.0 - plate.subsample_size / plate.size

    # -- log densities ---------------------------------------------------------------------
    def log_density_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``(params, indices) -> log density`` on the unconstrained space.

        With mini-batch indices this is log p(θ) + (N/n)·Σ_{i∈S} log f(x_i|θ) (+ log-Jacobian);
        with :meth:`full_indices` it is the exact full-data log posterior (up to a constant).
        """
        model_kwargs = model_kwargs or {}

        def log_density(params, indices):
            return -potential_energy(
                with_indices(self.model, indices), model_args, model_kwargs, params
            )

        return log_density

    def likelihood_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``(params, indices) -> (N/n)·Σ_{i∈S} log f(x_i|θ)`` (+ the log-Jacobian factors):
        :meth:`log_density_fn` without the latent sites outside the subsample plates
        (:class:`~numpyro_sg.infer.handlers.likelihood_only`), so its cost is that of the
        mini-batch alone, not O(d)."""
        model_kwargs = model_kwargs or {}
        names = tuple(p.name for p in self.plates)

        def likelihood(params, indices):
            model = likelihood_only(with_indices(self.model, indices), names)
            return -potential_energy(model, model_args, model_kwargs, params)

        return likelihood

    def group_noise_sd(self, likelihood, flat, indices, groups: int, anchor: Anchor | None = None,
                       to_working: Callable | None = None):
        """τ̂ from k = ``groups`` group estimators of the one plate's batch:
        :func:`~numpyro_sg.infer.noise.group_noise_sd` (memory O(d), time O(n + k·d))."""
        (plate,) = self.plates
        return group_noise_sd(likelihood, flat, indices[plate.name], groups, anchor, to_working,
                              name=plate.name, fraction_unsampled=self.fraction_unsampled)

    def value_grad_noise(self, log_density, params, indices, anchor: Anchor | None = None,
                         to_working: Callable | None = None, groups: int | None = None):
        """Log density, ĝ and the gradient-noise sd τ̂ from per-datum (or per-group) gradients.

        ``log_density(params, indices)`` is a log density as returned by
        :meth:`log_density_fn` (``params`` any pytree; a flat vector when ``anchor`` is given).  Evaluates it on one datum at a time
        (plate index set of size one, scale N), vectorised with ``jax.vmap`` over the n
        indices: O(n·d).  Each such gradient is g_i = ∇ log p(θ) + N ∇ log f(x_i|θ), so
        ĝ = mean_i g_i and τ̂ = sd_i(g_i)/√n = (N/√n)·sd_i(∇ log f(x_i|θ)) (× √(1 − n/N)
        without replacement); the mean of the per-datum values is the mini-batch log
        density.  With an ``anchor`` the per-datum differences g_i(θ) − g_i(θ̂) give the
        control-variate ĝ_cv = ∇ log π(θ̂) + mean_i (g_i(θ) − g_i(θ̂)) and its noise.
        ``to_working`` maps the (n, d) per-datum gradients into the working frame of a
        preconditioner before their sd is taken.  Requires a single subsample plate.

        ``groups`` k (see :func:`noise_groups`; default k = n, per datum): the n indices are
        split into k disjoint groups of n/k and the same formulas apply to the k group
        estimators (τ̂ = sd_g(g_g)/√k): memory O(n + k·d) instead of O(n·d).
        """
        (plate,) = self.plates
        idx = indices[plate.name]
        n = idx.shape[0]
        k = n if groups is None else int(groups)
        if n % k:
            raise ValueError(f"noise groups k={k} must divide the batch size n={n}.")
        idx = idx.reshape(k, n // k)

        def one(p, i):
            value, grad = jax.value_and_grad(log_density)(p, {plate.name: i})
            return value, ravel_pytree(grad)[0]

        def per_datum(p):
            return jax.vmap(lambda i: one(p, i))(idx)

        if anchor is None:
            values, g = per_datum(params)
            ghat = g.mean(0)
        else:  # params flat here: θ and θ̂ in one vectorised evaluation
            values, g2 = jax.vmap(per_datum)(jnp.stack([params, anchor.point]))
            values, g = values[0], g2[0] - g2[1]
            ghat = anchor.grad + g.mean(0)
        value = values.mean()
        g_work = g if to_working is None else to_working(g)
        tau = jnp.std(g_work, axis=0, ddof=1 if k > 1 else 0) / jnp.sqrt(k)
        tau = tau * jnp.sqrt(self.fraction_unsampled)
        return value, ghat, tau

    def estimate(self, flat_log_density, flat, indices, *, anchor: Anchor | None = None,
                 noise: bool = False, to_working: Callable | None = None,
                 groups: int | None = None, likelihood: Callable | None = None) -> GradientEstimate:
        """The stochastic gradient at the flat point ``flat`` on the mini-batch ``indices``.

        ``flat_log_density(x, indices)`` takes a flat unconstrained vector.  Plain (``anchor``
        ``None``): ĝ = ∇ of the mini-batch log density.  With an :class:`Anchor`: the
        control-variate ĝ_cv = ∇ log π(θ̂) + ĝ(θ) − ĝ(θ̂) on the same indices (both points in
        one vectorised evaluation).  ``noise=True`` adds τ̂ from per-datum gradients (see
        :meth:`value_grad_noise`, with ``groups`` groups; default :func:`noise_groups`);
        otherwise ``noise_sd`` is NaN.  Given the flat ``likelihood`` (:meth:`likelihood_fn`),
        group estimates (k < n) come from :meth:`group_noise_sd` beside the plain ĝ: the same
        τ̂ without evaluating the prior in every group.
        """
        if noise:
            (plate,) = self.plates
            k = noise_groups(plate.subsample_size, flat.shape[0], groups)
            if likelihood is not None and k < plate.subsample_size:
                value, grad, _ = self.estimate(flat_log_density, flat, indices, anchor=anchor)
                tau = self.group_noise_sd(likelihood, flat, indices, k, anchor, to_working)
                return GradientEstimate(value, grad, tau)
            value, grad, tau = self.value_grad_noise(
                flat_log_density, flat, indices, anchor=anchor, to_working=to_working, groups=k
            )
            return GradientEstimate(value, grad, tau)
        vg = jax.value_and_grad(flat_log_density)
        if anchor is None:
            value, grad = vg(flat, indices)
        else:
            values, grads = jax.vmap(vg, in_axes=(0, None))(jnp.stack([flat, anchor.point]), indices)
            value, grad = values[0], anchor.grad + grads[0] - grads[1]
        return GradientEstimate(value, grad, jnp.full_like(flat, jnp.nan))

    def estimate_at(self, unravel, flat, indices, *, anchor: Anchor | None = None, noise=False,
                    precond: Preconditioner | None = None, groups: int | None = None, model_args=(),
                    model_kwargs=None) -> GradientEstimate:
        """:meth:`estimate` of the model's log density at the flat point ``flat`` (``unravel``:
        flat → params) on ``indices``, for these data, τ̂ in the working frame of ``precond``:
        the kernels' one gradient estimate."""
        log_density = self.log_density_fn(model_args, model_kwargs)
        likelihood = self.likelihood_fn(model_args, model_kwargs)

        def flat_log_density(x, idx):
            return log_density(unravel(x), idx)

        def flat_likelihood(x, idx):
            return likelihood(unravel(x), idx)

        return self.estimate(flat_log_density, flat, indices, anchor=anchor, noise=noise,
                             to_working=working_rows(precond), groups=groups,
                             likelihood=flat_likelihood)

    def score_estimator(self, unravel, anchor: Anchor | None, batch_size: int, model_args=(),
                        model_kwargs=None) -> Callable:
        """``(X (T, d), rng_key) → Ŝ (T, d)``: an unbiased estimate of ∇ log π at each row of X.

        Row t gets its own mini-batch B_t of ``batch_size`` indices per plate (with
        replacement; the plate's full data when N ≤ ``batch_size``, then Ŝ is exact), so the
        noise is independent across rows — what the stochastic Stein discrepancy (Gorham, Raj
        & Mackey 2020) needs.  With an :class:`Anchor` the control-variate form
        ŝ(x) = ∇ log π(θ̂) + ĝ_B(x) − ĝ_B(θ̂) (:meth:`estimate`), whose noise vanishes as x → θ̂;
        without, the plain mini-batch gradient.  Cost O(T·batch_size·d); compiled once, the
        data passed as arguments (:func:`jit_with_data`).
        """
        sizes = {p.name: (p.size, min(int(batch_size), p.size)) for p in self.plates}

        def estimate_all(X, rng_key, model_args, model_kwargs):
            log_density = self.log_density_fn(model_args, model_kwargs)

            def flat_log_density(x, idx):
                return log_density(unravel(x), idx)

            def one(x, key):
                keys = random.split(key, len(sizes))
                idx = {name: draw_with_replacement(k, N, n) if n < N else jnp.arange(N, dtype=jnp.int32)
                       for (name, (N, n)), k in zip(sizes.items(), keys)}
                return self.estimate(flat_log_density, x, idx, anchor=anchor).grad

            return jax.vmap(one)(X, random.split(rng_key, X.shape[0]))

        return jit_with_data(estimate_all, model_args, model_kwargs)

    # -- full-data densities (:mod:`~numpyro_sg.infer.full_density`) -----------------------
    def prior_log_density_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``params -> log p(θ)`` (+ log-Jacobian): the model with every site inside the
        subsample plates given weight 0
        (:func:`~numpyro_sg.infer.full_density.prior_log_density_fn`)."""
        return full_density.prior_log_density_fn(self.model, self.plates, model_args, model_kwargs)

    def fisher_diagonal(self, unravel, x, indices, group_size: int = 8, model_args=(), model_kwargs=None,
                        block: int = 64):
        """Diagonal of the likelihood's Fisher information N·Var_i(∇ log f(x_i | θ)) at the
        flat point ``x`` (``unravel``: flat → params) from the rows ``indices`` of the (single)
        plate, by group gradients (:func:`~numpyro_sg.infer.full_density.fisher_diagonal`)."""
        (plate,) = self.plates
        log_density = self.log_density_fn(model_args, model_kwargs)
        prior = self.prior_log_density_fn(model_args, model_kwargs)
        return full_density.fisher_diagonal(plate, lambda y, i: log_density(unravel(y), i),
                                            lambda y: prior(unravel(y)), x, indices, group_size, block)

    def cv_noise_sd(self, unravel, x, key, anchor: Anchor, model_args=(), model_kwargs=None):
        """τ̂ of the control-variate gradient at the flat point ``x`` on one random mini-batch
        (group estimators, :func:`noise_groups`; the warmup's gradient-noise heat)."""
        (plate,) = self.plates
        n = plate.subsample_size
        idx = {plate.name: draw_with_replacement(key, plate.size, n)}
        log_density = self.log_density_fn(model_args, model_kwargs)
        return self.value_grad_noise(lambda y, i: log_density(unravel(y), i), x, idx, anchor=anchor,
                                     groups=noise_groups(n, x.shape[0]))[2]

    def full_value_and_grad_fn(self, unravel, model_args=(), model_kwargs=None,
                               chunk_size: int = 65536) -> Callable:
        """``x -> (log π(x), ∇ log π(x))`` over all the data, for a flat point x, in chunks of
        ``chunk_size`` rows (:func:`~numpyro_sg.infer.full_density.full_value_and_grad_fn`)."""
        return full_density.full_value_and_grad_fn(self.model, self.plates, unravel, model_args,
                                                   model_kwargs, chunk_size)

    def per_datum_loglik_grads(self, params, indices, model_args=(), model_kwargs=None):
        """Gradients ∇_θ log f(x_i | θ) of each datum's log-likelihood, shape (n, …) per site
        (one plate; :func:`~numpyro_sg.infer.full_density.per_datum_loglik_grads`)."""
        (plate,) = self.plates
        return full_density.per_datum_loglik_grads(self.model, plate, params, indices, model_args,
                                                   model_kwargs)
