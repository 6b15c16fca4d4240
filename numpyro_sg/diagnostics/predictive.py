r"""Held-out checks of a posterior: log predictive density, accuracy and calibration.

For draws θ_1 … θ_S of a run and held-out data (x_i, y_i), i = 1 … n, run through the model
with every subsample plate over all of its rows (:func:`~numpyro_sg.diagnostics.full_data_scores.full_data_model`):

* the log pointwise predictive density, ``lpd`` = (1/n)·Σ_i log((1/S)·Σ_s p(y_i | θ_s, x_i))
  (per observation, in nats; Vehtari, Gelman & Gabry (2017), "Practical Bayesian model
  evaluation using leave-one-out cross-validation and WAIC", eq. 3, on held-out data);
* for a ``Categorical`` or ``Bernoulli`` likelihood, the posterior predictive class
  probabilities p̄_i = (1/S)·Σ_s p(· | θ_s, x_i), their ``accuracy`` and the expected and
  maximum calibration errors of Guo, Pleiss, Sun & Weinberger (2017), "On calibration of
  modern neural networks": the confidence max_k p̄_ik is cut into equal-width bins B_b,
  ECE = Σ_b (|B_b|/n)·|acc(B_b) − conf(B_b)| and MCE = max_b |acc(B_b) − conf(B_b)| (non-empty
  bins);
* for any other likelihood with a mean, ``rmse`` of the posterior predictive mean.

The per-draw densities are NumPyro's (``numpyro.infer.log_likelihood`` semantics: the
observed sites' ``log_prob`` at substituted draws), so :func:`predictive_metrics` is what a
user would compute from ``numpyro.infer.Predictive`` draws, without the Monte Carlo noise of
sampling y.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jax.scipy.special import logsumexp
from numpyro import distributions as dist
from numpyro import handlers

from numpyro_sg.diagnostics.full_data_scores import full_data_model
from numpyro_sg.diagnostics.stein_runs import run_samples, thin_indices
from numpyro_sg.infer.handlers import with_indices

__all__ = ["calibration_errors", "held_out_score", "posterior_predictive", "predictive_metrics"]

#: what :func:`held_out_score` can return (each lower is better)
HELD_OUT_SCORES = ("nll", "error", "ece", "mce", "rmse")


def calibration_errors(probs, labels, bins: int = 15) -> tuple[float, float]:
    """Expected and maximum calibration error (ECE, MCE) of class probabilities.

    :param probs: predicted probabilities, array (n, K) (rows summing to 1), or (n,) for the
        probability of class 1 of a binary outcome.
    :param labels: the observed classes, integer array (n,).
    :param int bins: equal-width confidence bins on [0, 1] (Guo et al. use 15).
    :return: ``(ece, mce)``.

    **Example:** confidence 0.9 everywhere, right 90 % of the time: calibrated.

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.predictive import calibration_errors
    >>> probs = np.tile([0.9, 0.1], (10, 1))
    >>> labels = np.array([0] * 9 + [1])
    >>> [round(e, 12) for e in calibration_errors(probs, labels)]
    [0.0, 0.0]
    """
    probs, labels = np.asarray(probs, np.float64), np.asarray(labels)
    if probs.ndim == 1:
        probs = np.stack([1.0 - probs, probs], axis=1)
    if probs.ndim != 2 or len(probs) != len(labels):
        raise ValueError(f"probs must be (n, K) or (n,) and labels (n,); got {probs.shape} and {labels.shape}.")
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    counts = np.bincount(which, minlength=bins)
    filled = counts > 0
    gap = np.abs(np.bincount(which, correct, bins)[filled] - np.bincount(which, confidence, bins)[filled]) / counts[filled]
    return float(np.sum(gap * counts[filled]) / len(labels)), float(gap.max())


def _draws(obj, sites, max_draws):
    """The posterior draws of ``sites``, chains pooled, at most ``max_draws`` evenly spread, and
    the chain of each."""
    samples = run_samples(obj)
    chains, draws = samples[sites[0]].shape[:2]
    keep = thin_indices(chains * draws, max_draws)
    return {s: samples[s].reshape((chains * draws,) + samples[s].shape[2:])[keep] for s in sites}, keep // draws


def _likelihood_kind(fn, value):
    """``(kind, array)``: a classification likelihood's probabilities (``"categorical"``: (…, K);
    ``"bernoulli"``: of class 1), else its mean (``"mean"``) or nothing (``"none"``)."""
    base = fn.base_dist if isinstance(fn, dist.Independent) else fn
    if isinstance(base, (dist.CategoricalProbs, dist.CategoricalLogits)):
        return "categorical", base.probs
    if isinstance(base, (dist.BernoulliProbs, dist.BernoulliLogits)):
        return "bernoulli", jnp.broadcast_to(base.probs, jnp.shape(value))
    try:
        return "mean", jnp.broadcast_to(base.mean, jnp.shape(value))
    except NotImplementedError:
        return "none", jnp.zeros(jnp.shape(value))


def _terms_program(model, args, kwargs):
    """``(run, kinds)``: one compiled program of the observed sites' terms over a block of draws
    (``run(draws, keys)``), and ``kinds`` {site: kind}, filled when it is first traced."""
    kinds = {}

    def one(draw, key):
        tr = handlers.trace(handlers.substitute(handlers.seed(model, key), data=draw)).get_trace(*args, **kwargs)
        out = {}
        for name, site in tr.items():
            if site["type"] == "sample" and site["is_observed"]:
                kinds[name], extra = _likelihood_kind(site["fn"], site["value"])
                out[name] = (jnp.reshape(site["fn"].log_prob(site["value"]), (-1,)), extra, site["value"])
        return out

    return jax.jit(jax.vmap(one)), kinds


def _in_blocks(run, draws, block, key) -> list:
    """``run(draws, keys)`` on ``block`` draws at a time with one key per draw (``S`` keys split
    from ``key``, as ``numpyro.infer.Predictive`` does): the blocks' outputs, the last one
    filled with the last draw and then cut, so that one program serves any number of draws."""
    S = len(next(iter(draws.values())))
    pad = -S % block
    draws = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in draws.items()}
    keys = jax.random.split(key, S + pad)
    parts = [run({k: v[i:i + block] for k, v in draws.items()}, keys[i:i + block]) for i in range(0, S + pad, block)]
    if pad:
        parts[-1] = jax.tree_util.tree_map(lambda a: a[:block - pad], parts[-1])
    return parts


def _observed_terms(program, draws, block):
    """Per observed site: ``(log p(y_i | θ_s) (S, n), probabilities or mean (S, …), y, kind)``,
    evaluated ``block`` draws at a time by ``program`` (:func:`_terms_program`)."""
    run, kinds = program
    parts = _in_blocks(run, draws, block, jax.random.PRNGKey(0))   # (the key: latent sites without draws)
    if not kinds:
        raise ValueError("the model has no observed site (obs=...) for these arguments.")
    return {name: (np.concatenate([np.asarray(p[name][0], np.float64) for p in parts]),
                   np.concatenate([np.asarray(p[name][1], np.float64) for p in parts]),
                   np.asarray(parts[0][name][2])[0], kind) for name, kind in kinds.items()}


def _held_out_model(model, args, kwargs):
    """``(full-data model, its latent sites' shapes)`` on the held-out data."""
    full = full_data_model(model, args, kwargs)
    latent = jax.eval_shape(lambda: {k: v["value"] for k, v in handlers.trace(handlers.seed(full, 0)).get_trace(
        *args, **kwargs).items() if v["type"] == "sample" and not v["is_observed"]})
    return full, latent


def predictive_metrics(obj, *args, model=None, max_draws: int = 1000, bins: int = 15,
                       block: int = 100, per_chain: bool = False, **kwargs) -> pd.DataFrame:
    """Held-out log predictive density, accuracy and calibration of a run's posterior.

    Pass the held-out data as you passed the training data to ``mcmc.run`` (the same model,
    other rows); every subsample plate is run over all of its rows.  The formulas are in
    :mod:`numpyro_sg.diagnostics.predictive`.

    :param obj: a NumPyro ``MCMC`` after ``run`` (its model is used) or an ``InferenceData``
        (its ``posterior``; then pass ``model=``).
    :param args: the model's positional arguments on the held-out data.
    :param model: the model (default: the ``MCMC``'s own).
    :param int max_draws: at most this many posterior draws, evenly spread over the pooled
        chains (diverged chains included: drop them first with ``idata.isel(chain=…)``).
    :param int bins: confidence bins of the ECE and MCE.
    :param int block: draws evaluated at once (memory: block × held-out rows × classes).
    :param bool per_chain: also each chain's own predictive (its share of the draws): rows
        indexed by ``(site, chain)``, the pooled one as chain ``"all"``.  Where the parameters'
        R̂ cannot settle — a network's chains each explore their own mode, its hidden units
        permuted — chains that predict alike are what to judge.
    :param kwargs: the model's keyword arguments on the held-out data.  A latent site without
        draws (the effects of a group the run never saw) is drawn from its prior at each draw.
    :return: a ``DataFrame`` with one row per observed site and columns ``n`` (held-out
        observations), ``draws``, ``lpd`` (mean log predictive density per observation),
        ``accuracy``, ``ece``, ``mce`` (classification likelihoods; else NaN) and ``rmse``
        (of the predictive mean; NaN for classification).

    **Example:** a logistic regression's posterior on held-out rows.

    >>> import jax
    >>> from numpyro.infer import MCMC, NUTS
    >>> import numpyro_sg as nsg
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> X, y, _ = simulate_logistic_regression(num_data=600, dim=3)
    >>> mcmc = MCMC(NUTS(logistic_regression_model), num_warmup=200, num_samples=200, progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X[:500], y[:500])
    >>> table = nsg.predictive_metrics(mcmc, X[500:], y[500:])
    >>> list(table.index), int(table.loc["y", "n"]), bool(table.loc["y", "accuracy"] > 0.6)
    (['y'], 100, True)
    """
    model = model if model is not None else getattr(getattr(obj, "sampler", None), "model", None)
    if model is None:
        raise ValueError("predictive_metrics: pass model= (an InferenceData does not hold its model).")
    full, latent = _held_out_model(model, args, kwargs)
    posterior_sites = list(run_samples(obj))
    sites = [s for s in posterior_sites if s in latent]
    if not sites:
        raise KeyError(f"the run has no draws of the model's latent sites {sorted(latent)} (it has {posterior_sites}).")
    draws, chain = _draws(obj, sites, max_draws)
    terms = _observed_terms(_terms_program(full, args, kwargs), draws, block)
    if not per_chain:
        return pd.DataFrame.from_dict({name: _metrics(*t, bins) for name, t in terms.items()}, orient="index")
    return _per_chain_table(terms, chain, bins)


def posterior_predictive(obj, *args, model=None, rng_key=None, block: int = 100, **kwargs) -> dict:
    """Posterior predictive draws on new data, every row: ArviZ's ``predictions`` group.

    What ``numpyro.infer.Predictive(model, mcmc.get_samples())(rng_key, *args)`` returns, with
    two differences a subsample plate needs: every subsample plate runs over all of its rows
    (``Predictive`` would predict a random mini-batch of them), and the draws keep their
    chains, shape (chains, draws, …).  Each sample site without posterior draws is returned (the
    observed sites, run with their observations left out, and the effects of groups the run
    never saw, from their prior), evaluated ``block`` draws at a time by one compiled program.

    :param obj: a NumPyro ``MCMC`` after ``run`` (its model is used) or an ``InferenceData``
        (then pass ``model=``).
    :param args: the model's positional arguments on the new data, the observations left out
        (``None``) as for prediction.
    :param rng_key: a JAX key (default ``PRNGKey(0)``).
    :param kwargs: the model's keyword arguments on the new data.
    :return: ``{site: numpy array (chains, draws, …)}``, e.g. for
        ``nsg.to_inference_data(mcmc, predictions=..., predictions_constant_data={"X": X_new})``.

    **Example:**

    >>> import jax
    >>> from numpyro.infer import MCMC, NUTS
    >>> import numpyro_sg as nsg
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> X, y, _ = simulate_logistic_regression(num_data=600, dim=3)
    >>> mcmc = MCMC(NUTS(logistic_regression_model), num_warmup=100, num_samples=100, progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0), X[:500], y[:500])
    >>> nsg.posterior_predictive(mcmc, X[500:], subsample_size=50)["y"].shape   # all 100 rows
    (1, 100, 100)
    """
    model = model if model is not None else getattr(getattr(obj, "sampler", None), "model", None)
    if model is None:
        raise ValueError("posterior_predictive: pass model= (an InferenceData does not hold its model).")
    tr = handlers.trace(handlers.seed(model, 0)).get_trace(*args, **kwargs)   # (the plates, y left out)
    full = with_indices(model, {k: jnp.arange(v["args"][0]) for k, v in tr.items()
                                if v["type"] == "plate" and v["args"][1] < v["args"][0]})
    latent = [k for k, v in tr.items() if v["type"] == "sample" and not v["is_observed"]]
    samples = run_samples(obj)
    sites = [k for k in samples if k in latent]
    new = sorted(set(latent) - set(sites))
    if not new:
        raise ValueError(f"posterior_predictive: every sample site of the model ({sorted(latent)}) has posterior "
                         "draws; leave the observations out (y=None) to predict them.")
    if not sites:
        raise KeyError(f"the run has no draws of the model's latent sites {sorted(latent)} (it has {list(samples)}).")
    chains, draws = samples[sites[0]].shape[:2]
    flat = {k: samples[k].reshape((chains * draws,) + samples[k].shape[2:]) for k in sites}

    def one(draw, key):
        tr = handlers.trace(handlers.seed(handlers.substitute(full, data=draw), key)).get_trace(*args, **kwargs)
        return {k: tr[k]["value"] for k in new}   # (seed outside substitute, as in Predictive)

    parts = _in_blocks(jax.jit(jax.vmap(one)), flat, block, jax.random.PRNGKey(0) if rng_key is None else rng_key)
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]).reshape((chains, draws) + parts[0][k].shape[1:])
            for k in new}


