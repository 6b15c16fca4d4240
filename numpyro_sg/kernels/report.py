r"""The gradient kernels' end-of-run report: causes a kernel can name that R̂ and ESS cannot.

:meth:`numpyro_sg.kernels.gradient.GradientKernel.convergence_report` measures, from the
moments each chain collected over its kept draws (Welford sums in the flat parameter space), the
draws against the Laplace approximation N(θ̂, L·Lᵀ) at the warmup's mode θ̂:

* **frozen chains**: a chain whose draws spread over less than :data:`FROZEN_SPREAD` Laplace sds
  along every direction barely moves.  With the default preconditioner the step size is in
  posterior sds, so a paper's absolute step (say 10⁻⁶) given to a preconditioned kernel is a step
  of 10⁻⁶ posterior sds: the report names the units and how to give an absolute step
  (``preconditioner=None, gradient="plain"``), rather than blaming the posterior's shape;
* **excursions**: a chain whose draws went more than :data:`EXCURSION_SDS` Laplace sds from the
  mode in some coordinate (its running minimum and maximum): a jump that a pooled mean and
  variance, R̂ and ESS average away — the mark of a mini-batch gradient whose noise is
  dominated by a few extreme rows;
* **Laplace misfit**: the pooled draws' mean and covariance far from the Laplace approximation
  (the posterior is far from Gaussian); both reported only when no chain is frozen.

Each finding is a pair ``(problem, remedy)`` (a triple ending in ``True`` when the cause also
explains why the chains disagree): :func:`numpyro_sg.check_convergence` lists the problems and,
when a kernel names a cause, suggests that cause's remedy instead of generic ones.
"""

from __future__ import annotations

import numpy as np

from numpyro_sg.infer.preconditioner import laplace_misfit, pool_moments

#: a chain whose draws' sd is below this many Laplace sds along every direction barely moves
#: (a chain sampling the posterior spreads over about one)
FROZEN_SPREAD = 0.1
#: a chain whose draws went further than this many Laplace sds from the mode in a coordinate made
#: an excursion: 4 chains × 2,000 draws of a Gaussian stay within about 5 (the largest of 8,000·d
#: normal draws, √(2·ln(2·8,000·d)) for d ≤ 100), skewed posteriors within about 10
EXCURSION_SDS = 20.0
#: the misfit report counts at least this fraction of the kept draws as independent when it
#: allows for the sampling noise of their mean and covariance (:func:`with_sampling_noise`)
MIN_ESS_FRACTION = 0.1


def chain_moments(moments, dim: int):
    """Per-chain ``(counts (C,), means (C, d), m2s (C, d, d) or (C, d))`` (Welford sums of squared
    deviations) from the running moments of one chain or of vectorized chains (numpy, float64)."""
    counts = np.asarray(moments.count, np.float64).reshape(-1)
    chains = len(counts)
    means = np.asarray(moments.mean, np.float64).reshape(chains, dim)
    m2 = np.asarray(moments.m2, np.float64)
    return counts, means, m2.reshape((chains, dim, dim) if m2.size == chains * dim * dim else (chains, dim))


def _largest_whitened_sd(P, cov) -> float:
    """sqrt of the largest variance of one chain's draws in Laplace sds (whitened by L)."""
    if P.chol is not None:
        Linv = np.linalg.inv(np.asarray(P.chol, np.float64))
        C = cov if cov.ndim == 2 else np.diag(cov)
        return float(np.sqrt(max(np.linalg.eigvalsh(Linv @ C @ Linv.T).max(), 0.0)))
    scale = np.ones(cov.shape[0]) if P.scale is None else np.asarray(P.scale, np.float64)
    var = np.diag(cov) if cov.ndim == 2 else cov
    return float(np.sqrt(max((var / scale**2).max(), 0.0)))


