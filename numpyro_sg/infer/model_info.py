"""One trace of a NumPyro model, read by every part of the package that needs its structure.

:func:`trace_model` runs the model **once** — every subsample plate on its first n indices,
distribution validation off (so our data checks, which name the argument at fault, speak
first), optionally with an initialisation strategy substituted and vectorised over a batch of
chain keys — and returns a :class:`ModelInfo`: the sites (type, shape, support, plates), the
subsample plates and their sizes, whether a deterministic site sits inside one, the full data
arrays passed to ``numpyro.subsample`` (for the data checks and the GLM fast paths), and the
initial values of the chains on the unconstrained space.  Plate discovery
(:mod:`numpyro_sg.infer.minibatch`), spike-and-slab introspection (:mod:`numpyro_sg.spike_slab`),
site types and deterministic-site detection all read this object instead of tracing the
model again.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.distribution import validation_enabled
from numpyro.distributions.transforms import biject_to
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import init_to_uniform
from numpyro.primitives import Messenger
from numpyro.util import is_prng_key


def plates_of(site) -> tuple:
    """Names of the plates a trace site sits in (innermost last)."""
    return tuple(frame.name for frame in site.get("cond_indep_stack", []))


def base_distribution(fn):
    """``fn`` without its Independent / Expanded / Masked wrappers."""
    while isinstance(fn, (dist.Independent, dist.ExpandedDistribution, dist.MaskedDistribution)):
        fn = fn.base_dist
    return fn


def is_binary(fn) -> bool:
    """True when the distribution's support is {0, 1} (Bernoulli, boolean, integer_interval(0, 1))."""
    support = fn.support
    if support is constraints.boolean:
        return True
    if isinstance(base_distribution(fn), (dist.BernoulliLogits, dist.BernoulliProbs)):
        return True
    if isinstance(support, constraints.independent):
        support = support.base_constraint
    if isinstance(support, constraints._IntegerInterval):
        lo, hi = support.lower_bound, support.upper_bound
        if isinstance(lo, jax.core.Tracer) or isinstance(hi, jax.core.Tracer):
            return False
        return bool(np.all(np.asarray(lo) == 0) and np.all(np.asarray(hi) == 1))
    return support is constraints.boolean


def is_real(fn) -> bool:
    """True when the distribution's support is the whole real line (per element)."""
    support = fn.support
    if isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real or isinstance(support, type(constraints.real))


class first_indices(Messenger):
    """Handler filling every subsample plate with indices 0..n−1 (skips NumPyro's O(N) draw).

    A plate whose own ``subsample_size`` exceeds its size N is an error that names the plate
    (NumPyro itself would fail later with a shape error).
    """

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["value"] is None:
            size, n = msg["args"][0], msg["args"][1]
            if n is not None and n > size:
                raise ValueError(
                    f"Plate '{msg['name']}' is declared with subsample_size={n}, larger than its "
                    f"size N={size}. Use a subsample_size in [1, N]."
                )
            msg["value"] = jnp.arange(msg["args"][1])


class record_subsample(Messenger):
    """Handler recording the *full* data passed to every ``numpyro.subsample`` call, in order.

    (The plate subsamples in its own ``postprocess_message``, which runs after this one's.)
    """

    def __init__(self, fn=None):
        self.values = []
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "subsample":
            self.values.append(msg["value"])


@dataclass(frozen=True)
class SiteInfo:
    """Static description of one trace site.

    ``type`` NumPyro's site type (``"sample"``, ``"deterministic"``, ``"plate"``, …);
    ``shape`` the value's shape for one chain; ``plates`` the plates it sits in;
    ``distribution`` the class name of its (unwrapped) distribution; ``discrete``,
    ``binary``, ``real`` properties of its support; ``unconstrained_shape`` the shape of its
    unconstrained value (continuous latent sites only); ``plate_args`` ``(N, n)`` for a plate.
    """

    name: str
    type: str
    is_observed: bool = False
    shape: tuple = ()
    plates: tuple = ()
    distribution: str = ""
    discrete: bool = False
    binary: bool = False
    real: bool = False
    unconstrained_shape: tuple | None = None
    plate_args: tuple | None = None


