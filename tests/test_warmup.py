"""The warmup defaults: mode search, Laplace preconditioner, control variates, default steps.

What the issue "Warmup" asks of ``nsg.SGLD(model)`` / ``nsg.SGBD(model)`` with no step size:
the right answer against NUTS and closed forms, honest warnings when a run is not
trustworthy, and frozen diverged chains that keep a sane state.  The acceptance runs at
N = 10⁵ against NUTS are behind ``-m slow``; the default suite checks the same things at
N = 1,000–20,000.
"""

import warnings

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import CLASSIC, linear_model, linear_posterior
from numpyro.infer import MCMC, init_to_uniform, init_to_value

import numpyro_sg as nsg
from numpyro_sg import datasets as ds
from numpyro_sg.infer.minibatch import Minibatcher, discover_plates
from numpyro_sg.infer.preconditioner import (Moments, Preconditioner, adapted_preconditioner, init_moments,
                                             update_moments)

DEFAULTS = {"SGLD": lambda model, **kw: nsg.SGLD(model, **kw),
            "SGBD": lambda model, **kw: nsg.SGBD(model, **kw)}


def _run(kernel, *args, num_warmup=1000, num_samples=2000, num_chains=4, seed=0, **kwargs):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), *args, **kwargs)
    return mcmc


# -- the mode search ---------------------------------------------------------------------------
def test_mode_and_laplace_are_exact_on_a_gaussian_posterior(linear_data):
    """Gaussian posterior: the mode is the posterior mean and the Laplace covariance the
    posterior covariance, exactly (float32 rounding: 1e-3 sd); also with chunked full-data
    passes (chunk 300 of N = 1,000, padding masked) and a Hessian from a 400-row subsample
    (≈ √(1/400) = 5% sampling error in the curvature; tolerance 15%)."""
    X, y = linear_data
    mean, cov = linear_posterior(X, y)
    sd = np.sqrt(np.diag(cov))
    kernel = nsg.SGLD(linear_model)
    _run(kernel, X, y, num_warmup=1, num_samples=1, num_chains=1)
    fit = kernel.mode_fit
    assert fit.converged
    np.testing.assert_array_less(np.abs(np.asarray(fit.mode) - mean) / sd, 1e-3)
    np.testing.assert_allclose(fit.scales, sd, rtol=1e-3)
    L = np.asarray(fit.preconditioner.chol, np.float64)
    np.testing.assert_allclose(L @ L.T, cov, rtol=1e-3, atol=1e-3 * sd.max() ** 2)
    chunked = nsg.SGLD(linear_model, warmup_options=dict(chunk_size=300, hessian_rows=400))
    _run(chunked, X, y, num_warmup=1, num_samples=1, num_chains=1)
    np.testing.assert_array_less(np.abs(np.asarray(chunked.mode_fit.mode) - mean) / sd, 1e-3)
    np.testing.assert_allclose(chunked.mode_fit.scales, sd, rtol=0.15)


def test_chunked_full_pass_is_the_full_data_density(logistic_data):
    X, y = logistic_data  # N = 500
    from conftest import logistic_model

    mb = Minibatcher(logistic_model, discover_plates(logistic_model, (X, y), {}))
    x = jax.numpy.array([0.3, -0.2, 0.1])
    exact_v, exact_g = jax.value_and_grad(
        lambda t: mb.log_density_fn((X, y))({"theta": t}, mb.full_indices()))(x)
    for chunk in (500, 128, 77):
        v, g = mb.full_value_and_grad_fn(lambda t: {"theta": t}, (X, y), {}, chunk)(x)
        np.testing.assert_allclose(v, exact_v, rtol=1e-5)
        np.testing.assert_allclose(g, exact_g, rtol=1e-4, atol=1e-4)


