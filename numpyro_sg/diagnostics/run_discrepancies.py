"""KSD and FSSD of a run (``MCMC`` or ``InferenceData``) from its ``stein`` group, on one
scale: the run-aware layer above the array-only :mod:`numpyro_sg.diagnostics.ksd` and
:mod:`numpyro_sg.diagnostics.fssd`."""

from __future__ import annotations

import numpy as np

from numpyro_sg.diagnostics.fssd import fssd
from numpyro_sg.diagnostics.full_data_scores import ModelScores
from numpyro_sg.diagnostics.ksd import ksd, ksd_per_coordinate
from numpyro_sg.diagnostics.ksd_blocks import chain_pair_sums, check_block, normalise
from numpyro_sg.diagnostics.scales import precondition, resolve_scales
from numpyro_sg.diagnostics.stein_kernels import signed_sqrt
from numpyro_sg.diagnostics.stein_runs import stein_arrays, stein_of
from numpyro_sg.diagnostics.validation import as_draws, check_finite, check_kernel_args
from numpyro_sg.infer.laplace import laplace_scales


def resolve_run_scales(preconditioner, stein, scores: ModelScores | None = None):
    """Per-coordinate KSD scales of a run: ``"sd"`` pools the chains; ``"laplace"`` needs the model.

    As :func:`numpyro_sg.diagnostics.scales.resolve_scales` on the pooled unconstrained draws
    of the ``stein`` group, except ``"laplace"``: the Laplace scales of the model's full-data
    posterior (:func:`numpyro_sg.infer.laplace.laplace_scales`, started at the pooled mean).

    :param preconditioner: ``"sd"``, ``"laplace"``, an array of scales or ``None``.
    :param stein: the run's ``stein`` dataset.
    :param scores: the model's :class:`ModelScores` (needed for ``"laplace"`` only).
    :return: float64 array (dim,), or ``None`` (no preconditioning).
    :raises ValueError: for ``"laplace"`` without ``scores``, or an invalid preconditioner.

    **Example:**

    >>> import numpy as np
    >>> import xarray as xr
    >>> from numpyro_sg.diagnostics.model_scores import resolve_run_scales
    >>> dims = ("chain", "draw", "coordinate")
    >>> x = np.array([[[0.0], [2.0]], [[4.0], [6.0]]])  # 2 chains of 2 draws, one coordinate
    >>> stein = xr.Dataset({"unconstrained": (dims, x), "score": (dims, -x)})
    >>> resolve_run_scales("sd", stein).round(4).tolist()  # sd of 0, 2, 4, 6
    [2.2361]
    """
    pooled, _ = stein_arrays(stein, pooled=True)
    if isinstance(preconditioner, str) and preconditioner == "laplace":
        if scores is None:
            raise ValueError("preconditioner='laplace' needs the model (pass model=…).")
        if pooled.shape[1] != scores.dim:
            raise ValueError("preconditioner='laplace' needs every coordinate (its mode search "
                             "runs on the whole model); with var_names use 'sd' or an array.")
        return np.asarray(laplace_scales(scores.score_fn(), pooled.mean(axis=0)))
    return resolve_scales(preconditioner, pooled)


def ksd_of_stein(stein, scales, *, per_coordinate=False, **options):
    """Pooled KSD of a ``stein`` group with fixed ``scales`` (``None``: raw); per chain, and
    all three at once, :func:`chain_ksds`.

    :param stein: a ``stein`` dataset (:func:`stein_dataset`).
    :param scales: per-coordinate scales (d,) used as the preconditioner, or ``None``.
    :param bool per_coordinate: the per-coordinate terms
        (:func:`~numpyro_sg.diagnostics.ksd.ksd_per_coordinate`) instead of the KSD.
    :param options: further options of :func:`numpyro_sg.diagnostics.ksd.ksd` (``c``,
        ``beta``, ``statistic``, ``thin``, ``block_size``).
    :return: a float, or an array (d,).

    **Example:**

    >>> import numpy as np
    >>> import xarray as xr
    >>> from numpyro_sg.diagnostics.model_scores import ksd_of_stein
    >>> dims = ("chain", "draw", "coordinate")
    >>> x = np.random.default_rng(0).normal(size=(2, 500, 3))  # 2 chains of N(0, I) draws
    >>> stein = xr.Dataset({"unconstrained": (dims, x), "score": (dims, -x)})
    >>> ksd_of_stein(stein, np.ones(3), per_coordinate=True).shape
    (3,)
    """
    fn = ksd_per_coordinate if per_coordinate else ksd
    x, s = stein_arrays(stein, pooled=True)
    return fn(x, scores=s, preconditioner=scales, **options)


