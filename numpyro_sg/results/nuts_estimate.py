r"""Would full-data NUTS have reached a run's effective sample size sooner?

After a run of one of this package's kernels, :func:`nuts_estimate` sets the run's wall time
(its warmup and compilation included) against an estimate of the time NumPyro's NUTS would
take on the full data to reach the same smallest bulk effective sample size of the kernel's
sites,

.. math:: T_\mathrm{NUTS} \approx t_\mathrm{compile}
          + r \, t_\nabla \, L \, (W + \mathrm{ESS} / e),

* :math:`t_\nabla`: one full-data gradient of the model NUTS would run (the joint model, its
  locals decentred, for a model with local latents), compiled and timed here on this machine,
  :data:`LOOPED_GRADIENTS` in one compiled loop, and :math:`r` = :data:`LEAPFROG_OVER_GRADIENT`
  what a leapfrog step of NUTS costs against it;
* :math:`t_\mathrm{compile}` = :data:`NUTS_COMPILE_SECONDS`;
* :math:`L` (:func:`leapfrog_steps`): NUTS's trajectory with a diagonal mass matrix, whose
  step size falls as :math:`d^{-1/4}` and whose length spans the posterior's widest direction,
  :math:`\kappa` the condition number of the posterior's correlation matrix (the warmup's
  Laplace fit; the draws' where there is none) and :math:`d` the dimension NUTS samples; with
  local latents one doubling more, since the joint couples the locals with the intercept and
  scale, which the globals' fit does not see;
* :math:`W` = 500 warmup iterations and :math:`e` effective draws per draw: 0.5, or 0.1 with
  local latents (an intercept or a scale mixes slowly in the joint) — both pessimistic for
  NUTS, so that a statement that NUTS is faster holds.

:func:`numpyro_sg.to_inference_data` calls :func:`advise_nuts`, which issues one
:class:`PreferNUTSWarning` per run when the estimate is below the run's time by more than
:data:`MARGIN`, with both numbers.  How the estimate compares with NUTS runs:
``docs/checking_nuts.md``.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import jax
import numpy as np
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.infer.util import potential_energy

from numpyro_sg.diagnostics.full_data_scores import full_data_model
from numpyro_sg.diagnostics.stein_runs import run_model
from numpyro_sg.infer.sharding import spans_processes
from numpyro_sg.locals.model import MarginalModel
from numpyro_sg.locals.posterior import joint_model

#: NUTS's warmup iterations in the estimate (NumPyro users commonly run 500 to 1,000)
NUTS_WARMUP = 500
#: NUTS's effective draws per draw (smallest over the sites) assumed without, and with, local latents
ESS_PER_DRAW, ESS_PER_DRAW_LOCALS = 0.5, 0.1
#: the advice is given when the estimate is below the run's time by this factor
MARGIN = 1.25
#: runs shorter than this (seconds) are not checked: NUTS's own compilation takes seconds
MIN_RUN_SECONDS = 3.0
#: the warmup's full-data pass (in chunks) took 1.5–4× NUTS's gradient on regressions of 10⁵–10⁶
#: rows: a pass this many times NUTS's gradient bounds it from below without compiling it
PASS_OVER_GRADIENT = 6.0
#: gradient evaluations timed at least (up to 10× as many within 0.2 s; their median is t_∇)
TIMED_GRADIENTS = 3
#: gradients per timed call, in one compiled loop: NUTS's leapfrog steps run in its compiled loop, without
#: the ~0.1 ms of a call from Python, which doubled the time of a 1,000-group joint's gradient
LOOPED_GRADIENTS = 8
#: a leapfrog step of NumPyro's NUTS against one looped gradient: 2.0 on the 1,000-group joint (0.135 ms
#: against 0.067 ms), 2.1 on a Poisson regression of 10⁵ rows (the tree's bookkeeping, the warmup's
#: longer trajectories)
LEAPFROG_OVER_GRADIENT = 2.0
#: NUTS's compilation: NumPyro's NUTS compiled in 1.6–2.3 s on a 2-core CPU (logistic and Poisson
#: regressions, a 1,000-group joint model) in a process that had run JAX before
NUTS_COMPILE_SECONDS = 2.5


class PreferNUTSWarning(UserWarning):
    """Full-data NUTS would likely reach the run's effective sample size sooner (both times in
    the message; :mod:`numpyro_sg.results.nuts_estimate`)."""


class NutsEstimate(NamedTuple):
    """The comparison of :func:`nuts_estimate`: ``run_seconds`` and ``ess`` of the run, NUTS's
    estimated ``nuts_seconds`` to that ESS, from its ``gradient_seconds`` (one full-data
    gradient), ``leapfrog_steps`` per iteration, the ``condition`` number
    and the ``dim`` it samples, and the ``ess_per_draw`` assumed."""

    run_seconds: float
    ess: float
    nuts_seconds: float
    gradient_seconds: float
    leapfrog_steps: int
    condition: float
    dim: int
    ess_per_draw: float


def leapfrog_steps(condition: float, dim: int, doublings: int = 0) -> int:
    """Leapfrog steps per NUTS iteration: 2^(⌈log₂(1.5 √κ d^{1/4})⌉ + ``doublings``) − 1 (at least 3).

    The step size of a diagonal mass matrix adapted to a Gaussian with correlation condition
    number κ scales as its narrowest width over d^{1/4}, and the doubling stops once the
    trajectory spans the widest one.  The constant 1.5 matches NumPyro's NUTS on logistic and
    Poisson regressions (d = 10, 20: 7 steps) and on a 1,000-group hierarchical joint (d = 1,004:
    15 steps); a 60-group Poisson joint (d = 63) took 15 where the globals' κ = 1.3 gives 7,
    hence one doubling more for a joint (``doublings=1``).
    """
    base = math.ceil(math.log2(1.5 * math.sqrt(max(condition, 1.0)) * max(dim, 1) ** 0.25))
    return 2 ** max(2, base + doublings) - 1


def nuts_seconds(step_seconds: float, steps: int, ess: float, ess_per_draw: float,
                 warmup: int = NUTS_WARMUP, compile_seconds: float = NUTS_COMPILE_SECONDS) -> float:
    """t_compile + t_step · L · (W + ESS / e): NUTS's wall time to ``ess`` effective draws, a
    leapfrog step taking ``step_seconds``."""
    return compile_seconds + step_seconds * steps * (warmup + ess / ess_per_draw)


def correlation_condition(cov) -> float:
    """The condition number of the correlation matrix of a covariance ``cov`` (d, d)."""
    cov = np.asarray(cov, np.float64)
    sd = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
    eig = np.linalg.eigvalsh(cov / np.outer(sd, sd))
    return float(eig[-1] / max(eig[0], 1e-12))


def nuts_model(model, model_args, model_kwargs):
    """``(the full-data model NUTS would run, whether it has local latents)``: the joint one
    with decentred locals (:func:`~numpyro_sg.locals.posterior.joint_model`) or the model with
    every subsample plate over all of its data."""
    joint = joint_model(model, model_args, model_kwargs, decentre=True)
    return full_data_model(model if joint is None else joint, model_args, model_kwargs), joint is not None


def time_gradient(model, model_args, model_kwargs, too_slow: float):
    """``(median seconds of one full-data gradient, dimension)`` of NUTS's potential energy for
    ``model`` from a prior draw (data as the program's arguments; :data:`LOOPED_GRADIENTS` a call); ``None`` as soon as the median
    gradient takes longer than ``too_slow`` (or one takes 10× as long)."""
    def prior_point(key, args, kwargs):
        trace = handlers.trace(handlers.seed(model, key)).get_trace(*args, **kwargs)
        return {name: biject_to(site["fn"].support).inv(site["value"]) for name, site in trace.items()
                if site["type"] == "sample" and not site["is_observed"]}

    model_args, model_kwargs = jax.device_put((model_args, model_kwargs))   # (copied once, not at every call)
    z = jax.jit(prior_point)(jax.random.PRNGKey(0), model_args, model_kwargs)

    def gradients(z, args, kwargs):   # LOOPED_GRADIENTS in one program, as NUTS's leapfrogs run
        def body(_, u):
            g = jax.grad(lambda v: potential_energy(model, args, kwargs, v))(u)
            return jax.tree.map(lambda a, b: a - 1e-12 * b, u, g)   # each depends on the last
        return jax.lax.fori_loop(0, LOOPED_GRADIENTS, body, z)

    gradients = jax.jit(gradients)
    jax.block_until_ready(gradients(z, model_args, model_kwargs))   # compiles
    times, start = [], time.perf_counter()
    while len(times) < TIMED_GRADIENTS or (len(times) < 10 * TIMED_GRADIENTS and time.perf_counter() - start < 0.2):
        tick = time.perf_counter()
        jax.block_until_ready(gradients(z, model_args, model_kwargs))
        times.append((time.perf_counter() - tick) / LOOPED_GRADIENTS)
        if times[-1] > 10 * too_slow or (len(times) >= TIMED_GRADIENTS and np.median(times) > too_slow):
            return None
    return float(np.median(times)), sum(int(np.size(v)) for v in jax.tree.leaves(z))


def nuts_estimate(mcmc, ess: float, run_seconds: float, model=None, model_args=None, model_kwargs=None):
    """:class:`NutsEstimate` of a finished run of one of this package's kernels, or ``None``
    when it cannot be made (no full-data model NUTS could run, data spread over processes, no
    covariance to read the conditioning from) or when one gradient alone rules NUTS out.

    ``ess``: the run's smallest bulk ESS over the kernel's sites; ``run_seconds``: its wall
    time, warmup and compilation included.
    """
    model, model_args, model_kwargs = run_model(mcmc, model, model_args, model_kwargs)
    condition = _condition(mcmc)
    if model is None or condition is None or spans_processes(model_args, model_kwargs):
        return None
    full, has_locals = nuts_model(model, model_args, model_kwargs)
    # NUTS needs at least W iterations of 3 steps: one gradient slower than that rules it out
    timed = time_gradient(full, model_args, model_kwargs, run_seconds / (3 * NUTS_WARMUP))
    if timed is None:
        return None
    (gradient_seconds, dim), e = timed, ESS_PER_DRAW_LOCALS if has_locals else ESS_PER_DRAW
    steps = leapfrog_steps(condition, dim, doublings=int(has_locals))
    return NutsEstimate(float(run_seconds), float(ess), nuts_seconds(LEAPFROG_OVER_GRADIENT * gradient_seconds, steps, ess, e),
                        gradient_seconds, steps, condition, dim, e)


def _condition(mcmc) -> float | None:
    """κ of the warmup's dense Laplace covariance, else of the draws' covariance (≤ 2,000
    coordinates), else ``None``."""
    fit = getattr(mcmc.sampler, "mode_fit", None)
    chol = getattr(getattr(fit, "preconditioner", None), "chol", None)
    if chol is not None:
        chol = np.asarray(chol, np.float64)
        return correlation_condition(chol @ chol.T)
    draws = [np.asarray(v, np.float64).reshape(np.shape(v)[0], -1) for v in mcmc.get_samples().values()
             if np.issubdtype(np.asarray(v).dtype, np.floating)]
    if not draws:
        return None
    x = np.concatenate(draws, axis=1)
    keep = np.std(x, axis=0) > 0
    if not 0 < keep.sum() <= 2000 or x.shape[0] < 4 * keep.sum():
        return None
    return correlation_condition(np.atleast_2d(np.cov(x[:, keep], rowvar=False)))


def advise_nuts(mcmc, ess: float, run_seconds: float | None, model=None, model_args=None, model_kwargs=None,
                warn: bool = True) -> NutsEstimate | None:
    """:func:`nuts_estimate` for a run that took at least :data:`MIN_RUN_SECONDS`, and one
    :class:`PreferNUTSWarning` when NUTS's estimate is below the run's time by :data:`MARGIN`
    (once per run: a second conversion of the same run is silent).  ``None`` where the warmup's
    full-data pass already shows NUTS slower (κ = 1, e = 1, the gradient :data:`PASS_OVER_GRADIENT`
    times faster than the pass: nothing compiled) or no estimate can be made; never fails."""
    if run_seconds is None or run_seconds < MIN_RUN_SECONDS or not np.isfinite(ess) or ess <= 0:
        return None
    fit = getattr(mcmc.sampler, "mode_fit", None)
    if (model is None and model_args is None and not isinstance(mcmc.sampler.model, MarginalModel)
            and fit is not None and np.isfinite(fit.gradient_seconds)):   # no compilation where the pass rules NUTS out
        fastest = nuts_seconds(fit.gradient_seconds / PASS_OVER_GRADIENT, leapfrog_steps(1.0, np.size(fit.mode)),
                               ess, 1.0)
        if fastest * MARGIN > run_seconds:
            return None
    try:
        estimate = nuts_estimate(mcmc, ess, run_seconds, model, model_args, model_kwargs)
    except Exception:   # advice only: a model NUTS cannot run (discrete sites, data it cannot hold) has none
        return None
    if estimate is None or not warn or estimate.nuts_seconds * MARGIN > run_seconds:
        return estimate
    run = id(mcmc.last_state)
    if getattr(mcmc.sampler, "_nuts_advised", None) != run:
        mcmc.sampler._nuts_advised = run
        warnings.warn(advice(estimate, type(mcmc.sampler).__name__), PreferNUTSWarning, stacklevel=3)
    return estimate


def advice(e: NutsEstimate, kernel: str) -> str:
    """The :class:`PreferNUTSWarning` text."""
    draws = e.ess / e.ess_per_draw
    return (
        f"{kernel}: full-data NUTS would likely reach this run's effective sample size sooner. "
        f"This run took {e.run_seconds:.1f} s (warmup and compilation included) for a smallest bulk "
        f"ESS of {e.ess:.0f}; NUTS would take about {e.nuts_seconds:.1f} s: {NUTS_COMPILE_SECONDS} s to compile, "
        f"then {LEAPFROG_OVER_GRADIENT * e.gradient_seconds * 1e3:.3g} ms per leapfrog step ({LEAPFROG_OVER_GRADIENT:g} x "
        f"{e.gradient_seconds * 1e3:.3g} ms per full-data gradient, timed on this machine) x "
        f"{e.leapfrog_steps} leapfrog steps per iteration (d = {e.dim}, correlation condition number "
        f"{e.condition:.1f}) x ({NUTS_WARMUP} warmup + {draws:.0f} draws at {e.ess_per_draw} effective "
        "draws per draw). On this model and data size use numpyro.infer.NUTS on the full data "
        "(numpyro_sg.nuts_reference runs it and returns the same ArviZ data); the stochastic-gradient "
        "kernels pay off when one full-data gradient is expensive."
    )
