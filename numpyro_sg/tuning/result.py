"""What the tuners return: :class:`TuningResult`, and the ``InferenceData`` of the winning arm."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd
import xarray as xr

from numpyro_sg.arviz_compat import from_dict
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.results.inference_data import cast_discrete
from numpyro_sg.results.run_ksd import attach_ksd, preconditioner_name
from numpyro_sg.tuning.scoring import pooled


@dataclass
class TuningResult:
    """What :func:`mamba` and :func:`grid_search` return.

    ``best_params`` the winning arm's keyword arguments (``make_kernel(**best_params)`` is the
    tuned kernel; :meth:`best_kernel` builds it reusing the tuner's warmup); ``idata`` its
    chain as an ``arviz.InferenceData`` (its thinned draws pooled into one chain, KSD of the
    draws it was scored on in ``sample_stats``); ``rounds`` a ``DataFrame`` with one row per
    (round, arm): ``round``, ``arm``, the arm's hyperparameters, ``iterations`` (run in that
    round), ``draws`` (kept so far, burn-in excluded), ``seconds`` (charged in that round),
    ``ess`` (bulk effective sample size of those draws), ``ksd`` (signed √KSD_U² of the
    ESS-thinned draws, or the plain KSD), ``se`` (its standard error, KSD² units), ``score``
    (the ranking key; ``inf`` for a diverged chain), ``mixed`` (ESS ≥ :data:`~numpyro_sg.tuning.MIN_ESS`),
    ``diverged`` and ``kept``; ``elapsed`` the wall time of the whole call (the budget);
    ``scales`` the common per-coordinate KSD scales (``None``: raw form); ``arms`` every
    arm's hyperparameters; ``overhead`` the seconds spent outside the chains (``setup``: the
    warmup's mode search and the kernels' ``init``; ``compile``; ``score``; ``result``:
    building ``idata``).  ``rounds["seconds"].sum()`` is the chain time.  ``batches`` lists
    the arms that ran as one vectorised batch; ``eta`` and ``num_rounds`` the halving
    schedule (``eta`` is ``None`` for a grid search); ``criterion`` the selection rule;
    ``ess_per_iteration`` the winner's effective draws per iteration (see
    :meth:`suggested_num_samples`).
    """

    best_params: dict
    idata: Any
    rounds: pd.DataFrame
    elapsed: float
    scales: Any = None
    arms: list = field(default_factory=list)
    overhead: dict = field(default_factory=dict)
    batches: list = field(default_factory=list)
    eta: int | None = None
    num_rounds: int = 1
    criterion: str = "ess"
    time_budget: float = math.nan
    make_kernel: Callable | None = field(default=None, repr=False)
    mode_fit: Any = field(default=None, repr=False)
    ess_per_iteration: float = math.nan

    def suggested_num_samples(self, ess: float = 400.0) -> int:
        """``num_samples`` for about ``ess`` effective draws (one chain) with the winning arm:
        ``ess`` divided by the winner's effective draws per iteration in the tuner (its bulk
        ESS over the iterations behind its scored draws; ``criterion="ess"`` only).  MAMBA
        compares arms at equal *time*, so a cheap, slowly mixing arm (small mini-batch, small
        step) can win; it then needs more iterations than a user might guess."""
        if not (self.ess_per_iteration > 0):
            raise ValueError("the winner's effective draws per iteration are unknown: with criterion='plain' "
                             "(the default for metric='fssd' and for a metric of your own) no ESS is measured.")
        return int(math.ceil(ess / self.ess_per_iteration))

    def best_kernel(self):
        """A fresh kernel with the winning hyperparameters, ``make_kernel(**best_params)``,
        reusing the tuner's warmup (mode, Laplace preconditioner, control-variate anchor) so
        its ``init`` does not search for the mode again.  Run it with ``MCMC`` as any kernel."""
        kernel = self.make_kernel(**self.best_params)
        if self.mode_fit is not None and isinstance(kernel, GradientKernel):
            kernel.use_mode_fit(self.mode_fit)
        return kernel

    def __repr__(self):
        return (
            f"TuningResult(best_params={self.best_params}, elapsed={self.elapsed:.1f} s of "
            f"{self.time_budget:g} s, {len(self.arms)} arms, {self.num_rounds} round(s), "
            f"eta={self.eta}, criterion={self.criterion!r})"
        )




def arm_idata(scorer, pieces, stein, seconds, metric, criterion):
    """InferenceData of one arm's thinned draws (its chains pooled into one) and the KSD of
    the draws it was scored on, on the common scale.

    :param scorer: the tuner's :class:`~numpyro_sg.tuning.scoring.Scorer`.
    :param pieces: the arm's draws, a list of kernel-state dicts {site: (chains, draws, …)}.
    :param stein: ``(x, scores)`` of the draws the arm was scored on, or ``None``.
    :param float seconds: the chain time charged to the arm (``sampling_time``).
    :param metric: the tuner's metric (a name or a callable).
    :param str criterion: the tuner's criterion.
    :return: an ``arviz.InferenceData`` (an ``xarray.DataTree`` with ArviZ ≥ 1).
    """
    z = pooled(pieces)
    samples = scorer.constrained(z)
    idata = from_dict(posterior={k: v[None] for k, v in samples.items()})
    idata.posterior.attrs["sampling_time"] = float(seconds)
    cast_discrete(idata, scorer.scores.discrete_sites)
    if stein is not None:
        x, s = stein
        dims = ("chain", "draw", "coordinate")
        stein_ds = xr.Dataset(
            {"unconstrained": (dims, x[None]), "score": (dims, s[None])},
            coords={"chain": [0], "draw": np.arange(x.shape[0]), "coordinate": scorer.scores.coordinate_names,
                    "site": ("coordinate", scorer.scores.coordinate_sites)},
        )
        options = {k: v for k, v in scorer.ksd_options.items() if k in ("c", "beta", "statistic", "block_size")}
        attach_ksd(idata, stein_ds, scorer.scales, "array" if scorer.scales is not None else None, options)
        idata.sample_stats.attrs["ksd_preconditioner"] = (
            "common (tuner)" if scorer.scales is not None else preconditioner_name(None)
        )
        idata.sample_stats.attrs["ksd_scores"] = scorer.score_kind
    idata.posterior.attrs["tuning_metric"] = metric if isinstance(metric, str) else "callable"
    idata.posterior.attrs["tuning_criterion"] = criterion
    return idata
