r"""Full-data scores of a NumPyro model, and KSD / FSSD of a run.

The Stein diagnostics need, for each scored draw, the point in NumPyro's unconstrained space
(where the kernels move) and the score there,

.. math:: s(z) = \nabla_z \log \pi(z) = -\nabla_z U(z),

with :math:`U` NumPyro's potential energy of the model run over *all* of its data (every
subsample plate switched to ``arange(N)``, so the score is exact, not a mini-batch estimate).
Discrete latent sites (model indicators) are held at each draw's value: the score is that of
the continuous sites given the indicators.

:class:`ModelScores` does this for one model and data set; :func:`stein_dataset` picks evenly
thinned draws per chain and scores them.  The result is stored in the ``stein`` group of the
``InferenceData`` made by :func:`numpyro_sg.to_inference_data` and
:func:`numpyro_sg.nuts_reference`, so KSD with another preconditioner, per-coordinate KSD and
comparisons on a common scale are recomputed later without the model.

This is the run-aware layer of the diagnostics: it reads runs (``MCMC`` objects and
``InferenceData``) and hands arrays to the array-only :mod:`numpyro_sg.diagnostics.ksd` and
:mod:`numpyro_sg.diagnostics.fssd`.  :func:`numpyro_sg.ksd` and :func:`numpyro_sg.fssd`
(:mod:`numpyro_sg.diagnostics.stein`) dispatch a run to :func:`ksd_of_run` and
:func:`fssd_of_run`.
"""

from __future__ import annotations

import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.util import potential_energy, unconstrain_fn

from numpyro_sg.diagnostics.fssd import fssd
from numpyro_sg.diagnostics.ksd import ksd, ksd_per_coordinate
from numpyro_sg.diagnostics.scales import resolve_scales
from numpyro_sg.infer.laplace import laplace_scales
from numpyro_sg.infer.minibatch import discover_plates, full_data

__all__ = [
    "STEIN_GROUP",
    "full_data_model",
    "thin_indices",
    "ModelScores",
    "run_samples",
    "run_model",
    "stein_dataset",
    "stein_arrays",
    "stein_of",
    "resolve_run_scales",
    "ksd_of_stein",
    "ksd_of_run",
    "fssd_of_run",
]

STEIN_GROUP = "stein"


def full_data_model(model, model_args=(), model_kwargs=None):
    """``model`` with every subsample plate run over all of its data (the model if none).

    Each subsample plate (found by :func:`numpyro_sg.infer.minibatch.discover_plates` on the
    given arguments) is switched to the indices ``arange(N)``, so the model's log density is
    the exact full-data one: what the Stein scores and the NUTS reference need.

    :param model: a NumPyro model.
    :param model_args: its positional arguments (the data).
    :param dict model_kwargs: its keyword arguments.
    :return: a model callable with the same arguments.

    **Example:**

    >>> from numpyro import handlers
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import full_data_model
    >>> X, y, _ = simulate_logistic_regression(num_data=500, dim=3)
    >>> model = full_data_model(logistic_regression_model, (X, y, 50))
    >>> handlers.trace(handlers.seed(model, 0)).get_trace(X, y, 50)["y"]["value"].shape
    (500,)
    """
    model_kwargs = {} if model_kwargs is None else model_kwargs
    try:
        plates = discover_plates(model, model_args, model_kwargs, check_data=False)
    except ValueError as err:
        if "subsample plate" not in str(err):
            raise
        return model
    return full_data(model, plates)


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


