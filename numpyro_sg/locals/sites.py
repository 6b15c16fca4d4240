"""Local latent sites of a model: detection, the checks that name site, plate and remedy, and the
per-group log joint of a mini-batch.

A latent sample site inside a subsample plate is *local*: one value per group (row of the
plate), drawn afresh for each mini-batch by the kernels instead of being kept in their state.
:func:`local_sites` finds them and raises a clear error for what the kernels cannot integrate out
(a discrete local, a constrained one, locals in several subsample plates); :func:`check_locals_stay_in_plate`
checks that no site outside the plate depends on a local.  :func:`group_log_joint` runs the
model on given rows with the globals and the locals substituted and returns, per group,
log p(y_g, b_g | θ), unscaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from numpyro.distributions.distribution import validation_enabled
from numpyro.handlers import block, seed, substitute, trace

from numpyro_sg.infer.handlers import with_indices
from numpyro_sg.infer.model_info import ModelInfo, first_indices, plates_of


@dataclass(frozen=True)
class LocalSite:
    """One local latent site: its ``name``, the ``plate`` it sits in, the per-group shape
    ``rest_shape`` (the site's shape without the plate axis), the plate axis' position ``axis``
    (negative, counted from the end of the value's shape) and ``size`` = prod(rest_shape)."""

    name: str
    plate: str
    rest_shape: tuple
    axis: int

    @property
    def size(self) -> int:
        """Number of scalars per group."""
        return int(math.prod(self.rest_shape))

    def to_value(self, u):
        """The site's value from its per-group block ``u`` (n, size)."""
        n = u.shape[0]
        return jnp.moveaxis(u.reshape((n,) + self.rest_shape), 0, self.axis)

    def to_block(self, value):
        """The per-group block (n, size) of a site value."""
        v = jnp.moveaxis(value, self.axis, 0)
        return v.reshape(v.shape[0], -1)


def plate_frame_dim(site, plate: str):
    """The (negative) batch dim of ``plate`` in a trace site, or None."""
    for frame in site.get("cond_indep_stack", []):
        if frame.name == plate:
            return frame.dim
    return None


def _remedy_discrete(name, plate, dist_name):
    return (f"Local latent site '{name}' in subsample plate '{plate}' is discrete ({dist_name}). "
            "The stochastic-gradient kernels integrate local latents out by Newton/Laplace or "
            "importance sampling, which needs a continuous local. Sum it out in the model: write "
            "the likelihood as a mixture (e.g. `dist.MixtureSameFamily`) or enumerate its values, "
            "so that no discrete site remains inside the plate.")


def local_sites(info: ModelInfo, tr) -> tuple:
    """The :class:`LocalSite` s of a traced model (``tr`` a trace of it on the first n rows).

    Raises ValueError naming site, plate and remedy for a discrete local, a local whose support
    is not the real line, or locals in more than one subsample plate.
    """
    found = info.latent_in(info.subsample_plates)
    out = []
    for name, plate in found:
        s = info.sites[name]
        if s.discrete:
            raise ValueError(_remedy_discrete(name, plate, s.distribution))
        if not s.real:
            raise ValueError(
                f"Local latent site '{name}' in subsample plate '{plate}' has a constrained "
                f"support ({s.distribution}); the kernels integrate out real-valued locals only. "
                "Reparameterise it on the real line (e.g. sample its logarithm with a Normal "
                "prior and transform it with numpyro.deterministic outside the likelihood).")
        site = tr[name]
        event_dim = site["fn"].event_dim
        dim = plate_frame_dim(site, plate)
        ndim = len(s.shape)
        axis = (ndim - event_dim + dim) - ndim
        shape = list(s.shape)
        del shape[ndim + axis]
        out.append(LocalSite(name, plate, tuple(shape), axis))
    plates = sorted({s.plate for s in out})
    if len(plates) > 1:
        raise ValueError(
            f"Local latent sites sit in several subsample plates {plates} "
            f"({[(s.name, s.plate) for s in out]}); local latents in more than one subsample "
            "plate are not yet supported. Put every per-group latent in one plate (crossed "
            "random effects need a full-data sampler such as NUTS).")
    return tuple(out)


def traced(model, model_args, model_kwargs, data=None, key=None):
    """A trace of ``model`` on the first n rows of its subsample plates, ``data`` substituted."""
    key = np.zeros(2, np.uint32) if key is None else key
    fn = first_indices(substitute(seed(model, key), data=data or {}))
    with validation_enabled(False):
        return trace(fn).get_trace(*model_args, **(model_kwargs or {}))


def _site_values(tr, skip_plate):
    vals = {}
    for name, site in tr.items():
        if site["type"] not in ("sample", "deterministic") or skip_plate in plates_of(site):
            continue
        vals[name] = site["value"]
        if site["type"] == "sample":
            vals[name + " (log density)"] = jnp.sum(site["fn"].log_prob(site["value"]))
    return vals


def check_locals_stay_in_plate(model, model_args, model_kwargs, info, sites, tr):
    """Raise when a site outside the locals' plate depends on a local (two traces with the
    locals set to two different values; every other latent held fixed)."""
    plate = sites[0].plate
    fixed = {n: tr[n]["value"] for n in info.latent_sites if plate not in info.sites[n].plates}
    outs = []
    for shift in (0.0, 0.5):
        data = dict(fixed)
        data.update({s.name: jnp.zeros(info.sites[s.name].shape) + shift for s in sites})
        outs.append(_site_values(traced(model, model_args, model_kwargs, data), plate))
    other = set(info.subsample_plates) - {plate}
    for name in outs[0]:
        a, b = np.asarray(outs[0][name]), np.asarray(outs[1][name])
        if a.shape == b.shape and np.allclose(a, b, equal_nan=True):
            continue
        site = name.replace(" (log density)", "")
        where = set(info.sites[site].plates) & other
        local = ", ".join(f"'{s.name}'" for s in sites)
        if where:
            raise ValueError(
                f"Site '{site}' in subsample plate '{sorted(where)[0]}' depends on the local "
                f"latent(s) {local} of subsample plate '{plate}': observations must sit in the "
                "same subsample plate as their locals. Reshape the data to one row per group "
                "(numpyro_sg.locals.pad_groups pads a long table into (G, R) arrays and a mask) "
                f"and put the observations inside plate '{plate}'.")
        raise ValueError(
            f"Site '{site}' outside subsample plate '{plate}' depends on the local latent(s) "
            f"{local}: a local may only be used inside its plate (the kernels draw it afresh "
            "for the groups of each mini-batch). Move the site into the plate, or make the "
            "latent global.")


def group_log_joint(model, model_args, model_kwargs, plate, indices, fixed, sites, b):
    """Per-group log p(y_g, b_g | θ) (n,), unscaled: the model run on the rows ``indices``
    (``{plate name: index array}``, every subsample plate) with the globals ``fixed`` and the
    locals from the blocks ``b`` (n, k) substituted; sums every sample site of ``plate`` over all
    its dims but the plate's (a site's ``mask`` honoured, its plate scale ignored)."""
    n = b.shape[0]
    data, off = dict(fixed), 0
    for s in sites:
        data[s.name] = s.to_value(b[:, off:off + s.size])
        off += s.size
    tr = trace(with_indices(substitute(model, data=data), indices))
    block(tr)(*model_args, **(model_kwargs or {}))
    tr = tr.trace
    total = jnp.zeros((n,), b.dtype)
    for site in tr.values():
        dim = plate_frame_dim(site, plate) if site["type"] == "sample" else None
        if dim is None:
            continue
        lp = site["fn"].log_prob(site["value"])
        if site.get("mask") is not None:
            lp = jnp.where(site["mask"], lp, 0.0)
        lp = jnp.broadcast_to(lp, site["fn"].batch_shape)
        lp = jnp.moveaxis(lp, lp.ndim + dim, 0)
        total = total + lp.reshape(n, -1).sum(-1)
    return total