@dataclass(frozen=True)
class ModelInfo:
    """Everything the package needs to know about a model's structure, from one trace.

    :ivar model: the model.
    :ivar sites: ``{name: SiteInfo}`` in execution order.
    :ivar subsample_plates: ``{plate name: (N, n)}`` of the plates declared with a
        ``subsample_size`` (a plate declared with ``subsample_size=N`` counts).
    :ivar subsample_data: the full arrays passed to ``numpyro.subsample``, in call order.
    :ivar init_values: unconstrained initial values ``{site: array}`` of the continuous latent
        sites (with a leading chain axis when traced for a batch of keys), or ``None``.
    :ivar init_constrained: the same values on the constrained space, discrete latent sites
        included (their initial draws), or ``None``.
    """

    model: Callable = field(repr=False)
    sites: dict
    subsample_plates: dict
    subsample_data: tuple = field(default=(), repr=False)
    init_values: Any = field(default=None, repr=False)
    init_constrained: Any = field(default=None, repr=False)

    @property
    def latent_sites(self) -> list[str]:
        """Names of the latent sample sites (observed ones excluded)."""
        return [n for n, s in self.sites.items() if s.type == "sample" and not s.is_observed]

    @property
    def continuous_sites(self) -> list[str]:
        """Latent sites with a continuous support, sorted (``ravel_pytree``'s order)."""
        return sorted(n for n in self.latent_sites if not self.sites[n].discrete)

    @property
    def discrete_sites(self) -> list[str]:
        """Latent sites with a discrete support, sorted."""
        return sorted(n for n in self.latent_sites if self.sites[n].discrete)

    @property
    def site_types(self) -> dict:
        """``{site name: site type}``."""
        return {n: s.type for n, s in self.sites.items()}

    @property
    def plate_names(self) -> list[str]:
        """Names of every plate of the model (with or without subsampling)."""
        return [n for n, s in self.sites.items() if s.type == "plate"]

    def deterministic_in(self, plate_names) -> bool:
        """True when a deterministic site sits inside one of ``plate_names``."""
        names = set(plate_names)
        return any(s.type == "deterministic" and names.intersection(s.plates) for s in self.sites.values())

    def latent_in(self, plate_names) -> list[tuple[str, str]]:
        """``(site, plate)`` for every latent sample site inside one of ``plate_names``."""
        names = set(plate_names)
        return [
            (n, sorted(names.intersection(s.plates))[0])
            for n, s in self.sites.items()
            if s.type == "sample" and not s.is_observed and names.intersection(s.plates)
        ]

    def unconstrained_example(self) -> dict:
        """Zeros of each continuous latent site's unconstrained shape (for ``ravel_pytree``)."""
        return {n: jnp.zeros(self.sites[n].unconstrained_shape) for n in self.continuous_sites}


def _site_info(name, site) -> SiteInfo:
    if site["type"] == "plate":
        size, n = site["args"][0], site["args"][1]
        return SiteInfo(name, "plate", plate_args=(int(size), None if n is None else int(n)))
    if site["type"] != "sample":
        return SiteInfo(name, site["type"], shape=tuple(jnp.shape(site["value"])), plates=plates_of(site))
    fn = site["fn"]
    shape = tuple(jnp.shape(site["value"]))
    discrete = bool(fn.support.is_discrete)
    unconstrained = None
    if not discrete and not site["is_observed"]:
        unconstrained = tuple(biject_to(fn.support).inverse_shape(shape))
    return SiteInfo(
        name,
        "sample",
        is_observed=bool(site["is_observed"]),
        shape=shape,
        plates=plates_of(site),
        distribution=type(base_distribution(fn)).__name__,
        discrete=discrete,
        binary=is_binary(fn),
        real=is_real(fn),
        unconstrained_shape=unconstrained,
    )


