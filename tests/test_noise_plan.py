"""The defaults' mini-batch size from the gradient noise the warmup measures (kernels.noise_plan)."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.kernels.momentum import sghmc_inflation
from numpyro_sg.kernels.noise_plan import plan_noise
from numpyro_sg.kernels.sgld import sgld_inflation


def poisson_model(X, y, subsample_size=100):
    N, d = X.shape
    b = numpyro.sample("b", dist.Normal(0, 2).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=subsample_size):
        xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Poisson(jnp.exp(xb @ b)), obs=yb)


@pytest.fixture(scope="module")
def long_tailed_poisson():
    """A Poisson regression on 50,000 rows whose three covariates are standardised log-normals
    (long right tails: the largest are 19–32 sds out, as lab values are)."""
    rng = np.random.default_rng(0)
    N = 50_000
    Z = rng.lognormal(0.0, 0.8, (N, 3))
    X = np.column_stack([np.ones(N), (Z - Z.mean(0)) / Z.std(0)]).astype(np.float32)
    y = rng.poisson(np.exp(X @ np.array([-0.5, 0.05, 0.05, 0.05]))).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


def _sds(kernel, data, key=0):
    mcmc = MCMC(kernel, num_warmup=500, num_samples=1000, num_chains=4, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(key), *data)
    return np.asarray(mcmc.get_samples()["b"]).std(0) / kernel.mode_fit.scales


def test_the_defaults_choose_a_mini_batch_whose_noise_keeps_the_sds_right(long_tailed_poisson):
    """With the plate's 100 rows the control-variate noise of these rows makes SGLD's fixed
    default step (ε = 0.7) 4–11 % too wide in the three long-tailed coordinates (14–25 % before
    the Langevin gradient was tamed, which clips the largest rows' kicks); the warmup measures the
    noise of one row and of the largest, and the defaults raise n until they add at most 5 % to
    the variance.  The sds then match the Laplace sds (the posterior of a Poisson GLM on 50,000
    rows is Gaussian to well within this tolerance) within 6 %: 4 chains × 1,000 draws estimate
    an sd to about 3 % (seed fixed; measured 1.3–3.2 %).  The fixed default's run shows that the
    test can fail: its worst coordinate is 10.7 % wide, outside."""
    kernel = nsg.SGLD(poisson_model)
    ratios = _sds(kernel, long_tailed_poisson)
    plan = kernel.noise_plan
    assert plan.requested == 100 and 1_000 < plan.subsample_size < 50_000 and plan.step_scale == 1.0, plan
    assert plan.inflation <= 0.05 + 1e-9
    assert kernel.minibatcher.plates[0].subsample_size == plan.subsample_size
    assert np.all(np.abs(ratios - 1) < 0.06), ratios
    fixed = _sds(nsg.SGLD(poisson_model, warmup_options={"max_noise_inflation": None}), long_tailed_poisson)
    assert np.max(fixed) > 1.08, fixed


def test_a_users_step_and_size_are_kept_with_a_warning_whose_remedy_meets_the_tolerance(long_tailed_poisson):
    """An explicit ``subsample_size`` and ``step_size`` are the user's: the kernel keeps them, and
    when the measured noise adds more than the tolerance it says so before sampling, naming the
    mini-batch size that meets it; that size, applied, does (and warns no more)."""
    def run(**kw):
        kernel = nsg.SGLD(poisson_model, **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            MCMC(kernel, num_warmup=5, num_samples=5, progress_bar=False).run(jax.random.PRNGKey(0),
                                                                             *long_tailed_poisson)
        said = [str(w.message) for w in caught if "gradient noise" in str(w.message)]
        return kernel.noise_plan, said

    plan, said = run(step_size=0.7, subsample_size=100)
    assert plan.subsample_size == 100 and plan.inflation > 0.05 and len(said) == 1, said
    size = int(re.search(r"subsample_size=(\d+) keeps it below", said[0]).group(1))
    plan, said = run(step_size=0.7, subsample_size=size)
    assert plan.inflation <= 0.05 and not said, (plan, said)
    plan, said = run(subsample_size=100)   # the default step shrinks instead of the size growing
    assert plan.subsample_size == 100 and plan.step_scale < 1 and plan.inflation <= 0.05 + 1e-9 and not said


@pytest.mark.parametrize("friction", [None, 0.5, 1.0])
def test_the_predicted_inflation_is_the_stationary_variance_of_a_noisy_gaussian_chain(friction):
    """On a standard Gaussian target (the Laplace frame at its best) with Gaussian gradient noise
    of variance c, SGLD's (friction None) and SGHMC's linear recursions have stationary variance
    1 + the predicted inflation: checked by simulating 4,000 chains for 400 steps (the
    variance's Monte Carlo error is about 2 %; tolerance 5 %)."""
    eps, c, chains = 0.7, 2.0, 4_000
    rng = np.random.default_rng(1)
    u, v = np.zeros(chains), np.zeros(chains)
    for _ in range(400):
        g = -u + np.sqrt(c) * rng.normal(size=chains)
        if friction is None:
            u = u + 0.5 * eps * g + np.sqrt(eps * (1 - eps / 4)) * rng.normal(size=chains)
        else:
            eta = eps / 2
            s2 = 2 * friction * eta * (1 - eta / (4 - 2 * friction))
            v = (1 - friction) * v + eta * g + np.sqrt(s2) * rng.normal(size=chains)
            u = u + v
    predicted = sgld_inflation(eps, c) if friction is None else sghmc_inflation(eps, c, friction)
    assert abs(np.var(u) / (1 + predicted) - 1) < 0.05, (np.var(u), predicted)


def test_plan_noise_raises_the_size_then_takes_the_whole_data_then_shrinks_the_step():
    inflation = lambda eps, c: sgld_inflation(eps, c)
    plan = plan_noise(inflation, 0.7, [10.0, 200.0], 500, 10**6, 0.05, adjust_size=True, adjust_step=True)
    assert plan.subsample_size == 849 and plan.replace
    exact = plan_noise(inflation, 0.7, [1e6], 500, 10_000, 0.05, adjust_size=True, adjust_step=True, exact=True)
    assert (exact.subsample_size, exact.replace, exact.inflation) == (10_000, False, 0.0)
    smaller = plan_noise(inflation, 0.7, [1e6], 500, 10_000, 0.05, adjust_size=False, adjust_step=True)
    assert smaller.subsample_size == 500 and smaller.step_scale < 1 and abs(smaller.inflation - 0.05) < 1e-6
    quiet = plan_noise(inflation, 0.7, [1.0], 500, 10_000, 0.05, adjust_size=True, adjust_step=True)
    assert quiet.subsample_size == 500 and quiet.step_scale == 1.0 and not quiet.changed


def test_one_extreme_row_counts_as_if_drawn_at_every_step():
    """Where one row's kick t/n outweighs the rows' variance r/n, the plan sizes n so that (t/n)²
    meets the tolerance: SGLD at ε = 0.7 allows c ≤ 0.05·3.3/0.7, so n ≥ t/√c."""
    inflation = lambda eps, c: sgld_inflation(eps, c)
    averaged = plan_noise(inflation, 0.7, [10.0], 500, 10**6, 0.05, adjust_size=True, adjust_step=True)
    tail = plan_noise(inflation, 0.7, [10.0], 500, 10**6, 0.05, adjust_size=True, adjust_step=True, row_kick=[2000.0])
    need = int(np.ceil(2000.0 / np.sqrt(0.05 * 3.3 / 0.7)))
    assert averaged.subsample_size == 500 and abs(tail.subsample_size - need) <= 1, (tail, need)
    assert tail.row_kick == 2000.0 and tail.inflation <= 0.05
