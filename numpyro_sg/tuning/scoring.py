"""Scoring an arm's draws: a Stein discrepancy on one common scale (lower is better).

The default criterion is the U-statistic KSD² of the draws thinned to about one per
effective sample, plus its standard error; its scores may be stochastic control-variate
estimates on a mini-batch per draw, the stochastic Stein discrepancy of Gorham, Raj & Mackey
(2020), "Stochastic Stein discrepancies".  ``criterion="plain"`` is the KSD (V-statistic) of
Gorham & Mackey (2017), "Measuring sample quality with kernels", as used by Coullon, South &
Nemeth (2023), "Efficient and generalizable tuning strategies for stochastic gradient MCMC";
FSSD is that of Jitkrittum et al. (2017), "A linear-time kernel goodness-of-fit test".
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import random

from numpyro_sg.diagnostics.convergence import bulk_ess
from numpyro_sg.diagnostics.fssd import fssd
from numpyro_sg.diagnostics.ksd import ksd, ksd_u_statistic, signed_sqrt
from numpyro_sg.diagnostics.model_scores import ModelScores
from numpyro_sg.infer.minibatch import Anchor
from numpyro_sg.locals.fitting import log_marginal_of

#: arms with fewer effective draws than this are reported as not mixed (``rounds["mixed"]``)
MIN_ESS = 20
#: contiguous blocks of an arm's scored draws (in chain order) for the block-jackknife se
NUM_BLOCKS = 20


class Scorer:
    """Scores the thinned draws of an arm (lower is better).

    ``criterion="ess"``: the U-statistic KSD² of the arm's draws thinned to about one draw per
    effective sample (so the draws are nearly independent and KSD_U² estimates the bias part,
    KSD² of the distribution the arm samples, without a penalty for autocorrelation), plus its
    standard error — the delete-a-block jackknife over :data:`NUM_BLOCKS` contiguous blocks
    of the scored draws in chain order (:func:`~numpyro_sg.diagnostics.ksd.ksd_u_statistic`
    with ``num_blocks``), which holds when the thinning leaves autocorrelation; stochastic control-variate scores when the warmup's fit is known (a
    gradient kernel), else full-data scores.  ``criterion="plain"``: the V-statistic KSD of
    Coullon, South & Nemeth (2023) (or FSSD, or the user's metric) of all thinned draws with
    full-data scores.

    :param model: the NumPyro model.
    :param model_args: its positional arguments.
    :param model_kwargs: its keyword arguments.
    :param metric: ``"ksd"``, ``"fssd"`` or a callable ``f(samples) -> float``.
    :param str criterion: ``"ess"`` or ``"plain"``.
    :param preconditioner: ``"laplace"``, an array of per-coordinate scales, or ``None``.
    :param score_draws: at most this many draws are scored per arm (``None``: all).
    :param ksd_options: options of the KSD or FSSD.
    :param geometry: the warmup's ``(ModeFit, Minibatcher, unravel)``, or ``None``.
    :param int score_subsample: rows per plate of each stochastic score's mini-batch.
    :param rng_key: a ``jax.random.PRNGKey`` for the stochastic scores' mini-batches.
    """

    def __init__(self, model, model_args, model_kwargs, metric, criterion, preconditioner,
                 score_draws, ksd_options, geometry, score_subsample, rng_key):
        self.metric, self.criterion = metric, criterion
        self.score_draws = score_draws
        self.ksd_options = dict(ksd_options or {})
        self.postprocess = None  # set by attach() once a kernel is initialised
        self.scores = ModelScores(log_marginal_of(model), model_args, model_kwargs)
        self.fit = None if geometry is None else geometry[0]
        self.rng_key = rng_key
        self._stochastic = None
        if geometry is not None and criterion == "ess" and not self.scores.discrete_sites:
            fit, mb, unravel = geometry
            self._stochastic = mb.score_estimator(unravel, Anchor(fit.mode, fit.grad), score_subsample,
                                                  model_args, model_kwargs)
        self.scales = self._scales(preconditioner)

    @property
    def score_kind(self) -> str:
        """How the draws' scores are computed (stored in the result's attrs)."""
        return "stochastic (control variates)" if self._stochastic is not None else "full data"

    def attach(self, kernel, model_args, model_kwargs):
        """Use ``kernel``'s ``postprocess_fn`` to constrain draws (after its ``init``)."""
        self.postprocess = jax.jit(jax.vmap(kernel.postprocess_fn(model_args, model_kwargs)))

    def _scales(self, preconditioner):
        if preconditioner is None:
            return None
        if isinstance(preconditioner, str):
            if preconditioner == "laplace":
                if self.fit is None:
                    raise ValueError(
                        "preconditioner='laplace' uses the warmup's Laplace scales, which only the "
                        "gradient kernels (SGLD, SGBD, …) on models without discrete latent sites "
                        "have; pass an array of per-coordinate scales or None."
                    )
                return self.fit.scales
            raise ValueError(
                f"preconditioner must be 'laplace', an array of per-coordinate scales or None; "
                f"got {preconditioner!r}. ('sd' would scale every arm by its own sd, and "
                "scores on different scales cannot be compared.)"
            )
        scales = np.asarray(preconditioner, float)
        if scales.ndim == 0:
            scales = np.full(self.scores.dim, float(scales))
        if scales.shape != (self.scores.dim,) or not np.all(np.isfinite(scales) & (scales > 0)):
            raise ValueError(
                f"preconditioner scales must be {self.scores.dim} positive finite numbers (one "
                f"per unconstrained coordinate {self.scores.coordinate_names}); got {scales!r}."
            )
        return scales

    def constrained(self, z_draws) -> dict:
        """Constrained draws {site: (T, …)} of unconstrained kernel states (T, …), in blocks."""
        T = jax.tree.leaves(z_draws)[0].shape[0]
        out = []
        for start in range(0, T, 256):
            block = jax.tree.map(lambda v: v[start:start + 256], z_draws)
            n = jax.tree.leaves(block)[0].shape[0]
            if n < 256:  # fixed block shape: one compilation
                block = jax.tree.map(lambda v: np.pad(v, [(0, 256 - n)] + [(0, 0)] * (v.ndim - 1), mode="edge"), block)
            out.append(jax.tree.map(lambda v: np.asarray(v)[:n], self.postprocess(block)))
        return jax.tree.map(lambda *v: np.concatenate(v), *out)

    def coordinates(self, z_draws):
        """(x (T, dim), discrete {site: (T, …)}) of kernel states (T, …): the states' own
        unconstrained values for a model without discrete sites; otherwise the output draws
        (``postprocess_fn``: e.g. fresh spike values for excluded coefficients) unconstrained."""
        T = jax.tree.leaves(z_draws)[0].shape[0]
        if not self.scores.discrete_sites:
            x = np.concatenate(
                [np.asarray(z_draws[n], float).reshape(T, -1) for n in self.scores.continuous_sites], axis=1
            )
            return x, {}
        continuous, discrete = self.scores.split(self.constrained(z_draws))
        return self.scores.unconstrain({**continuous, **discrete}), discrete

    def _score_points(self, x, discrete):
        if self._stochastic is not None:
            # one compiled shape: pad to score_draws (or the next power of two) rows
            T = x.shape[0]
            rows = self.score_draws or 1 << max(T - 1, 1).bit_length()
            padded = np.pad(x, [(0, max(rows - T, 0)), (0, 0)], mode="edge")
            self.rng_key, key = random.split(self.rng_key)
            return np.asarray(self._stochastic(jnp.asarray(padded, jnp.result_type(float)), key), float)[:T]
        return self.scores.score(x, discrete)

    def score(self, pieces) -> dict:
        """Score an arm from its draws: a list of kernel-state dicts {site: (chains, draws, …)}.

        Returns ``score`` (the ranking key), ``ksd`` (the reported KSD: signed √KSD_U² for
        ``criterion="ess"``), ``se`` (its standard error, in KSD² units), ``ess``, ``mixed``
        and ``stein`` ((x, scores) of the scored draws, for the result).
        """
        if self.criterion == "plain":
            return self._score_plain(pieces)
        flat, ess = [], 0.0
        for z in pieces:
            c, n = jax.tree.leaves(z)[0].shape[:2]
            x, discrete = self.coordinates(jax.tree.map(lambda v: np.asarray(v).reshape((c * n,) + v.shape[2:]), z))
            if not np.all(np.isfinite(x)):
                return unscored("diverged: non-finite draws")
            e = bulk_ess(x.reshape(c, n, -1), quantile=0.5) if n >= 8 else 0.0
            ess += e
            lag = max(int(round(c * n / max(e, 1.0))), 1)  # one kept draw per effective draw
            keep = (np.arange(c)[:, None] * n + np.arange(0, n, lag)[None, :]).reshape(-1)
            flat.append((x[keep], {k: v[keep] for k, v in discrete.items()}))
        x = np.concatenate([f[0] for f in flat])
        discrete = {k: np.concatenate([f[1][k] for f in flat]) for k in self.scores.discrete_sites}
        keep = even_indices(x.shape[0], self.score_draws)
        x, discrete = x[keep], {k: v[keep] for k, v in discrete.items()}
        if x.shape[0] < 4:
            return {**unscored(f"its draws are autocorrelated over the whole run (ESS {ess:.1f}): "
                               f"{x.shape[0]} left after thinning to one per effective draw, too few to score (4)"), "ess": ess}
        s = self._score_points(x, discrete)
        if not np.all(np.isfinite(s)):
            return unscored("diverged: non-finite gradient of log density at its draws")
        options = {k: v for k, v in self.ksd_options.items() if k in ("c", "beta")}
        u, se = ksd_u_statistic(x, s, preconditioner=self.scales,
                                num_blocks=min(NUM_BLOCKS, x.shape[0] // 2), **options)
        return {"score": max(u, 0.0) + se, "ksd": float(signed_sqrt(u)), "se": se, "ess": ess,
                "mixed": ess >= MIN_ESS, "diverged": False, "reason": "", "stein": (x, s)}

    def _score_plain(self, pieces) -> dict:
        z = pooled(pieces)
        keep = even_indices(jax.tree.leaves(z)[0].shape[0], self.score_draws)
        z = jax.tree.map(lambda v: v[keep], z)
        if callable(self.metric):
            value = float(self.metric(self.constrained(z)))
            if not np.isfinite(value):
                return unscored(f"the metric is {value} at its draws")
            return {"score": value, "ksd": np.nan, "se": np.nan, "ess": np.nan, "mixed": True,
                    "diverged": False, "reason": "", "stein": None}
        x, discrete = self.coordinates(z)
        if not np.all(np.isfinite(x)):
            return unscored("diverged: non-finite draws")
        s = self.scores.score(x, discrete)
        if not np.all(np.isfinite(s)):
            return unscored("diverged: non-finite gradient of log density at its draws")
        fn = fssd if self.metric == "fssd" else ksd
        value = float(fn(x, scores=s, preconditioner=self.scales, **self.ksd_options))
        return {"score": value, "ksd": value if self.metric == "ksd" else np.nan, "se": np.nan,
                "ess": np.nan, "mixed": True, "diverged": False, "reason": "", "stein": (x, s)}


def pooled(pieces) -> dict:
    """An arm's draws {site: (chains, draws, …)} (a list of pieces) as one sequence {site: (T, …)}."""
    return jax.tree.map(lambda *v: np.concatenate([np.asarray(b).reshape((-1,) + b.shape[2:]) for b in v]),
                        *pieces)


def num_draws(pieces) -> int:
    """Kept draws of an arm, over its pieces and chains."""
    return int(sum(np.prod(jax.tree.leaves(z)[0].shape[:2]) for z in pieces))


def unscored(reason: str) -> dict:
    """The score (``inf``) of an arm that could not be scored, and why (``reason``: one that
    starts with "diverged" marks the arm ``diverged``)."""
    return {"score": math.inf, "ksd": math.inf, "se": np.nan, "ess": 0.0, "mixed": False,
            "diverged": reason.startswith("diverged"), "reason": reason, "stein": None}


def even_indices(num: int, at_most: int | None) -> np.ndarray:
    """At most ``at_most`` evenly spaced indices in ``[0, num)`` (all of them for ``None``)."""
    if at_most is None or num <= at_most:
        return np.arange(num)
    return np.unique(np.round(np.linspace(0, num - 1, at_most)).astype(int))




def no_riskier(b: dict, a: dict) -> bool:
    """True when arm settings ``b`` are at least as conservative as ``a``: a step size no larger,
    a subsample no smaller (per plate for a dict), every other setting equal.  Arms differing
    in anything else cannot be ordered by their bias, and are not."""
    for key in set(a) | set(b):
        va, vb = a.get(key), b.get(key)
        if key == "step_size" and va is not None and vb is not None:
            ok = bool(np.all(np.asarray(vb, float) <= np.asarray(va, float)))
        elif key == "subsample_size" and isinstance(va, dict) and isinstance(vb, dict):
            ok = va.keys() == vb.keys() and all(vb[k] >= va[k] for k in va)
        elif key == "subsample_size" and isinstance(va, (int, np.integer)) and isinstance(vb, (int, np.integer)):
            ok = vb >= va
        else:
            ok = va is vb or (np.shape(va) == np.shape(vb) and bool(np.all(np.asarray(va == vb))))
        if not ok:
            return False
    return True


def ranked(arms, results: dict, seconds, settings=None) -> list:
    """``arms`` best first: by score, except that among arms whose scores are within noise
    the faster-mixing of those no riskier than the best goes first.

    Repeatedly, of the arms not yet placed, take the one with the lowest score a (when a is not
    mixed and mixed arms lie within its noise, the best-scoring of those instead); the
    candidates are the mixed arms b (ESS ≥ :data:`MIN_ESS`) with
    score_b − score_a < 2·√(se_a² + se_b²) (a itself included) that are no riskier than a
    (:func:`no_riskier`: a step size no larger, a subsample no smaller); place the candidate
    with the most effective draws per second of chain time (ESS/``seconds[b]``), or a when
    there is none.  Scores that differ by less than twice their combined standard error do not
    tell the arms' biases apart; then the arm that mixes faster gives more accuracy per second
    (the criterion of equal-time comparisons in Coullon, South & Nemeth (2023), "Efficient and
    generalizable tuning strategies for stochastic gradient MCMC"), but noise is no evidence
    for taking on more bias: a larger step or a smaller subsample than the best-scoring arm's
    is never picked on a tie (a noisy score once handed the pick to the fastest, most biased
    arm of a grid).  Ties on everything go to the lower arm index.

    :param arms: arm indices.
    :param dict results: ``{arm: score dict}`` (``score``, ``se``, ``ess``, ``mixed``).
    :param seconds: chain seconds charged to each arm, indexable by arm.
    :param settings: each arm's settings (``{arm: dict}`` or a list), for :func:`no_riskier`;
        ``None``: every arm counts as no riskier (the ESS-per-second rule alone).
    """
    left = sorted(arms, key=lambda a: (results[a]["score"], a))

    def within_noise(a):  # the mixed arms whose scores do not differ detectably from a's
        noise_a = results[a]["se"] if np.isfinite(results[a]["se"]) else 0.0
        return [b for b in left if results[b]["mixed"] and np.isfinite(results[b]["score"])
                and np.isfinite(results[b]["se"])
                and results[b]["score"] - results[a]["score"] < 2.0 * math.hypot(noise_a, results[b]["se"])]

    order = []
    while left:
        a, close = left[0], within_noise(left[0])
        if close and not results[a]["mixed"]:  # an unmixed best: the best mixed arm within its noise leads
            a = close[0]
            close = within_noise(a)
        close = [b for b in close if settings is None or no_riskier(settings[b], settings[a])]
        pick = max(close, key=lambda b: (results[b]["ess"] / max(seconds[b], 1e-9), -b)) if close else a
        order.append(pick)
        left.remove(pick)
    return order
