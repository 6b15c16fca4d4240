"""SGLD and every SGBD variant recover a closed-form Gaussian posterior.

Model: Gaussian linear regression with known noise sd (``conftest.linear_model``), N = 1,000,
d = 3, prior N(0, 2²): the posterior is N(m, S) in closed form, posterior sd ≈ 0.032.

Tolerances (fixed seeds; 20,000 draws after 2,000 warmup):
* posterior mean within 0.25 posterior sd per coordinate.  The chains' integrated
  autocorrelation time is about 2·var/ε ≈ 20–50 iterations, so ESS ≥ 400 and the Monte Carlo
  standard error of a mean is ≤ 0.05 sd: 0.25 sd is 5 standard errors, while a wrong drift
  (e.g. a sign error or a missing N/n scale) moves the mean by many posterior sds.
* posterior sd ratio within [0.88, 1.15] for the vanilla variants and [0.9, 1.1] for the
  noise-corrected ones.  The sd estimate's Monte Carlo error is ≈ 1/√(2·ESS) ≈ 3.5%; vanilla
  SGLD at n = 200, ε = 1e-4 has a predicted sd inflation of √(1 + ε·τ̂²/4) − 1 ≈ 6%
  (τ̂ ≈ N/√n = 71), vanilla SGBD's gradient shrinkage 1.702/√(1.702² + z²τ̂²) ≈ 0.93 gives
  ≈ 4%; the corrected variants remove these.  Measured (seeds 0/1): sd ratios 1.05–1.12
  vanilla, 0.99–1.05 corrected; mean errors ≤ 0.11 sd.
* extreme SGBD is only right where the noise matches the breaking point, |z|·τ̂ ≈ 1.702: it is
  run at n = 35 (τ̂ ≈ 170 with σ = 0.01).
"""

import jax
import numpy as np
import pytest
from conftest import CLASSIC, linear_model, linear_posterior
from numpyro.infer import MCMC

import numpyro_sg as nsg

CASES = {
    "sgld-vanilla": (lambda **kw: nsg.SGLD(linear_model, 1e-4, **CLASSIC, **kw), 200, (0.88, 1.15)),
    "sgld-corrected": (lambda **kw: nsg.SGLD(linear_model, 1e-4, variant="corrected", **CLASSIC, **kw),
                       200, (0.9, 1.1)),
    "sgbd-vanilla": (lambda **kw: nsg.SGBD(linear_model, 0.01, variant="vanilla", **CLASSIC, **kw),
                     200, (0.88, 1.15)),
    "sgbd-corrected": (lambda **kw: nsg.SGBD(linear_model, 0.01, variant="corrected", **CLASSIC, **kw),
                       200, (0.9, 1.1)),
    "sgbd-extreme": (lambda **kw: nsg.SGBD(linear_model, 0.01, variant="extreme", **CLASSIC, **kw),
                     35, (0.88, 1.15)),
    "sgbd-adaptive": (
        lambda **kw: nsg.SGBD(linear_model, 0.01, variant="corrected", adapt_step_size=True, **CLASSIC, **kw),
        200,
        (0.88, 1.15),
    ),
}


def _run(make_kernel, n, X, y, seed=0, replace=True):
    kernel = make_kernel(minibatch_options={"replace": replace})
    mcmc = MCMC(kernel, num_warmup=2000, num_samples=20_000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), X, y, subsample_size=n)
    return np.asarray(mcmc.get_samples()["theta"], np.float64)


@pytest.fixture(scope="module")
def exact(linear_data):
    X, y = linear_data
    mean, cov = linear_posterior(X, y)
    return mean, np.sqrt(np.diag(cov))


class _LazyDraws(dict):
    """Each case's draws, run the first time a test asks for them (a test of two cases does not
    pay for all six)."""

    def __init__(self, data):
        super().__init__()
        self.data = data

    def __missing__(self, name):
        make, n, _ = CASES[name]
        self[name] = _run(make, n, *self.data)
        return self[name]


@pytest.fixture(scope="module")
def draws(linear_data):
    return _LazyDraws(linear_data)


@pytest.mark.parametrize("name", list(CASES))
def test_recovers_gaussian_posterior(name, draws, exact):
    mean, sd = exact
    s = draws[name]
    lo, hi = CASES[name][2]
    np.testing.assert_array_less(np.abs(s.mean(0) - mean) / sd, 0.25)
    ratio = s.std(0) / sd
    assert np.all((ratio > lo) & (ratio < hi)), ratio


def test_correction_removes_variance_inflation(draws, exact):
    """Vanilla SGLD inflates the sd by the gradient noise (≈ 6% predicted); c-SGLD does not."""
    _, sd = exact
    vanilla = np.mean(draws["sgld-vanilla"].std(0) / sd)
    corrected = np.mean(draws["sgld-corrected"].std(0) / sd)
    assert vanilla > 1.03
    assert abs(corrected - 1) < vanilla - 1


def test_sampling_without_replacement(linear_data, exact):
    X, y = linear_data
    mean, sd = exact
    s = _run(CASES["sgld-corrected"][0], 200, X, y, seed=3, replace=False)
    np.testing.assert_array_less(np.abs(s.mean(0) - mean) / sd, 0.25)
    ratio = s.std(0) / sd
    assert np.all((ratio > 0.9) & (ratio < 1.1)), ratio
