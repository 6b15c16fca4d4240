"""The posterior summary of a run: :func:`posterior_summary`, ArviZ's table with a per-coordinate
KSD column and the inclusion probabilities of indicator sites."""

from __future__ import annotations

import itertools
import warnings

import arviz as az
import numpy as np
import pandas as pd

from numpyro_sg.arviz_compat import ARVIZ_MAJOR, has_group
from numpyro_sg.diagnostics.chain_statistics import summary_diagnostics
from numpyro_sg.diagnostics.model_scores import STEIN_GROUP, ksd_of_stein, resolve_run_scales, stein_of
from numpyro_sg.results.chains import without_diverged
from numpyro_sg.results.inference_data import to_inference_data


def posterior_summary(idata, *, preconditioner="stored", model=None, model_args=None,
                      model_kwargs=None, **kwargs) -> pd.DataFrame:
    """``az.summary`` of the posterior plus a per-coordinate ``ksd`` column and, for indicator
    sites, an ``inclusion_prob`` column.

    ``ksd`` is the per-coordinate KSD term √(V_j) of each unconstrained coordinate (Song, Sun,
    Ye & Liang (2020), 'Extended stochastic gradient Markov chain Monte Carlo for large-scale
    Bayesian variable selection', supplement §4.4; their sum is the per-coordinate KSD), shown
    on the row of the matching posterior entry (``theta[3]``; a positive site's row shows the
    KSD of its log). Rows with no matching coordinate (deterministic sites, indicators, sites
    whose unconstrained shape differs, such as a simplex) show NaN. ``inclusion_prob`` is the
    posterior mean of each 0/1 indicator (the marginal inclusion probability).  Diverged chains
    (:mod:`numpyro_sg.results.chains`) are left out, with a :class:`~numpyro_sg.DivergenceWarning`.

    :param idata: an ``InferenceData`` or ``DataTree`` from :func:`~numpyro_sg.to_inference_data` (its
        ``stein`` group is used), or any ``InferenceData``/``MCMC`` together with ``model=``
        and its arguments.
    :param preconditioner: ``"stored"`` (default: the per-coordinate KSD stored by
        :func:`~numpyro_sg.to_inference_data`, i.e. with the preconditioner it was made with;
        ``"sd"`` when there is none), or recompute the column with ``"sd"``, ``"laplace"``
        (needs the model), an array of scales or ``None`` (the papers' raw form), as in
        :func:`numpyro_sg.ksd`.
    :param kwargs: passed to :func:`arviz.summary` (``var_names``, …; its columns and options
        are those of the installed ArviZ: ``hdi_prob`` with 0.x, ``ci_prob`` with ≥ 1).

    **Example:** draws of any origin, scored with the model; the third coordinate of these
    draws is off by 1 (about ten posterior sds), and its ``ksd`` term is the largest.

    >>> import numpy as np
    >>> import numpyro_sg as nsg
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> X, y, theta = simulate_logistic_regression(num_data=500, dim=3)
    >>> noise = 0.1 * np.random.default_rng(0).normal(size=(2, 200, 3))
    >>> idata = from_dict(posterior={"theta": theta + [0.0, 0.0, 1.0] + noise})
    >>> table = nsg.posterior_summary(idata, model=logistic_regression_model, model_args=(X, y))
    >>> table["ksd"].idxmax()
    'theta[2]'
    """
    stored = isinstance(preconditioner, str) and preconditioner == "stored"
    if hasattr(idata, "get_samples"):  # an MCMC object
        idata = to_inference_data(
            idata, model=model, model_args=model_args, model_kwargs=model_kwargs,
            preconditioner="sd" if stored else preconditioner,
        )
    idata, _ = without_diverged(idata, "the summary")
    with warnings.catch_warnings():
        if _has_constant_coordinates(idata):  # (an LKJ factor's fixed entries): NaN r_hat, no warning
            warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        table = _summary(idata, kwargs)
    if has_group(idata, STEIN_GROUP) or model is not None:
        per_coord = _per_coordinate_ksd(idata, preconditioner, stored, model, model_args, model_kwargs)
        table["ksd"] = per_coord.reindex(table.index)
    probs = _inclusion_probs(idata)
    if probs is not None:
        table["inclusion_prob"] = pd.Series(probs).reindex(table.index)
    return table


#: ``arviz.summary`` options the vectorised diagnostics (:func:`_summary`) handle
_FAST_OPTIONS = {"var_names", "filter_vars", "hdi_prob", "round_to"}
#: from this many coordinates on, ArviZ 0.x's diagnostics (a Python loop per coordinate) are
#: replaced by :func:`~numpyro_sg.diagnostics.chain_statistics.summary_diagnostics`
_FAST_FROM = 200


