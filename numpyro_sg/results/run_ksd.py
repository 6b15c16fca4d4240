"""A run's KSD stored in its ArviZ data: the ``stein`` group of scored draws, the per-chain
``ksd`` in ``sample_stats`` and the pooled KSD and its settings in ``sample_stats.attrs``
(the layout is described in :mod:`numpyro_sg.results.inference_data`)."""

from __future__ import annotations

import math
import time

import numpy as np
import xarray as xr

from numpyro_sg.arviz_compat import has_group, set_group
from numpyro_sg.diagnostics.run_discrepancies import chain_ksds, resolve_run_scales
from numpyro_sg.diagnostics.stein_runs import STEIN_GROUP, run_samples, stein_dataset, thin_indices
from numpyro_sg.infer.progress import progress_phase
from numpyro_sg.locals.posterior import MIN_AFFORDABLE_DRAWS


def score_and_attach_ksd(idata, mcmc, scores, ksd_draws, preconditioner, ksd_options, diverged=(),
                         var_names=None, seconds=None):
    """Score the run's draws (the coordinates of ``var_names``) and :func:`attach_ksd` their KSD
    (scales and pooled KSD without the ``diverged`` chains), recording the time it took.

    With ``seconds``, scores and pair sums share that budget: scoring stops when it is spent
    (:func:`~numpyro_sg.diagnostics.stein_runs.stein_dataset`), and when the pair sums (work
    quadratic in the draws) are projected past what is left, evenly spread fewer of the scored
    draws are kept, never under :data:`~numpyro_sg.locals.posterior.MIN_AFFORDABLE_DRAWS` per
    chain, so that the stored draws are the ones the KSD used."""
    start = time.perf_counter()
    stein = stein_dataset(run_samples(mcmc), scores, ksd_draws, var_names, seconds=seconds,
                          min_draws=MIN_AFFORDABLE_DRAWS)
    progress_phase("KSD")
    left = None if seconds is None else max(seconds - (time.perf_counter() - start), 0.0)
    while True:
        scales = resolve_run_scales(preconditioner, kept_chains(stein, diverged), scores)
        projected = attach_ksd(idata, stein, scales, preconditioner, ksd_options, diverged=diverged, seconds=left)
        if projected is None:
            break
        draws = stein.sizes["draw"]
        fewer = min(max(int(draws * math.sqrt(0.8 * left / projected)), MIN_AFFORDABLE_DRAWS), draws)
        stein, left = stein.isel(draw=thin_indices(draws, fewer)), None
    idata.sample_stats.attrs["ksd_seconds"] = time.perf_counter() - start


def kept_chains(stein, diverged):
    """``stein`` without the ``diverged`` chains (all of it when none or every chain diverged)."""
    keep = [c for c in range(stein.sizes["chain"]) if c not in set(diverged)]
    return stein if not diverged or not keep else stein.isel(chain=keep)


def preconditioner_name(preconditioner) -> str:
    """How a ``preconditioner`` option is recorded in the ``ksd_preconditioner`` attribute:
    ``"none"`` for ``None``, the string itself for ``"sd"``/``"laplace"``, else ``"array"``.

    :param preconditioner: ``"sd"``, ``"laplace"``, an array of scales or ``None``.
    :return: str.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.results.run_ksd import preconditioner_name
    >>> preconditioner_name(None), preconditioner_name("sd"), preconditioner_name(np.ones(3))
    ('none', 'sd', 'array')
    """
    if preconditioner is None:
        return "none"
    return preconditioner if isinstance(preconditioner, str) else "array"


def attach_ksd(idata, stein, scales, preconditioner, options, diverged=(), seconds=None):
    """Store a run's KSD in ``idata``, in place: per-chain ``ksd`` into ``sample_stats``, the
    pooled KSD and its settings into ``sample_stats.attrs``, and the ``stein`` group (with
    ``ksd_per_coordinate`` and the same settings in its attrs), replacing any earlier one.

    :param idata: the run's ``InferenceData`` (``posterior`` with a ``chain`` dim; a missing
        ``sample_stats`` group is created).
    :param stein: its scored draws (:func:`~numpyro_sg.diagnostics.stein_runs.stein_dataset`).
    :param scales: the common per-coordinate scales (d,), or ``None`` (raw form).
    :param preconditioner: the option the scales came from (recorded through
        :func:`preconditioner_name`).
    :param dict options: options of :func:`numpyro_sg.diagnostics.ksd.ksd` (``c``, ``beta``,
        ``statistic``, ``block_size``).
    :param diverged: positions of diverged chains: they get their per-chain ``ksd`` but are left
        out of the pooled KSD and of ``ksd_per_coordinate`` (unless every chain diverged).
    :param seconds: a time budget for the pair sums
        (:func:`~numpyro_sg.diagnostics.run_discrepancies.chain_ksds`), or ``None``.
    :return: ``None``; when the pair sums were projected past ``seconds``, that projection in
        seconds, and ``idata`` is unchanged.

    **Example:**

    >>> import numpy as np
    >>> import xarray as xr
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.results.run_ksd import attach_ksd
    >>> x = np.random.default_rng(0).normal(size=(2, 100, 3))  # 2 chains of N(0, I) draws
    >>> dims = ("chain", "draw", "coordinate")
    >>> stein = xr.Dataset({"unconstrained": (dims, x), "score": (dims, -x)},
    ...                    coords={"chain": [0, 1], "draw": np.arange(100)})
    >>> idata = from_dict(posterior={"theta": x})
    >>> attach_ksd(idata, stein, np.ones(3), "array", {})
    >>> idata.sample_stats["ksd"].shape, idata.stein["ksd_per_coordinate"].shape
    ((2,), (3,))
    """
    kept = [c for c in range(stein.sizes["chain"]) if c not in set(diverged)] or None
    terms, projected = chain_ksds(stein, scales, kept, seconds=seconds, **options)
    if terms is None:
        return projected
    return _store(idata, stein, terms, scales, preconditioner, options)


def _store(idata, stein, terms, scales, preconditioner, options):
    """Write :func:`attach_ksd`'s groups and attributes."""
    per_chain, pooled, per_coord = terms
    stein = stein.assign(ksd_per_coordinate=("coordinate", np.asarray(per_coord)))
    chains = idata.posterior["chain"].values
    ksd_var = xr.DataArray(per_chain, dims=("chain",), coords={"chain": chains})
    if not has_group(idata, "sample_stats"):  # (ArviZ drops an empty group: add it with ksd)
        set_group(idata, "sample_stats", xr.Dataset({"ksd": ksd_var}))
    else:
        idata.sample_stats["ksd"] = ksd_var
    attrs = {
        "ksd": float(pooled),
        "ksd_preconditioner": preconditioner_name(preconditioner),
        "ksd_scales": np.ones(stein.sizes["coordinate"]) if scales is None else np.asarray(scales, float),
        "ksd_c": float(options.get("c", 1.0)),
        "ksd_beta": float(options.get("beta", -0.5)),
        "ksd_statistic": str(options.get("statistic", "v")),
        "ksd_draws_per_chain": int(stein.sizes["draw"]),
    }
    idata.sample_stats.attrs.update(attrs)
    stein = stein.assign_coords(chain=chains)
    stein.attrs.update({k: v for k, v in attrs.items() if k != "ksd"})
    set_group(idata, STEIN_GROUP, stein)
