"""The draws of a run and its ``stein`` group: evenly thinned draws, unconstrained, with
their full-data scores (:class:`~numpyro_sg.diagnostics.full_data_scores.ModelScores`).

The ``stein`` group is stored in the ``InferenceData`` made by
:func:`numpyro_sg.to_inference_data` and :func:`numpyro_sg.nuts_reference`, so KSD with
another preconditioner, per-coordinate KSD and comparisons on a common scale are recomputed
later without the model.
"""

from __future__ import annotations

import time

import numpy as np
import xarray as xr

from numpyro_sg.arviz_compat import get_group, has_group
from numpyro_sg.diagnostics.full_data_scores import ModelScores
from numpyro_sg.infer.progress import progress_steps
from numpyro_sg.infer.sharding import agreed_by_all

#: the name of the ``InferenceData`` group of scored draws
STEIN_GROUP = "stein"


def thin_indices(num_draws: int, max_draws: int | None) -> np.ndarray:
    """At most ``max_draws`` evenly spaced draw indices in ``[0, num_draws)``, last one kept.

    :param int num_draws: number of draws per chain.
    :param max_draws: the most indices to keep (at least 2), or ``None`` for all.
    :return: sorted int array of indices, starting with 0 and ending with ``num_draws − 1``.

    **Example:**

    >>> from numpyro_sg.diagnostics.model_scores import thin_indices
    >>> thin_indices(10, 4).tolist()
    [0, 3, 6, 9]
    """
    if max_draws is None or max_draws >= num_draws:
        return np.arange(num_draws)
    if max_draws < 2:
        raise ValueError(f"KSD needs at least 2 draws per chain; got max_draws={max_draws}.")
    return np.unique(np.round(np.linspace(0, num_draws - 1, max_draws)).astype(int))


def spread_order(n: int) -> np.ndarray:
    """A permutation of ``range(n)`` whose every prefix is spread over the whole range (the van
    der Corput, or bit-reversal, order): draws scored in this order and stopped early still come
    from the whole chain, not its start.

    >>> from numpyro_sg.diagnostics.stein_runs import spread_order
    >>> spread_order(8).tolist(), spread_order(6).tolist()
    ([0, 4, 2, 6, 1, 5, 3, 7], [0, 4, 2, 1, 5, 3])
    """
    bits = max(1, int(n - 1).bit_length())
    codes = np.arange(2**bits)
    reversed_codes = np.zeros_like(codes)
    for b in range(bits):
        reversed_codes |= ((codes >> b) & 1) << (bits - 1 - b)
    return reversed_codes[reversed_codes < n]



def run_samples(obj) -> dict:
    """Constrained draws ``{site: (chains, draws, …)}`` of an ``MCMC`` or ``InferenceData``.

    :param obj: a NumPyro ``MCMC`` object after ``run``, or an ``InferenceData`` (its
        ``posterior`` group).
    :return: dict of numpy arrays with leading dims (chain, draw).
    :raises TypeError: for anything else.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.diagnostics.model_scores import run_samples
    >>> idata = from_dict(posterior={"theta": np.zeros((2, 100, 3))})
    >>> {k: v.shape for k, v in run_samples(idata).items()}
    {'theta': (2, 100, 3)}
    """
    if hasattr(obj, "posterior"):
        post = obj.posterior
        return {name: np.asarray(post[name].values) for name in post.data_vars}
    if hasattr(obj, "get_samples"):
        return {k: np.asarray(v) for k, v in obj.get_samples(group_by_chain=True).items()}
    raise TypeError(
        f"expected an MCMC object or an arviz.InferenceData, got {type(obj).__name__}."
    )


def run_model(obj, model=None, model_args=None, model_kwargs=None):
    """``(model, args, kwargs)`` of a run: the ones given, else those an ``MCMC`` ran with.

    :param obj: an ``MCMC`` object or an ``InferenceData``.
    :param model: the model, or ``None`` for the ``MCMC``'s own (``obj.sampler.model``).
    :param model_args: the model's positional arguments, or ``None`` for those the ``MCMC``
        ran with.
    :param model_kwargs: its keyword arguments, or ``None`` for those the ``MCMC`` ran with.
    :return: ``(model, model_args, model_kwargs)`` (a tuple and a dict); ``(None, (), {})``
        when no model is known (an ``InferenceData`` without ``model=``).

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.diagnostics.model_scores import run_model
    >>> idata = from_dict(posterior={"theta": np.zeros((1, 10, 3))})
    >>> run_model(idata)
    (None, (), {})
    """
    if model is None and hasattr(obj, "sampler"):
        model = obj.sampler.model
    if model is None:
        return None, (), {}
    if model_args is None:
        model_args = getattr(obj, "_args", ())
    if model_kwargs is None:
        model_kwargs = getattr(obj, "_kwargs", {})
    return model, tuple(model_args), dict(model_kwargs or {})