def held_out_score(model, *args, score: str = "nll", site: str | None = None, bins: int = 15,
                   block: int = 100, **kwargs):
    """A tuner's metric on held-out data: ``f(samples) -> float``, lower is better.

    Pass it as ``metric=`` to :func:`~numpyro_sg.mamba` or :func:`~numpyro_sg.grid_search`
    to pick a network's hyperparameters by its held-out predictive, as Coullon, South & Nemeth
    (2023), "Efficient and generalizable tuning strategies for stochastic gradient MCMC",
    judge networks (the grid search's log-loss; ECE and MCE).  ``samples`` are an arm's
    constrained draws ``{site: (T, …)}``; the value is :func:`predictive_metrics`'s, pooled
    over the draws: ``"nll"`` (−lpd, nats per observation), ``"error"`` (1 − accuracy),
    ``"ece"``, ``"mce"`` or ``"rmse"``.  One program is compiled, at the first call, for every
    arm and round.

    :param model: the model.
    :param args: its positional arguments on the held-out data.
    :param str score: one of ``"nll"``, ``"error"``, ``"ece"``, ``"mce"``, ``"rmse"``.
    :param site: the observed site scored (default: the model's only one).
    :param int bins: confidence bins of the ECE and MCE.
    :param int block: draws evaluated at once (memory: block × held-out rows × classes).
    :param kwargs: the model's keyword arguments on the held-out data.

    **Example:** ``nsg.mamba(partial(nsg.SGLD, net), grid, (X, y), metric=held_out_score(net, X_test, y_test))``.
    """
    if score not in HELD_OUT_SCORES:
        raise ValueError(f"score must be one of {HELD_OUT_SCORES}, got {score!r}.")
    full, latent = _held_out_model(model, args, kwargs)
    program = _terms_program(full, args, kwargs)

    def metric(samples) -> float:
        draws = {k: np.asarray(v) for k, v in samples.items() if k in latent}
        if not draws:
            raise KeyError(f"no draws of the model's latent sites {sorted(latent)} (got {sorted(samples)}).")
        terms = _observed_terms(program, draws, block)
        name = site if site is not None else next(iter(terms)) if len(terms) == 1 else None
        if name not in terms:
            raise ValueError(f"site must name one of the observed sites {sorted(terms)}; got {site!r}.")
        kind = terms[name][3]
        if score != "nll" and (kind == "mean") != (score == "rmse") or kind == "none" and score != "nll":
            raise ValueError(f"score={score!r} needs a {'mean' if score == 'rmse' else 'classification'} "
                             f"likelihood at {name!r}, which is {kind!r}.")
        row = _metrics(*terms[name], bins)
        return float({"nll": -row["lpd"], "error": 1.0 - row["accuracy"], "ece": row["ece"],
                      "mce": row["mce"], "rmse": row["rmse"]}[score])

    metric.__name__ = f"held_out_{score}"
    return metric


