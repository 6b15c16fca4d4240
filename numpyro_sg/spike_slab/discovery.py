r"""Finding the spike-and-slab structure of a model: :func:`find_spike_slab`.

The sites are read from one :class:`~numpyro_sg.infer.model_info.ModelInfo` (pass ``info=`` when the
model was traced already, e.g. by a kernel's ``init``); the numerical checks
(:mod:`numpyro_sg.spike_slab.checks`) then run the model once more, vectorised over all their
random configurations.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from numpyro.infer.initialization import init_to_uniform

from numpyro_sg.infer.plates import SubsamplePlate, resolve_subsample_size
from numpyro_sg.infer.model_info import ModelInfo, trace_model
from numpyro_sg.spike_slab.checks import run_checks
from numpyro_sg.spike_slab.structure import SpikeSlab, SpikeSlabError, trace_spike_slab


def _is_tracer_tree(tree):
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def _find_plate(info: ModelInfo, subsample_size):
    found = info.subsample_plates
    if len(found) > 1:
        raise SpikeSlabError(
            f"The model has several subsample plates {sorted(found)}; spike-and-slab kernels "
            "support one."
        )
    if not found:
        return None
    (name, (size, n)), = found.items()
    return SubsamplePlate(name, size, n, resolve_subsample_size(name, size, n, subsample_size))


def _find_indicator(info: ModelInfo, latent: dict, indicator):
    if indicator is None:
        binary = [n for n, s in latent.items() if s.binary]
        if not binary:
            discrete = [n for n, s in latent.items() if s.discrete]
            raise SpikeSlabError(
                "No binary indicator site found: the model needs a latent Bernoulli site "
                "γ ∈ {0,1}^p (e.g. `numpyro.sample('gamma', dist.Bernoulli(0.1).expand([p])"
                ".to_event(1))`)"
                + (f"; its discrete sites {discrete} are not binary" if discrete else "")
                + ". Pass indicator='name' (a kernel's sites={'indicator': 'name'}) if it exists."
            )
        if len(binary) > 1:
            raise SpikeSlabError(
                f"Several binary latent sites {binary} could be the indicator: pass "
                "indicator='name' (and coefficient='name'; a kernel's sites={'indicator': 'name', …})."
            )
        indicator = binary[0]
    else:
        site = info.sites.get(indicator)
        if site is None or site.type != "sample":
            raise SpikeSlabError(
                f"indicator={indicator!r} is not a sample site of the model; its latent sites "
                f"are {sorted(latent)}."
            )
        if site.is_observed:
            raise SpikeSlabError(f"indicator site {indicator!r} is observed; it must be latent.")
        if indicator not in latent:
            raise SpikeSlabError(
                f"indicator site {indicator!r} is inside the subsample plate; it must be global."
            )
        if not site.binary:
            raise SpikeSlabError(
                f"indicator site {indicator!r} is not binary: its distribution "
                f"{site.distribution} has a support other than {{0, 1}}; the indicator must be a "
                "Bernoulli site with values in {0, 1}."
            )
    shape = latent[indicator].shape
    if len(shape) != 1:
        raise SpikeSlabError(
            f"indicator site {indicator!r} has shape {shape}; it must be a vector (p,) "
            "(use .expand([p]).to_event(1) or a plate of size p)."
        )
    return indicator, shape[0]


def _depends_on_indicator(model, model_args, model_kwargs, indicator, candidates, p):
    """The candidates whose prior log-density changes between γ = 0 and γ = 1 (one model trace,
    vectorised over the two values; the latent sites held at one ``init_to_uniform`` draw)."""

    def log_probs(gamma):
        tr, _ = trace_spike_slab(model, model_args, model_kwargs, observed={indicator: gamma},
                                 fill=init_to_uniform)
        return jnp.stack([jnp.sum(tr[c]["fn"].log_prob(tr[c]["value"])) for c in candidates])

    try:
        lp = jax.vmap(log_probs)(jnp.stack([jnp.zeros((p,), jnp.int32), jnp.ones((p,), jnp.int32)]))
    except Exception:  # pragma: no cover - unusual models
        return []
    return [c for c, d in zip(candidates, jnp.abs(lp[0] - lp[1])) if bool(d > 1e-6)]


def _find_coefficient(model, model_args, model_kwargs, others: dict, indicator, p, coefficient):
    if coefficient is None:
        cands = [n for n, s in others.items() if s.shape == (p,) and s.real]
        if len(cands) > 1:
            dep = _depends_on_indicator(model, model_args, model_kwargs, indicator, cands, p)
            if len(dep) == 1:
                cands = dep
        if not cands:
            raise SpikeSlabError(
                f"No coefficient site found: the model needs a latent real-valued site θ of "
                f"shape ({p},) (the indicator {indicator!r} has {p} entries) whose product with "
                f"the indicator enters the likelihood; its continuous latent sites are "
                f"{ {n: s.shape for n, s in others.items()} }. Pass coefficient='name' "
                "(a kernel's sites={'coefficient': 'name'})."
            )
        if len(cands) > 1:
            raise SpikeSlabError(
                f"Several latent sites {cands} could be the coefficient site: pass "
                "coefficient='name' (a kernel's sites={'coefficient': 'name'})."
            )
        return cands[0]
    if coefficient not in others:
        raise SpikeSlabError(
            f"coefficient={coefficient!r} is not a latent site of the model outside the "
            f"subsample plate; candidates are {sorted(others)}."
        )
    if others[coefficient].shape != (p,):
        raise SpikeSlabError(
            f"coefficient site {coefficient!r} has shape {others[coefficient].shape} "
            f"but the indicator {indicator!r} has shape ({p},); they must match."
        )
    if not others[coefficient].real:
        raise SpikeSlabError(
            f"coefficient site {coefficient!r} must be real-valued (support real); its "
            f"distribution {others[coefficient].distribution} has another support."
        )
    return coefficient


def find_spike_slab(model: Callable, model_args=(), model_kwargs=None, *, indicator: str | None = None,
                    coefficient: str | None = None, subsample_size=None, glm="auto",
                    check: bool = True, seed: int = 0, info: ModelInfo | None = None) -> SpikeSlab:
    """Find and validate the spike-and-slab structure of ``model`` (see :mod:`numpyro_sg.spike_slab`).

    Reads the sites from one trace of the model (``info``, or a trace made here), picks the
    indicator γ (the binary latent site) and the coefficient θ (the real latent site of the
    same shape (p,)), then runs the numerical checks of :mod:`numpyro_sg.spike_slab.checks`
    (structure, per-coordinate prior, GLM affinity) in one more, vectorised, model run.

    :param model: a NumPyro model.
    :param model_args: its positional arguments (the data).
    :param model_kwargs: its keyword arguments.
    :param indicator: name of the binary indicator site (found automatically when omitted).
    :param coefficient: name of the coefficient site (found automatically when omitted).
    :param subsample_size: mini-batch size override for the subsample plate (as in the
        kernels); ``None`` keeps the model's.
    :param glm: ``"auto"`` (detect the GLM fast path), ``True`` (require it), ``False``.
    :param bool check: run the numerical checks (structure, per-coordinate prior, GLM
        affinity) on random values; they need concrete (non-traced) model arguments.
    :param int seed: seed of the numerical checks.
    :param info: a :class:`~numpyro_sg.infer.model_info.ModelInfo` of ``model`` on these arguments
        (from :func:`~numpyro_sg.infer.model_info.trace_model`), so the model is not traced again.
    :return: a :class:`~numpyro_sg.spike_slab.SpikeSlab`.
    :raises SpikeSlabError: (a ``ValueError``) when the model is not of the required form:
        no/several binary sites (pass ``indicator=``), an indicator that is not binary,
        no/several coefficient sites (pass ``coefficient=``), shapes that differ, a
        coefficient that is not real-valued, or a likelihood that changes when an excluded
        coefficient changes.

    **Example:**

    .. code-block:: python

        ss = find_spike_slab(model, (X, y))
        ss.indicator, ss.coefficient, ss.num_coefficients   # ('gamma', 'theta', 2000)
        ss.glm.family_name                                   # 'gaussian'
    """
    model_kwargs = dict(model_kwargs or {})
    if info is None:
        info = trace_model(model, model_args, model_kwargs)
    ss = _structure(model, model_args, model_kwargs, info, subsample_size, indicator, coefficient)
    if not (check and not _is_tracer_tree((model_args, model_kwargs))):
        if glm is True:
            raise SpikeSlabError("glm=True needs concrete model arguments and check=True.")
        return ss
    per_coordinate, glm_info, _ = run_checks(ss, info, model_args, model_kwargs, glm=glm, seed=seed)
    return dataclasses.replace(ss, per_coordinate_prior=per_coordinate, glm=glm_info)


def _structure(model, model_args, model_kwargs, info: ModelInfo, subsample_size, indicator,
               coefficient) -> SpikeSlab:
    """The :class:`~numpyro_sg.spike_slab.SpikeSlab` read from the trace, before the numerical
    checks (``per_coordinate_prior=False``, ``glm=None``)."""
    plate = _find_plate(info, subsample_size)
    plate_names = {plate.name} if plate is not None else set()
    latent = {
        name: site for name, site in info.sites.items()
        if site.type == "sample" and not site.is_observed and not plate_names.intersection(site.plates)
    }
    indicator, p = _find_indicator(info, latent, indicator)
    others = {n: s for n, s in latent.items() if n != indicator}
    discrete_others = [n for n, s in others.items() if s.discrete]
    if discrete_others:
        raise SpikeSlabError(
            f"Discrete latent sites {discrete_others} besides the indicator {indicator!r} are not "
            "supported: marginalise them out or fix them."
        )
    coefficient = _find_coefficient(model, model_args, model_kwargs, others, indicator, p, coefficient)
    return SpikeSlab(
        model=model,
        indicator=indicator,
        coefficient=coefficient,
        num_coefficients=p,
        plate=plate,
        continuous_sites=tuple(sorted(others)),
        per_coordinate_prior=False,
        glm=None,
        deterministic_in_plate=info.deterministic_in(plate_names),
    )
