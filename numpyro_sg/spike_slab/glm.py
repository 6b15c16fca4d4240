r"""GLM likelihoods of spike-and-slab models: the families, where the design comes from, and the
mini-batch a fast path works on.

A likelihood is a *GLM in β* when it is one observed site inside the subsample plate whose
distribution is ``Normal(loc=η, scale)``, ``Bernoulli(logits=η)`` (or ``probs=sigmoid(η)``) or
``Poisson(rate=exp(η))``, with η = offset + X[S]·β and X an array of shape (N, p) that is
either passed to ``numpyro.subsample(X, event_dim=1)`` or a model argument indexed by the
plate (``X[idx]``).  Changing β_j by Δ then changes η by X[S, j]·Δ: an O(n) update, which is
what the kernels' fast paths use.  Whether a model's likelihood is such a GLM is decided
numerically by :func:`numpyro_sg.spike_slab.checks.detect_glm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from numpyro_sg.infer.model_info import base_distribution


class GLMFamily:
    """Per-datum log-likelihood of a GLM in its linear predictor η (unscaled).

    ``loglik(eta, y, params)``, ``dloglik`` and ``d2loglik`` (first and second derivative in
    η); ``params`` holds the family's other parameters (``{"scale": σ}`` for the Gaussian).
    The second derivative is what a second-order Taylor expansion in β_j needs
    (∂²ℓ/∂β_j² = scale·Σ_i X_ij²·d2loglik_i).

    **Example:**

    .. code-block:: python

        fam = GLM_FAMILIES["bernoulli"]
        fam.loglik(eta, y, {})        # y·η − log(1 + e^η), per datum
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
        """The :class:`GLMFamily` named ``family_name``."""
        return GLM_FAMILIES[self.family_name]


def family_of(fn):
    """``(family name, η, params)`` read from an observation distribution, or ``None``.

    ``Normal(η, σ)`` → ``("gaussian", η, {"scale": σ})``; ``Bernoulli(logits=η)`` or
    ``Bernoulli(probs=…)`` → ``("bernoulli", logits, {})``; ``Poisson(rate)`` →
    ``("poisson", log rate, {})``; anything else ``None``.  Independent / expanded / masked
    wrappers are looked through.

    **Example:**

    .. code-block:: python

        family_of(dist.Bernoulli(logits=eta))     # ("bernoulli", eta, {})
    """
    base = base_distribution(fn)
    if isinstance(base, dist.Normal):
        return "gaussian", base.loc, {"scale": base.scale}
    if isinstance(base, (dist.BernoulliLogits, dist.BernoulliProbs)):
        return "bernoulli", base.logits, {}
    if isinstance(base, dist.Poisson) and not getattr(base, "is_sparse", False):
        return "poisson", jnp.log(base.rate), {}
    return None


def per_element_log_prob(fn, value):
    """``log_prob`` per element of ``value`` (Independent layers removed, broadcast to its shape).

    **Example:**

    .. code-block:: python

        per_element_log_prob(dist.Normal(0.0, s).to_event(1), theta)   # (p,) log N(θ_j; 0, s_j²)
    """
    while isinstance(fn, dist.Independent):
        fn = fn.base_dist
    lp = fn.log_prob(value)
    return jnp.broadcast_to(lp, jnp.shape(value))


def design_candidates(subsample_data, model_args, model_kwargs, num_data, num_coefficients) -> list:
    """Sources of an (N, p) design array: ``("subsample", k)`` for the k-th array passed to
    ``numpyro.subsample``, ``("arg", i)``, ``("kwarg", name)`` for model arguments, in that
    order (each is then checked numerically).

    **Example:**

    .. code-block:: python

        design_candidates(info.subsample_data, (X, y), {}, N, p)   # [("subsample", 0), ("arg", 0)]
    """
    shape = (num_data, num_coefficients)
    sources = [("subsample", k) for k, v in enumerate(subsample_data) if jnp.shape(v) == shape]
    sources += [("arg", i) for i, a in enumerate(model_args) if jnp.ndim(a) == 2 and jnp.shape(a) == shape]
    sources += [("kwarg", k) for k, a in (model_kwargs or {}).items()
                if jnp.ndim(a) == 2 and jnp.shape(a) == shape]
    return sources


def design_array(source: tuple, subsample_data, model_args, model_kwargs):
    """The full design array X (N, p) named by ``source`` (see :class:`GLMInfo`); no copy.

    **Example:**

    .. code-block:: python

        X = design_array(("subsample", 0), info.subsample_data, (X, y), {})
    """
    kind, where = source
    if kind == "subsample":
        return jnp.asarray(subsample_data[where])
    return jnp.asarray(model_args[where] if kind == "arg" else model_kwargs[where])


def glm_batch_from_site(site, X, rows=None, num_data=None) -> GLMBatch:
    """The :class:`GLMBatch` of an observed trace site of a known family.

    ``X`` is the full design array, ``rows`` the plate's indices (``None``: X is used as is,
    all of its rows) and ``num_data`` N, so that ``scale`` = N/n with n the number of
    observations (``None`` for a model without a subsample plate: scale 1).

    **Example:**

    .. code-block:: python

        tr, data = ss.trace_at((X, y), {}, {"theta": beta}, ones, {"data": idx})
        batch = glm_batch_from_site(tr["y"], X, idx, num_data=N)   # scale N/n
    """
    _, eta, params = family_of(site["fn"])
    y = site["value"]
    if rows is not None:
        X = jnp.take(X, rows, axis=0)
    n = jnp.shape(y)[0]
    eta = jnp.broadcast_to(eta, (n,))
    params = {k: jnp.broadcast_to(v, (n,)) for k, v in params.items()}
    return GLMBatch(X, eta, y, params, 1.0 if num_data is None else num_data / n)
