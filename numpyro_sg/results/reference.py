r"""NUTS ground truth and comparison of a run with it.

:func:`nuts_reference` runs NumPyro's NUTS on the full data (every subsample plate switched
to ``arange(N)``), optionally caching the result on disk; :func:`compare_to_reference` reports
how far a
stochastic-gradient run is from a reference, per coordinate and overall through

.. math:: \xi(\hat\sigma) = \lVert \hat\sigma - \sigma_{\mathrm{ref}} \rVert_2 /
          \lVert \sigma_{\mathrm{ref}} \rVert_2,

and scores both runs' KSD with one common preconditioner (the reference's per-coordinate sd
on the unconstrained space), so the two numbers are on one scale.
"""

from __future__ import annotations

import inspect
import os
import time
import warnings
from pathlib import Path
from typing import Callable

import jax
import numpy as np
import pandas as pd
from numpyro.infer import MCMC, NUTS

from numpyro_sg.arviz_compat import (check_netcdf_writable, ess, from_dict, from_netcdf, get_group, has_group,
                                      is_run_data, plot_densities, rename_vars)
from numpyro_sg.diagnostics.convergence import ConvergenceWarning, check_convergence
from numpyro_sg.results.inference_data import to_inference_data
from numpyro_sg.results.run_ksd import score_and_attach_ksd
from numpyro_sg.diagnostics.model_scores import (
    STEIN_GROUP,
    ModelScores,
    full_data_model,
    ksd_of_stein,
    stein_arrays,
    stein_dataset,
    thin_indices,
)
from numpyro_sg.locals.posterior import LOCAL_GROUP, compare_locals, joint_model, marginal_of, select_local_draws
from numpyro_sg.results.reference_cache import cache_key, key_list, save
from numpyro_sg.results.reference_start import log_density_check, reference_start, start_key

# -- NUTS reference -------------------------------------------------------------------------
def nuts_reference(model: Callable, *model_args, model_kwargs: dict | None = None,
                   num_warmup: int = 1000, num_samples: int = 1000, num_chains: int = 1,
                   cache_dir: str | os.PathLike | None = None, rng_key=None,
                   chain_method: str = "sequential", progress_bar: bool = True,
                   ksd_draws: int | None = 1000, decentre_locals: bool = True, start=None,
                   **nuts_kwargs):
    """NUTS on the full data: the ground truth a stochastic-gradient run is compared with.

    Every subsample plate of ``model`` is switched to its full size (the exact log density),
    NumPyro's ``NUTS`` runs on it, and the result comes back as ``InferenceData`` made by
    :func:`numpyro_sg.to_inference_data` (full-data observed data, KSD and scored draws in the
    ``stein`` group), with the wall time of the run (compilation included) as
    ``posterior.attrs["sampling_time"]``.  A model with local latents (latent sites inside a
    subsample plate) is sampled jointly, every group's locals included, and its KSD and ``stein``
    group are the globals' marginal's (locals integrated out, as the gradient kernels sample it).

    :param model: the NumPyro model; ``model_args`` and ``model_kwargs``: its arguments (the data).
    :param cache_dir: when given, the result is stored there as netCDF and reused by later
        calls with the same model source, data (hashed bytes), settings and versions. Data
        captured in a closure are not part of the key: pass data as arguments.
    :param rng_key: a ``jax.random.PRNGKey`` (default ``PRNGKey(0)``).
    :param decentre_locals: sample location-scale locals as loc + scale·z (the centred joint's
        funnel can bias NUTS silently; :func:`~numpyro_sg.locals.posterior.joint_model`).
    :param start: ``None`` (NumPyro's default start), ``"mode"`` (the warmup's multi-start
        mode: a mixture's default start can settle in a lower mode) or a ``ModeFit``
        (``kernel.mode_fit``), with the Laplace covariance there as NUTS's initial inverse mass
        (:mod:`~numpyro_sg.results.reference_start`: affordable on collinear covariates).
    :param nuts_kwargs: passed to ``numpyro.infer.NUTS`` (``target_accept_prob``, …).

    **Example:**

    >>> import numpyro_sg as nsg
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> X, y, _ = simulate_logistic_regression(num_data=500, dim=3)
    >>> ref = nsg.nuts_reference(logistic_regression_model, X, y, num_warmup=200,
    ...                          num_samples=200, progress_bar=False)
    >>> ref.posterior["theta"].shape, ref.posterior.attrs["reference"]
    ((1, 200, 3), 'NUTS on the full data')
    """
    _check_nuts_kwargs(model, nuts_kwargs)
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    settings = dict(num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                    rng_key=key_list(rng_key), ksd_draws=ksd_draws, decentre=bool(decentre_locals),
                    nuts=sorted((k, repr(v)) for k, v in nuts_kwargs.items()), start=start_key(start))
    path = None if cache_dir is None else (
        Path(cache_dir) / f"nuts_reference_{cache_key(model, model_args, model_kwargs, settings)}.nc")
    if path is not None and path.exists():
        idata = from_netcdf(path)
        idata.posterior.attrs["cache_file"] = str(path)
        return idata
    if path is not None:
        check_netcdf_writable(path.parent)  # before NUTS runs, not after
    nuts_kwargs = {**reference_start(model, model_args, model_kwargs, start, nuts_kwargs.get("dense_mass", False)),
                   **nuts_kwargs}
    idata = _run_nuts(model, model_args, model_kwargs, rng_key, ksd_draws, decentre_locals, nuts_kwargs,
                      dict(num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                           chain_method=chain_method, progress_bar=progress_bar))
    _check_reference(idata)
    return idata if path is None else save(idata, path)


