"""ArviZ output: :func:`to_inference_data`, with the KSD attached.

``az.from_numpyro`` on a subsample model stores a random mini-batch as ``observed_data`` and
cannot build the ``log_likelihood`` group.  :func:`to_inference_data` converts through a view of
the run whose model has every subsample plate switched to its full data, and adds the kernel
Stein discrepancy of the run (full-data scores) to ``sample_stats``.  Its groups:

* ``posterior``: constrained values; discrete indicator sites as integers.
* ``sample_stats``: the collected extra fields (``diverging``, ``step_size``,
  ``grad_noise_sd``, …; per-coordinate fields on a ``coordinate`` dim named after the
  unconstrained coordinates) and, with ``ksd=True``, ``ksd`` per chain (dims ``chain``).
  ``sample_stats.attrs`` hold the pooled KSD (``ksd``), the ``ksd_preconditioner``, its
  ``ksd_scales``, the kernel settings (``ksd_c``, ``ksd_beta``, ``ksd_statistic``),
  ``ksd_draws_per_chain``, ``ksd_seconds`` (the time the scores and KSD took) and
  ``diverged_chains``: the chains (positions along ``chain``) the kernel froze after a blow-up
  (:mod:`numpyro_sg.results.chains`).  Their raw draws stay in ``posterior`` (and ``stein``),
  so that they can be inspected, and they keep their per-chain ``ksd``, but the pooled KSD,
  ``ksd_per_coordinate`` and :func:`numpyro_sg.posterior_summary` leave them out, with a
  :class:`~numpyro_sg.DivergenceWarning` naming them.  With ArviZ directly, select the other
  chains first: ``idata.isel(chain=[c for c in range(idata.posterior.sizes["chain"]) if c not
  in idata.sample_stats.attrs["diverged_chains"]])`` (ArviZ ≥ 1: ``missing_dims="ignore"``).
* ``stein``: the scored draws (``unconstrained`` and ``score``, dims
  ``(chain, draw, coordinate)``) and ``ksd_per_coordinate``, so that :func:`numpyro_sg.ksd`,
  :func:`numpyro_sg.posterior_summary` and :func:`numpyro_sg.compare_to_reference` recompute
  KSD with another preconditioner without the model.
* ``observed_data`` (and, with ``log_likelihood=True``, ``log_likelihood``, so that
  ``az.loo`` works) over the full data, not a mini-batch.

The posterior summary with its per-coordinate KSD column is
:func:`numpyro_sg.results.summary.posterior_summary`.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from types import SimpleNamespace

import jax
import numpy as np
import xarray as xr
from numpyro import handlers

from numpyro_sg.arviz_compat import drop_group, from_numpyro, get_group, has_group, set_group
from numpyro_sg.locals.fitting import log_marginal_of
from numpyro_sg.locals.model import MarginalModel
from numpyro_sg.locals.posterior import add_local_draws, add_local_posterior, affordable_draws
from numpyro_sg.diagnostics.convergence import check_convergence
from numpyro_sg.results.nuts_estimate import advise_nuts
from numpyro_sg.diagnostics.full_data_scores import ModelScores, full_data_model
from numpyro_sg.diagnostics.stein_runs import run_model
from numpyro_sg.infer.model_info import improper_to_uniform, structure_only
from numpyro_sg.infer.progress import conversion_progress, progress_phase
from numpyro_sg.infer.run_clock import run_seconds, seconds_since_init
from numpyro_sg.infer.sharding import auto_view, spans_processes, without_global_observations
from numpyro_sg.results.run_ksd import score_and_attach_ksd
from numpyro_sg.results.chains import (DIVERGED_AT_ATTR, DIVERGED_ATTR, diverged_chains,
                                       divergence_iterations, warn_diverged)

_KSD_OPTIONS = ("c", "beta", "statistic", "block_size")
#: the share of the run's sampling time that ``ksd_draws="auto"`` gives the KSD (scores and pair sums)
KSD_SHARE = 0.35
#: the least time ``ksd_draws="auto"`` gives the KSD
MIN_KSD_SECONDS = 5.0


class _FullDataView:
    """Duck-typed stand-in for an ``MCMC`` object whose ``sampler.model`` uses the full data
    and whose draws are those of the sites ``keep`` (``None``: all)."""

    def __init__(self, mcmc, model, keep=None):
        self._mcmc, self._keep = mcmc, keep
        self.sampler = SimpleNamespace(model=model)

    def get_samples(self, group_by_chain=False):
        samples = self._mcmc.get_samples(group_by_chain=group_by_chain)
        return samples if self._keep is None else {k: samples[k] for k in self._keep}

    def __getattr__(self, name):
        return getattr(self._mcmc, name)


def _observed_size(model, model_args, model_kwargs) -> int:
    """Number of scalar log-likelihood terms of the model's observed sites (full data)."""

    def sizes():
        tr = handlers.trace(handlers.substitute(handlers.seed(model, 0), substitute_fn=improper_to_uniform)
                            ).get_trace(*model_args, **model_kwargs)
        return {
            name: site["fn"].log_prob(site["value"])
            for name, site in tr.items()
            if site["type"] == "sample" and site["is_observed"]
        }

    shapes = jax.eval_shape(sizes)
    return int(sum(math.prod(s.shape) for s in shapes.values()))


