"""The local latents after sampling, and NUTS on the joint model.

The kernels keep only the globals θ; the locals' posterior is recovered from the kept draws by
Rao-Blackwellisation: for each draw θ_t and group g the conditional p(b_g | y_g, θ_t) has mean
m_tg and sd s_tg (exact for Gaussian locals, importance-weighted otherwise:
:mod:`numpyro_sg.locals.marginal`), and

    E[b_g | y] ≈ mean_t m_tg,    sd[b_g | y] ≈ sqrt(mean_t s_tg² + var_t m_tg).

:func:`local_posterior` computes them in chunks of groups (memory O(chunk·draws·k)) on at most
``max_draws`` evenly thinned draws; :func:`add_local_posterior` stores them in an
``InferenceData`` group ``local_posterior`` (variables ``<site>_mean`` and ``<site>_sd``, dims
``(<plate>, <site>_dim_0, …)``).  :func:`local_draws` draws the locals of chosen groups, one
draw of b_g ~ p(b_g | y_g, θ_t) per kept draw θ_t (exact for Gaussian locals, by sampling
importance resampling otherwise), for trace plots and joint summaries of a few groups; a size
guard refuses more than ``max_values`` numbers.  :func:`joint_model` is the model with its
subsample plates made full, locals included, for NUTS.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr
import numpyro.distributions as dist
from numpyro.handlers import reparam, substitute
import numpyro
from numpyro.infer.reparam import LocScaleReparam, Reparam

from numpyro_sg.arviz_compat import get_group, set_group
from numpyro_sg.infer.handlers import with_indices
from numpyro_sg.infer.jit_data import jit_with_data
from numpyro_sg.infer.lapack_guard import map_over_draws
from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.infer.progress import progress_steps
from numpyro_sg.locals.fitting import log_marginal_of
from numpyro_sg.locals.model import MarginalModel, integrate_locals

#: NUTS on the joint model is refused above this many latent scalars (locals included)
JOINT_MAX_DIM = 200_000
#: the size guard of :func:`local_draws` (numbers drawn: draws × groups × locals per group)
LOCAL_DRAWS_MAX_VALUES = 10_000_000
#: importance draws per group and kept draw of :func:`local_posterior` (at least the run's)
POSTERIOR_DRAWS = 64
#: attribute marking a posterior variable as :func:`add_local_draws`' draws (value: the plate)
LOCAL_DRAWS_ATTR = "local_draws_of_plate"
#: the InferenceData group of the locals' Rao-Blackwellised posterior mean and sd
LOCAL_GROUP = "local_posterior"


#: the fewest draws per chain :func:`affordable_draws` gives
MIN_AFFORDABLE_DRAWS = 100


def affordable_draws(model, steps: int, most: int) -> int:
    """Draws per chain whose full-data evaluations cost about what a chain's ``steps`` sampling
    steps did, between :data:`MIN_AFFORDABLE_DRAWS` and ``most``: ``most`` for a model without
    local latents (a full-data pass is one vectorised sum, far cheaper than it is long), and
    ``steps · n / G`` for a :class:`~numpyro_sg.locals.MarginalModel` (its full-data pass does
    for every one of the G groups what a step does for the n of its mini-batch: a
    conditional-mode search and importance draws).

    >>> affordable_draws(lambda y: None, 3000, 1000)
    1000
    """
    if not isinstance(model, MarginalModel) or not model.batch_size:
        return int(most)
    return int(min(most, max(MIN_AFFORDABLE_DRAWS, steps * model.batch_size // model.plate_size)))


def _thin(samples, max_draws):
    T = next(iter(samples.values())).shape[0]
    keep = np.unique(np.linspace(0, T - 1, min(T, int(max_draws))).round().astype(int))
    return {k: jnp.asarray(v)[keep] for k, v in samples.items()}


def local_posterior(model: MarginalModel, samples: dict, model_args=(), model_kwargs=None, *,
                    chunk_size: int = 1024, max_draws: int = 500) -> dict:
    """Rao-Blackwellised posterior mean and sd of every local site, per group.

    :param model: the prepared :class:`~numpyro_sg.locals.MarginalModel` (``kernel.model`` after
        a run).
    :param samples: constrained draws of the globals ``{site: (T, ...)}`` (``mcmc.get_samples()``).
    :param chunk_size: groups per chunk (memory O(chunk_size · draws · k)).
    :param max_draws: at most this many evenly thinned draws are used.
    :return: ``{site: (mean, sd)}``, numpy arrays of shape (G, *per-group shape).
    """
    if not isinstance(model, MarginalModel) or model.resolved is None:
        raise TypeError("local_posterior needs the prepared MarginalModel of a run (kernel.model).")
    samples = _thin({k: v for k, v in samples.items() if not k.startswith("_")}, max_draws)
    # more importance draws than a step's (the self-normalised mean and sd are biased by O(1/m)),
    # in chunks shrunk to keep the memory
    m = max(model.num_draws, POSTERIOR_DRAWS) if model.resolved == "importance" else model.num_draws
    chunk_size = max(1, chunk_size * model.num_draws // m)
    model = model.with_num_draws(m)
    G, C = model.plate_size, int(min(chunk_size, model.plate_size))
    starts = jnp.arange(0, G, C)

    def moments(theta, idx, args, kwargs):
        box = {}

        def fn(*a, **k):
            box["est"] = model.run(*a, **k)[1]

        substitute(with_indices(fn, {model.plate: idx}), data=theta)(*args, **kwargs)
        return box["est"].mean, box["est"].sd

    def chunk(start, args, kwargs):
        idx = jnp.minimum(start + jnp.arange(C), G - 1)
        m, s = map_over_draws(lambda th: moments(th, idx, args, kwargs), samples)   # (T, C, k)
        return m.mean(0), jnp.sqrt((s**2).mean(0) + m.var(0))

    run = jit_with_data(lambda start, a, k: chunk(start, a, k), model_args, model_kwargs or {})
    parts = [jax.block_until_ready(run(s)) for s in progress_steps(starts, "locals' posterior")]
    mean = np.concatenate([np.asarray(p[0]) for p in parts])[:G]
    sd = np.concatenate([np.asarray(p[1]) for p in parts])[:G]
    out, off = {}, 0
    for site in model.sites:
        block = slice(off, off + site.size)
        out[site.name] = (mean[:, block].reshape((G,) + site.rest_shape),
                          sd[:, block].reshape((G,) + site.rest_shape))
        off += site.size
    return out


def local_draws(model: MarginalModel, samples: dict, groups, model_args=(), model_kwargs=None, *,
                rng_key=None, max_values: int = LOCAL_DRAWS_MAX_VALUES) -> dict:
    """Draws of the locals of the chosen ``groups``: for each draw θ_t of ``samples``, one
    b_g ~ p(b_g | y_g, θ_t) per group — together draws from the joint posterior of (θ, b_g).

    :param model: the prepared :class:`~numpyro_sg.locals.MarginalModel` (``kernel.model``).
    :param samples: constrained draws of the globals ``{site: (T, ...)}``.
    :param groups: indices of the groups (ints in [0, G)).
    :param rng_key: PRNG key of the draws (default ``PRNGKey(0)``).
    :param max_values: refuse to draw more numbers than this (T × groups × locals per group).
    :return: ``{site: array (T, len(groups), *per-group shape)}``.
    """
    if not isinstance(model, MarginalModel) or model.resolved is None:
        raise TypeError("local_draws needs the prepared MarginalModel of a run (kernel.model).")
    groups = np.asarray(groups)
    G = model.plate_size
    if groups.ndim != 1 or groups.size == 0 or groups.dtype.kind not in "iu" \
            or groups.min() < 0 or groups.max() >= G:
        raise ValueError(f"groups must be a non-empty 1-d array of group indices in [0, {G}) of "
                         f"plate '{model.plate}'; got {groups!r}.")
    samples = {k: jnp.asarray(v) for k, v in samples.items() if not k.startswith("_")}
    T = next(iter(samples.values())).shape[0]
    size = T * groups.size * model.k
    if size > max_values:
        raise ValueError(
            f"local draws of {groups.size} groups × {T} draws × {model.k} locals = {size:,} numbers "
            f"exceed max_values={max_values:,}: choose fewer groups, thin the draws, or raise "
            "max_values (the per-group means and sds of every group are in the local_posterior "
            "group).")
    keys = jax.random.split(jax.random.PRNGKey(0) if rng_key is None else rng_key, T)
    idx = jnp.asarray(groups, jnp.int32)

    def one(theta, key, args, kwargs):
        box = {}

        def fn(*a, **k):
            box["draw"] = model.conditional_draw(key, *a, **k)[1]

        substitute(with_indices(fn, {model.plate: idx}), data=theta)(*args, **kwargs)
        return box["draw"]

    run = jit_with_data(lambda s, ks, a, k: map_over_draws(lambda sk: one(*sk, a, k), (s, ks)),
                        model_args, model_kwargs or {})
    draws = np.asarray(run(samples, keys))                            # (T, n, k)
    out, off = {}, 0
    for site in model.sites:
        out[site.name] = draws[:, :, off:off + site.size].reshape((T, groups.size) + site.rest_shape)
        off += site.size
    return out


def add_local_draws(idata, model: MarginalModel, samples_by_chain: dict, groups, model_args=(),
                    model_kwargs=None, **options):
    """Add the :func:`local_draws` of ``groups`` to ``idata``'s posterior (in place), as
    variables named after the local sites with dims ``(chain, draw, <plate>, …)`` and the group
    indices as the plate's coordinate; ``samples_by_chain``: ``{site: (chains, draws, ...)}``."""
    samples = {k: np.asarray(v) for k, v in samples_by_chain.items() if not k.startswith("_")}
    C, D = next(iter(samples.values())).shape[:2]
    flat = {k: v.reshape((C * D,) + v.shape[2:]) for k, v in samples.items()}
    found = local_draws(model, flat, groups, model_args, model_kwargs, **options)
    posterior = get_group(idata, "posterior")
    for name, draws in found.items():
        dims = ["chain", "draw", model.plate] + [f"{name}_dim_{i}" for i in range(draws.ndim - 2)]
        posterior[name] = xr.DataArray(draws.reshape((C, D) + draws.shape[1:]), dims=dims,
                                       coords={model.plate: np.asarray(groups),
                                               "chain": posterior.chain, "draw": posterior.draw},
                                       attrs={LOCAL_DRAWS_ATTR: model.plate})
    set_group(idata, "posterior", posterior)
    return idata