def _check_nuts_kwargs(model, nuts_kwargs: dict):
    """A keyword that ``NUTS`` does not take but the model does is the model's: say how to pass it."""
    nuts_params = inspect.signature(NUTS.__init__).parameters
    try:
        model_params = inspect.signature(model).parameters
    except (TypeError, ValueError):
        model_params = {}
    for name in nuts_kwargs:
        if name not in nuts_params and name in model_params:
            raise TypeError(
                f"nuts_reference: {name!r} is an argument of the model, not of NUTS; pass it as "
                f"model_kwargs={{{name!r}: ...}} (keyword arguments go to numpyro.infer.NUTS)")


def _check_reference(idata):
    """Split-R̂ and bulk ESS of every coordinate of the reference (constant ones left out): record
    them in ``posterior.attrs`` and warn, naming the sites, when it cannot serve as ground truth."""
    table = check_convergence(idata, label="the NUTS reference", warn=False)
    bad = [str(site) for site in table.index[~table["ok"]]]
    idata.posterior.attrs.update(reference_rhat_max=float(table["r_hat"].max()),
                                 reference_ess_bulk_min=float(table["ess_bulk"].min()),
                                 reference_converged=int(not bad), reference_suspect_sites=", ".join(bad))
    if bad:
        worst = table.loc[bad]
        warnings.warn(f"nuts_reference: NUTS has not converged on {bad} (split-R̂ up to "
                      f"{worst['r_hat'].max():.3g}, bulk ESS down to {worst['ess_bulk'].min():.3g}): it cannot "
                      "serve as ground truth for those sites. Run more chains and draws (num_chains=4), "
                      "or reparameterise them (decentre_locals=True for location-scale locals).",
                      ConvergenceWarning, stacklevel=3)


def _run_nuts(model, model_args, model_kwargs, rng_key, ksd_draws, decentre, nuts_kwargs, mcmc_kwargs):
    """NUTS on the full-data model (the joint one for a model with local latents, whose KSD is
    then the globals' marginal's: the distribution the gradient kernels sample), converted."""
    joint = joint_model(model, model_args, model_kwargs, decentre=decentre)
    mcmc = MCMC(NUTS(full_data_model(model if joint is None else joint, model_args, model_kwargs),
                     **nuts_kwargs), **mcmc_kwargs)
    if joint is None:
        return _timed_run(mcmc, rng_key, model, model_args, model_kwargs, ksd_draws)
    idata = _timed_run(mcmc, rng_key, joint, model_args, model_kwargs, ksd_draws, ksd=False)
    marginal = marginal_of(model, model_args, model_kwargs)
    score_and_attach_ksd(idata, mcmc, ModelScores(marginal, model_args, model_kwargs), ksd_draws, "sd", {})
    idata.sample_stats.attrs["ksd_of"] = "the globals' marginal (local latents integrated out)"
    return idata