def stein_dataset(samples: dict, scores: ModelScores, max_draws: int | None = 1000,
                  var_names=None, *, seconds: float | None = None, min_draws: int = 2):
    """The ``stein`` group: evenly thinned draws per chain, unconstrained, with their scores.

    The draws are unconstrained and scored ``scores.block_size`` at a time, and only the
    coordinates of ``var_names`` are kept from each block: memory O(block · d + draws ·
    kept coordinates), so a model with 10⁵ parameters can be diagnosed on a few sites.  The
    scores of kept coordinates are components of the full score ∇ log π at the whole draw, so
    the Stein identity E_π[s_j(θ)·f(θ_S) + ∂_j f(θ_S)] = 0 (j in the kept set S) still holds
    and the KSD of the kept coordinates is zero for exact draws.

    With a time budget (``seconds``) the thinned draws are scored in :func:`spread_order` and
    scoring stops at the first block past the budget with ``min_draws`` per chain scored: the
    kept draws still span every chain, and their number depends on the machine's speed.

    :param samples: constrained draws ``{site: (chains, draws, …)}``.
    :param scores: the model's :class:`ModelScores`.
    :param max_draws: at most this many draws per chain (``None``: all).
    :param var_names: continuous latent sites whose coordinates to keep (a name or a list;
        ``None``: all).
    :param seconds: the time budget (``None``: score all ``max_draws``).
    :param int min_draws: the fewest draws per chain a budget keeps.
    :return: an ``xarray.Dataset`` with ``unconstrained`` and ``score`` of dims
        ``(chain, draw, coordinate)`` (``draw`` holds the indices of the kept draws) and the
        full-data ``log_density`` of each draw (dims ``(chain, draw)``).

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import ModelScores, stein_dataset
    >>> X, y, _ = simulate_logistic_regression(num_data=500, dim=3)
    >>> scores = ModelScores(logistic_regression_model, (X, y))
    >>> samples = {"theta": np.zeros((2, 100, 3))}  # 2 chains of 100 draws
    >>> stein = stein_dataset(samples, scores, max_draws=20)
    >>> dict(stein.sizes)
    {'chain': 2, 'draw': 20, 'coordinate': 3}
    """
    columns = scores.coordinate_indices(var_names)
    first = samples[scores.continuous_sites[0]]
    num_chains, num_draws = first.shape[:2]
    keep = thin_indices(num_draws, max_draws)
    if seconds is not None:
        keep = keep[spread_order(len(keep))]
    x, s, log_density = _scored_rows(samples, scores, keep, num_chains, columns, seconds, min_draws)
    kept = len(log_density) // num_chains  # rows position-major: back to (chain, draw) order
    order = np.argsort(keep[:kept])
    dims = ("chain", "draw", "coordinate")
    coords = {
        "chain": np.arange(num_chains),
        "draw": keep[:kept][order],
        "coordinate": [scores.coordinate_names[j] for j in columns],
        "site": ("coordinate", [scores.coordinate_sites[j] for j in columns]),
    }
    by_chain = lambda rows: np.swapaxes(rows.reshape((kept, num_chains) + rows.shape[1:])[order], 0, 1)  # noqa: E731
    return xr.Dataset(
        {"unconstrained": (dims, by_chain(x)), "score": (dims, by_chain(s)),
         "log_density": (dims[:2], by_chain(log_density))},
        coords=coords, attrs={"model_dim": scores.dim},
    )


def _scored_rows(samples, scores, keep, num_chains, columns, seconds, min_draws):
    """``(x, score, log_density)`` of the draws ``keep`` of every chain, position-major, a block
    at a time; with a budget (``seconds``), only the positions scored until it ran out."""
    start_time = time.perf_counter()
    draw_of, chain_of = np.repeat(keep, num_chains), np.tile(np.arange(num_chains), len(keep))
    x = np.empty((len(chain_of), len(columns)), samples[scores.continuous_sites[0]].dtype)
    s = np.empty_like(x)
    log_density = np.empty(len(chain_of), np.float64)
    done = len(chain_of)
    for start in progress_steps(range(0, len(chain_of), scores.block_size), "full-data scores"):
        rows = slice(start, start + scores.block_size)
        block = {k: np.asarray(v)[chain_of[rows], draw_of[rows]] for k, v in samples.items()}
        continuous, discrete = scores.split(block)
        xb = scores.unconstrain({**continuous, **discrete})
        log_density[rows], sb = scores.log_density_and_score(xb, discrete)
        x[rows], s[rows] = xb[:, columns], sb[:, columns]
        scored = min(start + scores.block_size, len(chain_of)) // num_chains  # complete positions
        if seconds is not None and scored >= min_draws and agreed_by_all(
                time.perf_counter() - start_time >= seconds, scores.model_args, scores.model_kwargs):
            done = scored * num_chains
            break
    return x[:done], s[:done], log_density[:done]


