r"""Which chains of a run to pool: diverged chains are left out, with a warning naming them.

Every kernel of this package freezes a chain whose state, log density or gradient blows up and
flags it (its ``diverging`` state field, per chain in vectorized runs; once set it stays set).
Such a chain's draws are its frozen last state before the blow-up, or values of order 10¹²:
averaging them into a pooled mean or inclusion probability gives nonsense.  The pooled results
(:func:`numpyro_sg.selection_summary`, :func:`numpyro_sg.posterior_summary`, the pooled KSD of
:func:`numpyro_sg.to_inference_data`) use the other chains and say so
(:class:`~numpyro_sg.DivergenceWarning`).

A chain counts as diverged when

* the run is an ``MCMC`` of one of this package's kernels and the chain's ``diverging`` flag is
  set at the end (``mcmc.last_state``, or the collected ``diverging`` extra field);
* the ``InferenceData`` records it in ``sample_stats.attrs["diverged_chains"]`` (as
  :func:`numpyro_sg.to_inference_data` does);
* any of its floating-point draws is not finite.

NUTS's ``diverging`` (a divergent transition, after which the chain carries on) is not a
blown-up chain and is ignored.
"""

from __future__ import annotations

import warnings

import numpy as np

from numpyro_sg.arviz_compat import from_dict, get_group, has_group, select_chains, set_group
from numpyro_sg.diagnostics.convergence import DivergenceWarning

__all__ = ["diverged_chains", "divergence_iterations"]

#: the ``sample_stats`` attribute listing the diverged chains (positions along ``chain``)
DIVERGED_ATTR = "diverged_chains"
#: the ``sample_stats`` attribute listing, for each of :data:`DIVERGED_ATTR`, the 1-based
#: iteration (warmup included) of its blow-up (−1 when unknown)
DIVERGED_AT_ATTR = "diverged_at"


def _grouped(obj) -> dict:
    """Draws ``{site: (chains, draws, …)}`` of an ``MCMC`` or ``InferenceData`` (else ``{}``)."""
    if hasattr(obj, "get_samples"):
        return {k: np.asarray(v) for k, v in obj.get_samples(group_by_chain=True).items()}
    if hasattr(obj, "posterior"):
        return {k: np.asarray(v.values) for k, v in obj.posterior.data_vars.items()}
    return {}


def _flagged(obj, chains: int) -> np.ndarray:
    """The chains a kernel of this package flagged ``diverging`` (bool (chains,))."""
    flags = np.zeros(chains, bool)
    if hasattr(obj, "posterior"):
        stats = get_group(obj, "sample_stats") if has_group(obj, "sample_stats") else None
        listed = [] if stats is None else list(np.asarray(stats.attrs.get(DIVERGED_ATTR, []), int).reshape(-1))
        flags[[c for c in listed if 0 <= c < chains]] = True
        return flags
    if not hasattr(getattr(obj, "sampler", None), "convergence_report"):  # not one of our kernels
        return flags
    final = getattr(getattr(obj, "last_state", None), "diverging", None)
    if final is not None and np.size(final) == chains:
        return np.array(final, bool).reshape(chains)
    extra = obj.get_extra_fields(group_by_chain=True).get("diverging")
    if extra is not None and np.size(extra) % chains == 0:
        return np.array(extra, bool).reshape(chains, -1).any(axis=1)
    return flags


def diverged_chains(obj) -> list:
    """Positions (0-based, along ``chain``) of the diverged chains of a run (see the module
    docstring); ``[]`` for a dict or an array of draws.

    :param obj: a ``numpyro.infer.MCMC`` after ``run`` or an ``arviz.InferenceData``.
    :return: sorted list of int.

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict
    >>> from numpyro_sg.results.chains import diverged_chains
    >>> draws = np.zeros((3, 10, 2))
    >>> draws[1, 5:] = np.inf
    >>> diverged_chains(from_dict(posterior={"theta": draws}))
    [1]
    """
    samples = _grouped(obj)
    if not samples:
        return []
    chains = next(iter(samples.values())).shape[0]
    bad = np.array(_flagged(obj, chains), bool)
    for v in samples.values():
        if np.issubdtype(v.dtype, np.floating):
            bad |= ~np.isfinite(v.reshape(chains, -1)).all(axis=1)
    return [int(c) for c in np.nonzero(bad)[0]]


def divergence_iterations(obj) -> dict:
    """``{chain: when}``: for the chains of a run whose kernel recorded the iteration of the
    blow-up (``mcmc.last_state``, or ``sample_stats.attrs["diverged_at"]`` of an
    ``InferenceData``), that iteration in words; ``{}`` otherwise."""
    if hasattr(obj, "posterior"):
        stats = get_group(obj, "sample_stats") if has_group(obj, "sample_stats") else None
        if stats is None:
            return {}
        chains = np.asarray(stats.attrs.get(DIVERGED_ATTR, []), int).reshape(-1)
        at = np.asarray(stats.attrs.get(DIVERGED_AT_ATTR, []), int).reshape(-1)
        return {int(c): f"iteration {int(k)} (warmup included)" for c, k in zip(chains, at) if k > 0}
    sampler, state = getattr(obj, "sampler", None), getattr(obj, "last_state", None)
    if not hasattr(sampler, "diverged_at") or state is None:
        return {}
    return {c: sampler.describe_iteration(k) for c, k in sampler.diverged_at(state).items() if k}


def warn_diverged(diverged, chains: int, what: str, when=None):
    """Issue the :class:`~numpyro_sg.DivergenceWarning` that ``what`` leaves out ``diverged``
    (``when``: :func:`divergence_iterations`, named in the warning)."""
    if not diverged:
        return
    left = "every chain diverged: nothing is left to pool, so all are kept and the results are " \
        "meaningless" if len(diverged) == chains else f"{what} use the other {chains - len(diverged)} chain(s)"
    when = when or {}
    at = "; ".join(f"chain {c} at {when[c]}" for c in diverged if c in when)
    warnings.warn(
        f"chain(s) {list(diverged)} of {chains} diverged{f' ({at})' if at else ''} (frozen after "
        f"their state or gradient blew up; draws of order 10¹² or their last value before the "
        f"blow-up): {left}. "
        "Reduce step_size, or keep the default preconditioner and step size.",
        DivergenceWarning, stacklevel=3,
    )


def without_diverged(obj, what: str):
    """``(obj, diverged)``: the run without its diverged chains, as an ``InferenceData`` (the run
    itself when none diverged, or when every chain did), after warning (:func:`warn_diverged`).

    :param obj: an ``MCMC``, an ``InferenceData``, or anything else (returned as is).
    :param str what: what the warning says uses the other chains (e.g. "the summary").
    """
    diverged = diverged_chains(obj)
    samples = _grouped(obj)
    if not diverged:
        return obj, []
    chains = next(iter(samples.values())).shape[0]
    warn_diverged(diverged, chains, what, divergence_iterations(obj))
    if len(diverged) == chains:
        return obj, diverged
    keep = [c for c in range(chains) if c not in set(diverged)]
    if hasattr(obj, "posterior"):
        kept = select_chains(obj, keep)
        if has_group(kept, "sample_stats"):  # positions changed: the kept chains did not diverge
            stats = get_group(kept, "sample_stats")
            stats.attrs = {**stats.attrs, DIVERGED_ATTR: []}
            set_group(kept, "sample_stats", stats)
        return kept, diverged
    return from_dict(posterior={k: v[keep] for k, v in samples.items()}), diverged