def chain_ksds(stein, scales, kept=None, *, seconds=None, c=1.0, beta=-0.5, statistic="v",
               block_size=None):
    """Per-chain KSDs, the pooled KSD of the ``kept`` chains and its per-coordinate terms, from
    one pass over the pairs of draws (:func:`~numpyro_sg.diagnostics.ksd_blocks.chain_pair_sums`):
    one KSD per chain, and the pooled KSD and its per-coordinate terms of :func:`ksd_of_stein`
    (up to float32 rounding), at the cost of the last alone.

    :param stein: a ``stein`` dataset (:func:`stein_dataset`).
    :param scales: per-coordinate scales (d,) used as the preconditioner, or ``None``.
    :param kept: positions of the chains pooled (``None``: all).
    :param seconds: a time budget for the pass, or ``None``.
    :param c, beta, statistic, block_size: options of :func:`numpyro_sg.diagnostics.ksd.ksd`.
    :return: ``((per_chain (chains,), pooled float, per_coordinate (d,)), projected)``: the
        first ``None`` when the pass was projected past ``seconds``, and its projected seconds.

    **Example:**

    >>> import numpy as np
    >>> import xarray as xr
    >>> from numpyro_sg.diagnostics.run_discrepancies import chain_ksds
    >>> x = np.random.default_rng(0).normal(size=(2, 500, 3))  # 2 chains of N(0, I) draws
    >>> stein = xr.Dataset({"unconstrained": (("chain", "draw", "coordinate"), x),
    ...                     "score": (("chain", "draw", "coordinate"), -x)})
    >>> (per_chain, pooled, per_coordinate), _ = chain_ksds(stein, np.ones(3))
    >>> per_chain.shape, per_coordinate.shape, bool(pooled < per_chain.max())
    ((2,), (3,), True)
    """
    check_kernel_args(c, beta, statistic)
    x, s = stein_arrays(stein)
    as_draws(x.reshape(-1, x.shape[-1]), "x")
    check_finite(s, "scores")
    C, T, d = x.shape
    x, s = precondition(x.reshape(C * T, d), s.reshape(C * T, d), scales)
    sums, projected = chain_pair_sums(x.reshape(C, T, d), s.reshape(C, T, d), c=c, beta=beta,
                                      exclude_diagonal=statistic == "u",
                                      block_size=check_block(block_size), seconds=seconds)
    if sums is None:
        return None, projected
    kept = list(range(C)) if kept is None else list(kept)
    per_chain = signed_sqrt(normalise(np.einsum("ccj->c", sums), T, statistic))
    pooled_terms = normalise(sums[np.ix_(kept, kept)].sum(axis=(0, 1)), len(kept) * T, statistic)
    pooled = float(signed_sqrt(pooled_terms.sum()))
    return (per_chain, pooled, signed_sqrt(pooled_terms)), projected


def _scaled_stein(obj, model, model_args, model_kwargs, preconditioner, max_draws, var_names):
    """A run's ``stein`` dataset (:func:`stein_of`) and its scales (:func:`resolve_run_scales`)."""
    stein, scores = stein_of(obj, model, model_args, model_kwargs, max_draws, var_names)
    return stein, resolve_run_scales(preconditioner, stein, scores)


