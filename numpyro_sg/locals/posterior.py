"""The local latents after sampling, and NUTS on the joint model.

The kernels keep only the globals θ; the locals' posterior is recovered from the kept draws by
Rao-Blackwellisation: for each draw θ_t and group g the conditional p(b_g | y_g, θ_t) has mean
m_tg and sd s_tg (exact for Gaussian locals, importance-weighted otherwise:
:mod:`numpyro_sg.locals.marginal`), and

    E[b_g | y] ≈ mean_t m_tg,    sd[b_g | y] ≈ sqrt(mean_t s_tg² + var_t m_tg).

:func:`local_posterior` computes them in chunks of groups (memory O(chunk·draws·k)) on at most
``max_draws`` evenly thinned draws; :func:`add_local_posterior` stores them in an
``InferenceData`` group ``local_posterior`` (variables ``<site>_mean`` and ``<site>_sd``, dims
``(<plate>, <site>_dim_0, …)``).  :func:`joint_model` is the model with its subsample plates made
full, locals included, for NUTS.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr
from numpyro.handlers import substitute

from numpyro_sg.arviz_compat import set_group
from numpyro_sg.infer.handlers import with_indices
from numpyro_sg.infer.jit_data import jit_with_data
from numpyro_sg.infer.lapack_guard import map_over_draws
from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.locals.model import MarginalModel, integrate_locals

__all__ = ["local_posterior", "add_local_posterior", "joint_model", "marginal_of", "compare_locals", "JOINT_MAX_DIM", "LOCAL_GROUP"]

#: NUTS on the joint model is refused above this many latent scalars (locals included)
JOINT_MAX_DIM = 200_000
#: the InferenceData group of the locals' Rao-Blackwellised posterior mean and sd
LOCAL_GROUP = "local_posterior"


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
    parts = [run(s) for s in starts]
    mean = np.concatenate([np.asarray(p[0]) for p in parts])[:G]
    sd = np.concatenate([np.asarray(p[1]) for p in parts])[:G]
    out, off = {}, 0
    for site in model.sites:
        block = slice(off, off + site.size)
        out[site.name] = (mean[:, block].reshape((G,) + site.rest_shape),
                          sd[:, block].reshape((G,) + site.rest_shape))
        off += site.size
    return out


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


def joint_model(model, model_args=(), model_kwargs=None, max_dim: int = JOINT_MAX_DIM):
    """The model with every subsample plate run over all of its groups, locals included (the
    joint full-data model NUTS samples), or ``None`` when it has no local latent.

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
    return with_indices(base, full)


def marginal_of(model, model_args=(), model_kwargs=None):
    """The model as the gradient kernels sample it: the prepared :class:`MarginalModel` of a model
    with local latents (its options kept when ``model`` is one already), ``model`` itself when it
    has none (its latent sites are then all globals)."""
    base = model.model if isinstance(model, MarginalModel) else model
    return integrate_locals(model, trace_model(base, model_args, model_kwargs), model_args, model_kwargs)


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