# -- defaults on a closed-form posterior -------------------------------------------------------
@pytest.mark.parametrize("name", list(DEFAULTS))
def test_defaults_recover_a_gaussian_posterior(name, linear_data):
    """No step size, 4 chains × (1,000 + 2,000): ESS ≈ 1,500–2,500, so the Monte Carlo error
    of a mean is ≈ 0.025 sd and of an sd ≈ 1.5–2%.  Tolerances: mean within 0.15 sd (6 se), sd
    ratio within [0.93, 1.07] (≈ 3.5 se).  Measured (seeds 0/1): mean errors ≤ 0.08 sd, sd
    ratios 0.98–1.03.  Without the discretisation correction SGLD's sd is ≈ 10% too large at
    ε = 0.7 and SGBD's ≈ 7% at σ = 0.8 (checked: both then fail)."""
    X, y = linear_data
    mean, cov = linear_posterior(X, y)
    sd = np.sqrt(np.diag(cov))
    s = np.asarray(_run(DEFAULTS[name](linear_model), X, y).get_samples()["theta"], np.float64)
    np.testing.assert_array_less(np.abs(s.mean(0) - mean) / sd, 0.15)
    ratio = s.std(0) / sd
    assert np.all((ratio > 0.93) & (ratio < 1.07)), ratio


# -- against NUTS on models the package does not ship ------------------------------------------
def poisson_regression(X, y=None, n=500):
    N, d = X.shape
    b0 = numpyro.sample("intercept", dist.Normal(0, 5))
    beta = numpyro.sample("beta", dist.Normal(0, 1).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Poisson(jax.numpy.exp(b0 + Xb @ beta)), obs=yb)


def linear_unknown_sigma(X, y=None, n=500):
    N, d = X.shape
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([d]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))  # a constrained global site
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(Xb @ beta, sigma), obs=yb)


def _simulate(kind, N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, 4)).astype(np.float32)
    if kind == "poisson":
        X = 0.3 * X
        y = rng.poisson(np.exp(1.0 + X @ np.array([0.5, -0.4, 0.3, 0.2]))).astype(np.float32)
    else:
        y = (X @ np.array([1.0, -0.5, 0.25, 2.0]) + 2.0 * rng.normal(size=N)).astype(np.float32)
    return X, y


MODELS = {"poisson": poisson_regression, "linear_sigma": linear_unknown_sigma}


@pytest.fixture(scope="module")
def nuts_refs(tmp_path_factory):
    cache = tmp_path_factory.mktemp("nuts")
    out = {}
    for kind, model in MODELS.items():
        X, y = _simulate(kind, 20_000)
        out[kind] = (X, y, nsg.nuts_reference(model, X, y, num_warmup=500, num_samples=1000,
                                              num_chains=2, cache_dir=cache, progress_bar=False))
    return out


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("name", list(DEFAULTS))
def test_defaults_match_nuts(kind, name, nuts_refs):
    """N = 20,000 against NUTS (2 × 1,000 draws, ESS ≈ 1,500): ξ(σ̂) ≤ 0.08 (NUTS's own sd
    error ≈ 2%, ours ≈ 2% per coordinate: ξ ≈ 0.03 expected; 0.08 leaves room for the
    constrained σ), max |mean error| ≤ 0.2 NUTS sd (≈ 5 se), R̂ ≤ 1.01, no warning.  Measured
    at N = 10⁵ (docs/warmup.md): ξ ≤ 0.03, mean errors ≤ 0.07 sd."""
    X, y, ref = nuts_refs[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.ConvergenceWarning)
        warnings.simplefilter("error", nsg.DivergenceWarning)
        mcmc = _run(DEFAULTS[name](MODELS[kind]), X, y)
        nsg.check_convergence(mcmc)
    idata = nsg.to_inference_data(mcmc, ksd=False)
    table = nsg.compare_to_reference(idata, ref)
    assert table.attrs["xi_sd"] <= 0.08, table
    assert table["mean_err"].abs().max() <= 0.2, table
    table = nsg.check_convergence(idata, warn=False)
    assert table["r_hat"].max() <= 1.01, table


# -- honest warnings -----------------------------------------------------------------------------
def test_far_start_with_a_tiny_fixed_step_warns(linear_data):
    """A chain started 100 posterior sds away with a step far too small never arrives: the
    end-of-run check must say so (R̂ and drift), naming the site."""
    X, y = linear_data
    far = init_to_value(values={"theta": np.full(3, 5.0, np.float32)})
    kernel = nsg.SGLD(linear_model, 1e-3, init_strategy=far)
    mcmc = _run(kernel, X, y, num_warmup=100, num_samples=400)
    with pytest.warns(nsg.ConvergenceWarning, match=r"(?s)SGLD.*split-R̂ .*'theta'.*still drifting"):
        nsg.check_convergence(mcmc)


