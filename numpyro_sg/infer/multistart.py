r"""The multi-start phase of the warmup's mode search (:func:`~numpyro_sg.infer.warmup.find_mode`).

A single gradient ascent from one start ends in the mode whose basin holds that start: on a
multimodal posterior — a Gaussian mixture, whose local modes leave a component empty or merge
two — that is often not the highest one, and every chain then starts (and stays) there.  Before
the main optimizer phase, :func:`explore_starts` therefore runs ``num_starts`` short Adam
ascents (``start_steps`` mini-batch steps each, ``starts_per_round`` at a time through one
vectorised program, the main phase's too):

* from the search's usual start (the unconstrained zero point, or the init strategy's draw
  where the log density is not finite there);
* from the kernel's ``init_strategy`` draw (NumPyro's ``init_to_uniform`` when none is given);
* from further ``init_to_uniform`` draws (uniform on (−2, 2) on the unconstrained space) and
  draws from the prior (:func:`prior_or_uniform`: ``init_to_uniform`` for a site with an improper
  prior, which has no draw);

and keeps the end points with the highest log density (over all the data up to the warmup's
``hessian_rows`` rows, in one batched pass per round; above, estimated on those rows and put
on the full-data scale by control variates at the mode), from which the main Adam phase and
the Newton refinement continue.
The rounds after the first run only when it does not show a log-concave posterior
(:func:`first_round_concave`): a GLM pays one round.  The end points' log densities are
returned too: the kernels warn when some starts ended in modes
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
from numpyro_sg.infer.indices import numpy_rng
from numpyro_sg.infer.model_info import ModelInfo, improper_to_uniform, trace_model


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


def first_chain_draw(info: ModelInfo, dtype):
    """The init strategy's chain-0 draw, flat (1, d) (NumPy), or ``None`` (also when it is
    traced: under ``chain_method="parallel"`` the draw depends on the chain's key, and the
    mode search runs eagerly, once for every chain)."""
    if info.init_values is None or any(isinstance(v, jax.core.Tracer)
                                       for v in jax.tree.leaves(info.init_values)):
        return None
    first = {k: np.asarray(v)[0] if np.ndim(v) > len(info.sites[k].unconstrained_shape) else np.asarray(v)
             for k, v in info.init_values.items()}
    return np.concatenate([np.ravel(v) for v in jax.tree.leaves(first)]).astype(dtype)[None]


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
    zero = np.zeros(unravel_dim, dtype)
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
    return first_chain_draw(info, dtype)[0]


def start_candidates(start, info: ModelInfo, prior_draws, num_starts: int, width: int, key):
    """The ``num_starts`` starts of :func:`explore_starts` (module docstring): ``(the first
    round's ``width`` starts (k, d), a function giving the others (S − k, d))``.  The first are
    ``start``, the init strategy's chain-0 draw and ``init_to_uniform`` draws (U(−2, 2) per
    unconstrained coordinate: no model trace); the others, drawn only when asked for (a
    multimodal posterior, or every round), prior and uniform draws in turn (all in the first
    round when ``width`` ≥ ``num_starts``).  ``prior_draws(key, n)``: n flat
    draws (n, d) of :func:`prior_or_uniform` in one compiled program; a
    ``NotImplementedError`` (a distribution without a sampler) gives uniform draws instead."""
    rng = numpy_rng(key)
    d, dtype = start.shape[0], start.dtype
    parts = [np.asarray(start, dtype)[None]]
    chain0 = first_chain_draw(info, dtype)
    if chain0 is not None and num_starts > 1:
        parts.append(chain0)
    parts = np.concatenate(parts)[:max(num_starts, 1)]
    k = max(1, min(width, num_starts))

    def drawn(rest):
        if rest <= 0:
            return np.zeros((0, d), dtype)
        uniform = rng.uniform(-2.0, 2.0, (rest - rest // 2, d)).astype(dtype)
        try:
            prior = np.asarray(prior_draws(random.fold_in(key, 1), rest // 2), dtype)
        except NotImplementedError:
            prior = rng.uniform(-2.0, 2.0, (rest // 2, d)).astype(dtype)
        return np.stack([kind[i] for i in range(len(uniform)) for kind in (prior, uniform) if i < len(kind)])

    if k >= num_starts:  # every start at once
        rest = num_starts - len(parts)
        return (np.concatenate([parts, drawn(rest)]) if rest > 0 else parts), lambda: parts[:0]
    firsts = np.concatenate([parts, rng.uniform(-2.0, 2.0, (max(k - len(parts), 0), d)).astype(dtype)])
    return firsts[:k], lambda: np.concatenate([firsts[k:], drawn(num_starts - len(firsts))])


def flat_prior_draws(model, model_args, model_kwargs, key, n: int, dtype):
    """n flat draws (n, d) of :func:`prior_or_uniform` (traceable: one program under ``jit``)."""
    return _flat_draws(model, model_args, model_kwargs, prior_or_uniform, random.split(key, n), dtype)


def padded_rows(rows, size: int):
    """``rows`` (k ≤ size, d) padded to ``size`` rows by repeating the last (one shape, one program)."""
    return np.concatenate([rows, np.repeat(rows[-1:], size - len(rows), axis=0)]) if len(rows) < size else rows


def explore_starts(starts, ascend, values_at, key, width: int, settled=None, report=None):
    """Adam ascents from the starts, ``width`` at a time (rounds), and the full-data log density
    at their ends.  With ``settled``, the rounds after the first run only when it says the first
    round's starts and ends do not show a log-concave posterior (:func:`first_round_concave`).

    :param starts: ``(first round's starts, function giving the others)`` (:func:`start_candidates`).
    :param ascend: ``(xs, keys) -> xs``, Adam on mini-batches from each row of xs (k, d) with
        k = ``width``: every call has one shape, and compiles once.
    :param values_at: ``xs -> (log π, ∇ log π)`` at each row of xs (k, d) (over all the data, or
        estimated on a fixed subsample of rows: the warmup's ``value_and_grad_many``).
    :param key: key of the mini-batches.
    :param settled: ``(starts, values, ends) -> bool`` of the first round, or ``None`` (every
        round runs).
    :param report: ``(starts done, starts to run) -> None`` after each round (a progress bar), or ``None``.
    :return: ``(log densities of the S' ≤ S end points (non-finite: -inf), their full-data
        gradients (S', d), the end points (S', d))``.
    """
    firsts, others = starts
    values, grads, ends = [], [], []
    batches = [firsts]
    while batches:
        chunk = batches.pop(0)
        lo = sum(len(e) for e in ends)
        x = np.asarray(ascend(padded_rows(chunk, width), random.split(random.fold_in(key, lo), width)))[:len(chunk)]
        v, g = (np.asarray(a, np.float64)[:len(chunk)] for a in values_at(padded_rows(x, width)))
        ok = np.isfinite(v) & np.all(np.isfinite(g), axis=1)
        values.append(np.where(ok, v, -np.inf))
        grads.append(np.where(ok[:, None], g, np.inf))
        ends.append(x)
        if lo == 0 and not (settled is not None and settled(chunk, values[0], x)):
            rest = others()
            batches = [rest[i:i + width] for i in range(0, len(rest), width)]
        if report is not None:
            report(lo + len(chunk), lo + len(chunk) + sum(len(b) for b in batches))
    return np.concatenate(values), np.concatenate(grads), np.concatenate(ends)


def first_round_concave(starts, values, ends, curvature) -> bool:
    """True when the first round shows a log-concave posterior as far as it can tell: every end
    finite, and −H = ``curvature(x)`` (full, up to :data:`EXACT_ASCENT_MAX` coordinates)
    finite and positive definite at every start.  A GLM's starts then all climb to its one mode
    and the other rounds are skipped; a mixture's dispersed starts meet indefinite curvature (two
    components pulling one mean apart), and every round runs.  The starts are checked one at a
    time and the first indefinite one ends the check: on a hierarchical model, where every
    start is indefinite, it costs one Hessian, not one per start.  Agreement of the first ends
    alone is no such evidence: on a three-component mixture four starts all climbed to the same
    merged mode.  Where −H is not finite at a start (it overflowed there: an exponential link on
    covariates tens of sds out), the start's end point ``ends`` stands in for it."""
    starts = np.asarray(starts)
    if not np.all(np.isfinite(values)) or starts.shape[1] > EXACT_ASCENT_MAX:
        return False
    for start, end in zip(starts, np.asarray(ends)):
        neg_h = np.asarray(curvature(start), np.float64)
        if not np.all(np.isfinite(neg_h)):  # overflowed far out (an exponential link on covariates
            neg_h = np.asarray(curvature(end), np.float64)  # tens of sds out): its ascent's end
        if not (np.all(np.isfinite(neg_h)) and np.all(np.linalg.eigvalsh(neg_h) > 0)):
            return False
    return True


def best_ends(values, ends, k: int):
    """The ``k`` end points of highest log density (padded by repeating, best first)."""
    order = np.argsort(-np.asarray(values, np.float64), kind="stable")[:k]
    return padded_rows(np.asarray(ends)[order], k)


#: up to this many coordinates :func:`start_ascents` uses the full Hessian (d Hessian-vector
#: products per end point, the Newton decrement); above, Hutchinson's diagonal (16 products)
EXACT_ASCENT_MAX = 64


def start_ascents(values, grads, ends, curvature_many, best_value: float, gap: float, screen=None,
                  rising=None) -> tuple:
    """How much further each start's end point would climb,
    :func:`~numpyro_sg.infer.curvature.predicted_ascent` (the Newton decrement) there.
    Computed only for the ends more than ``gap`` nats below ``best_value`` (the candidates for
    another mode; 0 for the others, ``inf`` for non-finite ones); ``curvature_many(xs)`` gives
    −H (S', d, d), or its diagonal (S', d), at the rows of xs (S', d).  ``screen(g)``, the
    ascent in the Laplace metric at the mode (½·gᵀΣ̂g), spares the curvature of an end that
    it already shows climbing to within ``gap`` of the best (no local mode: a GLM's
    unconverged starts); so does ``rising(ends, grads)`` (:func:`rises_to_mode`), for the ends
    from which log π rises all the way to the mode (their ascent: the whole gap); the others
    get their own curvature."""
    far = [bool(np.isfinite(value) and best_value - value > gap) for value in values]
    screened = {i: screen(grads[i]) for i, f in enumerate(far) if f and screen is not None}
    climbing = {i: a for i, a in screened.items() if best_value - values[i] - a <= gap}
    rest = [i for i, f in enumerate(far) if f and i not in climbing]
    if rising is not None and rest:
        up = rising(np.stack([ends[i] for i in rest]), np.stack([grads[i] for i in rest]))
        climbing.update({i: best_value - values[i] for i, r in zip(rest, up) if r})
    picked = [i for i, f in enumerate(far) if f and i not in climbing]
    curvatures = dict(zip(picked, curvature_many(np.stack([ends[i] for i in picked])) if picked else ()))
    return tuple(float(climbing[i]) if i in climbing
                 else predicted_ascent(grads[i], curvatures[i]) if far[i]
                 else (0.0 if np.isfinite(value) else np.inf) for i, value in enumerate(values))


#: where :func:`rises_to_mode` looks between an end point and the mode (fractions of the way)
SEGMENT_FRACTIONS = (0.125, 0.25, 0.5)


def rises_to_mode(values_at, mode, ends, grads, width: int) -> np.ndarray:
    """Whether log π rises along the straight line from each of ``ends`` (k, d) to ``mode``:
    its gradient there (``grads``, (k, d)) points towards the mode and its values at the end, at
    :data:`SEGMENT_FRACTIONS` of the way and at the mode increase.  Such an end climbs to the mode
    with no valley between them: it is no local mode, and needs no Hessian to say so (on a
    hierarchical model every far start's end, each Hessian costing up to tens of passes over the
    data; a local maximum has a zero gradient and values that fall in every direction).
    ``values_at(xs)``: ``(log π, ∇ log π)`` at the rows of xs (``width``, d), one scale for all
    (the warmup's :meth:`value_and_grad_many`); ``(1 + 4k)/width`` calls, rounded up."""
    mode, ends = np.asarray(mode, ends.dtype), np.asarray(ends)
    toward = mode[None] - ends
    points = np.concatenate([mode[None], ends] + [ends + f * toward for f in SEGMENT_FRACTIONS]).astype(ends.dtype)
    values = np.concatenate([np.asarray(values_at(padded_rows(points[lo:lo + width], width))[0], np.float64)
                             [:len(points[lo:lo + width])] for lo in range(0, len(points), width)])
    k = len(ends)
    path = np.concatenate([values[1:].reshape(1 + len(SEGMENT_FRACTIONS), k).T, np.full((k, 1), values[0])], axis=1)
    slope = np.einsum("kd,kd->k", np.asarray(grads, np.float64), toward.astype(np.float64))
    return np.all(np.isfinite(path), axis=1) & np.all(np.diff(path, axis=1) > 0, axis=1) & (slope > 0)
