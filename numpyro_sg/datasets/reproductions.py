r"""Mauri & Zanella's (2024) experiments: the skew-normal toy (§5.1, Fig. 2) and the plots of §5.3 (Fig. 7).

**Skew-normal toy.**  The target is the skew-normal density π(x) = 2·φ(x)·Φ(αx) (location 0,
scale 1) with score s(x) = −x + α·φ(αx)/Φ(αx), which grows like −α²x on the left as the shape
α grows.  Each sampler sees the exact score plus isotropic Gaussian noise,
ĝ = s(x) + τ·η with τ = ``noise_factor`` × the target sd, and runs with a step σ equal to
a fraction of the target sd:

* SGLD (vanilla): x ← x + (ε/2)·ĝ + √ε·ξ with ε = σ² (its increments have sd σ);
* SGBD (vanilla): the increment z ~ N(σ, (0.1σ)²) keeps its sign with probability
  sigmoid(z·ĝ) (:func:`numpyro_sg.kernels.sgbd.sgbd_update`).

The first-order bias is |mean of the draws − E_π[x]| / |E_π[x]|, E_π[x] = δ·√(2/π),
δ = α/√(1 + α²).  The paper finds SGBD's bias flat in α and SGLD's exploding beyond some α,
sooner with the larger step.  :func:`skew_normal_bias` runs the grid (``lax.scan`` over
iterations, ``vmap`` over chains and α), :func:`plot_skew_bias` draws Fig. 2a.

**BPMF traces.**  :func:`plot_rmse_traces` draws Fig. 7: test RMSE of single draws and of the
running MCMC average (:func:`numpyro_sg.datasets.ratings.rmse_trace`) against the iteration.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from jax import random
from jax.scipy.stats import norm

from numpyro_sg.kernels.moves import langevin_move
from numpyro_sg.kernels.sgbd import sgbd_update

__all__ = ["skew_normal_bias", "plot_skew_bias", "plot_rmse_traces"]


def skew_normal_moments(alpha):
    """Mean δ·√(2/π) and sd √(1 − 2δ²/π) of the skew-normal with shape α (δ = α/√(1 + α²))."""
    delta = alpha / np.sqrt(1.0 + np.square(alpha))
    mean = delta * np.sqrt(2.0 / np.pi)
    return mean, np.sqrt(1.0 - mean**2)


def skew_normal_score(x, alpha):
    """s(x) = d/dx log(2·φ(x)·Φ(αx)) = −x + α·exp(log φ(αx) − log Φ(αx)) (stable in the tail)."""
    return -x + alpha * jnp.exp(norm.logpdf(alpha * x) - norm.logcdf(alpha * x))


def _chain_mean(key, alpha, sigma, tau, sampler, num_iterations, burn_in, start):
    """Mean of one chain's draws after ``burn_in`` (NaN if it left the finite numbers)."""

    def body(carry, k):
        x, total = carry
        k_noise, k_move = random.split(k)
        grad = skew_normal_score(x, alpha) + tau * random.normal(k_noise, x.shape)
        if sampler == "SGLD":
            eps = sigma**2
            x = langevin_move(x, grad, eps, random.normal(k_move, x.shape), eps)
        else:
            x, _, _ = sgbd_update(k_move, x, grad, sigma, tau, "vanilla")
        return (x, total + x), None

    keys = random.split(key, num_iterations)
    (x, _), _ = jax.lax.scan(body, (start, jnp.zeros_like(start)), keys[:burn_in])
    (_, total), _ = jax.lax.scan(body, (x, jnp.zeros_like(start)), keys[burn_in:])
    return total / (num_iterations - burn_in)


def skew_normal_bias(alphas=(1, 2, 5, 10, 20, 50, 100), step_fractions=(0.1, 0.5), *,
                     num_iterations: int = 50_000, burn_in: int = 5_000, num_chains: int = 4,
                     noise_factor: float = 1.0, seed: int = 0) -> pd.DataFrame:
    """Relative first-order bias of SGLD and SGBD on the skew-normal toy (module docstring).

    :return: a ``DataFrame`` with columns ``sampler``, ``alpha``, ``step_fraction`` and
        ``relative_bias`` (of the mean over ``num_chains`` chains started at the target mean;
        ``inf`` where a chain left the finite numbers).
    """
    rows = []
    key = random.PRNGKey(seed)
    for sampler in ("SGLD", "SGBD"):
        for frac in step_fractions:
            for alpha in alphas:
                mean, sd = skew_normal_moments(float(alpha))
                key, sub = random.split(key)
                run = jax.jit(jax.vmap(lambda k: _chain_mean(
                    k, float(alpha), frac * sd, noise_factor * sd, sampler, num_iterations,
                    burn_in, jnp.asarray(mean, jnp.float32))))
                means = np.asarray(run(random.split(sub, num_chains)), np.float64)
                est = means.mean() if np.all(np.isfinite(means)) else np.inf
                rows.append(dict(sampler=sampler, alpha=float(alpha), step_fraction=float(frac),
                                 relative_bias=float(abs(est - mean) / abs(mean))))
    return pd.DataFrame(rows)


def plot_skew_bias(table: pd.DataFrame, ax=None, cap: float = 1e3):
    """Fig. 2a: relative bias of the mean against α (log–log), SGLD red, SGBD blue, dotted
    for the small step, dashed for the large one; infinite biases drawn at ``cap``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    colours = {"SGLD": "tab:red", "SGBD": "tab:blue"}
    fracs = sorted(table.step_fraction.unique())
    styles = dict(zip(fracs, [":", "--", "-.", "-"]))
    for (sampler, frac), part in table.groupby(["sampler", "step_fraction"]):
        part = part.sort_values("alpha")
        bias = np.minimum(part.relative_bias.to_numpy(), cap)
        ax.plot(part.alpha, bias, styles[frac], color=colours.get(sampler, "k"), marker="o",
                label=f"{sampler}, σ = {frac:g}·sd")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("shape α")
    ax.set_ylabel("relative bias of the mean")
    ax.set_title("Skew-normal target, isotropic gradient noise (τ = sd)")
    ax.legend()
    return ax.figure


def plot_rmse_traces(traces: dict, axes=None, ylim=None):
    """Fig. 7: test RMSE of single draws (left) and of the running MCMC average (right)
    against the iteration, one line per run.

    :param traces: ``{label: DataFrame}`` as returned by :func:`numpyro_sg.datasets.ratings.rmse_trace`
        (an optional ``iteration`` column replaces ``draw`` on the x axis).
    """
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for label, df in traces.items():
        x = df["iteration"] if "iteration" in df else df["draw"]
        axes[0].plot(x, df["rmse_sample"], label=label, lw=1)
        axes[1].plot(x, df["rmse_average"], label=label, lw=1.5)
    for ax, title in zip(axes, ("single draws", "running MCMC average")):
        ax.set_xlabel("iteration")
        ax.set_title(f"test RMSE of {title}")
        if ylim is not None:
            ax.set_ylim(*ylim)
    axes[0].set_ylabel("test RMSE")
    axes[1].legend()
    return axes[0].figure