def test_no_warning_for_a_good_run(linear_data):
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.ConvergenceWarning)
        table = nsg.check_convergence(_run(nsg.SGLD(linear_model), *linear_data))
    assert table["ok"].all(), table


def test_uniform_start_reaches_the_posterior_without_a_warning():
    """From NumPyro's init_to_uniform (up to 2 units from 0 on the unconstrained space, here
    hundreds of posterior sds from the posterior) the defaults reach the posterior: the chains'
    mean is within 0.15 Laplace sds of the mode (ESS ≈ 1,500: Monte Carlo error ≈ 0.026 sd,
    and the posterior mean differs from the mode by O(N^(−1/2)) sd; measured ≤ 0.05)
    and the end-of-run check stays silent.  A chain that did not arrive fails both (checked:
    with step_size=1e-5 the check warns and the centre is > 1 sd off); the check's warning on
    such a run is tested in test_far_start_with_a_tiny_fixed_step_warns."""
    X, y = _simulate("poisson", 20_000, seed=3)
    kernel = nsg.SGLD(poisson_regression, init_strategy=init_to_uniform)
    mcmc = _run(kernel, X, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nsg.check_convergence(mcmc)
    warned = [str(w.message) for w in caught if issubclass(w.category, nsg.ConvergenceWarning)]
    s = mcmc.get_samples()
    mode = kernel.mode_fit
    centre = np.concatenate([np.asarray(s["beta"]).mean(0), [np.asarray(s["intercept"]).mean()]])
    offset = np.abs(centre - np.asarray(mode.mode)) / mode.scales
    assert not warned, warned
    assert np.all(offset < 0.15), offset


def funnel_logistic(X, y=None, n=100):
    """The scale τ and the coefficients β are identified only through τ·β: a curved
    posterior far from its Laplace approximation."""
    N, d = X.shape
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    beta = numpyro.sample("beta", dist.Normal(0, 1).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ (tau * beta)), obs=yb)


