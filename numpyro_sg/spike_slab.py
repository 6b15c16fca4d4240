r"""Spike-and-slab model introspection, shared by :class:`~numpyro_sg.ESGLD` and SparseAsync.

A *spike-and-slab model* here is an ordinary NumPyro model with

* an **indicator** site γ ∈ {0,1}^p: a latent ``Bernoulli`` site of shape (p,) (any prior on it,
  e.g. ``dist.Bernoulli(lam).expand([p]).to_event(1)``);
* a **coefficient** site θ ∈ ℝ^p: a latent real-valued site of shape (p,) whose prior may
  depend on γ (spike N(0, σ0²) for γ_j = 0, slab N(0, σ1²) for γ_j = 1, or any other form);
* a **likelihood** (the observed sites) that depends on θ only through the effective
  coefficients β = θ·γ, usually inside a subsample plate
  ``numpyro.plate("data", N, subsample_size=n)``.

Other continuous latent sites (an unselected intercept, a noise scale, …) are allowed.

.. rubric:: Public API (stable; SparseAsync builds on it)

:func:`find_spike_slab`
    ``find_spike_slab(model, model_args, model_kwargs, *, indicator=None, coefficient=None,
    subsample_size=None, glm="auto", check=True, seed=0) -> SpikeSlab``.
    Finds the two sites (or takes their names), validates the structure and detects a GLM
    likelihood.  Errors (``ValueError``) name the problem: no/several binary sites (pass
    ``indicator=``), an indicator that is not binary, no/several coefficient sites (pass
    ``coefficient=``), shapes that differ, a coefficient that is not real-valued, or a
    likelihood that changes when an excluded coefficient changes.

:class:`SpikeSlab` (static metadata only: safe to build under ``jit``/``pmap``)
    Attributes ``indicator``, ``coefficient``, ``num_coefficients`` (p), ``plate`` (the
    :class:`~numpyro_sg.minibatch.SubsamplePlate` or ``None`` for a model without one),
    ``continuous_sites``, ``per_coordinate_prior`` (see below), ``glm``
    (a :class:`GLMInfo` or ``None``).  Each ``*_fn(model_args, model_kwargs)`` method returns
    a pure, jit-able function.  ``values`` are *constrained* values of the continuous latent
    sites (a dict; the coefficient site included), ``gamma`` an int/bool array (p,),
    ``indices`` a dict ``{plate_name: index array}`` (``{}`` for a model without a plate):

    * :meth:`SpikeSlab.conditioned` — the model with γ observed at a given value;
    * :meth:`SpikeSlab.log_density_fn` → ``f(params, gamma, indices)``: log density on
      NumPyro's *unconstrained* space (the Jacobian included), with the indicator's prior
      log p(γ) — differentiate it for Langevin steps;
    * :meth:`SpikeSlab.terms_fn` → ``f(values, gamma, indices) -> (log_prior, loglik_terms)``:
      ``log_prior`` the log density of every site outside the subsample plate (log p(γ) +
      log p(θ|γ) + other priors, constrained space), ``loglik_terms`` the (n,) per-datum
      contributions to the mini-batch log-likelihood estimate, *scaled* by N/n, so that
      log π(θ, γ | X_{n,N}) = log_prior + Σ loglik_terms;
    * :meth:`SpikeSlab.prior_fn` → ``f(values, gamma)``: ``log_prior`` alone, O(p) (the
      plate is run on a single datum with weight 0);
    * :meth:`SpikeSlab.effective_loglik_terms_fn` → ``f(values, beta, indices)``: the
      per-datum (scaled) log-likelihood as a function of the effective coefficients β
      (evaluated with θ = β and γ = 1); its sum is ℓ(β), differentiate it for ∇_β ℓ;
    * :meth:`SpikeSlab.coordinate_prior_fn` → ``f(values, theta) -> CoordinatePrior``:
      per-coordinate arrays (p,) log p(γ_j = 0), log p(γ_j = 1), log p(θ_j | γ_j = 0),
      log p(θ_j | γ_j = 1), read from the sites' own distributions.  They add up to the
      prior's dependence on γ exactly when ``per_coordinate_prior`` is True (checked at
      construction on random θ, γ; False e.g. for a slab variance that depends on size(γ));
      otherwise use :meth:`SpikeSlab.prior_fn`;
    * :meth:`SpikeSlab.coordinate_normal_fn` → ``f(values) -> CoordinateNormal``: prior
      log-odds of inclusion and the Normal spike/slab parameters per coordinate (p,) (an
      error when θ_j | γ_j is not Normal); :meth:`SpikeSlab.spike_sample_fn` →
      ``f(key, values)``: θ drawn from its prior under γ = 0; :meth:`SpikeSlab.design_fn` →
      ``f(values)``: the full design array X (N, p) of a GLM likelihood, without X·β;
    * :meth:`SpikeSlab.glm_batch_fn` → ``f(values, beta, indices=None) -> GLMBatch`` (only
      when ``glm`` is not None; ``indices=None``: all N data, X not copied): the design rows X_S (n, p), the linear predictor
      η = offset + X_S·β (n,), the observations y (n,), the family's other parameters and
      the N/n scale, so that ``scale * family.loglik(eta, y, params)`` are the per-datum
      terms.  Changing β_j by Δ changes η by X_S[:, j]·Δ: an O(n) update.

:class:`GLMFamily` (``gaussian``, ``bernoulli``, ``poisson``; :data:`GLM_FAMILIES`)
    ``loglik(eta, y, params)``, ``dloglik`` and ``d2loglik`` per datum (unscaled); the
    second derivative is what a second-order Taylor expansion in β_j needs
    (∂²ℓ/∂β_j² = scale·Σ_i X_ij²·d2loglik_i).

GLM detection (``glm="auto"``): the likelihood is one observed site inside the subsample
plate whose distribution is ``Normal(loc=η, scale)``, ``Bernoulli(logits=η)`` (or
``probs=sigmoid(η)``) or ``Poisson(rate=exp(η))``, and η = offset + X[S]·β with X an array
of shape (N, p) that is either passed to ``numpyro.subsample(X, event_dim=1)`` or a model
argument indexed by the plate (``X[idx]``).  Affinity is
checked numerically at construction.  ``glm=False`` turns the fast path off, ``glm=True``
makes a failed detection an error that says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.handlers import condition, seed, substitute, trace
from numpyro.infer.initialization import init_to_sample, init_to_uniform
from numpyro.infer.util import constrain_fn, initialize_model, potential_energy
from numpyro.primitives import Messenger

from numpyro_sg.minibatch import SubsamplePlate, resolve_subsample_size, with_indices
from numpyro_sg.model_info import first_indices as _first_indices_handler, plates_of as _plates_of


def _trace_model(model, model_args, model_kwargs, rng_seed=0):
    from numpyro.distributions.distribution import validation_enabled

    with validation_enabled(False):
        return trace(_first_indices_handler(seed(model, rng_seed=rng_seed))).get_trace(
            *model_args, **(model_kwargs or {})
        )


def _subsample_plates_in(tr):
    return {name: (int(site["args"][0]), int(site["args"][1])) for name, site in tr.items()
            if site["type"] == "plate" and site["args"][1] is not None}


__all__ = [
    "find_spike_slab",
    "SpikeSlab",
    "CoordinatePrior",
    "CoordinateNormal",
    "GLMInfo",
    "GLMBatch",
    "GLMFamily",
    "GLM_FAMILIES",
    "SpikeSlabError",
    "site_types",
    "effective_site_name",
    "init_to_spike",
    "initial_values",
]


class SpikeSlabError(ValueError):
    """The model is not of the spike-and-slab form (or its sites cannot be identified)."""


# -------------------------------------------------------------------------------------------
# GLM families
# -------------------------------------------------------------------------------------------
class GLMFamily:
    """Per-datum log-likelihood of a GLM in its linear predictor η (unscaled).

    ``params`` holds the family's other parameters (``{"scale": σ}`` for the Gaussian).
    """

    def __init__(self, name, loglik, dloglik, d2loglik):
        self.name = name
        self.loglik = loglik
        self.dloglik = dloglik
        self.d2loglik = d2loglik

    def __repr__(self):
        return f"GLMFamily({self.name!r})"


def _gauss_ll(eta, y, params):
    s = params["scale"]
    return -0.5 * jnp.log(2 * jnp.pi) - jnp.log(s) - 0.5 * ((y - eta) / s) ** 2


def _bern_ll(eta, y, params):
    return y * eta - jax.nn.softplus(eta)


def _pois_ll(eta, y, params):
    return y * eta - jnp.exp(eta) - jax.scipy.special.gammaln(y + 1.0)


#: The GLM families of the fast path, by name.
GLM_FAMILIES = {
    "gaussian": GLMFamily(
        "gaussian",
        _gauss_ll,
        lambda eta, y, params: (y - eta) / params["scale"] ** 2,
        lambda eta, y, params: -jnp.ones_like(eta) / params["scale"] ** 2,
    ),
    "bernoulli": GLMFamily(
        "bernoulli",
        _bern_ll,
        lambda eta, y, params: y - jax.nn.sigmoid(eta),
        lambda eta, y, params: -jax.nn.sigmoid(eta) * jax.nn.sigmoid(-eta),
    ),
    "poisson": GLMFamily(
        "poisson",
        _pois_ll,
        lambda eta, y, params: y - jnp.exp(eta),
        lambda eta, y, params: -jnp.exp(eta),
    ),
}


def _strip(fn):
    """Remove Independent / Expanded / Masked wrappers: the base distribution."""
    while True:
        if isinstance(fn, (dist.Independent, dist.ExpandedDistribution, dist.MaskedDistribution)):
            fn = fn.base_dist
        else:
            return fn


def _family_of(fn):
    """(family name, η, params) read from an observation distribution, or None."""
    base = _strip(fn)
    if isinstance(base, dist.Normal):
        return "gaussian", base.loc, {"scale": base.scale}
    if isinstance(base, (dist.BernoulliLogits, dist.BernoulliProbs)):
        return "bernoulli", base.logits, {}
    if isinstance(base, dist.Poisson) and not getattr(base, "is_sparse", False):
        return "poisson", jnp.log(base.rate), {}
    return None


def _per_element_log_prob(fn, value):
    """log_prob per element of ``value`` (Independent layers removed)."""
    while isinstance(fn, dist.Independent):
        fn = fn.base_dist
    lp = fn.log_prob(value)
    return jnp.broadcast_to(lp, jnp.shape(value))


# -------------------------------------------------------------------------------------------
# results
# -------------------------------------------------------------------------------------------
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


class GLMBatch(NamedTuple):
    """A GLM likelihood on a mini-batch: per-datum terms are ``scale * family.loglik(eta, y, params)``.

    ``X`` (n, p) design rows, ``eta`` (n,) linear predictor at the β given (offset included),
    ``y`` (n,) observations, ``params`` the family's other parameters, ``scale`` = N/n.
    """

    X: Any
    eta: Any
    y: Any
    params: Any
    scale: Any


@dataclass(frozen=True)
class GLMInfo:
    """How the GLM fast path reads a model: family and where the design rows come from.

    ``source`` is ``("subsample", k)`` (the data passed to the k-th ``numpyro.subsample``
    call), ``("arg", i)`` or ``("kwarg", name)`` (a model argument): an array X of shape
    (N, p) whose rows are taken by the plate's indices; ``site`` the observed site.
    """

    family_name: str
    site: str
    source: tuple

    @property
    def family(self) -> GLMFamily:
        return GLM_FAMILIES[self.family_name]


class _record_subsample(Messenger):
    """Handler recording the *full* data passed to every ``numpyro.subsample`` call, in order.

    (The plate subsamples in its own ``postprocess_message``, which runs after this one's.)
    """

    def __init__(self, fn=None):
        self.values = []
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "subsample":
            self.values.append(msg["value"])


class _zero_plate_sites(Messenger):
    def __init__(self, fn=None, plate_name=None):
        self.plate_name = plate_name
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and self.plate_name in _plates_of(msg):
            msg["scale"] = 0.0


def _is_tracer_tree(tree):
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


# -------------------------------------------------------------------------------------------
# SpikeSlab
# -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpikeSlab:
    """The spike-and-slab structure of a model (see the module docstring).

    Build it with :func:`find_spike_slab`.  Holds only static metadata.
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

    def _trace(self, model_args, model_kwargs, values, gamma, indices):
        m = substitute(self.conditioned(gamma), data=values)
        return trace(seed(self._run(m, indices), rng_seed=0)).get_trace(*model_args, **model_kwargs)

    def _split(self, tr, n):
        """(log prior, (n,) scaled per-datum log-likelihood terms) of a trace."""
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
            frame = None
            if self.plate is not None:
                for f in site.get("cond_indep_stack", []):
                    if f.name == self.plate.name:
                        frame = f
            is_lik = site["is_observed"] and site["name"] != self.indicator
            if self.plate is None:
                if is_lik:
                    terms = terms + jnp.sum(lp)
                else:
                    log_prior = log_prior + jnp.sum(lp)
                continue
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
        model_kwargs = model_kwargs or {}

        def terms(values, gamma, indices):
            tr = self._trace(model_args, model_kwargs, values, gamma, indices)
            n = int(jnp.shape(indices[self.plate.name])[0]) if self.plate is not None else 1
            return self._split(tr, n)

        return terms

    def prior_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, gamma) -> log_prior``: every site outside the plate, O(p)."""
        model_kwargs = model_kwargs or {}

        def prior(values, gamma):
            m = substitute(self.conditioned(gamma), data=values)
            if self.plate is not None:
                m = _zero_plate_sites(with_indices(m, self.first_indices(1)), self.plate.name)
            tr = trace(seed(m, rng_seed=0)).get_trace(*model_args, **model_kwargs)
            total = jnp.zeros(())
            for site in tr.values():
                if site["type"] != "sample":
                    continue
                if self.plate is None and site["is_observed"] and site["name"] != self.indicator:
                    continue
                if site.get("scale") is not None and self.plate is not None and (
                    self.plate.name in _plates_of(site)
                ):
                    continue
                lp = site["fn"].log_prob(site["value"])
                if site.get("mask") is not None:
                    lp = jnp.where(site["mask"], lp, 0.0)
                if site.get("scale") is not None:
                    lp = site["scale"] * lp
                total = total + jnp.sum(lp)
            return total

        return prior

    def effective_loglik_terms_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, beta, indices) -> (n,)`` scaled per-datum log-likelihood at β = θ·γ.

        Evaluated with θ = β and γ = 1 (valid for the spike-and-slab form, which is checked).
        ``values`` supplies the other continuous sites (its coefficient entry is ignored).
        """
        terms = self.terms_fn(model_args, model_kwargs)
        ones = jnp.ones((self.num_coefficients,), jnp.int32)

        def loglik_terms(values, beta, indices):
            vals = dict(values)
            vals[self.coefficient] = beta
            return terms(vals, ones, indices)[1]

        return loglik_terms

    def coordinate_prior_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, theta) -> CoordinatePrior`` (see :class:`CoordinatePrior`), O(p)."""
        model_kwargs = model_kwargs or {}
        p = self.num_coefficients

        def one(values, gamma, theta):
            vals = dict(values)
            vals[self.coefficient] = theta
            m = substitute(self.conditioned(gamma), data=vals)
            if self.plate is not None:
                m = _zero_plate_sites(with_indices(m, self.first_indices(1)), self.plate.name)
            tr = trace(seed(m, rng_seed=0)).get_trace(*model_args, **model_kwargs)
            ind = tr[self.indicator]["fn"]
            coef = _per_element_log_prob(tr[self.coefficient]["fn"], theta)
            return ind, coef

        def coordinate_prior(values, theta):
            zeros = jnp.zeros((p,), jnp.int32)
            ind0, coef0 = one(values, zeros, theta)
            _, coef1 = one(values, jnp.ones((p,), jnp.int32), theta)
            q0 = _per_element_log_prob(ind0, zeros)
            q1 = _per_element_log_prob(ind0, jnp.ones((p,), jnp.int32))
            return CoordinatePrior(q0, q1, coef0, coef1)

        return coordinate_prior

    def glm_batch_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values, beta, indices=None) -> GLMBatch`` for the GLM fast path (needs ``glm``).

        ``indices=None`` means all N data, with ``X`` the model's own design array (no copy).
        """
        if self.glm is None:
            raise SpikeSlabError("This model has no detected GLM likelihood (SpikeSlab.glm is None).")
        model_kwargs = model_kwargs or {}
        return _glm_batch_fn(self, self.glm, model_args, model_kwargs)

    def design_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values) -> X``: the full (N, p) design array of the GLM likelihood (needs ``glm``).

        No copy and no product with β: under ``jit`` the model's own X·β is dead code and is
        removed, so this is O(1) work (used by SparseAsync's fast path to gather columns).
        """
        if self.glm is None:
            raise SpikeSlabError("This model has no detected GLM likelihood (SpikeSlab.glm is None).")
        model_kwargs = model_kwargs or {}
        kind, where = self.glm.source
        if kind in ("arg", "kwarg"):
            return lambda values: _design(self.glm, None, model_args, model_kwargs)
        ones = jnp.ones((self.num_coefficients,), jnp.int32)

        def design(values):
            m = substitute(self.conditioned(ones), data=dict(values))
            rec = _record_subsample(self._run(m, self.first_indices(1)))
            trace(seed(rec, rng_seed=0)).get_trace(*model_args, **model_kwargs)
            return _design(self.glm, rec, model_args, model_kwargs)

        return design

    def coordinate_normal_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(values) -> CoordinateNormal`` when θ_j | γ_j is a per-coordinate Normal.

        Reads the coefficient site's distribution under γ = 0 (spike) and γ = 1 (slab) and the
        indicator's prior log-odds, each as a (p,) array.  Raises :class:`SpikeSlabError` when
        the coefficient's distribution is not (an Independent/expanded) ``Normal``.
        """
        model_kwargs = model_kwargs or {}
        p = self.num_coefficients

        def one(values, gamma):
            m = substitute(self.conditioned(gamma), data=dict(values))
            if self.plate is not None:
                m = _zero_plate_sites(with_indices(m, self.first_indices(1)), self.plate.name)
            tr = trace(seed(m, rng_seed=0)).get_trace(*model_args, **model_kwargs)
            base = _strip(tr[self.coefficient]["fn"])
            if not isinstance(base, dist.Normal):
                raise SpikeSlabError(
                    f"coefficient site {self.coefficient!r} has distribution "
                    f"{type(base).__name__}; a per-coordinate Normal spike/slab is needed here."
                )
            loc = jnp.broadcast_to(base.loc, (p,))
            scale = jnp.broadcast_to(base.scale, (p,))
            return tr[self.indicator]["fn"], loc, scale

        def coordinate_normal(values):
            zeros, ones = jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)
            ind, loc0, scale0 = one(values, zeros)
            _, loc1, scale1 = one(values, ones)
            logit = _per_element_log_prob(ind, ones) - _per_element_log_prob(ind, zeros)
            return CoordinateNormal(logit, loc0, scale0, loc1, scale1)

        return coordinate_normal

    def spike_sample_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(key, values) -> theta``: a draw of θ (p,) from its prior given γ = 0 (the spike).

        Coordinates of a per-coordinate prior are independent, so entry j is a draw of
        θ_j | γ_j = 0 (SparseAsync refreshes excluded coordinates with it), O(p).
        """
        model_kwargs = model_kwargs or {}
        zeros = jnp.zeros((self.num_coefficients,), jnp.int32)

        def spike_sample(key, values):
            vals = {k: v for k, v in dict(values).items() if k != self.coefficient}
            m = substitute(self.conditioned(zeros), data=vals)
            if self.plate is not None:
                m = _zero_plate_sites(with_indices(m, self.first_indices(1)), self.plate.name)
            tr = trace(seed(m, rng_seed=0)).get_trace(*model_args, **model_kwargs)
            return tr[self.coefficient]["fn"].sample(key)

        return spike_sample

    def constrain_fn(self, model_args=(), model_kwargs=None) -> Callable:
        """``f(params, gamma) -> values``: unconstrained → constrained continuous values, O(p)."""
        model_kwargs = model_kwargs or {}

        def constrain(params, gamma):
            m = self._run(self.conditioned(gamma), self.first_indices(1))
            return constrain_fn(m, model_args, model_kwargs, params)

        return constrain


def _design(info, rec, model_args, model_kwargs):
    kind, where = info.source
    if kind == "subsample":
        return jnp.asarray(rec.values[where])
    return jnp.asarray(model_args[where] if kind == "arg" else model_kwargs[where])


def _glm_batch_fn(ss: SpikeSlab, info: GLMInfo, model_args, model_kwargs):
    ones = jnp.ones((ss.num_coefficients,), jnp.int32)

    def glm_batch(values, beta, indices=None):
        full = indices is None
        if full:
            indices = ss.full_indices()
        vals = dict(values)
        vals[ss.coefficient] = beta
        m = substitute(ss.conditioned(ones), data=vals)
        rec = _record_subsample(ss._run(m, indices))
        tr = trace(seed(rec, rng_seed=0)).get_trace(*model_args, **model_kwargs)
        site = tr[info.site]
        _, eta, params = _family_of(site["fn"])
        y = site["value"]
        X = _design(info, rec, model_args, model_kwargs)
        if ss.plate is not None and not full:
            X = jnp.take(X, indices[ss.plate.name], axis=0)
        n = jnp.shape(y)[0]
        eta = jnp.broadcast_to(eta, (n,))
        params = {k: jnp.broadcast_to(v, (n,)) for k, v in params.items()}
        scale = ss.plate.size / n if ss.plate is not None else 1.0
        return GLMBatch(X, eta, y, params, scale)

    return glm_batch


# -------------------------------------------------------------------------------------------
# discovery
# -------------------------------------------------------------------------------------------
def _value_shape(site):
    return tuple(jnp.shape(site["value"]))


def _is_binary(fn):
    support = fn.support
    if support is constraints.boolean:
        return True
    base = _strip(fn)
    if isinstance(base, (dist.BernoulliLogits, dist.BernoulliProbs)):
        return True
    if isinstance(support, constraints.independent):
        support = support.base_constraint
    if isinstance(support, constraints._IntegerInterval):
        lo, hi = np.asarray(support.lower_bound), np.asarray(support.upper_bound)
        return bool(np.all(lo == 0) and np.all(hi == 1))
    return support is constraints.boolean


def _is_real(fn):
    support = fn.support
    if isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real or isinstance(support, type(constraints.real))


def find_spike_slab(
    model: Callable,
    model_args=(),
    model_kwargs=None,
    *,
    indicator: str | None = None,
    coefficient: str | None = None,
    subsample_size=None,
    glm="auto",
    check: bool = True,
    seed: int = 0,
) -> SpikeSlab:
    """Find and validate the spike-and-slab structure of ``model`` (see the module docstring).

    :param indicator: name of the binary indicator site (found automatically when omitted).
    :param coefficient: name of the coefficient site (found automatically when omitted).
    :param subsample_size: mini-batch size override for the subsample plate (as in the
        kernels); ``None`` keeps the model's.
    :param glm: ``"auto"`` (detect the GLM fast path), ``True`` (require it), ``False``.
    :param bool check: run the numerical checks (structure, per-coordinate prior, GLM
        affinity) on random values; they need concrete (non-traced) model arguments.
    :param int seed: seed of the numerical checks.
    :raises SpikeSlabError: (a ``ValueError``) when the model is not of the required form.
    """
    model_kwargs = dict(model_kwargs or {})
    tr = _trace_model(model, model_args, model_kwargs)
    found = _subsample_plates_in(tr)
    if len(found) > 1:
        raise SpikeSlabError(
            f"The model has several subsample plates {sorted(found)}; spike-and-slab kernels "
            "support one."
        )
    plate = None
    if found:
        (name, (size, n)), = found.items()
        plate = SubsamplePlate(name, size, n, resolve_subsample_size(name, size, n, subsample_size))
    plate_names = set(found)

    latent = {
        name: site
        for name, site in tr.items()
        if site["type"] == "sample" and not site["is_observed"]
        and not plate_names.intersection(_plates_of(site))
    }

    # ---- indicator -----------------------------------------------------------------------
    if indicator is None:
        binary = [n_ for n_, s in latent.items() if _is_binary(s["fn"])]
        if not binary:
            discrete = [n_ for n_, s in latent.items() if getattr(s["fn"], "is_discrete", False)]
            raise SpikeSlabError(
                "No binary indicator site found: the model needs a latent Bernoulli site "
                "γ ∈ {0,1}^p (e.g. `numpyro.sample('gamma', dist.Bernoulli(0.1).expand([p])"
                ".to_event(1))`)"
                + (f"; its discrete sites {discrete} are not binary" if discrete else "")
                + ". Pass indicator='name' if it exists."
            )
        if len(binary) > 1:
            raise SpikeSlabError(
                f"Several binary latent sites {binary} could be the indicator: pass "
                "indicator='name' (and coefficient='name')."
            )
        indicator = binary[0]
    else:
        if indicator not in tr or tr[indicator]["type"] != "sample":
            raise SpikeSlabError(
                f"indicator={indicator!r} is not a sample site of the model; its latent sites "
                f"are {sorted(latent)}."
            )
        if tr[indicator]["is_observed"]:
            raise SpikeSlabError(f"indicator site {indicator!r} is observed; it must be latent.")
        if indicator not in latent:
            raise SpikeSlabError(
                f"indicator site {indicator!r} is inside the subsample plate; it must be global."
            )
        if not _is_binary(tr[indicator]["fn"]):
            raise SpikeSlabError(
                f"indicator site {indicator!r} is not binary: its distribution "
                f"{type(tr[indicator]['fn']).__name__} has support {tr[indicator]['fn'].support}; "
                "the indicator must be a Bernoulli site with values in {0, 1}."
            )
    ishape = _value_shape(tr[indicator])
    if len(ishape) != 1:
        raise SpikeSlabError(
            f"indicator site {indicator!r} has shape {ishape}; it must be a vector (p,) "
            "(use .expand([p]).to_event(1) or a plate of size p)."
        )
    p = ishape[0]

    # ---- coefficient ---------------------------------------------------------------------
    others = {n_: s for n_, s in latent.items() if n_ != indicator}
    discrete_others = [n_ for n_, s in others.items() if getattr(s["fn"], "is_discrete", False)]
    if discrete_others:
        raise SpikeSlabError(
            f"Discrete latent sites {discrete_others} besides the indicator {indicator!r} are not "
            "supported: marginalise them out or fix them."
        )
    if coefficient is None:
        cands = [n_ for n_, s in others.items() if _value_shape(s) == (p,) and _is_real(s["fn"])]
        if len(cands) > 1:
            dep = [c for c in cands if _prior_depends_on_indicator(model, model_args, model_kwargs, tr, indicator, c, p)]
            if len(dep) == 1:
                cands = dep
        if not cands:
            raise SpikeSlabError(
                f"No coefficient site found: the model needs a latent real-valued site θ of "
                f"shape ({p},) (the indicator {indicator!r} has {p} entries) whose product with "
                f"the indicator enters the likelihood; its continuous latent sites are "
                f"{ {n_: _value_shape(s) for n_, s in others.items()} }. Pass coefficient='name'."
            )
        if len(cands) > 1:
            raise SpikeSlabError(
                f"Several latent sites {cands} could be the coefficient site: pass "
                "coefficient='name'."
            )
        coefficient = cands[0]
    else:
        if coefficient not in others:
            raise SpikeSlabError(
                f"coefficient={coefficient!r} is not a latent site of the model outside the "
                f"subsample plate; candidates are {sorted(others)}."
            )
        if _value_shape(others[coefficient]) != (p,):
            raise SpikeSlabError(
                f"coefficient site {coefficient!r} has shape {_value_shape(others[coefficient])} "
                f"but the indicator {indicator!r} has shape ({p},); they must match."
            )
        if not _is_real(others[coefficient]["fn"]):
            raise SpikeSlabError(
                f"coefficient site {coefficient!r} must be real-valued (support real), got "
                f"support {others[coefficient]['fn'].support}."
            )

    det_in_plate = any(
        s["type"] == "deterministic" and plate_names.intersection(_plates_of(s)) for s in tr.values()
    )
    ss = SpikeSlab(
        model=model,
        indicator=indicator,
        coefficient=coefficient,
        num_coefficients=p,
        plate=plate,
        continuous_sites=tuple(sorted(others)),
        per_coordinate_prior=False,
        glm=None,
        deterministic_in_plate=det_in_plate,
    )
    concrete = not _is_tracer_tree((model_args, model_kwargs))
    if not (check and concrete):
        if glm is True:
            raise SpikeSlabError("glm=True needs concrete model arguments and check=True.")
        return ss
    rng = np.random.default_rng(seed)
    values = _random_values(ss, tr, model_args, model_kwargs, rng)
    _check_structure(ss, model_args, model_kwargs, values, rng)
    per_coord = _check_per_coordinate(ss, model_args, model_kwargs, values, rng)
    info = None
    if glm is not False:
        info, why = _detect_glm(ss, model_args, model_kwargs, values, rng)
        if info is None and glm is True:
            raise SpikeSlabError(f"glm=True but the GLM fast path does not apply: {why}")
    return SpikeSlab(
        model=model,
        indicator=indicator,
        coefficient=coefficient,
        num_coefficients=p,
        plate=plate,
        continuous_sites=ss.continuous_sites,
        per_coordinate_prior=per_coord,
        glm=info,
        deterministic_in_plate=det_in_plate,
    )


def init_to_spike(site=None, coefficient=None):
    """Initialisation strategy: the site named ``coefficient`` is drawn from its prior (under
    γ = 0: the spike), every other continuous site uses ``init_to_uniform``.

    Use as ``init_to_spike(coefficient="theta")``.
    """
    if site is None:
        return partial(init_to_spike, coefficient=coefficient)
    if site["name"] == coefficient:
        return init_to_sample(site)
    return init_to_uniform(site)


def initial_values(ss: "SpikeSlab", rng_key, init_params, init_strategy, model_args=(),
                   model_kwargs=None, num_chains=None, ignore=()):
    """Starting values ``(continuous unconstrained params, indicator)`` of a spike-and-slab chain.

    ``init_params`` (a dict of unconstrained continuous site values, optionally with the
    indicator; names in ``ignore`` are dropped) is used as given.  Otherwise the indicator
    starts at 0 and the continuous sites come from ``init_strategy`` (default
    :func:`init_to_spike`: the coefficients from the spike, which the search for a model
    needs — SPEC §5) with the model conditioned on γ = 0.  ``num_chains``: ``None`` for one
    chain (``rng_key`` a key), else the number of vectorised chains (a batch of keys).
    """
    indicator = None
    if init_params is not None:
        init_params = dict(init_params)
        indicator = init_params.pop(ss.indicator, None)
        for name in ignore:
            init_params.pop(name, None)
    p = ss.num_coefficients
    if not init_params:
        zeros = jnp.zeros((p,), jnp.int32)
        info = initialize_model(
            rng_key,
            ss._run(ss.conditioned(zeros), ss.first_indices()),
            init_strategy=init_strategy or init_to_spike(coefficient=ss.coefficient),
            model_args=model_args,
            model_kwargs=model_kwargs or {},
        )
        init_params = info.param_info.z
    if indicator is None:
        indicator = jnp.zeros((p,) if num_chains is None else (num_chains, p), jnp.int32)
    return init_params, jnp.asarray(indicator)


def site_types(model, model_args=(), model_kwargs=None) -> dict:
    """``{site name: site type}`` of one cheap trace of ``model`` (plates on their first indices)."""
    return {name: site["type"] for name, site in _trace_model(model, model_args, model_kwargs).items()}


def effective_site_name(ss: "SpikeSlab", existing: dict, requested=None) -> str:
    """Name of the output β = θ·γ: ``requested``, else ``"beta"``, else ``"<coefficient>_eff"``.

    A deterministic site of the model may carry the name (the kernels then output the model's
    own value); any other kind of site with it is an error.  ``existing`` is
    :func:`site_types` of the model.
    """
    if requested is None:
        return "beta" if existing.get("beta", "deterministic") == "deterministic" else f"{ss.coefficient}_eff"
    if existing.get(requested, "deterministic") != "deterministic":
        raise ValueError(f"effective_name={requested!r} is already a {existing[requested]} site of the model.")
    return requested


def _prior_depends_on_indicator(model, model_args, model_kwargs, tr, indicator, name, p):
    vals = {n_: s["value"] for n_, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}
    out = []
    for g in (jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)):
        vals2 = dict(vals)
        vals2[indicator] = g
        try:
            t2 = _trace_model(substitute(model, data=vals2), model_args, model_kwargs)
        except Exception:  # pragma: no cover - unusual models
            return False
        out.append(jnp.sum(t2[name]["fn"].log_prob(t2[name]["value"])))
    return bool(jnp.abs(out[0] - out[1]) > 1e-6)


def _random_values(ss, tr, model_args, model_kwargs, rng):
    """Constrained values of the continuous sites: the traced draw, θ replaced by N(0,1)."""
    values = {
        n_: jnp.asarray(tr[n_]["value"]) for n_ in ss.continuous_sites
    }
    values[ss.coefficient] = jnp.asarray(rng.normal(size=ss.num_coefficients), jnp.result_type(float))
    return values


def _check_indices(ss, rng):
    if ss.plate is None:
        return {}
    n = min(ss.plate.size, 64)
    idx = rng.choice(ss.plate.size, size=n, replace=False) if ss.plate.size > n else np.arange(n)
    return {ss.plate.name: jnp.asarray(np.sort(idx), jnp.int32)}


def _close(a, b, rtol=1e-4, atol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all(np.abs(a - b) <= atol + rtol * np.maximum(np.abs(a), np.abs(b))))


def _check_structure(ss, model_args, model_kwargs, values, rng):
    """The likelihood depends on θ only through θ·γ (checked on two random γ)."""
    terms = ss.terms_fn(model_args, model_kwargs)
    idx = _check_indices(ss, rng)
    p = ss.num_coefficients
    for trial in range(2):
        gamma = (rng.random(p) < 0.5).astype(np.int32) if trial else (np.arange(p) % 2 == 0).astype(np.int32)
        if p > 1 and gamma.all():
            gamma[-1] = 0
        gamma = jnp.asarray(gamma)
        theta = values[ss.coefficient]
        _, ll = terms(values, gamma, idx)
        if not np.all(np.isfinite(np.asarray(ll))):
            continue
        moved = dict(values)
        moved[ss.coefficient] = theta + (1 - gamma) * jnp.asarray(3.0 * rng.normal(size=p) + 1.0, theta.dtype)
        _, ll_moved = terms(moved, gamma, idx)
        if not _close(ll, ll_moved):
            j = int(np.flatnonzero(np.asarray(1 - gamma))[0]) if (1 - np.asarray(gamma)).any() else 0
            raise SpikeSlabError(
                f"The likelihood is not of the spike-and-slab form: changing the coefficients "
                f"{ss.coefficient!r}[j] of excluded variables ({ss.indicator!r}[j] = 0, e.g. "
                f"j = {j}) changed the mini-batch log-likelihood (by up to "
                f"{float(np.max(np.abs(np.asarray(ll_moved) - np.asarray(ll)))):.3g}). The "
                f"likelihood must depend on {ss.coefficient!r} only through "
                f"{ss.coefficient} * {ss.indicator}."
            )
        eff = dict(values)
        eff[ss.coefficient] = theta * gamma
        _, ll_eff = terms(eff, jnp.ones((p,), jnp.int32), idx)
        if not _close(ll, ll_eff):
            raise SpikeSlabError(
                f"The likelihood is not of the spike-and-slab form: it depends on the indicator "
                f"{ss.indicator!r} other than through {ss.coefficient} * {ss.indicator} (the "
                f"likelihood at (θ, γ) differs from the one at (θ·γ, 1))."
            )


def _check_per_coordinate(ss, model_args, model_kwargs, values, rng):
    prior = ss.prior_fn(model_args, model_kwargs)
    coord = ss.coordinate_prior_fn(model_args, model_kwargs)
    p = ss.num_coefficients
    theta = values[ss.coefficient]
    try:
        cp = coord(values, theta)
    except Exception:  # a prior that cannot be read per coordinate
        return False
    shapes_ok = all(jnp.shape(a) == (p,) for a in cp)
    if not shapes_ok:
        return False
    odds = np.asarray(cp.indicator1 - cp.indicator0 + cp.coefficient1 - cp.coefficient0, np.float64)
    for _ in range(3):
        ga = (rng.random(p) < rng.uniform(0.05, 0.95)).astype(np.int32)
        gb = (rng.random(p) < rng.uniform(0.05, 0.95)).astype(np.int32)
        diff = float(prior(values, jnp.asarray(ga)) - prior(values, jnp.asarray(gb)))
        pred = float(np.sum((ga - gb) * odds))
        if not np.isfinite(diff) or abs(diff - pred) > 1e-3 * (1.0 + abs(diff)):
            return False
    return True


def _detect_glm(ss, model_args, model_kwargs, values, rng):
    """(GLMInfo, "") when the likelihood is a GLM in β, else (None, reason)."""
    if ss.plate is None:
        plate_names = set()
    else:
        plate_names = {ss.plate.name}
    p = ss.num_coefficients
    idx = _check_indices(ss, rng)
    ones = jnp.ones((p,), jnp.int32)
    vals = dict(values)
    m = substitute(ss.conditioned(ones), data=vals)
    rec = _record_subsample(ss._run(m, idx))
    tr = trace(seed(rec, rng_seed=0)).get_trace(*model_args, **model_kwargs)
    obs = [
        s for s in tr.values()
        if s["type"] == "sample" and s["is_observed"] and s["name"] != ss.indicator
        and (not plate_names or plate_names.intersection(_plates_of(s)))
    ]
    if len(obs) != 1:
        return None, f"the likelihood has {len(obs)} observed sites (the fast path needs one)"
    site = obs[0]
    fam = _family_of(site["fn"])
    if fam is None:
        return None, (
            f"observed site {site['name']!r} has distribution {type(_strip(site['fn'])).__name__}; "
            "the fast path supports Normal, Bernoulli and Poisson"
        )
    y = site["value"]
    if jnp.ndim(y) != 1:
        return None, f"observed site {site['name']!r} has shape {jnp.shape(y)}; the fast path needs (n,)"
    n = jnp.shape(y)[0]
    sources = []
    N = ss.plate.size if ss.plate is not None else n
    for k, v in enumerate(rec.values):
        if jnp.shape(v) == (N, p):
            sources.append(("subsample", k))
    for i, a in enumerate(model_args):
        if jnp.ndim(a) == 2 and jnp.shape(a) == (N, p):
            sources.append(("arg", i))
    for k, a in model_kwargs.items():
        if jnp.ndim(a) == 2 and jnp.shape(a) == (N, p):
            sources.append(("kwarg", k))
    if not sources:
        return None, (
            f"no design matrix of shape (N, p) = ({N}, {p}) found among the data passed to "
            "`numpyro.subsample(X, event_dim=1)` or the model arguments"
        )
    for source in sources:
        info = GLMInfo(fam[0], site["name"], source)
        try:
            fn = _glm_batch_fn(ss, info, model_args, model_kwargs)
            b1 = jnp.asarray(rng.normal(size=p) / np.sqrt(p), values[ss.coefficient].dtype)
            b2 = jnp.asarray(rng.normal(size=p) / np.sqrt(p), values[ss.coefficient].dtype)
            g1, g2 = fn(vals, b1, idx), fn(vals, b2, idx)
        except Exception:  # noqa: BLE001 - a candidate that does not fit is simply skipped
            continue
        d_eta = np.asarray(g1.eta, np.float64) - np.asarray(g2.eta, np.float64)
        pred = np.asarray(g1.X, np.float64) @ (np.asarray(b1, np.float64) - np.asarray(b2, np.float64))
        tol = 1e-3 * max(1.0, float(np.max(np.abs(np.asarray(g1.eta)))))
        if not np.all(np.abs(d_eta - pred) <= tol):
            continue
        terms = ss.effective_loglik_terms_fn(model_args, model_kwargs)(vals, b1, idx)
        fam_terms = g1.scale * info.family.loglik(g1.eta, g1.y, g1.params)
        if not _close(terms, fam_terms, rtol=1e-3, atol=1e-3 * g1.scale):
            continue
        return info, ""
    return None, "the linear predictor is not X·β (+ offset) for any candidate design matrix"