class ModelScores:
    """Unconstrained coordinates and full-data scores of a NumPyro model's latent sites.

    :param model: the NumPyro model (subsample plates are switched to their full data).
    :param model_args: positional arguments of the model (the data).
    :param model_kwargs: keyword arguments of the model.
    :param int block_size: number of draws scored per vectorised evaluation (memory is
        O(block_size · N) for a model with N data).

    Attributes: ``continuous_sites`` (names, in flat order), ``discrete_sites``,
    ``coordinate_names`` (one per flat unconstrained coordinate, e.g. ``"theta[3]"``),
    ``coordinate_sites`` (the site of each coordinate) and ``dim`` (their number).

    **Example:** full-data scores of a logistic regression with a N(0, 10²) prior, where
    ∇ log π(θ) = Xᵀ(y − σ(Xθ)) − θ/100.

    >>> import numpy as np
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import ModelScores
    >>> X, y, _ = simulate_logistic_regression(num_data=500, dim=3)
    >>> scores = ModelScores(logistic_regression_model, (X, y))
    >>> scores.coordinate_names
    ['theta[0]', 'theta[1]', 'theta[2]']
    >>> theta = np.array([0.5, -0.5, 1.0])
    >>> expected = X.T @ (y - 1 / (1 + np.exp(-X @ theta))) - theta / 100
    >>> bool(np.allclose(scores.score(theta[None])[0], expected, rtol=1e-3))
    True
    """

    def __init__(self, model: Callable, model_args=(), model_kwargs=None, block_size: int = 64):
        self.model_args = tuple(model_args)
        self.model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        self.model = full_data_model(model, self.model_args, self.model_kwargs)
        self.block_size = int(block_size)
        sites = self._static_sites()
        self.discrete_sites = sorted(n for n, info in sites.items() if info["discrete"])
        # sorted: ravel_pytree flattens a dict in sorted-key order
        self.continuous_sites = sorted(n for n, info in sites.items() if not info["discrete"])
        if not self.continuous_sites:
            raise ValueError("the model has no continuous latent site to compute a KSD for.")
        self._site_shapes = {n: sites[n]["shape"] for n in self.continuous_sites}
        example = {n: jnp.zeros(sites[n]["unconstrained_shape"]) for n in self.continuous_sites}
        flat, self._unravel = ravel_pytree(example)  # shapes only; see unconstrain()
        self.dim = int(flat.size)
        self.coordinate_names, self.coordinate_sites = _flat_names(example)
        self._unconstrain_block = jax.jit(jax.vmap(self._unconstrain_one))
        self._score_block = jax.jit(jax.vmap(lambda b, d: self._score_one(b["x"], d)))

    def _static_sites(self):
        """Name → {shape, discrete, unconstrained_shape} of every latent sample site (one cheap trace)."""
        out = {}

        def record():
            tr = handlers.trace(handlers.seed(self.model, 0)).get_trace(
                *self.model_args, **self.model_kwargs
            )
            for name, site in tr.items():
                if site["type"] == "sample" and not site["is_observed"]:
                    shape = tuple(jnp.shape(site["value"]))
                    discrete = bool(site["fn"].support.is_discrete)
                    out[name] = {
                        "shape": shape,
                        "discrete": discrete,
                        "unconstrained_shape": None
                        if discrete
                        else tuple(biject_to(site["fn"].support).inverse_shape(shape)),
                    }
            return 0

        jax.eval_shape(record)
        return out

    # -- coordinates -----------------------------------------------------------------------
    def split(self, samples: dict):
        """``(continuous, discrete)`` dicts of the model's latent sites from a dict of draws."""
        missing = [s for s in self.continuous_sites + self.discrete_sites if s not in samples]
        if missing:
            raise KeyError(f"the draws lack the latent site(s) {missing} of the model.")
        for name in self.continuous_sites:
            shape = self._site_shapes[name]
            if np.shape(samples[name])[1:] != shape:
                raise ValueError(
                    f"site {name!r}: draws have shape {np.shape(samples[name])[1:]} per draw, "
                    f"the model has {shape}."
                )
        continuous = {n: np.asarray(samples[n]) for n in self.continuous_sites}
        discrete = {n: np.asarray(samples[n]) for n in self.discrete_sites}
        return continuous, discrete

    def unconstrain(self, samples: dict) -> np.ndarray:
        """Flat unconstrained coordinates (S, dim) of constrained draws ``{site: (S, …)}``."""
        continuous, discrete = self.split(samples)
        return self._blocked(self._unconstrain_block, continuous, discrete)

    def _unconstrain_one(self, constrained, discrete):
        """Flat unconstrained point of one draw (dependent supports handled by NumPyro)."""
        model = handlers.substitute(self.model, data=discrete) if discrete else self.model
        with warnings.catch_warnings():  # NumPyro's notice about enumerating discrete sites
            warnings.filterwarnings("ignore", "Some algorithms will automatically enumerate")
            z = unconstrain_fn(model, self.model_args, self.model_kwargs, constrained)
        return ravel_pytree({n: z[n] for n in self.continuous_sites})[0]

    # -- scores ----------------------------------------------------------------------------
    def _score_one(self, flat, discrete):
        model = handlers.substitute(self.model, data=discrete) if discrete else self.model
        grad = jax.grad(
            lambda x: -potential_energy(model, self.model_args, self.model_kwargs, self._unravel(x))
        )
        return grad(flat)

    def score(self, x: np.ndarray, discrete: dict | None = None) -> np.ndarray:
        """Full-data scores ∇ log π (S, dim) at unconstrained points ``x`` (S, dim).

        :param discrete: ``{site: array (S, …)}`` values of the discrete latent sites, held
            fixed at each point.
        """
        discrete = {} if discrete is None else {k: np.asarray(v) for k, v in discrete.items()}
        missing = [s for s in self.discrete_sites if s not in discrete]
        if missing:
            raise KeyError(f"the draws lack the discrete latent site(s) {missing}.")
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (S, {self.dim}); got {x.shape}.")
        return self._blocked(self._score_block, {"x": x}, discrete)

    def score_fn(self) -> Callable:
        """``flat (dim,) → score (dim,)`` for models without discrete latent sites."""
        if self.discrete_sites:
            raise ValueError(
                f"the model has discrete latent sites {self.discrete_sites}; a single score "
                "function of the continuous coordinates is not defined."
            )
        return lambda flat: self._score_one(flat, {})

    def _blocked(self, fn, batched: dict, discrete: dict):
        """``fn(batched, discrete)`` (jitted, vmapped) over rows, ``block_size`` rows at a time."""
        arrays = {**{("b", k): v for k, v in batched.items()},
                  **{("d", k): v for k, v in discrete.items()}}
        num = next(iter(arrays.values())).shape[0]
        out = []
        for start in range(0, num, self.block_size):
            stop = min(start + self.block_size, num)
            pad = self.block_size - (stop - start)  # fixed block shape: one compilation
            block = {
                k: np.pad(v[start:stop], [(0, pad)] + [(0, 0)] * (v.ndim - 1), mode="edge")
                for k, v in arrays.items()
            }
            b = {k[1]: v for k, v in block.items() if k[0] == "b"}
            d = {k[1]: v for k, v in block.items() if k[0] == "d"}
            out.append(np.asarray(fn(b, d))[: stop - start])
        return np.concatenate(out, axis=0)