def _latent_values(tr):
    """(unconstrained continuous values, constrained latent values) of a trace."""
    unconstrained, constrained = {}, {}
    for name, site in tr.items():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        constrained[name] = site["value"]
        if not site["fn"].support.is_discrete:
            unconstrained[name] = biject_to(site["fn"].support).inv(site["value"])
    return unconstrained, constrained


def improper_to_uniform(site):
    """``init_to_uniform``'s value for a latent site with an improper prior
    (``dist.ImproperUniform``, which cannot be sampled), ``None`` (no substitution) elsewhere:
    the substitution that lets a model with such a site be traced without an init strategy."""
    if (site["type"] == "sample" and not site["is_observed"]
            and isinstance(base_distribution(site["fn"]), dist.ImproperUniform)):
        return init_to_uniform(site)
    return None


_STRUCTURE_ONLY = contextvars.ContextVar("structure_only", default=False)


@contextlib.contextmanager
def structure_only():
    """Within this block a model that integrates latent variables out numerically (the local
    latents' :class:`~numpyro_sg.locals.model.MarginalModel`) puts zeros where that integral's
    log density would go: for traces that read the model's structure and latent values (sites,
    shapes, initial values, constrained draws), never its density."""
    token = _STRUCTURE_ONLY.set(True)
    try:
        yield
    finally:
        _STRUCTURE_ONLY.reset(token)


def structure_only_active() -> bool:
    """Whether the current trace reads structure only (:func:`structure_only`)."""
    return _STRUCTURE_ONLY.get()


def trace_model(model: Callable, model_args=(), model_kwargs=None, *, init_strategy=None,
                rng_key=None) -> ModelInfo:
    """Trace ``model`` once and describe it (see :class:`ModelInfo`).

    Every subsample plate runs on its first n indices (no O(N) index draw) and distribution
    validation is off; a latent site with an improper prior (``dist.ImproperUniform``) takes
    :func:`improper_to_uniform`'s value (it has no prior draw).  With ``init_strategy`` (a NumPyro init strategy such as
    ``init_to_uniform``) and ``rng_key`` (a key, or a batch of keys for several chains, in
    which case the single trace is vectorised with ``jax.vmap``), the initial values of the
    latent sites are drawn in the same trace.

    :param model: a NumPyro model.
    :param model_args: its positional arguments.
    :param model_kwargs: its keyword arguments.
    :param init_strategy: optional init strategy (``substitute_fn``) for the latent sites.
    :param rng_key: key(s) of the trace's random draws (default ``PRNGKey(0)``).
    :return: a :class:`ModelInfo`.

    **Example:**

    .. code-block:: python

        info = trace_model(model, (X, y))
        info.subsample_plates      # {'data': (100000, 1000)}
        info.continuous_sites      # ['theta']
    """
    model_kwargs = {} if model_kwargs is None else model_kwargs
    rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    batched = init_strategy is not None and not is_prng_key(rng_key)
    recorded: dict = {}

    def run(key):
        fn = substitute(seed(model, key), substitute_fn=init_strategy or improper_to_uniform)
        rec = record_subsample(first_indices(fn))
        with validation_enabled(False), structure_only():
            tr = trace(rec).get_trace(*model_args, **model_kwargs)
        recorded["sites"] = {name: _site_info(name, site) for name, site in tr.items()}
        recorded["data"] = tuple(rec.values)
        return _latent_values(tr)

    if batched:
        unconstrained, constrained = jax.vmap(run)(rng_key)
    else:
        unconstrained, constrained = run(rng_key if is_prng_key(rng_key) else rng_key[0])
    sites = recorded["sites"]
    plates = {
        n: s.plate_args for n, s in sites.items() if s.type == "plate" and s.plate_args[1] is not None
    }
    return ModelInfo(
        model=model,
        sites=sites,
        subsample_plates=plates,
        subsample_data=recorded["data"],
        init_values=unconstrained if init_strategy is not None else None,
        init_constrained=constrained if init_strategy is not None else None,
    )
