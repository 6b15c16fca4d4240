r"""The mini-batch size and step of a kernel's defaults, from the gradient noise the warmup measured.

With control variates the gradient noise of a mini-batch of n rows, at a point θ of the
posterior, is (1/n)·Cov_i(g_i(θ) − g_i(θ̂)): its size is set by how much single rows' gradients
vary, and long-tailed covariates (lab values tens of sds out) or an exponential link make a few
rows dominate it.  In the Laplace frame the warmup measures, per coordinate j, r_j: one row's
variance (:attr:`~numpyro_sg.infer.warmup_options.ModeFit.row_noise`), so a mini-batch has
c_j = r_j/n (times 1 − (n − 1)/(N − 1) without replacement).  A variance averages the rows; where
a few rows dominate it, the mini-batch that holds one of them moves the chain by t_j/n per unit of
drift (t_j: :attr:`~numpyro_sg.infer.warmup_options.ModeFit.row_kick`), a jump that can carry the
chain past where the Laplace frame holds; the plans therefore count c_j = max(r_j/n, t_j²/n²), as
if the worst row were drawn at every step.

On a Gaussian target whitened by the preconditioner, gradient noise of variance c per step adds
to the chain's stationary variance (exactly for the linear kernels, to first order for SGBD):

* SGLD (``correct_discretisation``): ε·c/(4 − ε) (:func:`~numpyro_sg.kernels.sgld.sgld_inflation`);
* SGHMC, friction α, η = ε/2: η·c·(2 − α)/(α·(4 − 2α − η))
  (:func:`~numpyro_sg.kernels.momentum.sghmc_inflation`);
* SGBD, step σ: √(1 + σ²·c/1.702²) − 1 (:func:`~numpyro_sg.kernels.sgbd.sgbd_inflation`: the
  noise blurs the sign's logit by this factor, as the probit approximation shows, and a chain
  targeting π^(1/s) has s times π's variance).

The Laplace frame is exact only for a Gaussian posterior.  Where a saturating link fits a few
rows tens of sds out at the mode, the posterior's curvature a few sds out is several times the
mode's (a wall), and an unadjusted Langevin or SGHMC step sized for the mode overshoots it even
with the exact gradient: the draws come out too wide, by tens of percent (a multinomial logit on
collinear covariates with 30–45 sd outliers, at 10⁵ rows).  The warmup measures how steep the
gradient is at the Laplace draws, λ̂ (:attr:`~numpyro_sg.infer.warmup_options.ModeFit.drift_ratio`),
and the linear kernels' predictions are those for a whitened Gaussian of curvature
λ = max(1, λ̂ − 0.25) (the margin: λ̂ was 1.00–1.11 on Gaussian-looking posteriors of censored
survival, gamma, Poisson, Student-t and negative binomial regressions):
SGLD (4 − ε + ε·c)/(4 − ε·λ) − 1 and SGHMC (4 − 2α − η + η·c·(2 − α)/α)/(4 − 2α − η·λ) − 1, the
same as above at λ = 1.  SGBD's bounded moves do not overshoot, and its prediction keeps λ = 1.

:func:`plan_noise` raises n until this inflation is at most the tolerance
(``WarmupOptions.max_noise_inflation``) with the kernel's default step, up to N; where N rows
drawn with replacement are not enough, every mini-batch is the whole data (the exact gradient:
a data set so small, or rows so extreme, that subsampling buys nothing).  With a user's
``subsample_size`` the step shrinks instead.  What the kernel runs with is its ``noise_plan``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from numpyro_sg.diagnostics.convergence import ConvergenceWarning
from numpyro_sg.infer.sharded_minibatch import is_sharded


@dataclass(frozen=True)
class NoisePlan:
    """What a kernel runs with (:func:`plan_noise`).

    :ivar subsample_size: n, the rows of each mini-batch.
    :ivar step_scale: the factor on the default step (1: the default itself).
    :ivar inflation: the predicted variance the gradient noise adds, as a fraction of the
        posterior variance, in the worst coordinate.
    :ivar row_noise: max_j r_j (:attr:`~numpyro_sg.infer.warmup_options.ModeFit.row_noise`).
    :ivar row_kick: max_j t_j (:attr:`~numpyro_sg.infer.warmup_options.ModeFit.row_kick`; 0 when not measured).
    :ivar requested: the n the model's plate (or the kernel's ``subsample_size``) asked for.
    :ivar replace: whether rows are drawn with replacement (``False`` with n = N: every
        mini-batch is the whole data, the exact gradient).
    :ivar curvature: λ, the curvature the prediction assumed (module docstring; 1: the Laplace one).
    """

    subsample_size: int
    step_scale: float
    inflation: float
    row_noise: float
    requested: int
    replace: bool = True
    row_kick: float = 0.0
    curvature: float = 1.0

    @property
    def changed(self) -> bool:
        """Whether the plan departs from the requested size or the default step."""
        return self.subsample_size != self.requested or self.step_scale != 1.0


def batch_noise(row_noise: float, n: int, N: int, replace: bool = True, row_kick: float = 0.0) -> float:
    """c = max(r/n, t²/n²), times the finite-population factor 1 − (n − 1)/(N − 1) without replacement."""
    c = max(row_noise / n, (row_kick / n) ** 2)
    return c if replace or N <= 1 else c * max(1.0 - (n - 1) / (N - 1), 0.0)


def curvature_of(drift_ratio) -> float:
    """λ = max(1, λ̂ − 0.25) from the warmup's :attr:`~numpyro_sg.infer.warmup_options.ModeFit.drift_ratio`
    λ̂ (1 where it was not measured; module docstring)."""
    return 1.0 if drift_ratio is None else max(1.0, float(drift_ratio) - 0.25)


def plan_noise(inflation, step_size: float, row_noise, n: int, N: int, tolerance: float, *,
               adjust_size: bool, adjust_step: bool, replace: bool = True, exact: bool = False,
               row_kick=(), curvature: float = 1.0) -> NoisePlan:
    """The smallest n' ≥ n (≤ N, when ``adjust_size``) whose noise keeps ``inflation(step, c, λ)`` at
    most ``tolerance`` (:func:`batch_noise` of max_j ``row_noise`` and max_j ``row_kick``; λ =
    ``curvature``); where N rows drawn with replacement are not enough and ``exact`` allows it,
    every row without replacement (the exact gradient, c = 0); then, if ``adjust_step`` and that
    is still above, the largest step ``step_size``·s (s ≤ 1) that meets it.  ``inflation(step, c, λ)``
    grows with each argument.

    >>> sgld_inflation = lambda eps, c, lam=1.0: (eps * (lam - 1) + eps * c) / (4 - eps * lam)
    >>> plan = plan_noise(sgld_inflation, 0.7, [0.0, 200.0], 500, 100_000, 0.05,
    ...                   adjust_size=True, adjust_step=True)
    >>> plan.subsample_size, plan.step_scale, round(plan.inflation, 4)
    (849, 1.0, 0.05)
    >>> steep = plan_noise(sgld_inflation, 0.7, [1e6], 500, 10_000, 0.05, adjust_size=True,
    ...                    adjust_step=True, exact=True, curvature=3.0)
    >>> steep.subsample_size, steep.replace, round(steep.step_scale * 0.7, 3)
    (10000, False, 0.093)
    """
    r = float(np.max(row_noise)) if len(row_noise) else 0.0
    t = float(np.max(row_kick)) if row_kick is not None and len(row_kick) else 0.0
    predicted = lambda m, s=1.0: inflation(s * step_size, batch_noise(r, m, N, replace, t), curvature)
    fits = lambda m, s=1.0: predicted(m, s) <= tolerance
    m = n
    if adjust_size and not fits(m) and max(r, t) > 0:
        lo, hi = n, N   # fits(hi) may be false: then N
        if fits(hi):
            while hi - lo > 1:   # fits is monotone in n
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        m = hi
        if exact and replace and not fits(m):
            m, replace = N, False
    scale = 1.0
    if adjust_step and not fits(m):
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if fits(m, mid) else (lo, mid)
        scale = lo
    return NoisePlan(subsample_size=int(m), step_scale=float(scale), inflation=float(predicted(m, scale)),
                     row_noise=r, requested=int(n), replace=replace, row_kick=t, curvature=float(curvature))


def noise_warning(kernel: str, plan: NoisePlan, inflation, step_size: float, N: int, tolerance: float,
                  replace: bool = True) -> str:
    """The warning when the user's step and mini-batch size put the predicted inflation above
    ``tolerance``, with a remedy that meets it: the mini-batch size that would (at this step), or,
    where N rows are not enough, the step that would (at this size)."""
    n, common = plan.subsample_size, dict(replace=replace, row_kick=[plan.row_kick], curvature=plan.curvature)
    bigger = plan_noise(inflation, step_size, [plan.row_noise], n, N, tolerance, adjust_size=True,
                        adjust_step=False, **common)
    if bigger.inflation <= tolerance:
        remedy = f"subsample_size={bigger.subsample_size} keeps it below {tolerance:.0%} at this step"
    else:
        smaller = plan_noise(inflation, step_size, [plan.row_noise], n, N, tolerance, adjust_size=False,
                             adjust_step=True, **common)
        remedy = f"step_size={smaller.step_scale * step_size:.3g} keeps it below {tolerance:.0%} at this size"
    cause = f"the control-variate gradient noise of {n} rows per mini-batch adds"
    if plan.curvature > 1.0:
        cause = (f"{cause[:-5]} and the posterior's curvature, up to {plan.curvature:.3g} times the "
                 "Laplace approximation's a few sds out, add")
    amount = f"about {plan.inflation:.0%}" if plan.inflation < 10 else "more than 1000%"
    return (f"{kernel}: {cause} {amount} to the posterior variance at step_size={step_size:.3g} "
            f"(measured by the warmup; the tolerance is warmup_options['max_noise_inflation'] = {tolerance:g}): "
            f"the draws will be too wide. Remedy: {remedy}; the defaults (no step_size or "
            "subsample_size) choose such settings themselves.")


def slow_chain_remedy(plan: NoisePlan, step_size: float, bounded: bool) -> str | None:
    """The remedies for chains that did not converge when the plan shrank the default step (to
    ``step_size``; ``None`` where it did not): a longer run, not the larger step that the generic
    remedies suggest for slow chains; where the curvature shrank it and the kernel's moves are not
    ``bounded``, SGBD."""
    if plan.step_scale >= 1.0:
        return None
    why = ("the posterior is steeper a few sds out than its Laplace approximation, kernel.mode_fit.drift_ratio"
           if plan.curvature > 1.0 else f"the gradient noise of {plan.subsample_size} rows per mini-batch, "
           "kernel.noise_plan")
    sgbd = ("; or numpyro_sg.SGBD on the same model, whose bounded moves keep their default step there"
            if plan.curvature > 1.0 and not bounded else "")
    return (f"a longer num_warmup and num_samples: the default step was shrunk to {step_size:.3g} ({why}), so "
            f"the chains move slowly, and a larger step_size would widen the draws{sgbd}; compare with NUTS "
            "(numpyro_sg.nuts_reference) when it is affordable")


def kernel_noise_plan(kernel, fit, stacklevel: int = 2) -> NoisePlan | None:
    """A gradient kernel's plan from its warmup's ``fit``: ``None`` where nothing was measured
    (``fit.row_noise``), the tolerance is off, the kernel has no prediction
    (``kernel.noise_inflation``), or its settings are outside the prediction's reach (a
    preconditioner of the user's, plain gradients, several plates, a step per coordinate or a
    schedule).  With the default step the size (``subsample_size`` not given to the kernel) or
    else the step adapts; a user's step and size are kept, with a ``ConvergenceWarning``
    (:func:`noise_warning`) when they exceed the tolerance."""
    tolerance = kernel.warmup_options.max_noise_inflation
    if (fit is None or fit.row_noise is None or tolerance is None or kernel.noise_inflation(1.0, 0.0, 1.0) is None
            or not isinstance(kernel.preconditioner, str) or kernel.gradient != "cv"):
        return None
    default = kernel.step_size is None
    step = kernel.default_step_size(plain=True) if default else kernel.step_size
    mb = kernel.minibatcher
    if len(mb.plates) != 1 or callable(step) or np.ndim(step) != 0:
        return None
    (plate,) = mb.plates
    plan = plan_noise(kernel.noise_inflation, float(step), fit.row_noise, plate.subsample_size, plate.size,
                      tolerance, adjust_size=default and kernel._subsample_size is None, adjust_step=default,
                      replace=mb.replace, exact=not is_sharded(mb), row_kick=fit.row_kick,
                      curvature=curvature_of(fit.drift_ratio))
    if plan.inflation > tolerance:
        warnings.warn(noise_warning(type(kernel).__name__, plan, kernel.noise_inflation, float(step), plate.size,
                                    tolerance, mb.replace), ConvergenceWarning, stacklevel=stacklevel)
    return plan
