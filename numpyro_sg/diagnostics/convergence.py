r"""Convergence checks: no silent failure after ``MCMC.run``.

:func:`check_convergence` computes, for every continuous latent site of a run, over the kept
draws:

* the rank-normalised split-R̂ (``arviz.rhat``'s, computed for all coordinates at once by
  :mod:`numpyro_sg.diagnostics.chain_statistics`) — the chains (and the halves of each chain)
  disagree when it exceeds ``rhat_max`` (1.05);
* the bulk effective sample size (``arviz.ess``'s, likewise) — too few independent draws below
  ``ess_min`` (100);
* the *drift* of each chain: the difference between the means of the first and the last third
  of its draws, in units of the site's posterior sd (the sd of all kept draws) — a chain
  still travelling towards the posterior shows many sds (flagged above ``drift_max``, 1).

and issues one :class:`ConvergenceWarning` naming the sites at fault, the worst coordinate
and the remedy.  Given an ``MCMC`` whose sampler is one of this package's kernels, the check
covers the kernel's latent sites and adds the kernel's own findings
(:meth:`~numpyro_sg.kernels.base.SGKernel.convergence_report`, e.g. draws far from the
warmup's Laplace approximation) and a :class:`DivergenceWarning` naming each chain the kernel
froze after a blow-up and its iteration.  :func:`numpyro_sg.to_inference_data` runs it by default, so a
run converted for ArviZ is always checked; call it directly after ``MCMC.run`` otherwise.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from numpyro_sg.diagnostics.chain_statistics import ess_bulk, rank_rhat_and_ess_bulk

#: at most this many coordinates per site are checked (evenly spaced) — R̂/ESS cost per coordinate
MAX_COORDINATES = 1000


class ConvergenceWarning(UserWarning):
    """The chains of a run have not converged (R̂, effective sample size or drift)."""


class DivergenceWarning(UserWarning):
    """A chain produced a non-finite or exploding state or gradient (it is frozen from then on,
    and left out of pooled results).  Issued after the run — by :func:`check_convergence`,
    :func:`numpyro_sg.to_inference_data` and :func:`numpyro_sg.posterior_summary` — naming the
    chains and the iterations of the blow-ups; the kernels' compiled steps issue nothing."""


def _coordinates(values: np.ndarray) -> np.ndarray:
    """(chains, draws, k) float64 view of a site's draws, at most MAX_COORDINATES of them."""
    chains, draws = values.shape[:2]
    flat = values.reshape(chains, draws, -1).astype(np.float64)
    if flat.shape[-1] > MAX_COORDINATES:
        keep = np.unique(np.linspace(0, flat.shape[-1] - 1, MAX_COORDINATES).round().astype(int))
        flat = flat[..., keep]
    return flat