def _timed_run(mcmc, rng_key, model, model_args, model_kwargs, ksd_draws, ksd=True):
    """Run the NUTS ``mcmc`` and convert it, with its wall time as ``sampling_time``."""
    start = time.perf_counter()
    mcmc.run(rng_key, *model_args, extra_fields=("diverging",), **model_kwargs)
    jax.block_until_ready(mcmc.get_samples())
    elapsed = time.perf_counter() - start
    idata = to_inference_data(mcmc, sampling_time=elapsed, ksd=ksd, ksd_draws=ksd_draws,
                              model=model, model_args=model_args, model_kwargs=model_kwargs)
    idata.posterior.attrs["reference"] = "NUTS on the full data"
    return idata


def _as_idata(obj, names: dict | None = None):
    """ArviZ data (InferenceData or DataTree) from ArviZ data, an MCMC, or a dict of draws."""
    if is_run_data(obj):
        idata = obj
    elif hasattr(obj, "get_samples"):
        idata = from_dict(posterior=obj.get_samples(group_by_chain=True))
    elif isinstance(obj, dict):
        # {name: (draws, …)}: one chain (use arviz_compat.from_dict for several)
        idata = from_dict(posterior={k: np.asarray(v)[None] for k, v in obj.items()})
    else:
        raise TypeError(
            "expected an InferenceData, an MCMC object or a dict of draws; "
            f"got {type(obj).__name__}."
        )
    if names:
        idata = rename_vars(idata, names, group="posterior")
    return idata


def _coordinates(idata, var_names) -> dict:
    """``{"theta[0]": (chains, draws) array, …}`` for the chosen posterior variables."""
    out = {}
    for name in var_names:
        values = np.asarray(idata.posterior[name].values, dtype=float)
        if values.ndim == 2:
            out[name] = values
            continue
        for idx in np.ndindex(*values.shape[2:]):
            out[f"{name}[{', '.join(str(i) for i in idx)}]"] = values[(slice(None), slice(None)) + idx]
    return out


def _sampling_time(idata) -> float:
    return float(idata.posterior.attrs.get("sampling_time", np.nan))


def _draws(idata) -> dict:
    """The posterior's draws ``{site: (chains, draws, …)}`` as NumPy arrays."""
    return {k: np.asarray(v.values) for k, v in idata.posterior.data_vars.items()}


def _reference_stein(reference, scores: ModelScores | None, max_draws):
    """The reference's scored draws: stored, or computed from the model."""
    if has_group(reference, STEIN_GROUP):
        return get_group(reference, STEIN_GROUP)
    if scores is None:
        return None
    return stein_dataset(_draws(reference), scores, max_draws)


