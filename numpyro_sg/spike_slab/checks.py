r"""Numerical checks of a spike-and-slab model, evaluated in one vectorised model trace.

:func:`run_checks` draws random configurations (θ, γ) and evaluates the model at all of them
at once (:func:`evaluate_configurations`: ``jax.vmap`` over the configurations, so the model
function runs once), then decides:

* **structure** (:func:`check_structure`): the mini-batch log-likelihood does not change when
  an *excluded* coefficient θ_j (γ_j = 0) changes, and equals the one at (θ·γ, 1) — the
  likelihood depends on θ only through β = θ·γ; a failure raises
  :class:`~numpyro_sg.spike_slab.SpikeSlabError`;
* **per-coordinate prior** (:func:`check_per_coordinate`): log p(γ) + log p(θ|γ) changes with
  γ as Σ_j (γ_j − γ'_j)·odds_j, with odds_j read per coordinate from the sites'
  distributions (false e.g. for a slab variance that depends on size(γ));
* **GLM affinity** (:func:`detect_glm`): the likelihood is one observed site of a known
  family whose linear predictor moves by X[S]·Δβ for a design array X found among the data.

The other continuous sites (an intercept, a noise scale, …) are held at one draw of
``init_to_uniform`` (the same in every configuration).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.initialization import init_to_uniform

from numpyro_sg.infer.minibatch import jit_with_data
from numpyro_sg.infer.model_info import ModelInfo, base_distribution
from numpyro_sg.spike_slab.glm import (
    GLM_FAMILIES,
    GLMInfo,
    design_array,
    design_candidates,
    family_of,
    per_element_log_prob,
)
from numpyro_sg.spike_slab.structure import SpikeSlab, SpikeSlabError

#: configurations of the structure check: 2 trials × (θ, γ), (θ moved where γ = 0, γ), (θ·γ, 1)
_STRUCTURE_TRIALS = 2
#: random pairs (γ, γ') of the per-coordinate check
_PRIOR_PAIRS = 3
_CHECK_ROWS = 64


class Evaluation(NamedTuple):
    """The model at K configurations (leading axis K of every array).

    ``log_prior`` (K,) every site outside the plate; ``terms`` (K, n) scaled per-datum
    log-likelihood; ``coefficient`` (K, p) log p(θ_j | γ) per coordinate; ``indicator0`` /
    ``indicator1`` (K, p) log p(γ_j = 0) / log p(γ_j = 1); ``eta``, ``y`` (K, n) and
    ``params`` (dict of (K, n)) the linear predictor, observations and other parameters of
    the observed site when its family is a GLM family (zeros otherwise); ``static`` a dict of
    what the trace showed: ``per_element`` (the coefficient's log-density splits per
    coordinate), ``observed`` (names of the likelihood's observed sites), ``family``
    (``None`` when not a GLM family), ``distribution`` and ``y_shape``.
    """

    log_prior: Any
    terms: Any
    coefficient: Any
    indicator0: Any
    indicator1: Any
    eta: Any
    y: Any
    params: Any
    static: dict


class Configurations(NamedTuple):
    """The random configurations of :func:`run_checks`: ``theta`` (K, p), ``gamma`` (K, p),
    ``indices`` (the data indices, shared) and the slices of the three checks."""

    theta: Any
    gamma: Any
    indices: dict
    structure: slice
    prior: slice
    glm: slice


def evaluate_configurations(ss: SpikeSlab, model_args, model_kwargs, thetas, gammas, indices,
                            rng_key=0) -> Evaluation:
    """Evaluate the model at K configurations (θ_k, γ_k) on the data ``indices``, vectorised.

    One model trace under ``jax.vmap`` over the configurations; the other continuous sites
    come from ``init_to_uniform`` with keys from ``rng_key`` (the same in every
    configuration).

    **Example:**

    .. code-block:: python

        ev = evaluate_configurations(ss, (X, y), {}, thetas, gammas, {"data": idx})
        ev.log_prior + ev.terms.sum(1)    # log π(θ_k, γ_k | X_S) for each k
    """
    p = ss.num_coefficients
    zeros, ones = jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)
    n = ss.num_indices(indices)
    plate = ss.plate_name
    static: dict = {}

    def one(theta, gamma, model_args, model_kwargs):
        tr, _ = ss.trace_at(model_args, model_kwargs, {ss.coefficient: theta}, gamma, indices,
                            fill=init_to_uniform, rng_key=rng_key)
        log_prior, terms = ss.split_terms(tr, n)
        ind = tr[ss.indicator]["fn"]
        try:
            coord = (per_element_log_prob(tr[ss.coefficient]["fn"], theta),
                     per_element_log_prob(ind, zeros), per_element_log_prob(ind, ones))
            static["per_element"] = all(jnp.shape(c) == (p,) for c in coord)
        except Exception:  # noqa: BLE001 - a prior that cannot be read per coordinate
            static["per_element"] = False
        if not static["per_element"]:
            coord = (jnp.zeros((p,)),) * 3
        obs = [s for s in tr.values()
               if s["type"] == "sample" and s["is_observed"] and s["name"] != ss.indicator
               and (plate is None or plate in [f.name for f in s.get("cond_indep_stack", [])])]
        static["observed"] = tuple(s["name"] for s in obs)
        fam = family_of(obs[0]["fn"]) if len(obs) == 1 else None
        static["family"] = None if fam is None else fam[0]
        static["distribution"] = type(base_distribution(obs[0]["fn"])).__name__ if obs else ""
        static["y_shape"] = tuple(jnp.shape(obs[0]["value"])) if obs else ()
        glm_ok = fam is not None and len(static["y_shape"]) == 1
        m = static["y_shape"][0] if glm_ok else 1
        eta = jnp.broadcast_to(fam[1], (m,)) if glm_ok else jnp.zeros((1,))
        y = jnp.asarray(obs[0]["value"]) if glm_ok else jnp.zeros((1,))
        params = {k: jnp.broadcast_to(v, (m,)) for k, v in fam[2].items()} if glm_ok else {}
        return (log_prior, terms) + coord + (eta, y, params)

    # compiled with the data as arguments (as constants a large design array would be slow to
    # compile)
    run = jit_with_data(
        lambda ths, gs, args, kwargs: jax.vmap(lambda th, g: one(th, g, args, kwargs))(ths, gs),
        model_args, model_kwargs,
    )
    out = run(jnp.asarray(thetas), jnp.asarray(gammas))
    return Evaluation(*out, static=static)


def _check_indices(ss: SpikeSlab, rng):
    if ss.plate is None:
        return {}
    n = min(ss.plate.size, _CHECK_ROWS)
    idx = rng.choice(ss.plate.size, size=n, replace=False) if ss.plate.size > n else np.arange(n)
    return {ss.plate.name: jnp.asarray(np.sort(idx), jnp.int32)}


def random_configurations(ss: SpikeSlab, rng, dtype) -> Configurations:
    """The configurations of the three checks, drawn with the NumPy generator ``rng``.

    Structure (per trial: alternating, then random γ): (θ, γ), (θ + (1−γ)·(3ξ + 1), γ),
    (θ·γ, 1), θ ~ N(0, I); per-coordinate prior: (θ, 0), (θ, 1), then pairs (θ, γ), (θ, γ')
    with γ_j ~ Bernoulli(u), u ~ U(0.05, 0.95); GLM: (b, 1), (b', 1), b ~ N(0, I/p).

    **Example:**

    .. code-block:: python

        conf = random_configurations(ss, np.random.default_rng(0), jnp.float32)
        conf.theta.shape          # (16, p)
    """
    p = ss.num_coefficients
    theta = rng.normal(size=p)
    idx = _check_indices(ss, rng)
    thetas, gammas = [], []
    for trial in range(_STRUCTURE_TRIALS):
        g = (rng.random(p) < 0.5).astype(np.int32) if trial else (np.arange(p) % 2 == 0).astype(np.int32)
        if p > 1 and g.all():
            g[-1] = 0
        moved = theta + (1 - g) * (3.0 * rng.normal(size=p) + 1.0)
        thetas += [theta, moved, theta * g]
        gammas += [g, g, np.ones(p, np.int32)]
    s_end = len(thetas)
    thetas += [theta, theta]
    gammas += [np.zeros(p, np.int32), np.ones(p, np.int32)]
    for _ in range(_PRIOR_PAIRS):
        for _side in range(2):
            thetas.append(theta)
            gammas.append((rng.random(p) < rng.uniform(0.05, 0.95)).astype(np.int32))
    p_end = len(thetas)
    thetas += [rng.normal(size=p) / np.sqrt(p), rng.normal(size=p) / np.sqrt(p)]
    gammas += [np.ones(p, np.int32)] * 2
    return Configurations(
        jnp.asarray(np.stack(thetas), dtype), jnp.asarray(np.stack(gammas)), idx,
        slice(0, s_end), slice(s_end, p_end), slice(p_end, len(thetas)),
    )


def _close(a, b, rtol=1e-4, atol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all(np.abs(a - b) <= atol + rtol * np.maximum(np.abs(a), np.abs(b))))


def check_structure(ss: SpikeSlab, ev: Evaluation, conf: Configurations):
    """Raise :class:`~numpyro_sg.spike_slab.SpikeSlabError` unless the likelihood depends on θ
    only through θ·γ (see :func:`random_configurations` for the configurations read).

    **Example:**

    .. code-block:: python

        ev = evaluate_configurations(ss, (X, y), {}, conf.theta, conf.gamma, conf.indices)
        check_structure(ss, ev, conf)     # raises SpikeSlabError for a wrong form
    """
    terms = np.asarray(ev.terms[conf.structure])
    gammas = np.asarray(conf.gamma[conf.structure])
    for trial in range(_STRUCTURE_TRIALS):
        ll, ll_moved, ll_eff = terms[3 * trial: 3 * trial + 3]
        gamma = gammas[3 * trial]
        if not np.all(np.isfinite(ll)):
            continue
        if not _close(ll, ll_moved):
            j = int(np.flatnonzero(1 - gamma)[0]) if (1 - gamma).any() else 0
            raise SpikeSlabError(
                f"The likelihood is not of the spike-and-slab form: changing the coefficients "
                f"{ss.coefficient!r}[j] of excluded variables ({ss.indicator!r}[j] = 0, e.g. "
                f"j = {j}) changed the mini-batch log-likelihood (by up to "
                f"{float(np.max(np.abs(ll_moved - ll))):.3g}). The "
                f"likelihood must depend on {ss.coefficient!r} only through "
                f"{ss.coefficient} * {ss.indicator}."
            )
        if not _close(ll, ll_eff):
            raise SpikeSlabError(
                f"The likelihood is not of the spike-and-slab form: it depends on the indicator "
                f"{ss.indicator!r} other than through {ss.coefficient} * {ss.indicator} (the "
                f"likelihood at (θ, γ) differs from the one at (θ·γ, 1))."
            )


def check_per_coordinate(ev: Evaluation, conf: Configurations) -> bool:
    """True when the prior's dependence on γ adds up per coordinate: for every random pair,
    log p(γ, θ) − log p(γ', θ) = Σ_j (γ_j − γ'_j)·odds_j within 1e-3 (relative).

    **Example:**

    .. code-block:: python

        check_per_coordinate(ev, conf)    # False for a slab variance that depends on size(γ)
    """
    if not ev.static["per_element"]:
        return False
    k0 = conf.prior.start
    odds = np.asarray(ev.indicator1[k0] - ev.indicator0[k0] + ev.coefficient[k0 + 1] - ev.coefficient[k0],
                      np.float64)
    lp = np.asarray(ev.log_prior, np.float64)
    g = np.asarray(conf.gamma)
    for a in range(k0 + 2, conf.prior.stop, 2):
        diff = lp[a] - lp[a + 1]
        pred = float(np.sum((g[a] - g[a + 1]) * odds))
        if not np.isfinite(diff) or abs(diff - pred) > 1e-3 * (1.0 + abs(diff)):
            return False
    return True


def detect_glm(ss: SpikeSlab, ev: Evaluation, conf: Configurations, subsample_data=(), model_args=(),
               model_kwargs=None):
    """``(GLMInfo, "")`` when the likelihood is a GLM in β, else ``(None, reason)``.

    Candidate design arrays (N, p) are the data passed to ``numpyro.subsample`` (as recorded
    by the model trace, ``subsample_data``) and the model arguments; one qualifies when the
    linear predictor moves by X[S]·(b − b') between the two GLM configurations and the
    family's log-likelihood reproduces the model's per-datum terms.

    **Example:**

    .. code-block:: python

        glm, why = detect_glm(ss, ev, conf, info.subsample_data, (X, y))
        glm.family_name, glm.source     # ("gaussian", ("subsample", 0))
    """
    static = ev.static
    if len(static["observed"]) != 1:
        return None, f"the likelihood has {len(static['observed'])} observed sites (the fast path needs one)"
    site = static["observed"][0]
    if static["family"] is None:
        return None, (
            f"observed site {site!r} has distribution {static['distribution']}; "
            "the fast path supports Normal, Bernoulli and Poisson"
        )
    if len(static["y_shape"]) != 1:
        return None, f"observed site {site!r} has shape {static['y_shape']}; the fast path needs (n,)"
    n = static["y_shape"][0]
    p = ss.num_coefficients
    N = ss.plate.size if ss.plate is not None else n
    sources = design_candidates(subsample_data, model_args, model_kwargs, N, p)
    if not sources:
        return None, (
            f"no design matrix of shape (N, p) = ({N}, {p}) found among the data passed to "
            "`numpyro.subsample(X, event_dim=1)` or the model arguments"
        )
    a, b = conf.glm.start, conf.glm.start + 1
    family = GLM_FAMILIES[static["family"]]
    eta1, eta2 = np.asarray(ev.eta[a], np.float64), np.asarray(ev.eta[b], np.float64)
    db = np.asarray(conf.theta[a], np.float64) - np.asarray(conf.theta[b], np.float64)
    scale = N / n
    fam_terms = scale * family.loglik(ev.eta[a], ev.y[a], {k: v[a] for k, v in ev.params.items()})
    for source in sources:
        try:
            X = design_array(source, subsample_data, model_args, model_kwargs)
            if ss.plate is not None:
                X = jnp.take(X, conf.indices[ss.plate.name], axis=0)
            pred = np.asarray(X, np.float64) @ db
        except Exception:  # noqa: BLE001 - a candidate that does not fit is simply skipped
            continue
        tol = 1e-3 * max(1.0, float(np.max(np.abs(eta1))))
        if pred.shape != eta1.shape or not np.all(np.abs(eta1 - eta2 - pred) <= tol):
            continue
        if not _close(ev.terms[a], fam_terms, rtol=1e-3, atol=1e-3 * scale):
            continue
        return GLMInfo(static["family"], site, source), ""
    return None, "the linear predictor is not X·β (+ offset) for any candidate design matrix"


def run_checks(ss: SpikeSlab, info: ModelInfo, model_args=(), model_kwargs=None, *, glm="auto",
               seed: int = 0):
    """Run the three checks on one vectorised evaluation; return ``(per_coordinate_prior,
    GLMInfo or None, reason the GLM path does not apply)``.

    Raises :class:`~numpyro_sg.spike_slab.SpikeSlabError` for a likelihood that is not of the
    spike-and-slab form, and (``glm=True``) when the GLM path does not apply.

    **Example:**

    .. code-block:: python

        per_coordinate, glm, why = run_checks(ss, trace_model(model, (X, y)), (X, y))
    """
    model_kwargs = model_kwargs or {}
    rng = np.random.default_rng(seed)
    conf = random_configurations(ss, rng, jnp.result_type(float))
    ev = evaluate_configurations(ss, model_args, model_kwargs, conf.theta, conf.gamma, conf.indices)
    check_structure(ss, ev, conf)
    per_coordinate = check_per_coordinate(ev, conf)
    glm_info, why = None, "glm=False"
    if glm is not False:
        glm_info, why = detect_glm(ss, ev, conf, info.subsample_data, model_args, model_kwargs)
        if glm_info is None and glm is True:
            raise SpikeSlabError(f"glm=True but the GLM fast path does not apply: {why}")
    return per_coordinate, glm_info, why
