r"""Full-data scores of a NumPyro model at unconstrained points: :class:`ModelScores`.

The Stein diagnostics need, for each scored draw, the point in NumPyro's unconstrained space
(where the kernels move) and the score there,

.. math:: s(z) = \nabla_z \log \pi(z) = -\nabla_z U(z),

with :math:`U` NumPyro's potential energy of the model run over *all* of its data (every
subsample plate switched to ``arange(N)`` by :func:`full_data_model`, so the score is exact,
not a mini-batch estimate).  Discrete latent sites (model indicators) are held at each
draw's value: the score is that of the continuous sites given the indicators.
"""

from __future__ import annotations

import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.util import potential_energy, unconstrain_fn

from numpyro_sg.infer.jit_data import jit_with_data
from numpyro_sg.infer.lapack_guard import map_over_draws
from numpyro_sg.infer.minibatch import discover_plates, full_data
from numpyro_sg.infer.progress import progress_steps
from numpyro_sg.infer.model_info import improper_to_uniform, structure_only

#: bytes of temporaries one block of scored draws may take: fewer draws per block above it
SCORE_MEMORY = 2**28


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
    return _full_data_and_plates(model, model_args, model_kwargs)[0]


def _full_data_and_plates(model, model_args, model_kwargs):
    """(:func:`full_data_model`, its subsample plates (``()`` when none))."""
    model_kwargs = {} if model_kwargs is None else model_kwargs
    try:
        plates = discover_plates(model, model_args, model_kwargs, check_data=False)
    except ValueError as err:
        if "subsample plate" not in str(err):
            raise
        return model, ()
    return full_data(model, plates), tuple(plates)



