r"""Starting values of spike-and-slab chains, and the names of the kernels' extra outputs.

A search over models needs the chain to start at γ = 0 with θ drawn from the spike:
NumPyro's ``init_to_uniform`` puts every θ_j in (−2, 2), where under a tight spike each one
looks like a slab draw.  :func:`init_to_spike` is that strategy; :func:`start_fn` draws a start
in one model trace (and, for data-based proposal weights, reads the first rows of the GLM
likelihood in the same trace); :func:`initial_values` is the eager, multi-chain form.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from numpyro.distributions.transforms import biject_to
from numpyro.infer.initialization import init_to_sample, init_to_uniform, init_to_value

from numpyro_sg.infer.model_info import ModelInfo, trace_model
from numpyro_sg.spike_slab.structure import SpikeSlab, SpikeSlabError


def init_to_spike(site=None, coefficient=None):
    """Initialisation strategy: the site named ``coefficient`` is drawn from its prior (under
    γ = 0: the spike), every other continuous site uses ``init_to_uniform``.

    **Example:**

    .. code-block:: python

        ESGLD(model, 1e-6, init_strategy=init_to_spike(coefficient="theta"))
    """
    if site is None:
        return partial(init_to_spike, coefficient=coefficient)
    if site["name"] == coefficient:
        return init_to_sample(site)
    return init_to_uniform(site)


def strategy_indicator(init_strategy, indicator: str, num_chains=None):
    """The starting indicator that ``init_strategy`` names, or ``None``: the value of
    ``init_to_value(values={indicator: γ0, ...})`` (as int32, repeated per chain when
    ``num_chains`` is set).  Any other strategy leaves the indicator's start to the kernel (0).

    >>> from numpyro.infer import init_to_value
    >>> strategy_indicator(init_to_value(values={"delta": [1, 0, 1]}), "delta", 2).tolist()
    [[1, 0, 1], [1, 0, 1]]
    """
    if not (isinstance(init_strategy, partial) and init_strategy.func is init_to_value):
        return None
    value = init_strategy.keywords.get("values", {}).get(indicator)
    if value is None:
        return None
    value = jnp.asarray(value).astype(jnp.int32)
    return value if num_chains is None else jnp.broadcast_to(value, (num_chains,) + value.shape[-1:])


def _from_unconstrained(params, site):
    """Init strategy: the constrained value of the unconstrained ``params[name]``, if given."""
    if site["name"] in params:
        return biject_to(site["fn"].support)(params[site["name"]])
    return None


class SpikeSlabStart(NamedTuple):
    """A chain's start: ``params`` the unconstrained continuous site values; ``glm_rows`` the
    :class:`~numpyro_sg.spike_slab.GLMBatch` of the first data rows at β = 0 (or ``None``)."""

    params: Any
    glm_rows: Any


def start_fn(ss: SpikeSlab, model_args=(), model_kwargs=None, init_strategy=None,
             rows: int | None = None) -> Callable:
    """``f(key, init_params=None) -> SpikeSlabStart``: a start at γ = 0 in one model trace.

    The model runs with γ = 0 observed and its continuous sites drawn by ``init_strategy``
    (default :func:`init_to_spike`: θ from the spike, the others ``init_to_uniform``) with
    keys from ``key``, or set to the unconstrained ``init_params`` when given.  With ``rows``
    (needs a GLM likelihood) the plate runs on its first ``rows`` data and ``glm_rows`` holds
    their design rows, observations and linear predictor at β = θ·0 = 0 — what data-based
    proposal weights need, read in the same trace.  Pure and jit-able.

    **Example:**

    .. code-block:: python

        start = start_fn(ss, (X, y), rows=1000)(jax.random.PRNGKey(0))
        start.params["theta"], start.glm_rows.X.shape      # (p,), (1000, p)
    """
    strategy = init_strategy or init_to_spike(coefficient=ss.coefficient)
    zeros = jnp.zeros((ss.num_coefficients,), jnp.int32)
    if rows is not None and ss.glm is None:
        raise SpikeSlabError("start_fn(rows=...) reads a GLM likelihood; this model has none.")
    indices = ss.first_indices(1) if rows is None else ss.first_indices(rows)

    def start(key, init_params=None):
        fill = strategy if init_params is None else partial(_from_unconstrained, init_params)
        tr, data = ss.trace_at(model_args, model_kwargs, {}, zeros, indices, fill=fill, rng_key=key)
        if init_params is None:
            init_params = {
                name: biject_to(tr[name]["fn"].support).inv(tr[name]["value"])
                for name in ss.continuous_sites
            }
        batch = None if rows is None else ss.glm_batch_of(tr, data, indices, model_args, model_kwargs)
        return SpikeSlabStart(dict(init_params), batch)

    return start


def initial_values(ss: SpikeSlab, rng_key, init_params, init_strategy, model_args=(),
                   model_kwargs=None, num_chains=None, ignore=()):
    """Starting values ``(continuous unconstrained params, indicator)`` of a spike-and-slab chain.

    ``init_params`` (a dict of unconstrained continuous site values, optionally with the
    indicator; names in ``ignore`` are dropped) is used as given.  Otherwise the indicator
    starts at ``init_to_value``'s value for it (:func:`strategy_indicator`), else at 0, and the continuous sites come from ``init_strategy`` (default
    :func:`init_to_spike`: the coefficients from the spike, which the search for a model
    needs) with the model conditioned on γ = 0, in one model trace
    (:func:`start_fn`, vectorised over chains).  ``num_chains``: ``None`` for one chain
    (``rng_key`` a key), else the number of vectorised chains (a batch of keys).

    **Example:**

    .. code-block:: python

        params, gamma = initial_values(ss, keys, None, None, (X, y), num_chains=4)
        params["theta"].shape, gamma.shape     # (4, p), (4, p)
    """
    indicator = None
    if init_params is not None:
        init_params = dict(init_params)
        indicator = init_params.pop(ss.indicator, None)
        for name in ignore:
            init_params.pop(name, None)
    p = ss.num_coefficients
    if not init_params:
        start = start_fn(ss, model_args, model_kwargs, init_strategy)
        draw = lambda key: start(key).params  # noqa: E731
        init_params = draw(rng_key) if num_chains is None else jax.vmap(draw)(rng_key)
    if indicator is None:
        indicator = strategy_indicator(init_strategy, ss.indicator, num_chains)
    if indicator is None:
        indicator = jnp.zeros((p,) if num_chains is None else (num_chains, p), jnp.int32)
    return init_params, jnp.asarray(indicator)


def site_types(model, model_args=(), model_kwargs=None, *, info: ModelInfo | None = None) -> dict:
    """``{site name: site type}`` of the model, read from ``info`` (a
    :class:`~numpyro_sg.infer.model_info.ModelInfo`) or from one cheap trace made here.

    **Example:**

    .. code-block:: python

        site_types(model, (X, y))    # {'gamma': 'sample', 'theta': 'sample', 'data': 'plate', …}
    """
    if info is None:
        info = trace_model(model, model_args, model_kwargs)
    return info.site_types


def effective_site_name(ss: SpikeSlab, existing: dict, requested=None) -> str:
    """Name of the output β = θ·γ: ``requested``, else ``"beta"``, else ``"<coefficient>_eff"``.

    A deterministic site of the model may carry the name (the kernels then output the model's
    own value); any other kind of site with it is an error.  ``existing`` is
    :func:`site_types` of the model.

    **Example:**

    .. code-block:: python

        effective_site_name(ss, site_types(model, (X, y)))    # 'beta'
    """
    if requested is None:
        return "beta" if existing.get("beta", "deterministic") == "deterministic" else f"{ss.coefficient}_eff"
    if existing.get(requested, "deterministic") != "deterministic":
        raise ValueError(f"sites={{'effective': {requested!r}}} (the output name of θ·γ) is already a "
                         f"{existing[requested]} site of the model.")
    return requested