def ksd_of_run(obj, *, model=None, model_args=None, model_kwargs=None, preconditioner="sd",
               max_draws: int | None = 1000, per_coordinate: bool = False, var_names=None,
               **options):
    """Pooled KSD of an ``MCMC`` run or ``InferenceData``, on the unconstrained space.

    Scores are full-data (every subsample plate switched to all of its data).  An
    ``InferenceData`` made by :func:`numpyro_sg.to_inference_data` carries its scored draws
    (``stein`` group) and needs no model; otherwise pass ``model=`` and its arguments.  With
    ``preconditioner="sd"`` the scale is the sd of the pooled draws of all chains.

    :param obj: an ``MCMC`` object after ``run``, or an ``InferenceData``.
    :param model: the model (default: the ``MCMC``'s own, or none: use the stored ``stein``
        group).
    :param model_args: its positional arguments (default: those the ``MCMC`` ran with).
    :param model_kwargs: its keyword arguments (default: those the ``MCMC`` ran with).
    :param preconditioner: ``"sd"`` (default), ``"laplace"`` (needs the model), an array of
        scales or ``None``: see :func:`resolve_run_scales`.
    :param max_draws: at most this many evenly spaced draws per chain are scored when the
        scores are computed from the model (``None``: all).
    :param bool per_coordinate: the per-coordinate terms (an array) instead of the KSD.
    :param var_names: sites whose coordinates enter the KSD (a name or a list; default all).
    :param options: options of :func:`numpyro_sg.diagnostics.ksd.ksd` (``c``, ``beta``,
        ``statistic``, ``thin``, ``block_size``).
    :return: float (an array (d,) when ``per_coordinate``).

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import ksd_of_run
    >>> X, y, theta = simulate_logistic_regression(num_data=500, dim=3)
    >>> draws = theta + 0.1 * np.random.default_rng(0).normal(size=(2, 200, 3))
    >>> idata = from_dict(posterior={"theta": draws})
    >>> value = ksd_of_run(idata, model=logistic_regression_model, model_args=(X, y))
    >>> bool(value > 0)
    True
    """
    stein, scales = _scaled_stein(obj, model, model_args, model_kwargs, preconditioner, max_draws,
                                  var_names)
    return ksd_of_stein(stein, scales, per_coordinate=per_coordinate, **options)


def fssd_of_run(obj, *, model=None, model_args=None, model_kwargs=None, preconditioner="sd",
                max_draws: int | None = 1000, var_names=None, **options):
    """FSSD² of an ``MCMC`` run or ``InferenceData``, on the unconstrained space.

    The run's scored draws are found and preconditioned as by :func:`ksd_of_run` (same
    ``model``, ``model_args``, ``model_kwargs``, ``preconditioner``, ``max_draws`` and
    ``var_names``), pooled
    over the chains, and passed to :func:`numpyro_sg.diagnostics.fssd.fssd`.

    :param options: options of :func:`numpyro_sg.diagnostics.fssd.fssd` (``num_locations``,
        ``optimize``, ``rng_key``, …).
    :return: float FSSD².

    **Example:** two runs compared on one scale (fixed scales, so both use the same
    preconditioner); the run shifted by 1 in every coordinate scores far worse.

    >>> import numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import fssd_of_run
    >>> X, y, theta = simulate_logistic_regression(num_data=500, dim=3)
    >>> def run(shift):
    ...     noise = 0.1 * np.random.default_rng(0).normal(size=(1, 200, 3))
    ...     return from_dict(posterior={"theta": theta + shift + noise})
    >>> options = dict(model=logistic_regression_model, model_args=(X, y), preconditioner=np.full(3, 0.1))
    >>> bool(fssd_of_run(run(0.0), **options) < fssd_of_run(run(1.0), **options))
    True
    """
    stein, scales = _scaled_stein(obj, model, model_args, model_kwargs, preconditioner, max_draws,
                                  var_names)
    x, s = stein_arrays(stein, pooled=True)
    return fssd(x, scores=s, preconditioner=scales, **options)
