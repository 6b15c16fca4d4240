r"""The multi-start phase of the warmup's mode search (:func:`~numpyro_sg.infer.warmup.find_mode`).

A single gradient ascent from one start ends in the mode whose basin holds that start: on a
multimodal posterior — a Gaussian mixture, whose local modes leave a component empty or merge
two — that is often not the highest one, and every chain then starts (and stays) there.  Before
the main optimizer phase, :func:`explore_starts` therefore runs ``num_starts`` short Adam
ascents (``start_steps`` mini-batch steps each, all starts in one vectorised program):

* from the search's usual start (the unconstrained zero point, or the init strategy's draw
  where the log density is not finite there);
* from the kernel's ``init_strategy`` draw (NumPyro's ``init_to_uniform`` when none is given);
* from further ``init_to_uniform`` draws (uniform on (−2, 2) on the unconstrained space) and
  draws from the prior (:func:`prior_or_uniform`: ``init_to_uniform`` for a site with an improper
  prior, which has no draw);

and keeps the end point with the highest full-data log density (one pass over the data per
start, in chunks), from which the main Adam phase and the Newton refinement continue.  The
end points' log densities are returned too: the kernels warn when some starts ended in modes
clearly lower than the one kept (:meth:`~numpyro_sg.infer.warmup_options.ModeFit.multimodality`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.infer import init_to_sample

from numpyro_sg.infer.curvature import predicted_ascent
from numpyro_sg.infer.model_info import ModelInfo, improper_to_uniform, trace_model

__all__ = ["prior_or_uniform", "start_candidates", "explore_starts", "start_ascents", "usual_start",
           "break_symmetry"]


def prior_or_uniform(site):
    """NumPyro init strategy: a draw from the prior (``init_to_sample``), or ``init_to_uniform``'s
    value for a site with an improper prior (:func:`~numpyro_sg.infer.model_info.improper_to_uniform`)."""
    value = improper_to_uniform(site)
    return init_to_sample(site) if value is None else value


def _flat_draws(model, model_args, model_kwargs, strategy, keys, dtype):
    """Flat unconstrained initial points (len(keys), d) of ``strategy``'s draws."""
    if len(keys) == 0:
        return None
    info = trace_model(model, model_args, model_kwargs, init_strategy=strategy, rng_key=keys)
    return jax.vmap(lambda v: ravel_pytree(v)[0])(info.init_values).astype(dtype)


def _first_chain(info: ModelInfo, dtype):
    """The init strategy's chain-0 draw, flat, or ``None`` (also when it is traced: under
    ``chain_method="parallel"`` the draw depends on the chain's key, and the mode search runs
    eagerly, once for every chain)."""
    if info.init_values is None or any(isinstance(v, jax.core.Tracer)
                                       for v in jax.tree.leaves(info.init_values)):
        return None
    first = {k: v[0] if jnp.ndim(v) > len(info.sites[k].unconstrained_shape) else v
             for k, v in info.init_values.items()}
    return ravel_pytree(first)[0].astype(dtype)[None]


def break_symmetry(x, grad, key, scale):
    """x + ``scale``·ξ (ξ ~ N(0, I)) in the coordinates where ``grad`` is exactly 0, x elsewhere.

    At the zero point a model with a product of parameters (matrix factorisation, U·Vᵀ) sits
    on a saddle where the gradient of every factor vanishes exactly by symmetry, and gradient
    ascent never leaves it; perturbing those coordinates (and only those, so a model whose
    gradient is non-zero everywhere starts exactly at zero as before) breaks the symmetry.
    """
    xi = random.normal(key, x.shape, x.dtype)
    return jnp.where(grad == 0, x + scale * xi, x)


