r"""The :class:`SpikeSlab` structure of a model and the pure functions it builds.

:func:`trace_spike_slab` is the one place where a spike-and-slab model is run with its indicator
observed, its continuous sites substituted and chosen data indices in its plate; every
``*_fn`` method of :class:`SpikeSlab` (and the checks of :mod:`numpyro_sg.spike_slab.checks`)
reads such a trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.handlers import condition, seed, substitute, trace
from numpyro.infer.util import constrain_fn, potential_energy

from numpyro_sg.infer.minibatch import SubsamplePlate, with_indices, without_plate_sites
from numpyro_sg.infer.model_info import base_distribution, first_indices, improper_to_uniform
from numpyro_sg.infer.model_info import record_subsample
from numpyro_sg.spike_slab.glm import (
    GLMInfo,
    design_array,
    glm_batch_from_site,
    per_element_log_prob,
)


class SpikeSlabError(ValueError):
    """The model is not of the spike-and-slab form (or its sites cannot be identified)."""


class CoordinatePrior(NamedTuple):
    """Per-coordinate prior terms, each of shape (p,).

    ``indicator0``/``indicator1``: log p(γ_j = 0) and log p(γ_j = 1);
    ``coefficient0``/``coefficient1``: log p(θ_j | γ_j = 0) and log p(θ_j | γ_j = 1) at the θ
    given.  The prior log-odds of inclusion at θ are
    ``indicator1 − indicator0 + coefficient1 − coefficient0``.
    """

    indicator0: Any
    indicator1: Any
    coefficient0: Any
    coefficient1: Any


class CoordinateNormal(NamedTuple):
    """Per-coordinate Normal spike and slab, each of shape (p,).

    ``logit_prior`` = log p(γ_j = 1) − log p(γ_j = 0); θ_j | γ_j = 0 ~ N(``spike_loc``,
    ``spike_scale``²) and θ_j | γ_j = 1 ~ N(``slab_loc``, ``slab_scale``²).
    """

    logit_prior: Any
    spike_loc: Any
    spike_scale: Any
    slab_loc: Any
    slab_scale: Any


def _value_or_fill(values, fill, site):
    """substitute_fn: ``values[name]`` when given, else ``fill(site)`` for a latent sample site
    (``fill=None``: a prior draw, or ``init_to_uniform``'s value for an improper prior)."""
    if site["name"] in values:
        return values[site["name"]]
    if fill is None:
        return improper_to_uniform(site)
    if site["type"] == "sample" and not site["is_observed"]:
        return fill(site)
    return None


def trace_spike_slab(model: Callable, model_args=(), model_kwargs=None, *, observed=None, values=None,
                     fill=None, indices=None, prior_only_plate=None, rng_key=0):
    """Run ``model`` once and return ``(trace, data passed to numpyro.subsample, in order)``.

    The model runs with the sites in ``observed`` (e.g. ``{indicator: γ}``) conditioned on,
    the sites in ``values`` substituted (constrained values), every other latent sample site
    filled by the init strategy ``fill`` (if any; it draws with keys from ``rng_key``; without
    it a prior draw, or ``init_to_uniform``'s value for an improper prior), the
    plates in ``indices`` (``{plate: index array}``) on those indices and any other subsample
    plate on its first n indices; with ``prior_only_plate`` every site inside that plate gets
    weight 0 (the prior alone).

    **Example:**

    .. code-block:: python

        tr, data = trace_spike_slab(model, (X, y), observed={"gamma": g},
                                    values={"theta": theta}, indices={"data": idx})
        tr["y"]["fn"]           # the likelihood of the mini-batch idx at θ·γ
    """
    m = condition(model, data=observed) if observed else model
    m = seed(m, rng_seed=rng_key)
    values = dict(values or {})
    m = substitute(m, substitute_fn=lambda site: _value_or_fill(values, fill, site))
    if indices:
        m = with_indices(m, indices)
    if prior_only_plate is not None:
        m = without_plate_sites(m, (prior_only_plate,))
    rec = record_subsample(first_indices(m))
    tr = trace(rec).get_trace(*model_args, **(model_kwargs or {}))
    return tr, tuple(rec.values)


@dataclass(frozen=True)
class SpikeSlab:
    """The spike-and-slab structure of a model (see :mod:`numpyro_sg.spike_slab`).

    Build it with :func:`~numpyro_sg.spike_slab.find_spike_slab`.  Holds only static metadata:
    ``indicator``, ``coefficient``, ``num_coefficients`` (p), ``plate`` (the
    :class:`~numpyro_sg.infer.minibatch.SubsamplePlate` or ``None``), ``continuous_sites``,
    ``per_coordinate_prior``, ``glm`` (a :class:`~numpyro_sg.spike_slab.GLMInfo` or ``None``)
    and ``deterministic_in_plate``.  Each ``*_fn(model_args, model_kwargs)`` method returns a
    pure, jit-able function.

    **Example:**

    .. code-block:: python

        ss = find_spike_slab(model, (X, y))
        terms = ss.terms_fn((X, y))
        log_prior, loglik_terms = terms({"theta": theta}, gamma, {"data": idx})
    """

    model: Callable = field(repr=False)
    indicator: str
    coefficient: str
    num_coefficients: int
    plate: SubsamplePlate | None
    continuous_sites: tuple
    per_coordinate_prior: bool
    glm: GLMInfo | None = None
    deterministic_in_plate: bool = False

    # -- indices ---------------------------------------------------------------------------
    @property
    def plate_name(self):
        """Name of the subsample plate (``None`` without one)."""
        return None if self.plate is None else self.plate.name

    def first_indices(self, n=None):
        """Indices 0..n−1 in the plate (n defaults to the plate's subsample size)."""
        if self.plate is None:
            return {}
        n = self.plate.subsample_size if n is None else n
        return {self.plate.name: jnp.arange(n, dtype=jnp.int32)}

    def full_indices(self):
        """All N indices of the plate (``{}`` without a plate)."""
        if self.plate is None:
            return {}
        return {self.plate.name: jnp.arange(self.plate.size, dtype=jnp.int32)}

    def _run(self, model, indices):
        return with_indices(model, indices) if indices else model

    # -- models ----------------------------------------------------------------------------
    def conditioned(self, gamma, model=None):
        """The model with the indicator site observed at ``gamma``."""
        return condition(self.model if model is None else model, data={self.indicator: gamma})

    def trace_at(self, model_args, model_kwargs, values, gamma, indices=None, *, prior_only=False,
                 fill=None, rng_key=0):
        """``(trace, subsample data)`` at constrained ``values`` and indicator ``gamma``
        (:func:`trace_spike_slab`); ``prior_only``: the plate on one datum with weight 0."""
        plate = None
        if prior_only and self.plate is not None:
            indices, plate = self.first_indices(1), self.plate.name
        return trace_spike_slab(
            self.model, model_args, model_kwargs, observed={self.indicator: gamma}, values=values,
            fill=fill, indices=indices, prior_only_plate=plate, rng_key=rng_key,
        )

    def split_terms(self, tr, n):
        """``(log prior, (n,) scaled per-datum log-likelihood terms)`` of a trace."""
        log_prior = jnp.zeros(())
        terms = jnp.zeros((n,)) if self.plate is not None else jnp.zeros((1,))
        for site in tr.values():
            if site["type"] != "sample":
                continue
            lp = site["fn"].log_prob(site["value"])
            if site.get("mask") is not None:
                lp = jnp.where(site["mask"], lp, 0.0)
            if site.get("scale") is not None:
                lp = site["scale"] * lp
            is_lik = site["is_observed"] and site["name"] != self.indicator
            if self.plate is None:
                if is_lik:
                    terms = terms + jnp.sum(lp)
                else:
                    log_prior = log_prior + jnp.sum(lp)
                continue
            frame = None
            for f in site.get("cond_indep_stack", []):
                if f.name == self.plate.name:
                    frame = f
            if frame is None:
                log_prior = log_prior + jnp.sum(lp)
                continue
            axis = jnp.ndim(lp) + frame.dim
            if axis < 0 or jnp.shape(lp)[axis] != n:
                terms = terms + jnp.sum(lp) / n
            else:
                lp = jnp.moveaxis(lp, axis, 0)
                terms = terms + jnp.reshape(lp, (n, -1)).sum(1)
        return log_prior, terms

    def num_indices(self, indices) -> int:
        """n, the number of data indices of ``indices`` in the plate (1 without a plate)."""
        return int(jnp.shape(indices[self.plate.name])[0]) if self.plate is not None else 1

    # -- functions -------------------------------------------------------------------------
    def log_density_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(params, gamma, indices)``: log density on the unconstrained space (γ observed).

        ``params`` are unconstrained values of the continuous latent sites.  With mini-batch
        indices this is log p(γ) + log p(θ|γ) + … + (N/n)·Σ_{i∈S} log f(x_i | θ·γ)
        (+ log-Jacobian).
        """
        model_kwargs = model_kwargs or {}

        def log_density(params, gamma, indices):
            m = self._run(self.conditioned(gamma), indices)
            return -potential_energy(m, model_args, model_kwargs, params)

        return log_density

    def terms_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, gamma, indices) -> (log_prior, loglik_terms)`` (constrained values).

        One model evaluation: O(n·p) for a GLM.
        """

        def terms(values, gamma, indices):
            tr, _ = self.trace_at(model_args, model_kwargs, values, gamma, indices)
            return self.split_terms(tr, self.num_indices(indices))

        return terms

    def prior_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, gamma) -> log_prior``: every site outside the plate, O(p)."""

        def prior(values, gamma):
            tr, _ = self.trace_at(model_args, model_kwargs, values, gamma, prior_only=True)
            return self.split_terms(tr, 1)[0]

        return prior

    def effective_loglik_terms_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, beta, indices) -> (n,)`` scaled per-datum log-likelihood at β = θ·γ.

        Evaluated with θ = β and γ = 1 (valid for the spike-and-slab form, which is checked).
        ``values`` supplies the other continuous sites (its coefficient entry is ignored).
        """
        terms = self.terms_fn(model_args, model_kwargs)
        ones = jnp.ones((self.num_coefficients,), jnp.int32)

        def loglik_terms(values, beta, indices):
            return terms({**values, self.coefficient: beta}, ones, indices)[1]

        return loglik_terms

    def _both_indicator_values(self, model_args, model_kwargs, values, read):
        """``read(trace)`` at γ = 0 and at γ = 1 (prior sites only), stacked on a leading axis
        of 2: one model trace, vectorised over the two indicator values."""
        p = self.num_coefficients

        def one(gamma):
            tr, _ = self.trace_at(model_args, model_kwargs, values, gamma, prior_only=True)
            return read(tr)

        return jax.vmap(one)(jnp.stack([jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)]))

    def coordinate_prior_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, theta) -> CoordinatePrior`` (see :class:`CoordinatePrior`), O(p)."""
        p = self.num_coefficients
        zeros, ones = jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)

        def coordinate_prior(values, theta):
            def read(tr):
                ind = tr[self.indicator]["fn"]
                return (per_element_log_prob(tr[self.coefficient]["fn"], theta),
                        per_element_log_prob(ind, zeros), per_element_log_prob(ind, ones))

            vals = {**values, self.coefficient: theta}
            coef, q0, q1 = self._both_indicator_values(model_args, model_kwargs, vals, read)
            return CoordinatePrior(q0[0], q1[0], coef[0], coef[1])

        return coordinate_prior

    def glm_batch_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, beta, indices=None) -> GLMBatch`` for the GLM fast path (needs ``glm``).

        ``indices=None`` means all N data, with ``X`` the model's own design array (no copy).
        """
        self._require_glm()
        ones = jnp.ones((self.num_coefficients,), jnp.int32)

        def glm_batch(values, beta, indices=None):
            full = indices is None
            idx = self.full_indices() if full else indices
            vals = {**values, self.coefficient: beta}
            tr, data = self.trace_at(model_args, model_kwargs, vals, ones, idx)
            return self.glm_batch_of(tr, data, None if full else idx, model_args, model_kwargs)

        return glm_batch

    def glm_batch_of(self, tr, data, indices, model_args=(), model_kwargs=None):
        """The :class:`~numpyro_sg.spike_slab.GLMBatch` of a trace (``data`` its subsample
        data, ``indices`` its plate indices or ``None`` for the rows of X as they are)."""
        self._require_glm()
        X = design_array(self.glm.source, data, model_args, model_kwargs)
        rows = None if (indices is None or self.plate is None) else indices[self.plate.name]
        return glm_batch_from_site(tr[self.glm.site], X, rows,
                                   None if self.plate is None else self.plate.size)

    def _require_glm(self):
        if self.glm is None:
            raise SpikeSlabError("This model has no detected GLM likelihood (SpikeSlab.glm is None).")

    def design_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values) -> X``: the full (N, p) design array of the GLM likelihood (needs ``glm``).

        No copy and no product with β: under ``jit`` the model's own X·β is dead code and is
        removed, so this is O(1) work (used by SparseAsync's fast path to gather columns).
        """
        self._require_glm()
        if self.glm.source[0] in ("arg", "kwarg"):
            return lambda values: design_array(self.glm.source, (), model_args, model_kwargs)
        ones = jnp.ones((self.num_coefficients,), jnp.int32)

        def design(values):
            _, data = self.trace_at(model_args, model_kwargs, dict(values), ones, self.first_indices(1))
            return design_array(self.glm.source, data, model_args, model_kwargs)

        return design

    def coordinate_normal_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values) -> CoordinateNormal`` when θ_j | γ_j is a per-coordinate Normal.

        Reads the coefficient site's distribution under γ = 0 (spike) and γ = 1 (slab) and the
        indicator's prior log-odds, each as a (p,) array.  Raises :class:`SpikeSlabError` when
        the coefficient's distribution is not (an Independent/expanded) ``Normal``.
        """
        p = self.num_coefficients
        zeros, ones = jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)

        def read(tr):
            base = base_distribution(tr[self.coefficient]["fn"])
            if not isinstance(base, dist.Normal):
                raise SpikeSlabError(
                    f"coefficient site {self.coefficient!r} has distribution "
                    f"{type(base).__name__}; a per-coordinate Normal spike/slab is needed here."
                )
            ind = tr[self.indicator]["fn"]
            return (jnp.broadcast_to(base.loc, (p,)), jnp.broadcast_to(base.scale, (p,)),
                    per_element_log_prob(ind, ones) - per_element_log_prob(ind, zeros))

        def coordinate_normal(values):
            loc, scale, logit = self._both_indicator_values(model_args, model_kwargs, dict(values), read)
            return CoordinateNormal(logit[0], loc[0], scale[0], loc[1], scale[1])

        return coordinate_normal

    def spike_sample_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(key, values) -> theta``: a draw of θ (p,) from its prior given γ = 0 (the spike).

        Coordinates of a per-coordinate prior are independent, so entry j is a draw of
        θ_j | γ_j = 0 (SparseAsync refreshes excluded coordinates with it), O(p).
        """
        zeros = jnp.zeros((self.num_coefficients,), jnp.int32)

        def spike_sample(key, values):
            vals = {k: v for k, v in dict(values).items() if k != self.coefficient}
            tr, _ = self.trace_at(model_args, model_kwargs, vals, zeros, prior_only=True)
            return tr[self.coefficient]["fn"].sample(key)

        return spike_sample

    def constrain_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(params, gamma) -> values``: unconstrained → constrained continuous values, O(p)."""
        model_kwargs = model_kwargs or {}

        def constrain(params, gamma):
            m = self._run(self.conditioned(gamma), self.first_indices(1))
            return constrain_fn(m, model_args, model_kwargs, params)

        return constrain
