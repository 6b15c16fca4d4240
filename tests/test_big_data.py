"""Big-N conjugate regression at a 1% mini-batch (seed 0 in the default suite; more seeds and
longer runs with tighter tolerances behind ``pytest -m slow``).

Gaussian linear regression, known noise sd 1, N = 100,000, d = 5, prior N(0, 2²): the
posterior is Gaussian in closed form with sd ≈ 1/√N ≈ 0.0032 per coordinate.  Mini-batch
n = 1,000, so the gradient-noise sd is τ̂ ≈ N/√n ≈ 3,200.

* c-SGLD with ε = 2e-7 (ε·τ̂²/4 ≈ 0.5: half the Langevin variance comes from the gradient
  noise, the corrected variant injects only the other half);
* corrected SGBD with ``adapt_step_size=True`` (σ_j = 1.702/(1.233·τ̂_j) ≈ 0.13 posterior sd).

Tolerances: relaxation time ≈ 2·var/ε ≈ 100 iterations for c-SGLD, ≈ (sd/σ)² ≈ 60 for SGBD.
* default (60,000 draws, ESS ≳ 300): mean within 0.2 posterior sd and sd within ±12% (standard
  errors ≤ 0.06 sd and ≤ 4%: 3–3.5 se).  Measured, seed 0: mean errors ≤ 0.10 sd, sd ratios
  0.96–1.04.
* slow (240,000 draws, ESS ≳ 1,200, seeds 1–4): mean within 0.12 sd (standard error ≤ 0.03 sd);
  sd within ±6% for c-SGLD and within [−4%, +10%] for c-SGBD (standard error ≤ 2%).  Measured
  over seeds 1–4: c-SGLD sd ratios 0.966–1.039 (no visible bias), mean errors ≤ 0.065 sd;
  c-SGBD sd ratios 1.010–1.072, mean 1.035: adaptive corrected SGBD over-disperses by about
  3.5% here (it has no accept/reject step, and the corrected sign probability is unbiased only
  to within 0.019, Mauri & Zanella 2024, Prop. 4), mean errors ≤ 0.068 sd.  Vanilla SGLD at this ε
  inflates the sd by √1.5 − 1 ≈ 22% and fails.
"""

import jax
import numpy as np
import pytest
from conftest import linear_model, linear_posterior
from numpyro.infer import MCMC, init_to_value

import numpyro_sg as nsg

@pytest.fixture(scope="module")
def big_linear():
    rng = np.random.default_rng(7)
    N, d = 100_000, 5
    X = rng.normal(size=(N, d)).astype(np.float32)
    y = (X @ rng.normal(size=d) + rng.normal(size=N)).astype(np.float32)
    mean, cov = linear_posterior(X, y)
    return X, y, mean, np.sqrt(np.diag(cov))


KERNELS = {
    "c-SGLD": lambda init: nsg.SGLD(linear_model, 2e-7, variant="corrected", init_strategy=init,
                                      preconditioner=None, gradient="plain"),
    "c-SGBD adaptive": lambda init: nsg.SGBD(
        linear_model, 1e-3, variant="corrected", adapt_step_size="always", init_strategy=init,
        preconditioner=None, gradient="plain",
    ),
}


def _check(big_linear, name, seed, num_samples, mean_tol, sd_range):
    X, y, mean, sd = big_linear
    init = init_to_value(values={"theta": np.zeros(5, np.float32)})
    mcmc = MCMC(KERNELS[name](init), num_warmup=5000, num_samples=num_samples, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), X, y, subsample_size=1000)
    s = np.asarray(mcmc.get_samples()["theta"], np.float64)
    mean_err = (s.mean(0) - mean) / sd
    sd_ratio = s.std(0) / sd
    print(name, seed, "mean err / sd", np.round(mean_err, 3), "sd ratio", np.round(sd_ratio, 3))
    np.testing.assert_array_less(np.abs(mean_err), mean_tol)
    assert np.all((sd_ratio > sd_range[0]) & (sd_ratio < sd_range[1])), sd_ratio


@pytest.mark.parametrize("name", list(KERNELS))
def test_big_n_one_percent_batch(big_linear, name):
    _check(big_linear, name, seed=0, num_samples=60_000, mean_tol=0.2, sd_range=(0.88, 1.12))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(KERNELS))
def test_big_n_one_percent_batch_long(big_linear, name, seed):
    sd_range = (0.94, 1.06) if name == "c-SGLD" else (0.96, 1.10)
    _check(big_linear, name, seed=seed, num_samples=240_000, mean_tol=0.12, sd_range=sd_range)
