"""KSD versus iteration and versus time, for one run or several on a common scale.

The top of the diagnostics: reads the ``stein`` group of runs
(:mod:`numpyro_sg.diagnostics.model_scores`) and computes KSD paths with the array-only
:func:`numpyro_sg.diagnostics.ksd.ksd_path`.  matplotlib is imported only when plotting.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from numpyro_sg.arviz_compat import get_group, has_group
from numpyro_sg.diagnostics.ksd import ksd_path
from numpyro_sg.diagnostics.model_scores import STEIN_GROUP, stein_arrays


def _stein(idata):
    if not has_group(idata, STEIN_GROUP):
        raise ValueError(
            "this run has no 'stein' group: make it with "
            "numpyro_sg.to_inference_data(mcmc, ksd=True)."
        )
    return get_group(idata, STEIN_GROUP)


def _pooled_sd(runs) -> np.ndarray:
    xs = [stein_arrays(_stein(r), pooled=True)[0] for r in runs]
    return np.concatenate(xs).std(axis=0, ddof=1)


def ksd_path_of_run(idata, *, scales=None, num_steps: int = 20, **options) -> pd.DataFrame:
    """KSD of the first k scored draws of every chain, for ``num_steps`` values of k.

    Uses the run's ``stein`` group (the evenly thinned, scored draws stored by
    :func:`numpyro_sg.to_inference_data`); the chains are pooled draw by draw, so the point
    at draw index t scores the draws up to t of all chains.

    :param scales: per-coordinate scales (one common preconditioner for the whole path;
        default: the run's stored ``ksd_scales``, or ``None`` for the raw form if it has none).
    :return: a ``DataFrame`` with columns ``draw`` (index of the last draw used, per chain),
        ``seconds`` (``draw`` × sampling time per draw, when
        ``posterior.attrs["sampling_time"]`` is known; warmup included in the time per draw)
        and ``ksd``.

    **Example:** a run converted with a stored ``stein`` group (here made by hand).

    >>> import numpy as np
    >>> import xarray as xr
    >>> from numpyro_sg.arviz_compat import from_dict, set_group
    >>> from numpyro_sg.diagnostics.plots import ksd_path_of_run
    >>> x = np.random.default_rng(0).normal(size=(2, 100, 3))  # 2 chains, N(0, I) draws
    >>> dims = ("chain", "draw", "coordinate")
    >>> idata = from_dict(posterior={"theta": x})
    >>> set_group(idata, "stein", xr.Dataset({"unconstrained": (dims, x), "score": (dims, -x)},
    ...                                      coords={"draw": np.arange(100)}))
    >>> path = ksd_path_of_run(idata, num_steps=5)
    >>> list(path.columns), int(path["draw"].iloc[-1])
    (['draw', 'seconds', 'ksd'], 99)
    """
    stein = _stein(idata)
    x, s = stein_arrays(stein)
    C, K, d = x.shape
    if scales is None and "ksd_scales" in stein.attrs and stein.attrs.get("ksd_preconditioner") != "none":
        scales = np.asarray(stein.attrs["ksd_scales"])
    # interleave chains: the first C·k rows are the first k draws of every chain
    xi = np.swapaxes(x, 0, 1).reshape(K * C, d)
    si = np.swapaxes(s, 0, 1).reshape(K * C, d)
    ks = np.unique(np.clip(np.round(np.geomspace(2, K, num_steps)).astype(int), 2, K))
    steps, values = ksd_path(xi, scores=si, steps=ks * C, preconditioner=scales, **options)
    draw = np.asarray(stein["draw"].values)[steps // C - 1]
    total = float(idata.posterior.attrs.get("sampling_time", np.nan))
    per_draw = total / idata.posterior.sizes["draw"] if np.isfinite(total) else np.nan
    return pd.DataFrame({"draw": draw, "seconds": (draw + 1) * per_draw, "ksd": values})


def plot_ksd_path(runs, *, x: str = "draw", reference=None, scales=None, num_steps: int = 20,
                  ax=None, **options):
    """Plot KSD against the draw index or the sampling time for one or several runs.

    Several runs are scored with **one common preconditioner** (otherwise their KSDs are not
    on one scale): ``scales`` if given, else the unconstrained sd of ``reference`` (e.g. a
    :func:`numpyro_sg.nuts_reference` result), else the sd of all the runs' scored draws
    pooled together.

    :param runs: an ``InferenceData`` from :func:`numpyro_sg.to_inference_data`, or a dict
        ``{label: InferenceData}``.
    :param str x: ``"draw"`` or ``"time"`` (needs ``posterior.attrs["sampling_time"]``, which
        ``to_inference_data(..., sampling_time=…)`` records).
    :param reference: an ``InferenceData`` whose unconstrained sd gives the common scales.
    :param scales: per-coordinate scales (d,) used for every run (overrides ``reference``).
    :param int num_steps: number of points on each path.
    :param ax: a matplotlib axes (default: a new figure).
    :param options: options of :func:`numpyro_sg.diagnostics.ksd.ksd_path` (``c``, ``beta``, …).
    :return: the matplotlib axes.

    **Example:**

    >>> import matplotlib
    >>> import numpy as np
    >>> import xarray as xr
    >>> import numpyro_sg as nsg
    >>> from numpyro_sg.arviz_compat import from_dict, set_group
    >>> matplotlib.use("Agg")
    >>> def run(scale):  # an InferenceData with a stored ``stein`` group, made by hand
    ...     x = scale * np.random.default_rng(0).normal(size=(1, 100, 2))
    ...     dims = ("chain", "draw", "coordinate")
    ...     idata = from_dict(posterior={"theta": x})
    ...     set_group(idata, "stein", xr.Dataset({"unconstrained": (dims, x), "score": (dims, -x)},
    ...                                          coords={"draw": np.arange(100)}))
    ...     return idata
    >>> ax = nsg.plot_ksd_path({"exact": run(1.0), "too wide": run(2.0)}, num_steps=5)
    >>> ax.get_ylabel()
    'KSD (common scale)'
    """
    import matplotlib.pyplot as plt

    if x not in ("draw", "time"):
        raise ValueError(f"x must be 'draw' or 'time', got {x!r}.")
    if not isinstance(runs, dict):
        runs = {"run": runs}
    if scales is None:
        scales = _pooled_sd([reference]) if reference is not None else _pooled_sd(runs.values())
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for label, idata in runs.items():
        path = ksd_path_of_run(idata, scales=scales, num_steps=num_steps, **options)
        column = "draw" if x == "draw" else "seconds"
        if path[column].isna().all():
            raise ValueError(f"run {label!r} has no posterior.attrs['sampling_time'] to plot against time.")
        ax.loglog(path[column], path["ksd"], marker="o", ms=3, label=label)
    ax.set_xlabel("draw (after warmup)" if x == "draw" else "sampling time (s)")
    ax.set_ylabel("KSD (common scale)")
    if len(runs) > 1:
        ax.legend()
    return ax