def _per_chain_table(terms, chain, bins) -> pd.DataFrame:
    """:func:`predictive_metrics`'s rows per ``(site, chain)`` (``chain``: each draw's), then ``(site, "all")``."""
    rows = {}
    for name, (log_p, extra, value, kind) in terms.items():
        rows.update({(name, int(c)): _metrics(log_p[chain == c], extra[chain == c], value, kind, bins)
                     for c in np.unique(chain)})
        rows[(name, "all")] = _metrics(log_p, extra, value, kind, bins)
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index = pd.MultiIndex.from_tuples(table.index, names=["site", "chain"])
    return table


def _metrics(log_p, extra, value, kind, bins) -> dict:
    """One row of :func:`predictive_metrics` from the per-draw terms of one observed site."""
    S = log_p.shape[0]
    lpd = float(np.mean(logsumexp(log_p, axis=0) - np.log(S)))
    row = dict(n=log_p.shape[1], draws=S, lpd=lpd, accuracy=np.nan, ece=np.nan, mce=np.nan, rmse=np.nan)
    if kind in ("categorical", "bernoulli"):
        labels = np.asarray(value).astype(int).reshape(-1)
        probs = extra.mean(axis=0).reshape((len(labels), -1) if kind == "categorical" else -1)
        if probs.ndim == 1:
            probs = np.stack([1.0 - probs, probs], axis=1)
        row["accuracy"] = float(np.mean(probs.argmax(axis=1) == labels))
        row["ece"], row["mce"] = calibration_errors(probs, labels, bins)
    elif kind == "mean":
        mean = extra.mean(axis=0).reshape(-1)
        row["rmse"] = float(np.sqrt(np.mean((mean - np.asarray(value, np.float64).reshape(-1)) ** 2)))
    return row