def _flat_names(example: dict):
    """Coordinate names ``site[i, j]`` in ``ravel_pytree`` order, and the site of each."""
    names, sites = [], []
    for name in sorted(example):  # ravel_pytree flattens a dict in sorted-key order
        shape = jnp.shape(example[name])
        if shape == ():
            names.append(name)
            sites.append(name)
            continue
        for idx in np.ndindex(*shape):
            names.append(f"{name}[{', '.join(str(i) for i in idx)}]")
            sites.append(name)
    return names, sites


# -- draws of a run ------------------------------------------------------------------------
def run_samples(obj) -> dict:
    """Constrained draws ``{site: (chains, draws, …)}`` of an ``MCMC`` or ``InferenceData``.

    :param obj: a NumPyro ``MCMC`` object after ``run``, or an ``InferenceData`` (its
        ``posterior`` group).
    :return: dict of numpy arrays with leading dims (chain, draw).
    :raises TypeError: for anything else.

    **Example:**

    >>> import arviz as az
    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.model_scores import run_samples
    >>> idata = az.from_dict(posterior={"theta": np.zeros((2, 100, 3))})
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

    >>> import arviz as az
    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.model_scores import run_model
    >>> idata = az.from_dict(posterior={"theta": np.zeros((1, 10, 3))})
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


def stein_dataset(samples: dict, scores: ModelScores, max_draws: int | None = 1000):
    """The ``stein`` group: evenly thinned draws per chain, unconstrained, with their scores.

    :param samples: constrained draws ``{site: (chains, draws, …)}``.
    :param scores: the model's :class:`ModelScores`.
    :param max_draws: at most this many draws per chain (``None``: all).
    :return: an ``xarray.Dataset`` with ``unconstrained`` and ``score`` of dims
        ``(chain, draw, coordinate)`` (``draw`` holds the indices of the kept draws).

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
    first = samples[scores.continuous_sites[0]]
    num_chains, num_draws = first.shape[:2]
    keep = thin_indices(num_draws, max_draws)
    flat = {k: v[:, keep].reshape((-1,) + v.shape[2:]) for k, v in samples.items()}
    continuous, discrete = scores.split(flat)
    x = scores.unconstrain({**continuous, **discrete})
    s = scores.score(x, discrete)
    shape = (num_chains, len(keep), scores.dim)
    dims = ("chain", "draw", "coordinate")
    coords = {
        "chain": np.arange(num_chains),
        "draw": keep,
        "coordinate": scores.coordinate_names,
        "site": ("coordinate", scores.coordinate_sites),
    }
    return xr.Dataset(
        {"unconstrained": (dims, x.reshape(shape)), "score": (dims, s.reshape(shape))},
        coords=coords,
    )


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