def frozen_chains(P, counts, m2s, diverging, min_count: int = 50) -> dict:
    """``{chain: largest sd in Laplace sds}`` of the chains (not diverged, with at least
    ``min_count`` kept draws) that spread over less than :data:`FROZEN_SPREAD` Laplace sds."""
    diverging = np.broadcast_to(np.asarray(diverging, bool).reshape(-1), counts.shape)
    found = {}
    for c in range(len(counts)):
        if counts[c] >= min_count and not diverging[c]:
            spread = _largest_whitened_sd(P, m2s[c] / max(counts[c] - 1.0, 1.0))
            if spread < FROZEN_SPREAD:
                found[c] = spread
    return found


def frozen_report(frozen: dict, preconditioner, step_size) -> tuple:
    """The ``(problem, remedy, True)`` of chains that barely move: the step size's units are the
    cause (``True``: it also explains why the chains disagree, see
    :func:`numpyro_sg.check_convergence`)."""
    steps = np.unique(np.asarray(step_size, np.float64).reshape(-1))
    step = f"{steps[0]:.3g}" if steps.size == 1 else f"{steps.min():.3g}–{steps.max():.3g}"
    problem = (f"chain(s) {sorted(frozen)} barely move: their draws spread over at most "
               f"{max(frozen.values()):.2g} posterior sds (Laplace sds at the warmup's mode) along "
               f"any direction, with step_size {step}")
    if preconditioner is None:
        remedy = (f"with preconditioner=None, step_size is in the parameters' own units, and {step} "
                  "is far smaller than the posterior's sds: increase it, or drop preconditioner=None "
                  "and leave step_size=None (a step calibrated in posterior sds)")
    else:
        units = ("posterior sds with the default preconditioner='laplace'" if isinstance(preconditioner, str)
                 else "the scales of the preconditioner array you gave")
        remedy = (f"step sizes are in the preconditioner's units — {units} — so step_size={step} is a step of "
                  f"about {step} posterior sds. Leave step_size=None for the calibrated default or "
                  "give a step in posterior sds (of order 0.1–1); to use an absolute step (as in "
                  "the papers), pass preconditioner=None, gradient='plain'")
    return problem, remedy, True  # frozen chains also explain why the chains disagree


def with_sampling_noise(limits, d: int, draws: float):
    """``limits`` = (largest whitened mean offset, (low, high) whitened eigenvalues) widened by
    the noise of n = ``MIN_ESS_FRACTION``·``draws`` independent draws of a d-dimensional
    Gaussian that the Laplace approximation fits: the largest of d mean offsets, each of sd
    1/√n, is about √(2·ln(2d)/n); the eigenvalues of the sample covariance spread to the
    Marchenko–Pastur edges (1 ± √(d/n))² (no lower limit once d ≥ n)."""
    n = max(MIN_ESS_FRACTION * float(draws), 1.0)
    max_offset, (lo, hi) = limits
    g = np.sqrt(d / n)
    return max_offset + np.sqrt(2.0 * np.log(2.0 * d) / n), (lo * max(1.0 - g, 0.0) ** 2, hi * (1.0 + g) ** 2)


def misfit_report(fit, counts, means, m2s, limits) -> list:
    """``[(problem, remedy)]`` when the pooled draws are far from the Laplace approximation
    (``limits``: the largest whitened mean offset and the range of whitened eigenvalues, widened
    by :func:`with_sampling_noise`)."""
    _, mean, cov = pool_moments(counts, means, m2s)
    offset, low, high = laplace_misfit(fit.preconditioner, fit.mode, mean, cov)
    max_offset, (lo, hi) = with_sampling_noise(limits, mean.shape[0], np.sum(counts))
    if offset <= max_offset and lo <= low and high <= hi:
        return []
    return [(
        f"the draws are far from the Laplace approximation at the warmup's mode (their mean "
        f"is up to {offset:.2g} Laplace sds from the mode, their variance {max(low, 0.0):.2g}–{high:.2g} "
        "times the Laplace variance along some directions): the posterior is far from "
        "Gaussian, where the default step sizes, calibrated on near-Gaussian posteriors, can "
        "be biased",
        "check against NUTS (numpyro_sg.nuts_reference), or use a smaller step_size and "
        "preconditioner='adapt'",
    )]