def _check_log_likelihood_size(num_samples, model, model_args, model_kwargs, limit_gb):
    need_gb = 8 * num_samples * _observed_size(model, model_args, model_kwargs) / 1e9
    if limit_gb is not None and need_gb > limit_gb:
        raise MemoryError(
            f"the full-data log_likelihood group needs about {need_gb:.2f} GB "
            f"({num_samples} draws × the observations × 8 bytes, and as much again while it "
            f"is computed), above log_likelihood_limit_gb={limit_gb}. Raise the limit, or "
            "thin the run (MCMC(..., thinning=k)) before converting."
        )


def cast_discrete(idata, discrete_sites):
    """Round the posterior's discrete (indicator) sites to integers, in place (a kernel may
    carry them as floats).  Names not in the posterior are skipped.

    :param idata: an ``InferenceData`` with a ``posterior`` group (modified).
    :param discrete_sites: names of the discrete latent sites (e.g.
        ``ModelScores.discrete_sites``).

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.results.inference_data import cast_discrete
    >>> idata = from_dict(posterior={"gamma": np.array([[0.0, 1.0, 1.0]])})
    >>> cast_discrete(idata, ["gamma"])
    >>> idata.posterior["gamma"].dtype
    dtype('int64')
    """
    for name in discrete_sites:
        if name in idata.posterior:
            idata.posterior[name] = idata.posterior[name].round().astype(np.int64)


def _name_coordinate_dims(idata, coordinate_names):
    """Put per-coordinate sample_stats (``grad_noise_sd``, ``step_size``, …) on a named dim."""
    stats = get_group(idata, "sample_stats")
    old_dims = set()
    for name, var in list(stats.data_vars.items()):
        if var.ndim == 3 and var.shape[-1] == len(coordinate_names):
            old_dims.add(var.dims[-1])
            stats[name] = var.rename({var.dims[-1]: "coordinate"}).drop_vars(
                var.dims[-1], errors="ignore"
            )
    if old_dims:
        stats = stats.drop_vars([d for d in old_dims if d in stats.coords])
        set_group(idata, "sample_stats", stats.assign_coords(coordinate=coordinate_names))


