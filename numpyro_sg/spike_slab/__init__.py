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
    subsample_size=None, glm="auto", check=True, seed=0, info=None) -> SpikeSlab``.
    Finds the two sites (or takes their names), validates the structure and detects a GLM
    likelihood.  Errors (``ValueError``) name the problem: no/several binary sites (pass
    ``indicator=``), an indicator that is not binary, no/several coefficient sites (pass
    ``coefficient=``), shapes that differ, a coefficient that is not real-valued, or a
    likelihood that changes when an excluded coefficient changes.  ``info`` is a
    :class:`~numpyro_sg.infer.model_info.ModelInfo` of the model (a kernel that traced it already
    passes it, so the model is not traced again); the numerical checks then run the model
    once, vectorised over all their random configurations.

:class:`SpikeSlab` (static metadata only: safe to build under ``jit``/``pmap``)
    Attributes ``indicator``, ``coefficient``, ``num_coefficients`` (p), ``plate`` (the
    :class:`~numpyro_sg.infer.minibatch.SubsamplePlate` or ``None`` for a model without one),
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

.. rubric:: Modules

* :mod:`numpyro_sg.spike_slab.glm` — GLM families, :class:`GLMInfo`, :class:`GLMBatch`,
  where the design array comes from;
* :mod:`numpyro_sg.spike_slab.structure` — :class:`SpikeSlab` and the pure functions it
  builds, on the one substitute/condition/trace chain :func:`trace_spike_slab`;
* :mod:`numpyro_sg.spike_slab.checks` — the numerical structure, per-coordinate-prior and
  GLM-affinity checks, in one vectorised model run;
* :mod:`numpyro_sg.spike_slab.discovery` — :func:`find_spike_slab`;
* :mod:`numpyro_sg.spike_slab.sites` — :class:`SpikeSlabSites`, the kernels' ``sites``;
* :mod:`numpyro_sg.spike_slab.initial` — starting values (:func:`init_to_spike`,
  :func:`start_fn`, :func:`initial_values`) and output names (:func:`site_types`,
  :func:`effective_site_name`).
"""

from numpyro_sg.spike_slab.discovery import find_spike_slab
from numpyro_sg.spike_slab.glm import GLM_FAMILIES, GLMBatch, GLMFamily, GLMInfo  # noqa: F401
from numpyro_sg.spike_slab.initial import (  # noqa: F401
    effective_site_name,
    init_to_spike,
    initial_values,
    site_types,
    start_fn,
    strategy_indicator,
)
from numpyro_sg.spike_slab.sites import SpikeSlabSites
from numpyro_sg.spike_slab.structure import (  # noqa: F401
    CoordinateNormal,
    CoordinatePrior,
    SpikeSlab,
    SpikeSlabError,
)

__all__ = ["find_spike_slab", "SpikeSlab", "SpikeSlabError", "GLMFamily", "GLM_FAMILIES",
           "init_to_spike", "SpikeSlabSites"]