def test_posterior_far_from_laplace_is_reported():
    """SGBD's increments are bounded, so on this posterior it neither diverges nor mixes badly
    enough for R̂ > 1.05 (measured R̂ 1.02–1.04, ξ(σ̂) 0.56–0.83 against NUTS): the report of
    the draws' distance from the Laplace fit is what catches it."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 8)).astype(np.float32)
    y = (rng.random(1000) < 1 / (1 + np.exp(-X @ (0.3 * rng.normal(size=8))))).astype(np.float32)
    mcmc = _run(nsg.SGBD(funnel_logistic), X, y, n=333, seed=1)
    with pytest.warns(nsg.ConvergenceWarning, match="far from the Laplace approximation"):
        nsg.check_convergence(mcmc)


# -- the preconditioner's adaptation -------------------------------------------------------------
def test_adapted_preconditioner_estimates_the_covariance():
    """Moments of 20,000 draws of N(0, C): the adapted L·Lᵀ is C up to sampling error (≈ 1–2%
    per entry; tolerance 5% relative to the largest variance) and the shrinkage towards the
    current M (5/(n+5)) is negligible."""
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 3))
    C = A @ A.T + np.eye(3)
    x = rng.multivariate_normal(np.zeros(3), C, size=20_000).astype(np.float32)
    m = init_moments(3, dense=True)
    m = jax.lax.scan(lambda mm, xi: (update_moments(mm, xi), None), m, x)[0]
    P = adapted_preconditioner(Preconditioner(chol=np.eye(3, dtype=np.float32)), m)
    L = np.asarray(P.chol, np.float64)
    np.testing.assert_allclose(L @ L.T, C, atol=0.05 * C.max())
    Pd = adapted_preconditioner(Preconditioner(scale=np.ones(3, np.float32)),
                                Moments(m.count, m.mean, np.diag(m.m2)))
    np.testing.assert_allclose(np.asarray(Pd.scale) ** 2, np.diag(C), rtol=0.05)


def test_adapt_preconditioner_runs_and_is_accurate(linear_data):
    X, y = linear_data
    mean, cov = linear_posterior(X, y)
    sd = np.sqrt(np.diag(cov))
    mcmc = _run(nsg.SGLD(linear_model, preconditioner="adapt"), X, y)
    s = np.asarray(mcmc.get_samples()["theta"], np.float64)
    np.testing.assert_array_less(np.abs(s.mean(0) - mean) / sd, 0.15)
    ratio = s.std(0) / sd
    assert np.all((ratio > 0.93) & (ratio < 1.07)), ratio


# -- arguments -------------------------------------------------------------------------------------
def test_warmup_argument_errors():
    with pytest.raises(ValueError, match="give step_size"):
        nsg.SGLD(linear_model, preconditioner=None)
    with pytest.raises(ValueError, match="unknown warmup option"):
        nsg.SGBD(linear_model, warmup_options={"newton": 3})
    with pytest.raises(ValueError, match="preconditioner must be one of"):
        nsg.SGLD(linear_model, preconditioner="fisher")
    with pytest.raises(ValueError, match="gradient must be one of"):
        nsg.SGBD(linear_model, gradient="svrg")


def test_classic_settings_skip_the_mode_search(linear_data):
    kernel = nsg.SGLD(linear_model, 1e-4, **CLASSIC)
    _run(kernel, *linear_data, num_warmup=5, num_samples=5, num_chains=1)
    assert kernel.mode_fit is None


# -- the acceptance runs (slow) ----------------------------------------------------------
def logistic_regression(X, y=None, n=1000):
    N, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0, 10).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=yb)


def negative_binomial_regression(X, y=None, n=1000):
    N, d = X.shape
    b0 = numpyro.sample("intercept", dist.Normal(0, 5))
    beta = numpyro.sample("beta", dist.Normal(0, 1).expand([d]).to_event(1))
    phi = numpyro.sample("phi", dist.Exponential(0.1))  # constrained global site
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.NegativeBinomial2(jax.numpy.exp(b0 + Xb @ beta), phi), obs=yb)


def _simulate_large(kind, N, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "logistic":
        X = rng.normal(size=(N, 20)).astype(np.float32)
        y = (rng.random(N) < 1 / (1 + np.exp(-X @ (0.5 * rng.normal(size=20))))).astype(np.float32)
    elif kind == "negbin":
        X = (0.3 * rng.normal(size=(N, 6))).astype(np.float32)
        mu = np.exp(1.5 + X @ (0.5 * rng.normal(size=6)))
        y = rng.negative_binomial(3.0, 3.0 / (3.0 + mu)).astype(np.float32)
    else:
        X, y = _simulate(kind, N, seed)
    return X, y


LARGE = {"logistic": logistic_regression, "poisson": poisson_regression,
         "linear_sigma": linear_unknown_sigma, "negbin": negative_binomial_regression}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(LARGE))
def test_acceptance_defaults_at_n_100000(kind, tmp_path_factory):
    """The issue's bar at N = 10⁵, 4 chains × (1,000 + 2,000), against NUTS 4 × 1,000:
    ξ(σ̂) ≤ 0.05, max |mean error| ≤ 0.2 NUTS sd, R̂ ≤ 1.01, for SGLD and SGBD with defaults.
    (NUTS's own sd error with ESS ≈ 3,000 is ≈ 1.3% per coordinate; measured ξ ≤ 0.03.)
    The negative binomial's full-data NUTS takes about ten minutes on two cores, so SGHMC and
    SGNHT share its reference here (tests/test_sghmc.py checks them on the other three)."""
    X, y = _simulate_large(kind, 100_000)
    ref = nsg.nuts_reference(LARGE[kind], X, y, num_warmup=1000, num_samples=1000, num_chains=4,
                             cache_dir=tmp_path_factory.mktemp("nuts"), progress_bar=False)
    kernels = dict(DEFAULTS, **({"SGHMC": nsg.SGHMC, "SGNHT": nsg.SGNHT} if kind == "negbin" else {}))
    for name, make in kernels.items():
        idata = nsg.to_inference_data(_run(make(LARGE[kind]), X, y, seed=1), ksd=False)
        table = nsg.compare_to_reference(idata, ref)
        rhat = nsg.check_convergence(idata, warn=False)["r_hat"].max()
        print(kind, name, table.attrs["xi_sd"], table["mean_err"].abs().max(), rhat)
        assert table.attrs["xi_sd"] <= 0.05, (name, table)
        assert table["mean_err"].abs().max() <= 0.2, (name, table)
        assert rhat <= 1.01, (name, rhat)


def test_bulk_ess_and_a_shared_mode_fit():
    """bulk_ess: ≈ T for iid draws, ≈ T(1−ρ)/(1+ρ) for AR(ρ) (within 30%), 0 for a frozen
    chain; use_mode_fit: a kernel given another's ModeFit does not search again."""
    from numpyro_sg.diagnostics.convergence import bulk_ess
    from numpyro_sg.infer.warmup import fit_model_mode

    rng = np.random.default_rng(0)
    iid = rng.normal(size=(2, 2000, 5))
    assert bulk_ess(iid, quantile=0.5) == pytest.approx(4000, rel=0.3)
    ar = np.zeros((2, 4000, 5))
    for t in range(1, 4000):
        ar[:, t] = 0.9 * ar[:, t - 1] + np.sqrt(1 - 0.81) * rng.normal(size=(2, 5))
    assert bulk_ess(ar, quantile=0.5) == pytest.approx(8000 * 0.1 / 1.9, rel=0.3)
    assert bulk_ess(np.ones((1, 100, 3))) == 0.0
    X, y, _ = ds.simulate_logistic_regression(num_data=2000, dim=3, seed=0)
    fit, _, _ = fit_model_mode(ds.logistic_regression_model, (X, y))
    kernel = nsg.SGLD(ds.logistic_regression_model)
    kernel.use_mode_fit(fit)
    kernel.init(jax.random.PRNGKey(0), 10, None, (X, y), {})
    assert kernel.mode_fit is fit
    with pytest.raises(TypeError, match="ModeFit"):
        kernel.use_mode_fit({"mode": 0})


def _diabetes_network(X, y=None, subsample_size=50):
    """A 10–32–1 tanh regression network with a HalfNormal noise sd (385 parameters)."""
    N, D = X.shape
    W1 = numpyro.sample("W1", dist.Normal(0, 1).expand([D, 32]).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(0, 1).expand([32]).to_event(1))
    W2 = numpyro.sample("W2", dist.Normal(0, 1 / np.sqrt(32)).expand([32]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0, 1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", N, subsample_size=min(subsample_size, N)):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(jax.numpy.tanh(Xb @ W1 + b1) @ W2 + b2, sigma), obs=yb)


@pytest.mark.slow
def test_an_interpolating_mode_is_reported_and_the_variational_centre_recovers_the_noise_sd():
    """An over-parameterised regression network (scikit-learn's diabetes data, 350 rows): the
    mode search's highest mode interpolates (σ ≈ 0.07, where NUTS gives 0.65) and the warmup's
    multimodality warning names the remedy; applying it (a variational centre) gives σ within
    15 % of NUTS's posterior mean (measured 0.679 against 0.646; the defaults' chains stay
    at 0.066, so the assertion fails without the remedy)."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X, y = (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()
    rows = np.random.default_rng(0).permutation(len(y))[:350]
    X, y = jax.numpy.asarray(X[rows], np.float32), jax.numpy.asarray(y[rows], np.float32)
    with pytest.warns(nsg.ConvergenceWarning, match=r"warmup_options=\{'centre': 'variational'\}"):
        _run(nsg.SGLD(_diabetes_network), X, y, num_warmup=10, num_samples=10, num_chains=1)
    nuts = MCMC(numpyro.infer.NUTS(_diabetes_network), num_warmup=300, num_samples=300, progress_bar=False)
    nuts.run(jax.random.PRNGKey(1), X, y, subsample_size=350)
    reference = float(np.mean(nuts.get_samples()["sigma"]))
    kernel = nsg.SGLD(_diabetes_network, warmup_options={"centre": "variational"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # R̂ across the network's modes
        sigma = _run(kernel, X, y).get_samples()["sigma"]
    assert abs(float(np.mean(sigma)) - reference) < 0.15 * reference