def usual_start(full_vg, info: ModelInfo, unravel_dim, dtype, key=None, scale=0.1):
    """The mode search's usual start: the unconstrained zero point (its exact-zero-gradient
    coordinates perturbed, :func:`break_symmetry`), or chain 0's initial draw where log π is not
    finite there.  ``full_vg``: ``x -> (log π(x), ∇ log π(x))``; ``unravel_dim``: d."""
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
    return _first_chain(info, dtype)[0]


def start_candidates(start, info: ModelInfo, model_args, model_kwargs, num_starts: int, key):
    """The ``num_starts`` starts of :func:`explore_starts` (module docstring), an array (S, d):
    ``start``, the init strategy's chain-0 draw, then ``init_to_uniform`` and prior draws
    (half each; uniform draws instead when the prior cannot be sampled)."""
    dtype = start.dtype
    parts = [start[None]]
    first = _first_chain(info, dtype)
    if first is not None and num_starts > 1:
        parts.append(first)
    rest = max(num_starts - len(parts), 0)
    n_prior = rest // 2
    key_u, key_p = random.split(key)
    try:
        prior = _flat_draws(info.model, model_args, model_kwargs, prior_or_uniform,
                            random.split(key_p, n_prior), dtype)
    except NotImplementedError:  # a distribution without a sampler
        prior, n_prior = None, 0
    # init_to_uniform draws each unconstrained coordinate from U(−2, 2): no trace needed
    uniform = random.uniform(key_u, (rest - n_prior, start.shape[0]), dtype, -2.0, 2.0)
    parts += [p for p in (uniform, prior) if p is not None]
    return jnp.concatenate(parts, axis=0)


def explore_starts(starts, adam_many, full_value_and_grad_many, key, steps: int):
    """Short Adam ascents from each start; the best end point by full-data log density.

    :param starts: (S, d) starting points (:func:`start_candidates`).
    :param adam_many: ``(xs, keys, steps) -> xs``, Adam on mini-batches from each row of xs.
    :param full_value_and_grad_many: ``xs -> (log π, ∇ log π)`` at each row of xs (S, d), over
        all the data (one batched pass).
    :param key: key of the mini-batches.
    :param int steps: Adam steps per start.
    :return: ``(best point (d,), log densities of the S end points (non-finite: -inf),
        their full-data gradients (S, d), the end points (S, d))``.
    """
    ends = np.asarray(adam_many(starts, random.split(key, starts.shape[0]), steps))
    values, grads = full_value_and_grad_many(ends)
    values, grads = np.asarray(values, np.float64), np.asarray(grads, np.float64)
    ok = np.isfinite(values) & np.all(np.isfinite(grads), axis=1)
    values, grads = np.where(ok, values, -np.inf), np.where(ok[:, None], grads, np.inf)
    if not np.any(ok):
        return np.asarray(starts)[0], values, grads, ends
    return ends[int(np.argmax(values))], values, grads, ends


#: up to this many coordinates :func:`start_ascents` uses the exact Hessian's diagonal (d
#: Hessian-vector products per end point); above, Hutchinson's estimate (16 products)
EXACT_ASCENT_MAX = 64


def start_ascents(values, grads, ends, curvature_many, best_value: float, gap: float) -> tuple:
    """How much further each start's end point would climb,
    :func:`~numpyro_sg.infer.curvature.predicted_ascent` (½·Σ g_j²/|h_jj|) there.  Computed only
    for the ends more than ``gap`` nats below ``best_value`` (the candidates for another mode;
    0 for the others, ``inf`` for non-finite ones); ``curvature_many(xs)`` gives −diag H (S', d)
    at the rows of xs (S', d), all those ends at once."""
    far = [bool(np.isfinite(value) and best_value - value > gap) for value in values]
    picked = [x for x, f in zip(ends, far) if f]
    curvatures = iter(curvature_many(np.stack(picked)) if picked else ())
    return tuple(predicted_ascent(grad, next(curvatures)) if f else (0.0 if np.isfinite(value) else np.inf)
                 for value, grad, f in zip(values, grads, far))