def stein_of(obj, model=None, model_args=None, model_kwargs=None, max_draws: int | None = 1000):
    """A run's ``stein`` dataset (stored, or computed from the model) and its ModelScores.

    Without a model (neither ``model=`` nor an ``MCMC``'s own), the ``stein`` group stored by
    :func:`numpyro_sg.to_inference_data` is used and the ModelScores is ``None``; with one,
    the run's draws are thinned and scored afresh (:func:`stein_dataset`).

    :param obj: an ``MCMC`` object or an ``InferenceData``.
    :param model: the model (default: the ``MCMC``'s own, see :func:`run_model`).
    :param model_args: its positional arguments (default: those the ``MCMC`` ran with).
    :param model_kwargs: its keyword arguments (default: those the ``MCMC`` ran with).
    :param max_draws: at most this many draws per chain are scored (``None``: all).
    :return: ``(stein, scores)``: an ``xarray.Dataset`` and a :class:`ModelScores` or ``None``.
    :raises ValueError: if there is neither a model nor a stored ``stein`` group.

    **Example:**

    >>> import arviz as az
    >>> import numpy as np
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import stein_of
    >>> X, y, _ = simulate_logistic_regression(num_data=500, dim=3)
    >>> idata = az.from_dict(posterior={"theta": np.zeros((2, 100, 3))})
    >>> stein, scores = stein_of(idata, logistic_regression_model, (X, y), max_draws=20)
    >>> dict(stein.sizes), scores.dim
    ({'chain': 2, 'draw': 20, 'coordinate': 3}, 3)
    """
    model, model_args, model_kwargs = run_model(obj, model, model_args, model_kwargs)
    if model is None:
        if hasattr(obj, "groups") and STEIN_GROUP in obj.groups():
            return obj[STEIN_GROUP], None
        raise ValueError(
            "this InferenceData has no 'stein' group (scored draws); pass model=, model_args= "
            "(and model_kwargs=) so the full-data scores can be computed."
        )
    scores = ModelScores(model, model_args, model_kwargs)
    return stein_dataset(run_samples(obj), scores, max_draws), scores


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
        return np.asarray(laplace_scales(scores.score_fn(), pooled.mean(axis=0)))
    return resolve_scales(preconditioner, pooled)


