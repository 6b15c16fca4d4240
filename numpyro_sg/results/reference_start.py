"""Where the NUTS reference starts, and whether it found the run's posterior.

NUTS started from NumPyro's default (uniform draws on (−2, 2) per unconstrained coordinate) can
settle in a lower mode — merged components of a mixture — and look converged.  Two guards:

* :func:`reference_start`: ``nuts_reference(..., start="mode")`` starts the chains at the
  mode the warmup's multi-start search finds (:func:`~numpyro_sg.infer.warmup.fit_model_mode`),
  or at a :class:`~numpyro_sg.infer.warmup.ModeFit` already computed (``kernel.mode_fit``),
  with the Laplace covariance as NUTS's initial inverse mass matrix (a model without local
  latents): on collinear covariates NUTS's own adaptation from a unit mass can spend its
  warmup at tree depth 10 and end far from the posterior;
* :func:`log_density_check`: :func:`numpyro_sg.compare_to_reference` compares the mean full-data
  log density of the two runs' scored draws.  Draws of one posterior share it up to noise;
  a run collapsed onto the mode lies at most d/2 nats above the posterior's mean (the mean of
  χ²_d/2 for a Gaussian posterior), so a reference more than d/2 + 4 se + 2 nats below the run
  cannot be the same posterior, and a ``ConvergenceWarning`` says so.
"""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.infer import init_to_value
from numpyro.infer.util import constrain_fn

from numpyro_sg.diagnostics.convergence import ConvergenceWarning
from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.infer.warmup import ModeFit, fit_model_mode
from numpyro_sg.locals.posterior import joint_model, marginal_of


def start_key(start) -> str | None:
    """The part of the reference's cache key that names its start."""
    if isinstance(start, ModeFit):
        return "mode " + hashlib.sha256(np.asarray(start.mode).tobytes()).hexdigest()[:16] + ", Laplace mass"
    if start not in (None, "mode"):
        raise ValueError(f"start must be None, 'mode' or a ModeFit (e.g. kernel.mode_fit); got {start!r}.")
    return None if start is None else "mode, Laplace mass"


def reference_start(model, model_args, model_kwargs, start, dense_mass=False) -> dict:
    """NUTS keyword arguments for ``start`` (:func:`start_key`): none for NumPyro's default,
    else ``init_strategy`` (``init_to_value`` at the mode's constrained values: the globals of a
    model with local latents, whose locals start as NumPyro's default) and, for a model without
    local latents and a boolean ``dense_mass``, ``inverse_mass_matrix``: the Laplace covariance
    L·Lᵀ at the mode (its diagonal when ``dense_mass`` is false), which NUTS's windows adapt on."""
    start_key(start)
    if start is None:
        return {}
    marginal = marginal_of(model, model_args, model_kwargs)
    if isinstance(start, ModeFit):
        info = trace_model(marginal, model_args, model_kwargs)
        fit, unravel = start, ravel_pytree(info.unconstrained_example())[1]
    else:
        fit, _, unravel = fit_model_mode(marginal, model_args, model_kwargs)
    values = constrain_fn(handlers.seed(marginal, 0), model_args, model_kwargs, unravel(fit.mode))
    kwargs = {"init_strategy": init_to_value(values={k: np.asarray(v) for k, v in values.items()})}
    if isinstance(dense_mass, bool) and joint_model(model, model_args, model_kwargs) is None:
        cov = laplace_covariance(fit.preconditioner, np.size(fit.mode))
        kwargs["inverse_mass_matrix"] = cov if dense_mass else np.diag(cov).copy()
    return kwargs


def laplace_covariance(P, dim: int) -> np.ndarray:
    """L·Lᵀ of a :class:`~numpyro_sg.infer.preconditioner.Preconditioner` as a (dim, dim) array."""
    if P.chol is not None:
        L = np.asarray(P.chol, np.float64)
        return L @ L.T
    return np.diag(np.ones(dim) if P.scale is None else np.asarray(P.scale, np.float64) ** 2)


def log_density_check(run_stein, ref_stein) -> dict:
    """``{"log_density", "reference_log_density"}``: the mean full-data log density of the two
    runs' scored draws (``stein`` groups); warn when the reference's is too far below
    (module docstring).  Empty when a group has no ``log_density`` (made before it was stored)."""
    if "log_density" not in run_stein or "log_density" not in ref_stein:
        return {}
    a, b = (np.asarray(s["log_density"].values, np.float64).ravel() for s in (run_stein, ref_stein))
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 2 or len(b) < 2:
        return {}
    dim = int(ref_stein.attrs.get("model_dim", ref_stein.sizes["coordinate"]))
    gap, se = a.mean() - b.mean(), np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    limit = dim / 2 + 4 * se + 2
    if gap > limit:
        warnings.warn(
            f"compare_to_reference: the reference's draws lie {gap:.3g} nats below the run's in mean "
            f"full-data log density, more than the {limit:.3g} a run collapsed onto the mode could "
            "explain: the reference cannot be the same posterior (NUTS has likely settled in a lower "
            "mode, e.g. merged mixture components). Rerun it from the run's mode: "
            "nsg.nuts_reference(..., start=kernel.mode_fit) or start='mode'.",
            ConvergenceWarning, stacklevel=3)
    return {"log_density": float(a.mean()), "reference_log_density": float(b.mean())}