class ModelScores:
    """Unconstrained coordinates and full-data scores of a NumPyro model's latent sites.

    :param model: the NumPyro model (subsample plates are switched to their full data).
    :param model_args: positional arguments of the model (the data).
    :param model_kwargs: keyword arguments of the model.
    :param int block_size: the most draws scored per vectorised evaluation (memory is
        O(block_size · N) for a model with N data: fewer when one block's temporaries, from
        XLA's memory analysis, would exceed :data:`SCORE_MEMORY`).

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
        self.model, plates = _full_data_and_plates(model, self.model_args, self.model_kwargs)
        self.block_size = int(block_size)
        self._programs = {}  # (function, row shapes and dtypes) → (rows per block, program)
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
        # vmap over a block's draws, or lax.map where jaxlib's LAPACK could deadlock (lapack_guard);
        # the data are arguments, never constants (large data; arrays spanning several processes);
        # the programs are shared by every ModelScores of the same model, plates and sites (a
        # second conversion of a run on the same model compiles nothing new)
        key = ("model_scores", model, plates, tuple((n, sites[n]["shape"], sites[n]["unconstrained_shape"])
                                                    for n in self.continuous_sites), tuple(self.discrete_sites))
        full, names, unravel = self.model, tuple(self.continuous_sites), self._unravel  # (no self: no data)
        self._unconstrain_block = jit_with_data(lambda c, d, a, k: map_over_draws(
            lambda cc, dd: _unconstrain_one(full, names, cc, dd, a, k), c, d), self.model_args, self.model_kwargs,
            key=key + ("unconstrain",))
        self._score_block = jit_with_data(lambda b, d, a, k: map_over_draws(
            lambda bb, dd: _score_one(full, unravel, bb["x"], dd, a, k), b, d), self.model_args, self.model_kwargs,
            key=key + ("score",))

    def _static_sites(self):
        """Name → {shape, discrete, unconstrained_shape} of every latent sample site (one cheap trace)."""
        out = {}

        def record():
            seeded = handlers.seed(self.model, 0)  # improper priors have no draw: see trace_model
            with structure_only():
                tr = handlers.trace(handlers.substitute(seeded, substitute_fn=improper_to_uniform)).get_trace(
                    *self.model_args, **self.model_kwargs)
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

    def coordinate_indices(self, var_names=None) -> np.ndarray:
        """Flat indices of the coordinates of the continuous sites ``var_names`` (a name or a
        list, in flat order; ``None``: all ``dim``)."""
        if var_names is None:
            return np.arange(self.dim)
        names = [var_names] if isinstance(var_names, str) else list(var_names)
        unknown = [n for n in names if n not in self.continuous_sites]
        if unknown:
            raise KeyError(f"var_names: {unknown} are not continuous latent sites of the model; "
                           f"those are {self.continuous_sites}.")
        return np.flatnonzero(np.isin(np.asarray(self.coordinate_sites), names))

    def unconstrain(self, samples: dict) -> np.ndarray:
        """Flat unconstrained coordinates (S, dim) of constrained draws ``{site: (S, …)}``."""
        continuous, discrete = self.split(samples)
        return self._blocked(self._unconstrain_block, continuous, discrete)

    # -- scores ----------------------------------------------------------------------------
    def score(self, x: np.ndarray, discrete: dict | None = None) -> np.ndarray:
        """Full-data scores ∇ log π (S, dim) at unconstrained points ``x`` (S, dim).

        :param discrete: ``{site: array (S, …)}`` values of the discrete latent sites, held
            fixed at each point.
        """
        return self.log_density_and_score(x, discrete)[1]

    def log_density_and_score(self, x: np.ndarray, discrete: dict | None = None):
        """``(log π (S,), ∇ log π (S, dim))`` over the full data at unconstrained points ``x``
        (S, dim); log π is NumPyro's negative potential energy (Jacobians included, up to the
        model's normalising constant); ``discrete`` as in :meth:`score`."""
        discrete = {} if discrete is None else {k: np.asarray(v) for k, v in discrete.items()}
        missing = [s for s in self.discrete_sites if s not in discrete]
        if missing:
            raise KeyError(f"the draws lack the discrete latent site(s) {missing}.")
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (S, {self.dim}); got {x.shape}.")
        rows = self._blocked(self._score_block, {"x": x}, discrete)
        return rows[:, -1], rows[:, :-1]

    def score_fn(self) -> Callable:
        """``flat (dim,) → score (dim,)`` for models without discrete latent sites."""
        if self.discrete_sites:
            raise ValueError(
                f"the model has discrete latent sites {self.discrete_sites}; a single score "
                "function of the continuous coordinates is not defined."
            )
        return lambda flat: _score_one(self.model, self._unravel, flat, {}, self.model_args, self.model_kwargs)[:-1]

    def _blocked(self, fn, batched: dict, discrete: dict):
        """``fn(batched, discrete)`` (vmapped) over rows, a block of rows at a time
        (:meth:`_program`)."""
        arrays = {**{("b", k): np.asarray(v) for k, v in batched.items()},
                  **{("d", k): np.asarray(v) for k, v in discrete.items()}}
        num = next(iter(arrays.values())).shape[0]
        size, program = self._program(fn, arrays)
        out, starts = [], range(0, num, size)
        for start in progress_steps(starts, "full-data scores", standalone_min=8):
            stop = min(start + size, num)
            b, d = _padded_block(arrays, start, stop, size)  # fixed block shape: one compilation
            out.append(np.asarray(program(b, d))[: stop - start])
        return np.concatenate(out, axis=0)

    def _program(self, fn, arrays: dict):
        """``(rows, program)``: ``fn`` compiled for blocks of ``block_size`` rows, or of fewer
        when XLA's memory analysis puts one block's temporaries above :data:`SCORE_MEMORY`
        (a model with 10⁵ data and 10⁵ parameters); compiled once per function and row shapes."""
        key = (fn, tuple((k, v.dtype.str, v.shape[1:]) for k, v in arrays.items()))
        if key not in self._programs:
            size = self.block_size
            program, temp = fn.compile(*_padded_block(arrays, 0, 1, size))
            if temp > SCORE_MEMORY and size > 1:
                size = max(1, int(size * SCORE_MEMORY // temp))
                program, _ = fn.compile(*_padded_block(arrays, 0, 1, size))
            self._programs[key] = (size, program)
        return self._programs[key]


def _unconstrain_one(full_model, continuous_sites, constrained, discrete, model_args, model_kwargs):
    """Flat unconstrained point of one draw (dependent supports handled by NumPyro)."""
    model = handlers.substitute(full_model, data=discrete) if discrete else full_model
    with warnings.catch_warnings():  # NumPyro's notice about enumerating discrete sites
        warnings.filterwarnings("ignore", "Some algorithms will automatically enumerate")
        z = unconstrain_fn(model, model_args, model_kwargs, constrained)
    return ravel_pytree({n: z[n] for n in continuous_sites})[0]


def _score_one(full_model, unravel, flat, discrete, model_args, model_kwargs):
    """One draw's score ∇ log π (dim,) and log π, as one row (dim + 1,): the log density comes
    free with its gradient, and one program gives both."""
    model = handlers.substitute(full_model, data=discrete) if discrete else full_model
    value, grad = jax.value_and_grad(
        lambda x: -potential_energy(model, model_args, model_kwargs, unravel(x)))(flat)
    return jnp.append(grad, value)


def _padded_block(arrays: dict, start: int, stop: int, size: int):
    """Rows ``start:stop`` of every array, padded to ``size`` rows by repeating the last one,
    split into the ``(batched, discrete)`` dicts."""
    block = {k: np.pad(v[start:stop], [(0, size - (stop - start))] + [(0, 0)] * (v.ndim - 1),
                       mode="edge") for k, v in arrays.items()}
    return ({k[1]: v for k, v in block.items() if k[0] == "b"},
            {k[1]: v for k, v in block.items() if k[0] == "d"})


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