def to_inference_data(mcmc, log_likelihood: bool = False, ksd: bool = True, *,
                      ksd_draws: int | None | str = "auto", preconditioner="sd", ksd_options: dict | None = None,
                      log_likelihood_limit_gb: float | None = 1.0, sampling_time: float | None = None,
                      model=None, model_args=None, model_kwargs=None, check: bool = True,
                      local_groups=None, var_names=None, **kwargs):
    """ArviZ data of an MCMC run (``InferenceData``; ``xarray.DataTree`` with ArviZ ≥ 1), with KSD.

    Works for the ``numpyro_sg`` kernels and for any NumPyro kernel (NUTS too).  The groups
    (``posterior``, ``sample_stats`` with the KSD, ``stein``, ``observed_data``, optionally
    ``log_likelihood``) are described in :mod:`numpyro_sg.results.inference_data`.  KSD uses
    full-data scores on the unconstrained space at ``ksd_draws`` evenly thinned draws per chain
    (``None``: all).  The default ``"auto"``, 1,000 (with local latents, as many as cost what
    the steps did), gives the KSD :data:`KSD_SHARE` (35 %) of the run's sampling time
    (unknown, since its ``init``; at least :data:`MIN_KSD_SECONDS`): draws are scored in an order spread over the chain until
    it is spent, and fewer, evenly spread, are kept when the pairwise sums (quadratic in the
    draws, linear in the coordinates) would overrun it; never under 100 per chain: on large
    data or many coordinates the count (``attrs["ksd_draws_per_chain"]``) depends on the
    machine.  The chains' KSDs share the pooled scale.  (Long because its docstring documents every option.)

    :param mcmc: a ``numpyro.infer.MCMC`` object after ``run``.
    :param bool log_likelihood: add the full-data pointwise ``log_likelihood`` group.
    :param bool ksd: compute the KSD (default ``True``).
    :param preconditioner: ``"sd"`` (default), ``"laplace"``, an array of per-coordinate
        scales, or ``None`` (the papers' raw form); see :func:`numpyro_sg.ksd`.
    :param dict ksd_options: further options of :func:`numpyro_sg.ksd` (``c``, ``beta``,
        ``statistic``, ``block_size``).
    :param log_likelihood_limit_gb: refuse a ``log_likelihood`` group estimated above this
        size (``None``: no limit).
    :param sampling_time: wall time of ``mcmc.run`` in seconds, stored as
        ``posterior.attrs["sampling_time"]`` (ArviZ's convention) and used for ESS per second
        by :func:`numpyro_sg.compare_to_reference`; by default, for this package's kernels, the
        run's own clock (from the start of ``init`` to the last iteration;
        :func:`~numpyro_sg.infer.run_clock.run_seconds`).
    :param model, model_args, model_kwargs: override the model and data the run used.
    :param local_groups: for a model with local latents, indices of groups whose locals are
        also drawn, one draw b_g ~ p(b_g | y_g, θ) per kept draw θ, into the ``posterior`` group
        (dims ``(chain, draw, <plate>, …)``; :func:`numpyro_sg.locals.posterior.local_draws`,
        with its size guard).  Every group's mean and sd are in ``local_posterior`` regardless.
    :param var_names: keep only these sites (a name or a list) in ``posterior`` and ``stein``,
        and compute the KSD on their coordinates: for models with tens of thousands of
        parameters, where every site's draws and scores would not fit (each kept draw is still
        scored with the whole model, a block at a time; :func:`numpyro_sg.ksd`).
    :param bool check: for a run of one of this package's kernels, run
        :func:`numpyro_sg.check_convergence` on it first (a :class:`~numpyro_sg.ConvergenceWarning` names
        the sites at fault; NumPyro's ``MCMC`` has no end-of-run hook, so this is where the
        check runs unless you call it yourself), and estimate how long full-data NUTS would take
        to the same effective sample size (``posterior.attrs["nuts_estimated_seconds"]``; a
        :class:`~numpyro_sg.results.nuts_estimate.PreferNUTSWarning` when that is sooner:
        :mod:`numpyro_sg.results.nuts_estimate`).
    :param kwargs: passed to :func:`arviz.from_numpyro` (``coords``, ``dims``, …).

    **Example:**

    >>> import numpy as np, numpyro, numpyro.distributions as dist
    >>> from jax import random
    >>> from numpyro.infer import MCMC, NUTS
    >>> import numpyro_sg as nsg
    >>> def model(y):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> mcmc = MCMC(NUTS(model), num_warmup=200, num_samples=200, progress_bar=False)
    >>> mcmc.run(random.PRNGKey(0), np.random.default_rng(0).normal(1.0, 1.0, size=100))
    >>> idata = nsg.to_inference_data(mcmc)
    >>> sorted(nsg.arviz_compat.group_names(idata))
    ['observed_data', 'posterior', 'sample_stats', 'stein']
    >>> idata.sample_stats.attrs["ksd_preconditioner"], idata.sample_stats["ksd"].dims
    ('sd', ('chain',))
    """
    ksd_options, table = _checked_ksd_options(mcmc, ksd_options, check)
    sampling_time = run_seconds(mcmc) if sampling_time is None else sampling_time
    estimate = None if table is None else advise_nuts(   # would full-data NUTS have been faster?
        mcmc, float(table["ess_bulk"].min()), sampling_time, model, model_args, model_kwargs)
    model, model_args, model_kwargs = run_model(mcmc, model, model_args, model_kwargs)
    model = log_marginal_of(model)  # (an imputation's surrogate is not a log density)
    model_args, model_kwargs = auto_view(model_args, model_kwargs)  # data on an Explicit mesh
    with conversion_progress():  # one bar for a long conversion (its phases named on it)
        progress_phase("model traces")
        scores = ModelScores(model, model_args, model_kwargs)
        scores.coordinate_indices(var_names)  # unknown names fail before any work
        steps = getattr(mcmc, "num_warmup", 0) + getattr(mcmc, "num_samples", 0)
        affordable = affordable_draws(model, steps, 1000)  # per chain
        idata = _full_data_idata(mcmc, model, model_args, model_kwargs, log_likelihood,
                                 log_likelihood_limit_gb, kwargs, local_groups, var_names, affordable // 2)
        _finish(idata, scores, sampling_time)
        if estimate is not None:
            idata.posterior.attrs["nuts_estimated_seconds"] = estimate.nuts_seconds
        diverged = _record_diverged(idata, mcmc)
        if ksd:
            auto, spent = ksd_draws == "auto", seconds_since_init(mcmc) if sampling_time is None else sampling_time
            seconds = max(KSD_SHARE * spent, MIN_KSD_SECONDS) if auto and spent is not None else None
            score_and_attach_ksd(idata, mcmc, scores, affordable if auto else ksd_draws,
                                 preconditioner, ksd_options, diverged, var_names, seconds)
    return idata


def _finish(idata, scores, sampling_time):
    """Record ``sampling_time``, cast discrete sites, name the coordinate dims (in place)."""
    if sampling_time is not None:
        idata.posterior.attrs["sampling_time"] = float(sampling_time)
    cast_discrete(idata, scores.discrete_sites)
    if has_group(idata, "sample_stats"):
        _name_coordinate_dims(idata, scores.coordinate_names)


def _record_diverged(idata, mcmc) -> list:
    """Find the run's diverged chains, warn (naming the iterations of the blow-ups), and record
    them in ``sample_stats.attrs["diverged_chains"]`` (chain positions) and
    ``attrs["diverged_at"]`` (their iterations, −1 unknown), in place; return them."""
    diverged = diverged_chains(mcmc)
    warn_diverged(diverged, idata.posterior.sizes["chain"], "the pooled KSD and posterior_summary",
                  divergence_iterations(mcmc))
    sampler, state = getattr(mcmc, "sampler", None), getattr(mcmc, "last_state", None)
    at = sampler.diverged_at(state) if hasattr(sampler, "diverged_at") and state is not None else {}
    if not has_group(idata, "sample_stats"):
        set_group(idata, "sample_stats", xr.Dataset(attrs={DIVERGED_ATTR: list(diverged)}))
    idata.sample_stats.attrs[DIVERGED_ATTR] = list(diverged)
    idata.sample_stats.attrs[DIVERGED_AT_ATTR] = [int(at.get(c) or -1) for c in diverged]
    return diverged


def _checked_ksd_options(mcmc, ksd_options, check=False) -> tuple:
    """``(ksd_options as a dict, the convergence table or None)``, after checking that ``mcmc`` is
    a finished MCMC run (and, with ``check``, its convergence: :func:`numpyro_sg.check_convergence`,
    for this package's kernels, whose table is returned)."""
    if not hasattr(mcmc, "get_samples") or not hasattr(mcmc, "sampler"):
        raise TypeError(
            f"to_inference_data expects a numpyro.infer.MCMC object, got {type(mcmc).__name__}."
        )
    if getattr(mcmc, "_states", None) is None:
        raise ValueError("the MCMC object has no draws yet: call mcmc.run(...) first.")
    ksd_options = dict(ksd_options or {})
    unknown = set(ksd_options) - set(_KSD_OPTIONS)
    if unknown:
        raise TypeError(f"unknown ksd_options {sorted(unknown)}; allowed: {list(_KSD_OPTIONS)}.")
    if check and hasattr(getattr(mcmc, "sampler", None), "convergence_report"):
        return ksd_options, check_convergence(mcmc)
    return ksd_options, None


def _full_data_idata(mcmc, model, model_args, model_kwargs, log_likelihood, limit_gb, kwargs,
                     local_groups=None, var_names=None, local_posterior_draws=500):
    """``az.from_numpyro`` of the run seen through its model on the full data (the posterior of
    the sites ``var_names`` only), with the local latents' posterior group (``local_posterior_draws``
    draws) and the ``local_groups``' local draws in the posterior when the model has locals."""
    full_model = full_data_model(model, model_args, model_kwargs)
    several_processes = spans_processes(model_args, model_kwargs)
    if several_processes:   # N-sized groups would need every process's rows on one host
        full_model, log_likelihood = without_global_observations(full_model), False
    if log_likelihood:
        num_samples = next(iter(mcmc.get_samples().values())).shape[0]  # chains × draws
        _check_log_likelihood_size(num_samples, full_model, model_args, model_kwargs, limit_gb)
    keep = None if var_names is None else [var_names] if isinstance(var_names, str) else list(var_names)
    if not log_likelihood and not several_processes:   # ArviZ's traces at a draw: no prior draws to compile
        first = {k: np.asarray(v[0]) for k, v in mcmc.get_samples().items()}   # (host values: any mesh)
        full_model = handlers.substitute(full_model, data=first)
    view = _FullDataView(mcmc, full_model, None if log_likelihood else keep)  # (it needs every site)
    view._args, view._kwargs = model_args, model_kwargs
    with contextlib.nullcontext() if log_likelihood else structure_only(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"init_to_median\(\) skipping initialization", UserWarning)
        idata = from_numpyro(view, log_likelihood=log_likelihood, **kwargs)   # (the densities come later)
    if keep is not None and log_likelihood:
        set_group(idata, "posterior", get_group(idata, "posterior")[keep])
    if several_processes:
        drop_group(idata, "observed_data")
    if local_groups is not None:
        if not isinstance(model, MarginalModel):
            raise ValueError("local_groups: the run's model has no local latents (no latent site "
                             "inside a subsample plate).")
        add_local_draws(idata, model, mcmc.get_samples(group_by_chain=True), local_groups,
                        model_args, model_kwargs)
    return add_local_posterior(idata, model, mcmc.get_samples(), model_args, model_kwargs,
                               max_draws=local_posterior_draws)
