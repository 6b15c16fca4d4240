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
from numpyro_sg.infer.noise import drift_ratio
from numpyro_sg.kernels.noise_plan import curvature_of, plan_noise
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
        run.kernel = kernel
        return kernel.noise_plan, said

    plan, said = run(step_size=0.7, subsample_size=100)
    assert plan.subsample_size == 100 and plan.inflation > 0.05 and len(said) == 1, said
    size = int(re.search(r"subsample_size=(\d+) keeps it below", said[0]).group(1))
    plan, said = run(step_size=0.7, subsample_size=size)
    assert plan.inflation <= 0.05 and not said, (plan, said)
    plan, said = run(subsample_size=100)   # the default step shrinks instead of the size growing
    assert plan.subsample_size == 100 and plan.step_scale < 1 and plan.inflation <= 0.05 + 1e-9 and not said
    # chains that then move slowly are told to run longer, not to take the larger step
    remedy = run.kernel.slow_chain_remedy()
    assert "shrunk to" in remedy and "a larger step_size would widen the draws" in remedy, remedy


@pytest.mark.parametrize("curvature", [1.0, 2.5])
@pytest.mark.parametrize("friction", [None, 0.5, 1.0])
def test_the_predicted_inflation_is_the_stationary_variance_of_a_noisy_gaussian_chain(friction, curvature):
    """On a Gaussian target of curvature λ in the Laplace frame (λ = 1: the frame at its best;
    λ = 2.5: a posterior steeper than the Laplace approximation) with Gaussian gradient noise of
    variance c, SGLD's (friction None) and SGHMC's linear recursions have stationary variance
    (1 + the predicted inflation)/λ: checked by simulating 4,000 chains for 400 steps (the
    variance's Monte Carlo error is about 2 %; tolerance 5 %)."""
    eps, c, chains = 0.7, 2.0, 4_000
    rng = np.random.default_rng(1)
    u, v = np.zeros(chains), np.zeros(chains)
    for _ in range(400):
        g = -curvature * u + np.sqrt(c) * rng.normal(size=chains)
        if friction is None:
            u = u + 0.5 * eps * g + np.sqrt(eps * (1 - eps / 4)) * rng.normal(size=chains)
        else:
            eta = eps / 2
            s2 = 2 * friction * eta * (1 - eta / (4 - 2 * friction))
            v = (1 - friction) * v + eta * g + np.sqrt(s2) * rng.normal(size=chains)
            u = u + v
    predicted = (sgld_inflation(eps, c, curvature) if friction is None
                 else sghmc_inflation(eps, c, friction, curvature))
    assert abs(curvature * np.var(u) / (1 + predicted) - 1) < 0.05, (np.var(u), predicted)


def test_plan_noise_raises_the_size_then_takes_the_whole_data_then_shrinks_the_step():
    inflation = sgld_inflation
    plan = plan_noise(inflation, 0.7, [10.0, 200.0], 500, 10**6, 0.05, adjust_size=True, adjust_step=True)
    assert plan.subsample_size == 849 and plan.replace
    exact = plan_noise(inflation, 0.7, [1e6], 500, 10_000, 0.05, adjust_size=True, adjust_step=True, exact=True)
    assert (exact.subsample_size, exact.replace, exact.inflation) == (10_000, False, 0.0)
    smaller = plan_noise(inflation, 0.7, [1e6], 500, 10_000, 0.05, adjust_size=False, adjust_step=True)
    assert smaller.subsample_size == 500 and smaller.step_scale < 1 and abs(smaller.inflation - 0.05) < 1e-6
    quiet = plan_noise(inflation, 0.7, [1.0], 500, 10_000, 0.05, adjust_size=True, adjust_step=True)
    assert quiet.subsample_size == 500 and quiet.step_scale == 1.0 and not quiet.changed
    steep = plan_noise(inflation, 0.7, [1e6], 500, 10_000, 0.05, adjust_size=True, adjust_step=True, exact=True,
                       curvature=2.5)   # the exact gradient, and still a smaller step for the curvature
    assert (steep.subsample_size, steep.replace, steep.curvature) == (10_000, False, 2.5)
    assert steep.step_scale < 1 and abs(steep.inflation - 0.05) < 1e-6


def _walled(u, a=10.0, b=1.0):
    """∇ log π of a standard Gaussian with a wall: log π(u) = −u²/2 − softplus(a·(u − b)) (a
    coefficient that a few rows tens of sds out fit at the mode, in its Laplace frame)."""
    return -u - a / (1.0 + np.exp(-a * (u - b)))