def excursion_report(fit, moments, diverging, limit: float = EXCURSION_SDS, bounded: bool = False) -> list:
    """``[(problem, remedy)]`` for chains (not diverged: those are reported as such) whose draws
    went more than ``limit`` Laplace sds from the mode in a coordinate, from the running
    ``low`` and ``high`` of their moments.  The remedy, for a kernel whose moves grow with the
    gradient (SGLD, SGHMC), is SGBD, whose moves are ``bounded``; for SGBD, a larger mini-batch."""
    d = fit.mode.shape[0]
    low, high = (np.asarray(a, np.float64).reshape(-1, d) for a in (moments.low, moments.high))
    mode, scale = np.asarray(fit.mode, np.float64), fit.scales
    reach = np.maximum(high - mode, mode - low) / scale          # (chains, d)
    diverging = np.asarray(diverging).reshape(-1)
    far = {c: float(np.max(reach[c])) for c in range(len(reach))
           if np.max(reach[c]) > limit and not diverging[c] and np.all(np.isfinite(reach[c]))}
    if not far:
        return []
    worst = max(far, key=far.get)
    remedy = ("raise subsample_size" if bounded else
              "run numpyro_sg.SGBD on the same model: its moves are bounded, so neither an extreme row's gradient "
              "nor a steep wall of the posterior can throw a chain")
    return [(
        f"chain(s) {sorted(far)} made excursions: their draws went up to {far[worst]:.3g} Laplace sds "
        f"from the warmup's mode (chain {worst}, flat coordinate {int(np.argmax(reach[worst]))}), where a "
        f"posterior's draws stay within about 10: jumps that the pooled mean and variance, R̂ and ESS "
        "average away, from a mini-batch gradient whose noise a few extreme rows dominate, or a step too "
        "long for where the posterior's curvature rises far above the mode's",
        f"{remedy}; check against NUTS (numpyro_sg.nuts_reference)",
    )]


#: a diagonal preconditioner shrunk at least this many times for stiffness changes the remedies
#: for chains that did not converge (:func:`stiff_diagonal_remedy`)
STIFF_SHRINK = 10.0


def stiff_diagonal_remedy(fit) -> str | None:
    """The remedies for chains that did not converge when the warmup's diagonal preconditioner
    (above ``dense_max`` coordinates) was shrunk at least :data:`STIFF_SHRINK` times for the
    posterior's stiffest direction, √(2λ − 1) (``WarmupOptions.stabilise_diagonal``); else ``None``.
    On a 3,760-weight classifier (λ = 937, 43 times) R̂ stayed 3.9 with step_size 1 (default 0.7)
    and with SGHMC, and a ten times longer run raised ESS from 4 to 5: the generic remedies do not help."""
    if fit is None or fit.preconditioner.chol is not None:
        return None
    shrink = float(np.sqrt(max(2.0 * fit.stiffness - 1.0, 1.0)))
    if shrink < STIFF_SHRINK:
        return None
    return (f"none that a feasible run gives: the diagonal preconditioner was shrunk {shrink:.0f} times for the "
            f"posterior's stiffest direction (kernel.mode_fit.stiffness {fit.stiffness:.3g}: strongly coupled "
            "coordinates), so the chains move that many times slower than the posterior's spread along the others, "
            "and a neural network's chains may each settle in a mode of their own (its hidden units permuted); "
            "a longer run or a larger step_size does not reconcile the parameters. Judge the chains by their "
            "predictions: numpyro_sg.predictive_metrics(mcmc, *held_out_data, per_chain=True) gives each chain's "
            "held-out log predictive density, accuracy and calibration")