def _summary(idata, kwargs: dict) -> pd.DataFrame:
    """``az.summary(idata, **kwargs)``; on ArviZ 0.x, for a posterior of at least
    :data:`_FAST_FROM` coordinates, the same table computed for all coordinates at once: the
    statistics columns by :func:`_statistics`, the diagnostics by
    :mod:`~numpyro_sg.diagnostics.chain_statistics` (the same numbers to float64 rounding, 7×
    faster on 3,760 coordinates)."""
    hdi_prob = kwargs.get("hdi_prob")
    hdi_prob = az.rcParams["stats.ci_prob"] if hdi_prob is None else hdi_prob
    if ARVIZ_MAJOR >= 1 or not set(kwargs) <= _FAST_OPTIONS or not 0 < hdi_prob < 1:  # (ArviZ's errors)
        return az.summary(idata, **kwargs)
    from arviz.utils import _var_names

    posterior = az.convert_to_dataset(idata, group="posterior")
    names = _var_names(kwargs.get("var_names"), posterior, kwargs.get("filter_vars"))
    posterior = posterior if names is None else posterior[names]
    blocks = [np.asarray(v.values).reshape(v.shape[0], v.shape[1], -1) for v in posterior.data_vars.values()]
    if sum(b.shape[-1] for b in blocks) < _FAST_FROM:
        return az.summary(idata, **kwargs)
    table = _statistics(posterior, blocks, hdi_prob)
    for name, values in summary_diagnostics(np.concatenate(blocks, axis=-1)).items():
        table[name] = values
    round_to = kwargs.get("round_to")
    if round_to is not None and round_to not in ("None", "none"):
        return table.round(round_to)
    if round_to is None:   # ArviZ's default rounding
        return table.round({c: 2 if c == "r_hat" else 0 if c in ("ess_bulk", "ess_tail") else 3 for c in table.columns})
    return table


def _statistics(posterior, blocks, hdi_prob) -> pd.DataFrame:
    """``az.summary(kind="stats")``'s table (mean, sd, HDI), rows labelled as ArviZ labels them,
    for every coordinate at once: the HDI is ArviZ's (the narrowest of the intervals between
    sorted draws i and i + ⌊hdi_prob·n⌋, the first on ties)."""
    labels, columns = [], []
    for (name, var), x in zip(posterior.data_vars.items(), blocks):
        rest = var.dims[2:]
        values = [var.coords[d].values if d in var.coords else np.arange(var.sizes[d]) for d in rest]
        labels += [f"{name}[{', '.join(f'{v}' for v in combo)}]" if combo else f"{name}"
                   for combo in itertools.product(*values)]
        flat = x.reshape(-1, x.shape[-1])
        ordered = np.sort(flat, axis=0)
        inside = int(np.floor(hdi_prob * len(ordered)))
        widths = np.subtract(ordered[inside:], ordered[:len(ordered) - inside], dtype=np.float64)
        first = np.argmin(widths, axis=0)
        lower = np.take_along_axis(ordered, first[None], axis=0)[0]
        upper = np.take_along_axis(ordered, first[None] + inside, axis=0)[0]
        columns.append(np.stack([flat.mean(axis=0), flat.std(axis=0, ddof=1), lower, upper], axis=1))
    alpha = 1 - hdi_prob
    return pd.DataFrame(np.concatenate(columns).astype(np.float64), index=labels,
                        columns=["mean", "sd", f"hdi_{100 * alpha / 2:g}%", f"hdi_{100 * (1 - alpha / 2):g}%"])


def _has_constant_coordinates(idata) -> bool:
    """Whether some coordinate of a floating-point posterior variable never changes."""
    return any(np.issubdtype(v.dtype, np.floating) and bool(np.any(np.ptp(v.values, axis=(0, 1)) == 0))
               for v in idata.posterior.data_vars.values() if v.ndim >= 2)


def _per_coordinate_ksd(idata, preconditioner, stored, model, model_args, model_kwargs) -> pd.Series:
    """The per-coordinate KSD terms, indexed by coordinate name: the stored ones or recomputed."""
    stein, scores = stein_of(idata, model, model_args, model_kwargs, None)
    if stored and "ksd_per_coordinate" in stein:
        per_coord = np.asarray(stein["ksd_per_coordinate"].values)
    else:
        precond = "sd" if stored else preconditioner
        scales = resolve_run_scales(precond, stein, scores)
        per_coord = np.asarray(ksd_of_stein(stein, scales, per_coordinate=True))
    names = [str(n) for n in stein["coordinate"].values]
    return pd.Series(dict(zip(names, per_coord)))


def _indicator_vars(idata) -> list[str]:
    """Posterior variables whose values are all 0/1 integers (model indicators)."""
    out = []
    for name, var in idata.posterior.data_vars.items():
        if np.issubdtype(var.dtype, np.integer) or np.issubdtype(var.dtype, np.bool_):
            vals = np.unique(var.values)
            if np.all(np.isin(vals, (0, 1))):
                out.append(name)
    return out


def _inclusion_probs(idata) -> dict | None:
    """``{"gamma[3]": posterior mean, …}`` of every indicator entry; ``None`` without indicators."""
    indicators = _indicator_vars(idata)
    if not indicators:
        return None
    probs = {}
    for name in indicators:
        mean = idata.posterior[name].mean(("chain", "draw")).values
        if mean.ndim == 0:
            probs[name] = float(mean)
        for idx in np.ndindex(*mean.shape) if mean.ndim else ():
            probs[f"{name}[{', '.join(str(i) for i in idx)}]"] = float(mean[idx])
    return probs