def select_local_draws(run, reference):
    """``reference`` with its draws of the local sites cut to the groups whose draws ``run``'s
    posterior holds (:func:`add_local_draws`), under the run's dims, so that the two compare
    variable by variable; ``reference`` itself (not copied) when there are none to cut."""
    run_post, ref_post = get_group(run, "posterior"), get_group(reference, "posterior")
    local = [v for v in run_post.data_vars
             if LOCAL_DRAWS_ATTR in run_post[v].attrs and v in ref_post.data_vars
             and run_post[v].shape[2:] != ref_post[v].shape[2:]]
    if not local:
        return reference
    for name in local:
        draws = run_post[name]
        plate = draws.attrs[LOCAL_DRAWS_ATTR]
        groups = draws.coords[plate].values
        ref_dim = ref_post[name].dims[2]
        if ref_dim == plate:   # the plate's dim by name: cut every variable on it alike
            ref_post = ref_post.isel({plate: groups}).assign_coords({plate: groups})
            continue
        ref = ref_post[name].isel({ref_dim: groups})
        ref = ref.rename(dict(zip(ref.dims[2:], draws.dims[2:]))).assign_coords({plate: groups})
        ref_post = ref_post.drop_vars(name).assign({name: ref})
    reference = reference.copy()
    set_group(reference, "posterior", ref_post)
    return reference