def compare_to_reference(idata, reference, *, var_names=None, reference_names: dict | None = None,
                         model=None, model_args=None, model_kwargs=None, ksd: bool = True,
                         ksd_draws: int | None = 1000) -> pd.DataFrame:
    r"""Compare a run with a reference posterior, per coordinate and overall.

    :param idata: the run (``InferenceData`` from :func:`to_inference_data`, or an MCMC).
    :param reference: an ``InferenceData`` from :func:`nuts_reference` or
        :func:`numpyro_sg.datasets.posteriordb.posteriordb_reference`, or a dict of draws
        ``{name: (draws, …)}``.
    :param var_names: variables to compare (default: every posterior variable both have).
    :param reference_names: renames ``{reference name: site name}`` applied to the reference.
    :param model, model_args, model_kwargs: needed only to score a reference that carries no
        ``stein`` group (posteriordb draws, a dict).
    :return: a ``pandas.DataFrame`` indexed by coordinate (``theta[0]``, …) with columns
        ``mean``, ``sd``, ``ref_mean``, ``ref_sd``, ``mean_err`` = (mean − ref_mean)/ref_sd,
        ``sd_rel_err`` = (sd − ref_sd)/ref_sd, ``ess_per_s`` and ``ref_ess_per_s`` (bulk ESS
        over ``posterior.attrs["sampling_time"]``; NaN when the time is unknown).
        ``attrs``: ``xi_sd`` = ξ(σ̂) = ‖σ̂ − σ_ref‖₂/‖σ_ref‖₂ over all compared coordinates,
        ``ksd`` and ``ksd_reference`` (both with the reference's unconstrained sd as the
        common preconditioner, recorded in ``ksd_scales``, and on as many scored draws in all,
        ``ksd_draws``: the larger ``stein`` group thinned), ``sampling_time`` and
        ``reference_sampling_time``, and the mean full-data log density of both runs' scored
        draws (``log_density``, ``reference_log_density``; a reference far below the run warns:
        :func:`~numpyro_sg.results.reference_start.log_density_check`).  A run with local latents (its ``local_posterior`` group)
        against a reference with their draws (NUTS on the joint model) adds
        ``attrs["locals"]``, the same columns per group (no ESS), from
        :func:`numpyro_sg.locals.posterior.compare_locals`.

    **Example:** a run whose draws are twice too wide has ``sd_rel_err`` ≈ 1.

    >>> import numpy as np
    >>> import numpyro_sg as nsg
    >>> z = np.random.default_rng(0).normal(size=(2000, 2))
    >>> table = nsg.compare_to_reference({"theta": 2.0 * z}, {"theta": z}, ksd=False)
    >>> list(table.index), bool(np.allclose(table["sd_rel_err"], 1.0))
    (['theta[0]', 'theta[1]'], True)
    """
    run, full_ref = _as_idata(idata), _as_idata(reference, reference_names)
    ref = select_local_draws(run, full_ref)   # the reference's locals of the run's drawn groups
    common = _shared_variables(run, ref, var_names)
    x, r = _coordinates(run, common), _coordinates(ref, common)
    t_run, t_ref = _sampling_time(run), _sampling_time(ref)
    table = _comparison_table(x, r, t_run, t_ref)
    sd, ref_sd = table["sd"].to_numpy(), table["ref_sd"].to_numpy()
    table.attrs.update(xi_sd=float(np.linalg.norm(sd - ref_sd) / np.linalg.norm(ref_sd)),
                       sampling_time=t_run, reference_sampling_time=t_ref)
    if ksd:
        table.attrs.update(_common_scale_ksd(run, ref, model, model_args, model_kwargs, ksd_draws))
    if has_group(run, LOCAL_GROUP):  # local latents: per-group rows in attrs["locals"]
        table.attrs["locals"] = compare_locals(get_group(run, LOCAL_GROUP), get_group(full_ref, "posterior"))
    return table


def _shared_variables(run, ref, var_names) -> list:
    """The variables to compare: ``var_names`` or every one both posteriors have, of one shape."""
    common = [v for v in run.posterior.data_vars if v in ref.posterior.data_vars]
    if var_names is not None:
        var_names = [var_names] if isinstance(var_names, str) else list(var_names)
        missing = [v for v in var_names if v not in common]
        if missing:
            raise KeyError(f"{missing} are not in both posteriors (shared: {common}); "
                           "rename reference variables with reference_names={ref_name: site}.")
        common = var_names
    if not common:
        raise ValueError(f"the run ({list(run.posterior.data_vars)}) and the reference "
                         f"({list(ref.posterior.data_vars)}) share no variable; pass "
                         "reference_names={reference name: site name}.")
    for name in common:
        a, b = run.posterior[name].shape[2:], ref.posterior[name].shape[2:]
        if a != b:
            raise ValueError(f"variable {name!r}: run shape {a} vs reference shape {b}.")
    return common