def select_sites(stein, var_names):
    """The coordinates of the sites ``var_names`` (a name or a list; ``None``: all) of a stored
    ``stein`` group.

    :raises KeyError: naming the sites the group has no coordinates of.
    """
    if var_names is None:
        return stein
    names = [var_names] if isinstance(var_names, str) else list(var_names)
    sites = np.asarray(stein["site"].values) if "site" in stein.coords else None
    if sites is None:
        raise KeyError("this stein group has no 'site' coordinate; var_names cannot be applied.")
    missing = [n for n in names if n not in set(sites.tolist())]
    if missing:
        raise KeyError(f"var_names: the stein group has no coordinates of {missing}; it holds "
                       f"{sorted(set(sites.tolist()))}.")
    return stein.isel(coordinate=np.flatnonzero(np.isin(sites, names)))


def stein_arrays(stein, pooled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(x, score)`` arrays (chains, draws, dim) of a ``stein`` group.

    :param stein: a ``stein`` dataset (:func:`stein_dataset`).
    :param bool pooled: pool the chains: arrays (chains · draws, dim) instead.
    :return: ``(x, score)``: unconstrained draws and their scores, numpy arrays.

    **Example:**

    >>> import numpy as np
    >>> import xarray as xr
    >>> from numpyro_sg.diagnostics.model_scores import stein_arrays
    >>> dims = ("chain", "draw", "coordinate")
    >>> stein = xr.Dataset({"unconstrained": (dims, np.zeros((2, 5, 3))),
    ...                     "score": (dims, np.ones((2, 5, 3)))})
    >>> x, s = stein_arrays(stein, pooled=True)
    >>> x.shape, s.shape
    ((10, 3), (10, 3))
    """
    x, s = np.asarray(stein["unconstrained"].values), np.asarray(stein["score"].values)
    if pooled:
        d = x.shape[-1]
        return x.reshape(-1, d), s.reshape(-1, d)
    return x, s


def stein_of(obj, model=None, model_args=None, model_kwargs=None, max_draws: int | None = 1000,
             var_names=None):
    """A run's ``stein`` dataset (stored, or computed from the model) and its ModelScores.

    Without a model (neither ``model=`` nor an ``MCMC``'s own), the ``stein`` group stored by
    :func:`numpyro_sg.to_inference_data` is used and the ModelScores is ``None``; with one,
    the run's draws are thinned and scored afresh (:func:`stein_dataset`).

    :param obj: an ``MCMC`` object or an ``InferenceData``.
    :param model: the model (default: the ``MCMC``'s own, see :func:`run_model`).
    :param model_args: its positional arguments (default: those the ``MCMC`` ran with).
    :param model_kwargs: its keyword arguments (default: those the ``MCMC`` ran with).
    :param max_draws: at most this many draws per chain are scored (``None``: all).
    :param var_names: keep only these sites' coordinates (:func:`stein_dataset`,
        :func:`select_sites`; ``None``: all).
    :return: ``(stein, scores)``: an ``xarray.Dataset`` and a :class:`ModelScores` or ``None``.
    :raises ValueError: if there is neither a model nor a stored ``stein`` group.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import stein_of
    >>> X, y, _ = simulate_logistic_regression(num_data=500, dim=3)
    >>> idata = from_dict(posterior={"theta": np.zeros((2, 100, 3))})
    >>> stein, scores = stein_of(idata, logistic_regression_model, (X, y), max_draws=20)
    >>> dict(stein.sizes), scores.dim
    ({'chain': 2, 'draw': 20, 'coordinate': 3}, 3)
    """
    model, model_args, model_kwargs = run_model(obj, model, model_args, model_kwargs)
    if model is None:
        if has_group(obj, STEIN_GROUP):
            return select_sites(get_group(obj, STEIN_GROUP), var_names), None
        raise ValueError(
            "this InferenceData has no 'stein' group (scored draws); pass model=, model_args= "
            "(and model_kwargs=) so the full-data scores can be computed."
        )
    scores = ModelScores(model, model_args, model_kwargs)
    return stein_dataset(run_samples(obj), scores, max_draws, var_names), scores