def _drift(x: np.ndarray) -> np.ndarray:
    """max over chains of |mean(last third) − mean(first third)| / sd, per coordinate."""
    draws = x.shape[1]
    third = max(draws // 3, 1)
    sd = x.reshape(-1, x.shape[-1]).std(axis=0)
    diff = np.abs(x[:, -third:].mean(axis=1) - x[:, :third].mean(axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(sd > 0, diff / np.where(sd > 0, sd, 1.0), 0.0)
    return ratio.max(axis=0)


def _separation(x: np.ndarray) -> tuple:
    """Per coordinate, the largest distance of a chain's mean from the mean of the other chains'
    means, in within-chain sds; and, per coordinate, the chain at that distance."""
    means = x.mean(axis=1)
    chains = means.shape[0]
    within = np.sqrt(x.var(axis=1).mean(axis=0))
    others = (means.sum(axis=0) - means) / max(chains - 1, 1)
    dist = np.abs(means - others) if chains > 1 else np.zeros_like(means)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(within > 0, dist / np.where(within > 0, within, 1.0), np.where(dist > 0, np.inf, 0.0))
    return ratio.max(axis=0), ratio.argmax(axis=0)


def bulk_ess(x: np.ndarray, quantile: float = 0.0, max_coordinates: int = 64) -> float:
    """A quantile over coordinates of the bulk ESS (``arviz.ess``: rank-normalised, split chains).

    :param x: draws (chains, draws, k), at least 4 draws per chain.
    :param float quantile: 0 (default) the smallest ESS, 0.5 the median (steadier: the
        minimum of many noisy per-coordinate estimates is biased low).
    :param int max_coordinates: check at most this many coordinates, evenly spaced (the cost
        is per coordinate).
    :return: the quantile over the non-constant coordinates; 0.0 when every coordinate is
        constant or a draw is not finite (a frozen or diverged chain has no effective draws).
    """
    x = np.asarray(x, np.float64)
    if x.ndim != 3 or x.shape[1] < 4:
        raise ValueError(f"x must have shape (chains, draws ≥ 4, k); got {x.shape}.")
    if x.shape[-1] > max_coordinates:
        x = x[..., np.unique(np.linspace(0, x.shape[-1] - 1, max_coordinates).round().astype(int))]
    if not np.all(np.isfinite(x)):
        return 0.0
    x = x[..., x.reshape(-1, x.shape[-1]).std(axis=0) > 0]  # constant coordinates: no information
    if x.shape[-1] == 0:
        return 0.0
    ess = ess_bulk(x)
    ess = ess[np.isfinite(ess)]
    return float(np.quantile(ess, quantile)) if ess.size else 0.0


#: the columns of :func:`convergence_table`
COLUMNS = ["r_hat", "ess_bulk", "drift", "worst", "separation", "far_chain"]


def convergence_table(samples: dict) -> pd.DataFrame:
    """Per site: worst split-R̂, lowest bulk ESS and largest drift (in sds) over its coordinates,
    and how far apart the chains sit.

    :param samples: draws ``{site: array (chains, draws, …)}``; integer/boolean sites (model
        indicators) and sites with fewer than 4 draws per chain are skipped.
    :return: a ``DataFrame`` indexed by site with columns ``r_hat``, ``ess_bulk``, ``drift``,
        ``worst`` (the coordinate index, within the site, with the worst R̂), ``separation``
        (on that coordinate, the largest distance of a chain's mean from the mean of the other
        chains' means, in within-chain sds) and ``far_chain`` (that chain; NaN and −1 when a
        draw is not finite).
    """
    rows = {}
    for name, values in samples.items():
        values = np.asarray(values)
        if values.ndim < 2 or values.shape[1] < 4 or not np.issubdtype(values.dtype, np.floating):
            continue
        x = _coordinates(values)
        if not np.all(np.isfinite(x)):
            rows[name] = dict(r_hat=np.inf, ess_bulk=0.0, drift=np.inf, worst=0, separation=np.nan, far_chain=-1)
            continue
        rhat, ess = rank_rhat_and_ess_bulk(x)   # NaN R̂ for one chain or a constant coordinate
        drift = _drift(x)
        rhat_ok = np.where(np.isfinite(rhat), rhat, 1.0)
        separation, far = _separation(x)
        worst = int(np.argmax(rhat_ok))
        rows[name] = dict(
            r_hat=float(rhat_ok.max()), ess_bulk=float(np.nanmin(ess)) if np.isfinite(ess).any() else np.nan,
            drift=float(drift.max()), worst=worst, separation=float(separation[worst]), far_chain=int(far[worst]),
        )
    return pd.DataFrame.from_dict(rows, orient="index", columns=COLUMNS)


def _run_samples(obj) -> dict:
    if hasattr(obj, "posterior"):
        return {k: np.asarray(v.values) for k, v in obj.posterior.data_vars.items()}
    if hasattr(obj, "get_samples"):
        return {k: np.asarray(v) for k, v in obj.get_samples(group_by_chain=True).items()}
    if isinstance(obj, dict):
        return {k: np.asarray(v) for k, v in obj.items()}
    raise TypeError(f"expected an MCMC object, an InferenceData or a dict of draws; got {type(obj).__name__}.")


def check_convergence(obj, *, rhat_max: float = 1.05, ess_min: float = 100, drift_max: float = 1.0,
                      sites=None, label: str = "the run", warn: bool = True,
                      extra_problems=()) -> pd.DataFrame:
    """Check a run for convergence; warn (:class:`ConvergenceWarning`) naming the sites at fault.

    :param obj: a ``numpyro.infer.MCMC`` after ``run``, an ``arviz.InferenceData`` or a dict
        ``{site: (chains, draws, …)}``.  For an ``MCMC`` whose sampler is one of this
        package's kernels, the default ``sites`` are the kernel's latent sites and the kernel's
        own findings are added (:meth:`~numpyro_sg.kernels.base.SGKernel.convergence_report`).
    :param float rhat_max: split-R̂ above this is flagged (default 1.05).
    :param float ess_min: bulk ESS below this is flagged (default 100).
    :param float drift_max: a chain whose first and last thirds differ by more than this many
        posterior sds is flagged as still drifting (default 1).
    :param sites: names of the sites to check (default: every floating-point site).
    :param str label: how the run is named in the warning.
    :param bool warn: issue the warning (default True).
    :param extra_problems: further problems found by the caller, reported in the same warning:
        sentences, or ``(problem, remedy)`` pairs naming a cause — its remedy then replaces the
        generic ones — or ``(problem, remedy, True)`` for a cause that also explains why the
        chains disagree (e.g. frozen chains).  Otherwise chains that each settled (no drift)
        many within-chain sds apart are reported as possibly stuck in different modes, with
        the remedies for that alone.
    :return: the :func:`convergence_table` with a boolean column ``ok``.

    **Example:**

    .. code-block:: python

        mcmc.run(key, X, y)
        table = nsg.check_convergence(mcmc)   # warns when R̂ > 1.05, ESS < 100 or drift > 1 sd
    """
    samples = _run_samples(obj)
    sampler = getattr(obj, "sampler", None)
    findings, thinning, random_start = [], int(getattr(obj, "thinning", 1) or 1), False
    if hasattr(sampler, "convergence_report") and getattr(obj, "last_state", None) is not None:
        z = obj.last_state.z
        sites = list(z) if sites is None and isinstance(z, dict) else sites
        label = f"{type(sampler).__name__} (MCMC.run)" if label == "the run" else label
        findings = sampler.convergence_report(obj.last_state)
        extra_problems = list(extra_problems) + findings
        random_start = getattr(sampler, "_init_strategy", None) is not None
        message = sampler.divergence_message(obj.last_state) if warn and hasattr(sampler, "divergence_message") else None
        if message:  # the kernels report a blow-up after the run, never from the compiled step
            warnings.warn(message, DivergenceWarning, stacklevel=2)
    if sites is not None:
        samples = {k: v for k, v in samples.items() if k in set(sites)}
    table = convergence_table(samples)
    # a finding of the kernel's (divergence, frozen chains, draws far from the Laplace fit) concerns
    # the joint draws: no site's row is then ok
    table["ok"] = ((table["r_hat"] <= rhat_max) & (table["ess_bulk"] >= ess_min) & (table["drift"] <= drift_max)
                   & (not findings))
    if warn and (not table["ok"].all() or extra_problems):
        draws = max((np.shape(v)[1] for v in samples.values() if np.ndim(v) >= 2), default=0)
        generic = getattr(sampler, "slow_chain_remedy", lambda: None)() or GENERIC_REMEDY
        warnings.warn(_message(table, label, rhat_max, ess_min, drift_max, list(extra_problems), draws,
                               thinning, random_start, generic), ConvergenceWarning, stacklevel=2)
    return table


#: chains whose means sit this many within-chain sds apart, each without drift, are in
#: different modes
SEPARATED = 5.0

GENERIC_REMEDY = (
    "a longer num_warmup and num_samples; a larger step_size if the chain moves too "
    "slowly, a smaller one if it is unstable; compare with NUTS (numpyro_sg.nuts_reference) when "
    "it is affordable"
)
#: added to the generic remedies when the chains started from an init strategy's draws
RANDOM_START_REMEDY = ("start from the warmup's mode (the kernels' default, init_strategy=None) rather "
                       "than a random start")
MULTIMODAL_REMEDY = (
    "stochastic-gradient chains rarely cross between well-separated modes, so a longer run or "
    "another step size will not reconcile them, and pooled draws weight each mode by the number "
    "of chains in it, not by its posterior mass. If the modes are relabellings of one solution "
    "(e.g. a mixture's components), break the symmetry (e.g. ordered means); otherwise report "
    "the modes separately or compare their log densities before pooling"
)


def _multimodal(table, rhat_max, drift_max) -> str | None:
    """The sentence naming chains that each settled (no drift) but far apart, or None."""
    bad = table[(table["r_hat"] > rhat_max) & (table["separation"] >= SEPARATED) & (table["drift"] <= drift_max)]
    if not len(bad):
        return None
    return ("the chains disagree — possible multimodality: each chain is stable (no drift) but "
            + ", ".join(f"chain {c} sits {x:.3g} within-chain sds from the others' mean in '{n}' "
                        f"(coordinate {w})" for n, x, c, w in zip(bad.index, bad["separation"],
                                                                 bad["far_chain"], bad["worst"]))
            + ": the chains are stuck in different modes")


def _draws_needed(ess, draws, ess_min, thinning: int = 1) -> str:
    """How long a run would reach ``ess_min``, bulk ESS growing in proportion to the draws of a
    stationary chain: ``draws · ess_min / ess`` kept draws per chain, i.e. ``num_samples`` that
    many times ``thinning`` (two significant digits).  Said only of chains that agree (none
    :data:`SEPARATED` within-chain sds from the others), do not drift and drew no finding of the
    kernel's (the caller's check): where they disagree a longer run need not raise ESS at all."""
    if not (draws and np.isfinite(ess) and ess > 0):
        return ""
    needed = float(f"{draws * ess_min / ess:.2g}")
    return (f" (ESS grows about in proportion to the draws of chains that agree: at this rate about "
            f"num_samples={needed * thinning:,.0f} per chain, {needed / draws:.2g}× this run's "
            f"{draws * thinning:,}, would reach {ess_min:.0f})")


def _message(table, label, rhat_max, ess_min, drift_max, findings, draws=0, thinning=1, random_start=True,
             generic: str = GENERIC_REMEDY) -> str:
    """The warning: the kernel's findings (``(problem, remedy)`` pairs or sentences), the sites at
    fault, and the remedies of the causes found (``generic`` ones when no cause is named: the
    sampler's :meth:`~numpyro_sg.kernels.base.SGKernel.slow_chain_remedy`, if any); with the
    run's ``draws`` per chain (kept, after ``thinning``), the run length that low ESS asks for
    where the chains agree; the remedy of a random start only where the run had one."""
    problems = [f[0] if isinstance(f, tuple) else f for f in findings]
    remedies = [f[1] for f in findings if isinstance(f, tuple)]
    explained = any(isinstance(f, tuple) and len(f) > 2 and f[2] for f in findings)
    multimodal = None if explained else _multimodal(table, rhat_max, drift_max)
    if multimodal:  # the other findings' remedies (e.g. for a Laplace misfit) do not help here
        problems.append(multimodal)
        remedies = [MULTIMODAL_REMEDY]
    bad = table[table["r_hat"] > rhat_max]
    if len(bad):
        problems.append("split-R̂ " + ", ".join(f"{r:.3g} for '{n}' (worst coordinate {w})"
                                                for n, r, w in zip(bad.index, bad["r_hat"], bad["worst"]))
                        + f" > {rhat_max}")
    bad = table[~(table["ess_bulk"] >= ess_min)]
    if len(bad):
        problems.append("bulk ESS " + ", ".join(f"{e:.0f} for '{n}'" for n, e in zip(bad.index, bad["ess_bulk"]))
                        + f" < {ess_min:.0f}" + (_draws_needed(bad["ess_bulk"].min(), draws, ess_min, thinning)
                                                 if (table["separation"] < SEPARATED).all() and not findings
                                                 and (table["drift"] <= drift_max).all() else ""))
    bad = table[table["drift"] > drift_max]
    if len(bad):
        problems.append("still drifting: the first and last thirds of a chain's draws differ by "
                        + ", ".join(f"{x:.3g} posterior sds in '{n}'" for n, x in zip(bad.index, bad["drift"])))
    return (f"{label} may not have sampled the posterior: " + "; ".join(problems) + ". The draws may be far "
            "from the posterior. Remedies: " + "; ".join(
                remedies or [generic + ("; " + RANDOM_START_REMEDY if random_start else "")]) + ".")