def _comparison_table(x: dict, r: dict, t_run: float, t_ref: float) -> pd.DataFrame:
    """One row per coordinate: means, sds, their errors and ESS per second; coordinates constant
    in both runs (an ``LKJCholesky`` factor's fixed entries) are left out."""
    rows = {}
    for name in x:
        mean, sd = x[name].mean(), x[name].std(ddof=1)
        ref_mean, ref_sd = r[name].mean(), r[name].std(ddof=1)
        if sd == 0 and ref_sd == 0:
            continue
        rows[name] = {
            "mean": mean,
            "sd": sd,
            "ref_mean": ref_mean,
            "ref_sd": ref_sd,
            "mean_err": (mean - ref_mean) / ref_sd,
            "sd_rel_err": (sd - ref_sd) / ref_sd,
            "ess_per_s": ess(x[name]) / t_run,
            "ref_ess_per_s": ess(r[name]) / t_ref,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "variable"
    return table


def _common_scale_ksd(run, ref, model, model_args, model_kwargs, ksd_draws) -> dict:
    """KSD of run and reference, both with the reference's sd as preconditioner."""
    scores = None
    if model is not None:  # local latents: the globals' marginal, as the kernels sample it
        scores = ModelScores(marginal_of(model, model_args or (), model_kwargs), model_args or (), model_kwargs)
    if has_group(run, STEIN_GROUP):
        run_stein = get_group(run, STEIN_GROUP)
    elif scores is not None:
        run_stein = stein_dataset(_draws(run), scores, ksd_draws)
    else:
        run_stein = None
    ref_stein = _reference_stein(ref, scores, ksd_draws)
    if run_stein is None or ref_stein is None:
        return {"ksd": np.nan, "ksd_reference": np.nan, "ksd_note": "pass model= to score"}
    run_coords, ref_coords = list(run_stein["coordinate"].values), list(ref_stein["coordinate"].values)
    if run_coords != ref_coords and scores is not None and has_group(run, LOCAL_GROUP):
        ref_stein = stein_dataset(_draws(ref), scores, ksd_draws)  # the globals, on the run's marginal
    elif run_coords != ref_coords and set(run_coords) <= set(ref_coords) and not has_group(run, LOCAL_GROUP):
        # the run kept some sites (var_names); a run with local latents needs the marginal's scores
        ref_stein = ref_stein.sel(coordinate=run_coords)
    elif run_coords != ref_coords:
        raise ValueError("the run and the reference have different unconstrained coordinates; for a run with "
                         "local latents pass model=, model_args= (the run's) to score both on the globals' "
                         "marginal, or ksd=False.")
    x_ref, _ = stein_arrays(ref_stein)
    scales = x_ref.reshape(-1, x_ref.shape[-1]).std(axis=0, ddof=1)
    run_stein, ref_stein = _equal_draw_counts(run_stein, ref_stein)
    options = {
        k.removeprefix("ksd_"): run_stein.attrs[k]
        for k in ("ksd_c", "ksd_beta", "ksd_statistic")
        if k in run_stein.attrs
    }
    return {
        "ksd": float(ksd_of_stein(run_stein, scales, **options)),
        "ksd_reference": float(ksd_of_stein(ref_stein, scales, **options)),
        "ksd_preconditioner": "reference sd",
        "ksd_scales": scales,
        "ksd_draws": int(run_stein.sizes["chain"] * run_stein.sizes["draw"]),
        **log_density_check(run_stein, ref_stein),
    }


def _equal_draw_counts(run_stein, ref_stein):
    """Both ``stein`` groups with about as many draws in all, the larger thinned evenly along
    ``draw``: the V-statistic KSD of exact draws shrinks as 1/√T with T draws (its diagonal
    terms), so two KSDs compare only at equal T."""
    totals = [stein.sizes["chain"] * stein.sizes["draw"] for stein in (run_stein, ref_stein)]
    fewest = min(totals)
    return tuple(stein if total == fewest else
                 stein.isel(draw=thin_indices(stein.sizes["draw"], max(2, fewest // stein.sizes["chain"])))
                 for stein, total in zip((run_stein, ref_stein), totals))


def plot_reference_comparison(idata, reference, *, var_names=None, reference_names=None, labels=None,
                              **kwargs):
    """Overlay the marginal densities of a run and a reference.

    With ArviZ 0.x this is ``arviz.plot_density`` and returns its matplotlib axes; with
    ArviZ ≥ 1 it is ``arviz_plots.plot_dist`` over ``{label: run}`` and returns its
    ``PlotCollection`` (:func:`numpyro_sg.arviz_compat.plot_densities`).

    :param labels: the two legend labels (default ``("run", "reference")``).
    :param kwargs: passed to the plotting function above.
    :return: the matplotlib axes (ArviZ 0.x) or a ``PlotCollection`` (ArviZ ≥ 1).

    **Example:**

    >>> import matplotlib
    >>> import numpy as np
    >>> import numpyro_sg as nsg
    >>> matplotlib.use("Agg")
    >>> z = np.random.default_rng(0).normal(size=(500, 2))
    >>> axes = nsg.plot_reference_comparison({"theta": 2.0 * z}, {"theta": z}, labels=("wide", "exact"))
    """
    run = _as_idata(idata)
    ref = select_local_draws(run, _as_idata(reference, reference_names))
    if var_names is None:
        var_names = [v for v in run.posterior.data_vars if v in ref.posterior.data_vars]
    labels = ("run", "reference") if labels is None else labels
    posteriors = [get_group(run, "posterior")[var_names], get_group(ref, "posterior")[var_names]]
    return plot_densities(posteriors, labels, **kwargs)