def test_a_wall_a_few_sds_out_shrinks_the_default_step_to_one_that_samples_it():
    """A posterior whose log density falls steeply a sd beyond its mode: its Laplace approximation
    is N(0, 1) (curvature 1.005 at the mode), but at probes 1.5 Laplace sds out on either side the
    gradient is 7.6 times steeper (λ̂, :func:`drift_ratio`), and SGLD's default ε = 0.7 overshoots
    the wall: its sd is 27 % too large, with the exact gradient.  The plan's step for that
    curvature (ε = 0.030) gives the sd within 3 % (measured 0.3 %; the target's sd by quadrature;
    4,000 chains × 3,000 steps estimate it to about 1 %, the plan allows 2.5 %); without the
    curvature (λ = 1) the plan keeps ε = 0.7, so the test fails without it."""
    probes = np.array([[1.5], [-1.5]])
    ratio = drift_ratio(_walled(probes) - _walled(np.zeros((1, 1))), probes, np.eye(1))
    plan = plan_noise(sgld_inflation, 0.7, [0.0], 10_000, 10_000, 0.05, adjust_size=True, adjust_step=True,
                      replace=False, curvature=curvature_of(ratio))
    grid = np.linspace(-8.0, 4.0, 24_001)
    density = np.exp(-grid**2 / 2 - np.logaddexp(0.0, 10.0 * (grid - 1.0)))
    mean = np.sum(grid * density) / np.sum(density)
    true_sd = np.sqrt(np.sum((grid - mean) ** 2 * density) / np.sum(density))

    def sgld_sd(eps, steps=3_000, chains=4_000):
        rng, u = np.random.default_rng(1), np.zeros(chains)
        for _ in range(steps):
            u = u + 0.5 * eps * _walled(u) + np.sqrt(eps * (1 - eps / 4)) * rng.normal(size=chains)
        return np.std(u)

    eps = 0.7 * plan.step_scale
    assert ratio > 3 and eps < 0.2, (ratio, plan)
    assert abs(sgld_sd(eps) / true_sd - 1) < 0.03, (sgld_sd(eps), true_sd)
    assert sgld_sd(0.7) / true_sd > 1.1


def test_one_extreme_row_counts_as_if_drawn_at_every_step():
    """Where one row's kick t/n outweighs the rows' variance r/n, the plan sizes n so that (t/n)²
    meets the tolerance: SGLD at ε = 0.7 allows c ≤ 0.05·3.3/0.7, so n ≥ t/√c."""
    inflation = sgld_inflation
    averaged = plan_noise(inflation, 0.7, [10.0], 500, 10**6, 0.05, adjust_size=True, adjust_step=True)
    tail = plan_noise(inflation, 0.7, [10.0], 500, 10**6, 0.05, adjust_size=True, adjust_step=True, row_kick=[2000.0])
    need = int(np.ceil(2000.0 / np.sqrt(0.05 * 3.3 / 0.7)))
    assert averaged.subsample_size == 500 and abs(tail.subsample_size - need) <= 1, (tail, need)
    assert tail.row_kick == 2000.0 and tail.inflation <= 0.05


def test_a_diagonal_preconditioner_shrunk_for_stiffness_changes_the_remedies_for_slow_chains():
    """Above dense_max the warmup divides the diagonal scales by √(2λ − 1); from 10 times on
    (λ ≥ 50.5) chains that do not converge hear that a longer run or a larger step will not
    reconcile them (measured on a 3,760-weight network: R̂ 3.9 at steps 0.7 and 1, and with
    SGHMC) and how to judge each chain's predictions; not with preconditioner="adapt" (whose
    scales are re-estimated from the draws) nor with a dense preconditioner."""
    from numpyro_sg.infer.preconditioner import Preconditioner
    from numpyro_sg.infer.warmup_options import ModeFit
    from numpyro_sg.kernels.report import stiff_diagonal_remedy

    def fit(stiffness, dense=False):
        P = Preconditioner(chol=jnp.eye(3)) if dense else Preconditioner(scale=jnp.ones(300))
        d = 3 if dense else 300
        return ModeFit(mode=jnp.zeros(d), grad=jnp.zeros(d), log_density=0.0, preconditioner=P, converged=True,
                       newton_steps=0, seconds=0.0, stiffness=stiffness)
    assert stiff_diagonal_remedy(fit(20.0)) is None and stiff_diagonal_remedy(fit(937.0, dense=True)) is None
    text = stiff_diagonal_remedy(fit(937.0))
    assert "shrunk 43 times" in text and "per_chain=True" in text, text
    kernel = nsg.SGLD(poisson_model)
    kernel.use_mode_fit(fit(937.0))
    assert kernel.slow_chain_remedy() == text
    adapt = nsg.SGLD(poisson_model, preconditioner="adapt")
    adapt.use_mode_fit(fit(937.0))
    assert adapt.slow_chain_remedy() is None