def add_local_posterior(idata, model: MarginalModel, samples: dict, model_args=(),
                        model_kwargs=None, **options):
    """Add the group :data:`LOCAL_GROUP` (``<site>_mean``, ``<site>_sd`` per group) to ``idata``
    (in place) from :func:`local_posterior`; returns ``idata`` (unchanged when ``model`` is not a
    :class:`~numpyro_sg.locals.MarginalModel`: a model without local latents)."""
    if not isinstance(model, MarginalModel):
        return idata
    found = local_posterior(model, samples, model_args, model_kwargs, **options)
    data = {}
    for name, (mean, sd) in found.items():
        dims = [model.plate] + [f"{name}_dim_{i}" for i in range(mean.ndim - 1)]
        data[f"{name}_mean"] = xr.DataArray(mean, dims=dims)
        data[f"{name}_sd"] = xr.DataArray(sd, dims=dims)
    ds = xr.Dataset(data, attrs={"method": model.resolved, "rao_blackwellised": 1})
    set_group(idata, LOCAL_GROUP, ds)
    return idata


def joint_model(model, model_args=(), model_kwargs=None, max_dim: int = JOINT_MAX_DIM,
                decentre: bool = False):
    """The model with every subsample plate run over all of its groups, locals included (the
    joint full-data model NUTS samples), or ``None`` when it has no local latent.

    ``decentre``: locals of a location-scale family (Normal, Student-t, Cauchy, Laplace,
    Logistic) are sampled as b = loc + scale·z (NumPyro's ``LocScaleReparam(0)``; ``b`` stays a
    deterministic site), multivariate normal ones as b = loc + L·z (``scale_tril`` L).  The centred joint has a funnel where a group scale is small, which
    NUTS can under-explore without a single divergence; the decentred one has none.

    Raises ValueError when the joint has more than ``max_dim`` latent scalars (NUTS would not be
    affordable): compare with a full-data sampler of the marginal model instead.
    """
    base = model.model if isinstance(model, MarginalModel) else model
    info = trace_model(base, model_args, model_kwargs)
    locals_ = info.latent_in(info.subsample_plates)
    if not locals_:
        return None
    dim = 0
    for name in info.continuous_sites:
        shape = info.sites[name].unconstrained_shape
        scale = 1
        if name in dict(locals_):
            N, n = info.subsample_plates[dict(locals_)[name]]
            scale = N / n
        dim += int(np.prod(shape) * scale)
    if dim > max_dim:
        raise ValueError(
            f"NUTS on the joint model would sample {dim:,} latent scalars (locals "
            f"{[s for s, _ in locals_]} included), more than max_dim={max_dim:,}: not affordable. "
            "Use a marginal model with the locals integrated out in closed form, or fewer groups.")
    full = {p: jnp.arange(N) for p, (N, _) in info.subsample_plates.items()}
    joint = with_indices(base, full)
    return decentred(joint, {name for name, _ in locals_}) if decentre else joint


