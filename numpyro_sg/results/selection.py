r"""Variable-selection summaries for spike-and-slab runs.

As reported by Song, Sun, Ye & Liang (2020), 'Extended stochastic gradient Markov chain Monte
Carlo for large-scale Bayesian variable selection' (supplement §4.1).

Every function takes the run in any of these forms:

* a ``numpyro.infer.MCMC`` object that has run :class:`~numpyro_sg.ESGLD` (or any kernel whose
  samples hold an inclusion frequency or a binary indicator);
* an ``arviz.InferenceData`` (its ``posterior`` group);
* a dict of arrays (``mcmc.get_samples()``), or a plain array of draws, shape (draws, p) or
  (chains, draws, p).

Definitions (supp. §4.1):

* marginal inclusion probability of variable j: the mean over draws of the inclusion frequency
  (1/m)·Σ_k γ_{k,j} (Theorem 1(iii)), or of the indicator γ_j when no frequency was recorded;
* median probability model (Barbieri & Berger 2004): Ŝ = {j : P(γ_j = 1 | X) > 0.5};
* with the true model S* and the true coefficients β*:
  FSR = size(Ŝ∖S*)/size(Ŝ) (0 when Ŝ is empty), NSR = size(S*∖Ŝ)/size(S*),
  MSE₁ = mean_{j∈S*} (β̂_j − β*_j)², MSE₀ = mean_{j∉S*} (β̂_j − β*_j)², β̂ the mean of the
  draws of β = θ·γ thinned by ``thin`` (the paper thins by 10).
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pandas as pd

from numpyro_sg.diagnostics.convergence import ConvergenceWarning
from numpyro_sg.results.chains import without_diverged

__all__ = [
    "inclusion_probabilities",
    "median_probability_model",
    "posterior_mean",
    "selection_metrics",
    "selection_summary",
    "relative_error",
    "plot_inclusion_probabilities",
]

_INCLUSION_NAMES = ("inclusion",)
_INDICATOR_NAMES = ("gamma", "delta")


def _draws(obj, var_name=None, candidates=()):
    """(name, array of draws with the draw axes flattened to the front)."""
    if hasattr(obj, "get_samples"):  # MCMC
        samples = obj.get_samples(group_by_chain=True)
        samples = {k: np.asarray(v) for k, v in samples.items()}
        samples = {k: v.reshape((-1,) + v.shape[2:]) for k, v in samples.items()}
    elif hasattr(obj, "posterior"):  # InferenceData
        post = obj.posterior
        samples = {k: np.asarray(post[k].values) for k in post.data_vars}
        samples = {k: v.reshape((-1,) + v.shape[2:]) for k, v in samples.items()}
    elif isinstance(obj, dict):
        samples = {k: np.asarray(v) for k, v in obj.items()}
    else:
        try:
            arr = np.asarray(obj)
        except Exception as e:  # noqa: BLE001
            raise TypeError(
                "Expected an MCMC object, an arviz InferenceData, a dict of samples or an array, "
                f"got {type(obj).__name__}."
            ) from e
        if arr.ndim == 0 or arr.dtype == object:
            raise TypeError(
                "Expected an MCMC object, an arviz InferenceData, a dict of samples or an array, "
                f"got {type(obj).__name__}."
            )
        arr = arr[None] if arr.ndim == 1 else arr
        return var_name, arr.reshape(-1, arr.shape[-1])
    if var_name is not None:
        if var_name not in samples:
            raise KeyError(f"{var_name!r} is not among the samples {sorted(samples)}.")
        return var_name, samples[var_name]
    for name in candidates:
        if name in samples:
            return name, samples[name]
    raise KeyError(
        f"None of {list(candidates)} is among the samples {sorted(samples)}; pass var_name=."
    )


def inclusion_probabilities(obj, var_name: str | None = None, *, indicator: str | None = None):
    """Marginal posterior inclusion probabilities P(γ_j = 1 | X), shape (p,).

    Uses the inclusion frequency (``var_name``, default ``"inclusion"``) when the samples have
    it, else the indicator (``indicator``, default ``"gamma"`` or ``"delta"``).
    """
    if var_name is None and indicator is not None:
        _, arr = _draws(obj, indicator)
    else:
        cands = _INCLUSION_NAMES + _INDICATOR_NAMES if var_name is None else ()
        _, arr = _draws(obj, var_name, cands)
    arr = np.asarray(arr, np.float64)
    return arr.reshape(-1, arr.shape[-1]).mean(0)


def median_probability_model(probs, threshold: float = 0.5):
    """Boolean mask of the median probability model: inclusion probability > ``threshold``."""
    return np.asarray(probs) > threshold


def posterior_mean(obj, var_name: str = "beta", thin: int = 1):
    """Mean of the draws of ``var_name`` (e.g. β = θ·γ) thinned by ``thin`` (per chain)."""
    if hasattr(obj, "get_samples"):
        arr = np.asarray(obj.get_samples(group_by_chain=True)[var_name])[:, ::thin]
    elif hasattr(obj, "posterior"):
        arr = np.asarray(obj.posterior[var_name].values)[:, ::thin]
    else:
        _, arr = _draws(obj, var_name)
        arr = np.asarray(arr)[::thin]
    arr = np.asarray(arr, np.float64)
    return arr.reshape(-1, arr.shape[-1]).mean(0)


def selection_metrics(selected, beta_hat, beta_true):
    """FSR, NSR, MSE₁ and MSE₀ (supp. §4.1) of one run, as a dict.

    :param selected: boolean mask of the selected variables Ŝ.
    :param beta_hat: estimated coefficients β̂ (p,).
    :param beta_true: true coefficients β* (p,); S* = {j : β*_j ≠ 0}.
    """
    sel = np.asarray(selected, bool)
    bhat = np.asarray(beta_hat, np.float64)
    btrue = np.asarray(beta_true, np.float64)
    if not (sel.shape == bhat.shape == btrue.shape):
        raise ValueError(f"shapes differ: selected {sel.shape}, beta_hat {bhat.shape}, beta_true {btrue.shape}.")
    true = btrue != 0
    fsr = float((sel & ~true).sum() / sel.sum()) if sel.sum() else 0.0
    nsr = float((true & ~sel).sum() / true.sum()) if true.sum() else 0.0
    err = (bhat - btrue) ** 2
    return {
        "FSR": fsr,
        "NSR": nsr,
        "MSE1": float(err[true].mean()) if true.any() else float("nan"),
        "MSE0": float(err[~true].mean()) if (~true).any() else float("nan"),
        "num_selected": int(sel.sum()),
    }


def selection_summary(obj, beta_true=None, *, beta_name: str = "beta", thin: int = 10, threshold: float = 0.5,
                      inclusion_name: str | None = None, names=None):
    """A tidy table of a variable-selection run: one row per variable.

    Columns: ``variable`` (``names`` or the index), ``inclusion`` (marginal inclusion
    probability, :func:`inclusion_probabilities`), ``selected`` (median probability model,
    inclusion > ``threshold``), ``beta_hat`` (mean of the draws of ``beta_name`` thinned by
    ``thin``) and, with ``beta_true``, ``beta_true``.  With several chains, the agreement
    between them: ``inclusion_sd`` (the sd across chains of each chain's inclusion
    probability) and ``inclusion_r_hat`` (split-R̂ of the inclusion draws, ``arviz.rhat``; 1 for
    a variable constant in every chain); a :class:`~numpyro_sg.ConvergenceWarning` names the
    chains and variables when the chains' median probability models differ.  With
    ``beta_true`` the frame's ``attrs`` hold FSR, NSR, MSE1, MSE0 and num_selected
    (:func:`selection_metrics`); without it only num_selected; ``attrs["diverged_chains"]``
    lists the chains left out.  ``inclusion_name="inclusion_rb"`` summarises ESGLD's
    Rao-Blackwellised inclusion instead of the indicator frequency.

    Diverged chains (:mod:`numpyro_sg.results.chains`: flagged by the kernel, or with
    non-finite draws) are left out of every column, with a :class:`~numpyro_sg.DivergenceWarning`
    naming them.

    **Example:**

    .. code-block:: python

        df = selection_summary(mcmc, beta_true)
        df[df.selected]            # the selected variables
        df.attrs["FSR"], df.attrs["NSR"], df.attrs["MSE1"], df.attrs["MSE0"]
    """
    obj, diverged = without_diverged(obj, "the inclusion probabilities and beta_hat")
    probs = inclusion_probabilities(obj, inclusion_name)
    sel = median_probability_model(probs, threshold)
    bhat = posterior_mean(obj, beta_name, thin)
    p = probs.shape[0]
    if names is not None and len(names) != p:
        raise ValueError(f"names has {len(names)} entries; the run has p = {p} variables.")
    variables = list(range(p)) if names is None else list(names)
    frame = pd.DataFrame({"variable": variables, "inclusion": probs, "selected": sel, "beta_hat": bhat})
    frame.attrs.update(diverged_chains=list(diverged))
    if beta_true is None:
        frame.attrs.update(num_selected=int(sel.sum()))
    else:
        btrue = np.asarray(beta_true, np.float64)
        if btrue.shape != (p,):
            raise ValueError(f"beta_true has shape {btrue.shape}; the run has p = {p} variables.")
        frame["beta_true"] = btrue
        frame.attrs.update(selection_metrics(sel, bhat, btrue))
    per_chain = _chain_inclusion(obj, inclusion_name)
    if per_chain is not None and per_chain.shape[0] >= 2 and per_chain.shape[-1] == p:
        _chain_agreement(frame, per_chain, threshold, variables)
    return frame


def _chain_inclusion(obj, var_name):
    """Inclusion draws per chain (chains, draws, p), float64; ``None`` when the run has no
    chain axis (a dict of flattened draws, a 2-d array)."""
    if hasattr(obj, "get_samples") or hasattr(obj, "posterior"):
        samples = obj.get_samples(group_by_chain=True) if hasattr(obj, "get_samples") else \
            {k: v.values for k, v in obj.posterior.data_vars.items()}
        names = (var_name,) if var_name is not None else _INCLUSION_NAMES + _INDICATOR_NAMES
        arr = next((samples[n] for n in names if n in samples), None)
    elif isinstance(obj, dict):
        return None
    else:
        arr = np.asarray(obj)
        arr = arr if arr.ndim == 3 else None
    if arr is None:
        return None
    arr = np.asarray(arr, np.float64)
    return arr.reshape(arr.shape[0], arr.shape[1], -1)


def _chain_agreement(frame, per_chain, threshold, variables):
    """Add ``inclusion_sd`` and ``inclusion_r_hat`` to ``frame``; warn when the chains' median
    probability models differ."""
    chain_probs = per_chain.mean(axis=1)  # (chains, p)
    frame["inclusion_sd"] = chain_probs.std(axis=0, ddof=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant indicators: arviz warns and gives NaN
        rhat = np.asarray(az.rhat(az.convert_to_dataset({"x": per_chain}))["x"].values, np.float64)
    frame["inclusion_r_hat"] = np.where(np.isfinite(rhat), rhat, 1.0)
    chosen = chain_probs > threshold
    differ = np.nonzero((chosen != chosen[0]).any(axis=0))[0]
    if differ.size:
        models = "; ".join(f"chain {c} selects {[variables[j] for j in np.nonzero(chosen[c])[0]]}"
                           for c in range(len(chosen)))
        warnings.warn(
            f"the chains select different models (median probability models): {models}; they "
            f"disagree on variable(s) {[variables[j] for j in differ]} (inclusion_sd and "
            "inclusion_r_hat in the summary). The pooled inclusion probabilities average models "
            "the chains have not agreed on: run longer, or with more chains, before trusting them.",
            ConvergenceWarning, stacklevel=3,
        )


def relative_error(obj, theta_true, *, var_name: str = "beta", last: int | None = 1000):
    r"""Relative error 𝓔 of Atchadé & Wang (2023), 'A fast asynchronous MCMC sampler for sparse
    Bayesian inference', eq. (21).

    𝓔 = mean over the last ``last`` draws k of ‖θ⁽ᵏ⁾·δ⁽ᵏ⁾ − θ*‖₂ / ‖θ*‖₂, computed per chain
    and averaged over chains.  ``obj`` is an ``MCMC``, an ``InferenceData``, a dict of samples
    (``var_name``, default ``"beta"`` = θ·δ) or an array of draws (draws, p) or
    (chains, draws, p); ``last=None`` uses every draw.
    """
    if hasattr(obj, "get_samples"):
        arr = np.asarray(obj.get_samples(group_by_chain=True)[var_name])
    elif hasattr(obj, "posterior"):
        arr = np.asarray(obj.posterior[var_name].values)
    elif isinstance(obj, dict):
        arr = np.asarray(obj[var_name])[None]
    else:
        arr = np.asarray(obj)
        arr = arr[None] if arr.ndim == 2 else arr
    if arr.ndim != 3:
        raise ValueError(f"expected draws of shape (draws, p) or (chains, draws, p), got {arr.shape}.")
    truth = np.asarray(theta_true, np.float64)
    if arr.shape[-1] != truth.shape[-1]:
        raise ValueError(f"draws have p = {arr.shape[-1]} but theta_true has {truth.shape[-1]} entries.")
    norm = np.linalg.norm(truth)
    if norm == 0:
        raise ValueError("theta_true is zero: the relative error is undefined.")
    if last is not None:
        arr = arr[:, -int(last):]
    err = np.linalg.norm(arr.astype(np.float64) - truth, axis=-1) / norm
    return float(err.mean())


def plot_inclusion_probabilities(probs_or_run, beta_true=None, *, ax=None, threshold: float = 0.5, names=None, top: int | None = None):
    """Stem plot of the marginal inclusion probabilities, the 0.5 line of the median model, and
    (with ``beta_true``) the true variables marked.  Returns the matplotlib ``Axes``.

    ``probs_or_run`` is an array of probabilities or anything :func:`inclusion_probabilities`
    takes; ``top`` shows only the ``top`` largest.
    """
    import matplotlib.pyplot as plt

    probs = np.asarray(probs_or_run, np.float64) if isinstance(probs_or_run, (np.ndarray, list, tuple)) else inclusion_probabilities(probs_or_run)
    idx = np.arange(probs.shape[0])
    if top is not None:
        idx = np.sort(np.argsort(-probs)[:top])
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    x = np.arange(len(idx)) if top is not None else idx
    ax.vlines(x, 0, probs[idx], color="C0", lw=1)
    ax.plot(x, probs[idx], "o", color="C0", ms=3, label="inclusion probability")
    if beta_true is not None:
        true = np.asarray(beta_true)[idx] != 0
        ax.plot(x[true], probs[idx][true], "o", color="C3", ms=5, label="true variable")
    ax.axhline(threshold, color="grey", ls="--", lw=1, label="median probability model")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("P(γ_j = 1 | X)")
    if names is not None:
        ax.set_xticks(x)
        ax.set_xticklabels(np.asarray(names)[idx], rotation=90)
    else:
        ax.set_xlabel("variable" if top is None else f"variable (top {top})")
        if top is not None:
            ax.set_xticks(x)
            ax.set_xticklabels(idx, rotation=90)
    ax.legend(loc="best", fontsize="small")
    return ax