def ksd_of_stein(stein, scales, *, per_chain=False, per_coordinate=False, **options):
    """KSD of a ``stein`` group with fixed ``scales`` (``None``: raw), pooled or per chain.

    :param stein: a ``stein`` dataset (:func:`stein_dataset`).
    :param scales: per-coordinate scales (d,) used as the preconditioner, or ``None``.
    :param bool per_chain: one KSD per chain (an array (chains,)) instead of the pooled one.
    :param bool per_coordinate: the per-coordinate terms
        (:func:`~numpyro_sg.diagnostics.ksd.ksd_per_coordinate`) instead of the KSD.
    :param options: further options of :func:`numpyro_sg.diagnostics.ksd.ksd` (``c``,
        ``beta``, ``statistic``, ``thin``, ``block_size``).
    :return: a float, or an array (chains,), (d,) or (chains, d).

    **Example:**

    >>> import numpy as np
    >>> import xarray as xr
    >>> from numpyro_sg.diagnostics.model_scores import ksd_of_stein
    >>> dims = ("chain", "draw", "coordinate")
    >>> x = np.random.default_rng(0).normal(size=(2, 500, 3))  # 2 chains of N(0, I) draws
    >>> stein = xr.Dataset({"unconstrained": (dims, x), "score": (dims, -x)})
    >>> ksd_of_stein(stein, np.ones(3), per_chain=True).shape
    (2,)
    """
    fn = ksd_per_coordinate if per_coordinate else ksd
    if per_chain:
        x, s = stein_arrays(stein)
        return np.array([fn(xc, scores=sc, preconditioner=scales, **options) for xc, sc in zip(x, s)])
    x, s = stein_arrays(stein, pooled=True)
    return fn(x, scores=s, preconditioner=scales, **options)


def _scaled_stein(obj, model, model_args, model_kwargs, preconditioner, max_draws):
    """A run's ``stein`` dataset (:func:`stein_of`) and its scales (:func:`resolve_run_scales`)."""
    stein, scores = stein_of(obj, model, model_args, model_kwargs, max_draws)
    return stein, resolve_run_scales(preconditioner, stein, scores)


def ksd_of_run(obj, *, model=None, model_args=None, model_kwargs=None, preconditioner="sd",
               max_draws: int | None = 1000, per_coordinate: bool = False, **options):
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
    :param options: options of :func:`numpyro_sg.diagnostics.ksd.ksd` (``c``, ``beta``,
        ``statistic``, ``thin``, ``block_size``).
    :return: float (an array (d,) when ``per_coordinate``).

    **Example:**

    >>> import arviz as az
    >>> import numpy as np
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import ksd_of_run
    >>> X, y, theta = simulate_logistic_regression(num_data=500, dim=3)
    >>> draws = theta + 0.1 * np.random.default_rng(0).normal(size=(2, 200, 3))
    >>> idata = az.from_dict(posterior={"theta": draws})
    >>> value = ksd_of_run(idata, model=logistic_regression_model, model_args=(X, y))
    >>> bool(value > 0)
    True
    """
    stein, scales = _scaled_stein(obj, model, model_args, model_kwargs, preconditioner, max_draws)
    return ksd_of_stein(stein, scales, per_coordinate=per_coordinate, **options)


def fssd_of_run(obj, *, model=None, model_args=None, model_kwargs=None, preconditioner="sd",
                max_draws: int | None = 1000, **options):
    """FSSD² of an ``MCMC`` run or ``InferenceData``, on the unconstrained space.

    The run's scored draws are found and preconditioned as by :func:`ksd_of_run` (same
    ``model``, ``model_args``, ``model_kwargs``, ``preconditioner`` and ``max_draws``), pooled
    over the chains, and passed to :func:`numpyro_sg.diagnostics.fssd.fssd`.

    :param options: options of :func:`numpyro_sg.diagnostics.fssd.fssd` (``num_locations``,
        ``optimize``, ``rng_key``, …).
    :return: float FSSD².

    **Example:** two runs compared on one scale (fixed scales, so both use the same
    preconditioner); the run shifted by 1 in every coordinate scores far worse.

    >>> import arviz as az
    >>> import numpy as np
    >>> from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    >>> from numpyro_sg.diagnostics.model_scores import fssd_of_run
    >>> X, y, theta = simulate_logistic_regression(num_data=500, dim=3)
    >>> def run(shift):
    ...     noise = 0.1 * np.random.default_rng(0).normal(size=(1, 200, 3))
    ...     return az.from_dict(posterior={"theta": theta + shift + noise})
    >>> options = dict(model=logistic_regression_model, model_args=(X, y), preconditioner=np.full(3, 0.1))
    >>> bool(fssd_of_run(run(0.0), **options) < fssd_of_run(run(1.0), **options))
    True
    """
    stein, scales = _scaled_stein(obj, model, model_args, model_kwargs, preconditioner, max_draws)
    x, s = stein_arrays(stein, pooled=True)
    return fssd(x, scores=s, preconditioner=scales, **options)