#: location-scale families the joint model decentres, with their shape parameters
LOC_SCALE_FAMILIES = {dist.Normal: (), dist.StudentT: ("df",), dist.Cauchy: (), dist.Laplace: (),
                      dist.Logistic: ()}


class MultivariateNormalDecentring(Reparam):
    """A ``MultivariateNormal(loc, scale_tril=L)`` site sampled as b = loc + L·z, z ~ N(0, I)
    (site ``<name>_decentered``; ``b`` stays a deterministic site): the multivariate form of
    ``LocScaleReparam(0)``, for correlated group effects whose scale can be small."""

    def __call__(self, name, fn, obs):
        assert obs is None, "decentring applies to latent sites only"
        fn, expand_shape, event_dim = self._unwrap(fn)
        standard = dist.Normal(jnp.zeros(fn.batch_shape + fn.event_shape), 1.0).to_event(1)
        z = numpyro.sample(f"{name}_decentered", self._wrap(standard, expand_shape, event_dim))
        return None, fn.loc + jnp.einsum("...ij,...j->...i", fn.scale_tril, z)


def decentred(model, names):
    """``model`` with its sites ``names`` of a location-scale family (possibly expanded or made
    independent; not masked) sampled as loc + scale·z (``LocScaleReparam(0)``; a multivariate
    normal as loc + L·z, :class:`MultivariateNormalDecentring`)."""
    def config(site):
        if site["type"] != "sample" or site["name"] not in names or site.get("is_observed"):
            return None
        fn = site["fn"]
        while isinstance(fn, (dist.Independent, dist.ExpandedDistribution)):
            fn = fn.base_dist
        if type(fn) is dist.MultivariateNormal:
            return MultivariateNormalDecentring()
        shape = LOC_SCALE_FAMILIES.get(type(fn))
        return None if shape is None else LocScaleReparam(0, shape_params=shape)

    return reparam(model, config=config)


def marginal_of(model, model_args=(), model_kwargs=None):
    """The globals' marginal as the gradient kernels sample it, to fit or score: the prepared
    :class:`MarginalModel` of a model with local latents (its options kept when ``model`` is one
    already; an imputation's log-marginal copy, :func:`log_marginal_of`), ``model`` itself when
    it has none (its latent sites are then all globals)."""
    base = model.model if isinstance(model, MarginalModel) else model
    return log_marginal_of(integrate_locals(model, trace_model(base, model_args, model_kwargs), model_args, model_kwargs))


def compare_locals(local_group, reference_posterior) -> pd.DataFrame | None:
    """Per-group comparison of a run's ``local_posterior`` group with a reference's draws of the
    same local sites (NUTS on the joint model), or ``None`` when they share none.

    Rows ``<site>[g, …]``; columns ``mean``, ``sd``, ``ref_mean``, ``ref_sd``, ``mean_err`` =
    (mean − ref_mean)/ref_sd and ``sd_rel_err`` = (sd − ref_sd)/ref_sd.
    """
    rows = []
    for var in local_group.data_vars:
        if not var.endswith("_mean") or var[:-5] not in reference_posterior.data_vars:
            continue
        name = var[:-5]
        mean = np.asarray(local_group[var]).ravel()
        sd = np.asarray(local_group[f"{name}_sd"]).ravel()
        draws = np.asarray(reference_posterior[name])
        draws = draws.reshape(-1, *draws.shape[2:]).reshape(draws.shape[0] * draws.shape[1], -1)
        if draws.shape[1] != mean.size:
            raise ValueError(f"local {name!r}: run has {mean.size} values, reference {draws.shape[1]}.")
        ref_mean, ref_sd = draws.mean(0), draws.std(0, ddof=1)
        shape = np.asarray(local_group[var]).shape
        labels = [f"{name}[{', '.join(map(str, i))}]" for i in np.ndindex(*shape)]
        rows.append(pd.DataFrame({"mean": mean, "sd": sd, "ref_mean": ref_mean, "ref_sd": ref_sd,
                                  "mean_err": (mean - ref_mean) / ref_sd,
                                  "sd_rel_err": (sd - ref_sd) / ref_sd}, index=labels))
    return pd.concat(rows) if rows else None
