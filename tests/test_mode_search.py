"""Models the warmup's mode search and the helpers must handle without failing silently:
an improper prior (``dist.ImproperUniform``, which has no prior draw) and a multimodal,
label-switching posterior (a Gaussian mixture)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints, transforms
from numpyro.infer import MCMC, NUTS, init_to_value

import numpyro_sg as nsg
from numpyro_sg.diagnostics.convergence import ConvergenceWarning
from numpyro_sg.infer.warmup import WarmupOptions, fit_model_mode


def improper_location_model(y=None, N=2000):
    """Three ordered locations with a flat (improper) prior on the ordered cone."""
    mu = numpyro.sample("mu", dist.ImproperUniform(constraints.ordered_vector, (), (3,)))
    with numpyro.plate("data", N, subsample_size=200):
        yb = numpyro.subsample(y, event_dim=1)
        numpyro.sample("y", dist.Normal(mu, 1.0).to_event(1), obs=yb)


def test_every_helper_works_on_an_improper_prior():
    y = np.random.default_rng(0).normal(size=(2000, 3)) + np.array([-1.0, 0.0, 1.0])
    mcmc = MCMC(nsg.SGLD(improper_location_model), num_warmup=200, num_samples=500,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y)
    idata = nsg.to_inference_data(mcmc, check=False)
    mean = idata.posterior["mu"].mean(("chain", "draw")).values
    np.testing.assert_allclose(mean, y.mean(0), atol=0.1)  # posterior sd ≈ 0.022
    assert np.isfinite(nsg.ksd(mcmc))
    ref = nsg.nuts_reference(improper_location_model, y, num_warmup=100, num_samples=200,
                             progress_bar=False, ksd_draws=100)
    table = nsg.compare_to_reference(idata, ref)
    assert np.all(np.isfinite(table["mean"].values))


def mixture_model(y=None, N=10_000):
    """Three-component Gaussian mixture, Dirichlet weights, ordered means, as a user writes it."""
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(3)))
    mu = numpyro.sample("mu", dist.TransformedDistribution(dist.Normal(0.0, 10.0).expand([3]),
                                                           transforms.OrderedTransform()))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", N, subsample_size=500):
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.MixtureSameFamily(dist.Categorical(w), dist.Normal(mu, sigma)),
                       obs=yb)


def mixture_scales_model(y=None, N=10_000):
    """The mixture with a flat (improper) prior on the ordered means and a scale per component."""
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(3)))
    mu = numpyro.sample("mu", dist.ImproperUniform(constraints.ordered_vector, (), (3,)))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0).expand([3]).to_event(1))
    with numpyro.plate("data", N, subsample_size=500):
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.MixtureSameFamily(dist.Categorical(w), dist.Normal(mu, sigma)),
                       obs=yb)


def _mixture_data(N=10_000, seed=1, centers=(2.0, 6.0, 10.0), weights=(0.3, 0.5, 0.2)):
    rng = np.random.default_rng(seed)
    z = rng.choice(3, N, p=list(weights))
    return np.array(centers)[z] + rng.normal(size=N)


def _means(fit, unravel):
    """The ordered means at the mode (both models' ``mu`` live on the ordered cone, whose
    unconstrained map is ``OrderedTransform``)."""
    return np.asarray(transforms.OrderedTransform()(unravel(fit.mode)["mu"]))


#: (centers, weights, data seed, model): the components at −10, 0 and 10 (where 8 starts and 8
#: Newton steps ended in a mode with two merged components), unequal weights with one small
#: component, and equal weights.
WIDE = ((-10.0, 0.0, 10.0), (0.3, 0.5, 0.2), 1, mixture_model)
MIXTURES = {
    "wide": WIDE,
    "unequal": ((-3.0, 0.0, 5.0), (0.1, 0.6, 0.3), 3, mixture_model),
    "equal": ((-10.0, 0.0, 10.0), (1 / 3, 1 / 3, 1 / 3), 4, mixture_model),
}


def test_mode_search_finds_well_separated_mixture_components():
    """The default mode search (32 starts, up to 30 Newton steps) on the components at −10, 0
    and 10: the means within 0.1 (posterior sds ≈ 0.01–0.02) of the truth; with the previous
    defaults (8 starts, 8 Newton steps) it ended at means ≈ (−1.4, −0.7, −0.7)."""
    centers, weights, seed, model = WIDE
    fit, _, unravel = fit_model_mode(model, (_mixture_data(seed=seed, centers=centers,
                                                           weights=weights),))
    np.testing.assert_allclose(_means(fit, unravel), centers, atol=0.1)
    assert len(fit.start_log_densities) == 32  # indefinite curvature at its starts: every round


def test_a_glm_settles_after_one_round_of_starts():
    """A logistic regression's log posterior is concave everywhere: the first round's eight
    starts show it (−H positive definite at each), and the other three rounds are skipped."""
    from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression

    X, y, _ = simulate_logistic_regression(num_data=2000, dim=5)
    fit, _, unravel = fit_model_mode(logistic_regression_model, (X, y))
    assert len(fit.start_log_densities) == 8 and fit.converged
    every, _, _ = fit_model_mode(logistic_regression_model, (X, y), options=WarmupOptions(settle_early=False))
    assert len(every.start_log_densities) == 32
    np.testing.assert_allclose(fit.mode, every.mode, atol=1e-3 * float(np.max(fit.scales)) + 1e-4)


def test_a_single_round_of_starts_skips_the_concavity_check(monkeypatch):
    """With ``num_starts`` ≤ ``starts_per_round`` (a model with local latents by default) there is
    no later round to skip, so the first round's concavity check, a full-data Hessian per start
    until one is indefinite (41 s each on the ten-million-rating mixed model), is not run."""
    from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    from numpyro_sg.infer import warmup

    calls = []
    monkeypatch.setattr(warmup, "first_round_concave", lambda *a, **k: calls.append(1) or True)
    X, y, _ = simulate_logistic_regression(num_data=500, dim=3)
    fit, _, _ = fit_model_mode(logistic_regression_model, (X, y), options=WarmupOptions(num_starts=8))
    assert len(fit.start_log_densities) == 8 and not calls
    fit_model_mode(logistic_regression_model, (X, y), options=WarmupOptions(num_starts=16))
    assert calls   # two rounds: checked


def test_an_ill_conditioned_log_concave_posterior_converges_and_reports_its_condition_number():
    """Three covariates that are one up to 1 % noise, one of them 1,000 times larger than the
    others, and a 30-sd outlier: a log-concave posterior whose curvature has a condition number
    above 10⁶.  Newton (its steps solved in float64) converges, and
    ``condition_number`` reports the conditioning (cond(−H) from the Laplace factor: at least
    10⁶ here, against about 1 for orthogonal covariates)."""
    from numpyro_sg.datasets import logistic_regression_model

    rng = np.random.default_rng(0)
    base = rng.normal(size=4000)
    X = np.column_stack([base + 0.01 * rng.normal(size=4000) for _ in range(3)])
    X[:, 2] *= 1000.0
    X[0, 0] = 30.0
    y = (rng.uniform(size=4000) < 1 / (1 + np.exp(-0.5 * base))).astype(np.float32)
    fit, _, _ = fit_model_mode(logistic_regression_model, (jnp.asarray(X, jnp.float32), jnp.asarray(y)))
    assert fit.converged and fit.condition_number > 1e6, (fit.converged, fit.condition_number)
    orthogonal, _, _ = fit_model_mode(logistic_regression_model, (jnp.asarray(rng.normal(size=(4000, 3)), jnp.float32),
                                                                  jnp.asarray(y)))
    assert orthogonal.condition_number < 10, orthogonal.condition_number


@pytest.mark.slow
@pytest.mark.parametrize("name", ["unequal", "equal"])
@pytest.mark.parametrize("seed", [0, 1])
def test_mode_search_finds_mixture_components_from_any_seed(name, seed):
    centers, weights, data_seed, model = MIXTURES[name]
    y = _mixture_data(seed=data_seed, centers=centers, weights=weights)
    fit, _, unravel = fit_model_mode(model, (y,), options=WarmupOptions(seed=seed))
    np.testing.assert_allclose(_means(fit, unravel), centers, atol=0.15)


@pytest.mark.slow
def test_mode_search_finds_the_highest_mode_of_a_mixture_and_warns():
    """From the zero start alone Adam and Newton end in a local mode (means ≈ 3.2, 4.0, 7.9);
    the multi-start phase finds the components at 2, 6 and 10, and says that it saw lower modes."""
    y = _mixture_data()
    kernel = nsg.SGLD(mixture_model)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.warns(ConvergenceWarning, match="multimodal"):
        mcmc.run(jax.random.PRNGKey(0), y)
    fit = kernel.mode_fit
    mu = np.asarray(transforms.OrderedTransform()(kernel._unravel(fit.mode)["mu"]))
    np.testing.assert_allclose(mu, [2.0, 6.0, 10.0], atol=0.1)
    assert fit.local_modes().sum() >= 1


@pytest.mark.slow
def test_above_hessian_rows_the_starts_are_ranked_on_those_rows():
    """Above ``hessian_rows`` rows the starts' ends are ranked on those rows (m rows a point, not
    N); the ends estimated more than 20 nats from the mode (candidates for another mode) get their exact
    full-data value and gradient, and the others their difference from the mode on the rows.
    With 1,000 of 10,000 rows the mixture's search finds the same components as with all of
    them, its ends (all 9,000–17,000 nats below, at merged components) have their exact log
    densities, and it still warns of the lower modes."""
    centers, weights, seed, model = WIDE
    y = _mixture_data(seed=seed, centers=centers, weights=weights)
    exact, _, unravel = fit_model_mode(model, (y,))
    rows, _, _ = fit_model_mode(model, (y,), options=WarmupOptions(hessian_rows=1000))
    np.testing.assert_allclose(_means(rows, unravel), _means(exact, unravel), atol=0.05)
    a, b = np.asarray(exact.start_log_densities), np.asarray(rows.start_log_densities)
    assert np.array_equal(np.isfinite(a), np.isfinite(b)) and np.all(exact.log_density - a[np.isfinite(a)] > 1000)
    np.testing.assert_allclose(b[np.isfinite(b)], a[np.isfinite(a)], rtol=1e-6)
    assert exact.local_modes().sum() >= 1 and rows.local_modes().sum() >= 1


def test_above_hessian_rows_ends_near_the_mode_keep_their_log_density():
    """A logistic regression's ends, 0.4–1.7 nats below its mode, valued on 2,000 of 20,000 rows
    by their difference from the mode, corrected by the gradient there: within 0.5 nats of the
    exact values (the error is second order in the distance: 0.07 measured; the difference
    alone, without the gradient term, was off by up to 14 nats), and no pass over all the data."""
    from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression

    X, y, _ = simulate_logistic_regression(num_data=20_000, dim=5)
    exact, _, _ = fit_model_mode(logistic_regression_model, (X, y))
    rows, _, _ = fit_model_mode(logistic_regression_model, (X, y), options=WarmupOptions(hessian_rows=2000))
    np.testing.assert_allclose(rows.start_log_densities, exact.start_log_densities, atol=0.5)
    assert rows.converged and np.max(np.abs(np.asarray(rows.mode) - np.asarray(exact.mode))) < 1e-3
    # passes over all the data: the Newton steps' alone (the usual start is checked on the rows too;
    # with every row: + the start's, the starts' round's and the main phase's ends', and the
    # gradient at the drift ratio's probes)
    assert rows.data_passes == rows.newton_steps and exact.data_passes == exact.newton_steps + 4


def test_the_starts_report_their_rounds():
    """The warmup's bar names each round of starts as it ends ("starts 8/32"), so a long
    multi-start phase shows progress; a first round that settles the search reports its end."""
    from numpyro_sg.infer.multistart import explore_starts

    firsts, rest = np.zeros((4, 2)), np.ones((10, 2))
    ascend, values_at = (lambda xs, keys: xs), (lambda xs: (np.zeros(len(xs)), np.zeros_like(xs)))
    seen = []
    explore_starts((firsts, lambda: rest), ascend, values_at, jax.random.PRNGKey(0), 4,
                   report=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 14), (8, 14), (12, 14), (14, 14)]
    seen.clear()
    explore_starts((firsts, lambda: rest), ascend, values_at, jax.random.PRNGKey(0), 4,
                   settled=lambda starts, values, ends: True, report=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 4)]


def test_progress_bar_option_defaults_to_quiet_off_a_terminal(capsys):
    assert WarmupOptions().show_progress() is False  # pytest captures stderr: not a terminal
    assert WarmupOptions(progress_bar=True).show_progress() is True


@pytest.mark.slow
def test_mixture_matches_nuts_with_sgld_defaults():
    y = _mixture_data()
    mcmc = MCMC(nsg.SGLD(mixture_model), num_warmup=1000, num_samples=2000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y)
    idata = nsg.to_inference_data(mcmc, check=False)
    # NUTS from init_to_uniform ends in the local mode too: start it at the components
    start = init_to_value(values={"mu": np.array([2.0, 6.0, 10.0]), "sigma": 1.0,
                                  "w": np.array([0.3, 0.5, 0.2])})
    ref = nsg.nuts_reference(mixture_model, y, num_warmup=500, num_samples=1000,
                             progress_bar=False, ksd_draws=100, init_strategy=start)
    table = nsg.compare_to_reference(idata, ref, ksd=False)
    assert np.max(np.abs(table["mean_err"])) < 0.25, table
    assert table.attrs["xi_sd"] <= 0.1, table


@pytest.fixture(scope="module")
def wide_mixture():
    """The components at −10, 0 and 10 and NUTS on them (started at the components: from
    ``init_to_uniform`` NUTS ends in a local mode too)."""
    centers, weights, seed, model = WIDE
    y = _mixture_data(seed=seed, centers=centers, weights=weights)
    start = init_to_value(values={"mu": np.array(centers), "sigma": 1.0, "w": np.array(weights)})
    ref = nsg.nuts_reference(model, y, num_warmup=500, num_samples=1000, progress_bar=False,
                             ksd_draws=100, init_strategy=start)
    return y, ref


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [nsg.SGLD, nsg.SGBD])
def test_wide_mixture_matches_nuts_with_defaults(kernel, wide_mixture):
    """Same tolerances as on the components at 2, 6 and 10 (above)."""
    y, ref = wide_mixture
    mcmc = MCMC(kernel(WIDE[3]), num_warmup=1000, num_samples=2000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), y)
    table = nsg.compare_to_reference(nsg.to_inference_data(mcmc, check=False), ref, ksd=False)
    assert np.max(np.abs(table["mean_err"])) < 0.25, table
    assert table.attrs["xi_sd"] <= 0.1, table


def _grouped_data(G=100, R=4, tau=0.7, seed=0):
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(G), R).astype(np.int32)
    y = 1.0 + tau * rng.normal(size=G)[group] + rng.normal(size=G * R)
    return group, y.astype(np.float32)


def hierarchical_effects_model(group, y=None, num_groups=100, subsample_size=50):
    """Group effects as parameters (outside the subsample plate) with a learnt scale τ."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    b = numpyro.sample("b", dist.Normal(0.0, tau).expand([num_groups]).to_event(1))
    with numpyro.plate("rows", group.shape[0], subsample_size=subsample_size):
        g = numpyro.subsample(group, event_dim=0)
        obs = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(mu + b[g], 1.0), obs=obs)


def test_variational_centre_sits_in_the_bulk_where_the_joint_mode_collapses():
    """100 group effects with a learnt scale τ: the joint mode has τ → 0 (measured 0.0004), the
    mean-field centre τ = 0.692 (NUTS 0.693 ± 0.078), and SGLD with the defaults started there
    has τ 0.66 ± 0.06.  Tolerances: the centre within 0.5 NUTS sd; the chain's mean within 0.75
    NUTS sd (τ mixes slowly: 4,000 draws give an effective sample size of a few tens)."""
    group, y = _grouped_data()
    data = (group, y)
    tau_of = lambda fit, unravel: float(np.exp(unravel(fit.mode)["tau"]))  # noqa: E731
    fit, _, unravel = fit_model_mode(hierarchical_effects_model, data, options=WarmupOptions(num_starts=1))
    ref = MCMC(NUTS(hierarchical_effects_model), num_warmup=500, num_samples=1000, progress_bar=False)
    ref.run(jax.random.PRNGKey(0), *data, subsample_size=None)
    tau_ref = np.asarray(ref.get_samples()["tau"])
    assert tau_of(fit, unravel) < 0.05 * tau_ref.mean()
    fit, _, unravel = fit_model_mode(hierarchical_effects_model, data,
                                     options=WarmupOptions(centre="variational"))
    assert abs(tau_of(fit, unravel) - tau_ref.mean()) < 0.5 * tau_ref.std()
    mcmc = MCMC(nsg.SGLD(hierarchical_effects_model, warmup_options={"centre": "variational"}),
                num_warmup=1000, num_samples=4000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), *data)
    assert abs(float(mcmc.get_samples()["tau"].mean()) - tau_ref.mean()) < 0.75 * tau_ref.std()


def test_centre_option_is_checked():
    with pytest.raises(ValueError, match="centre='laplace'"):
        WarmupOptions(centre="laplace")


def test_starts_stopped_on_a_slope_are_not_called_local_modes():
    """A linear mixed model: prior draws of β ~ N(0, 10²) start far out, where a variance is far
    too large and the likelihood flat, and some starts stop there, 300–3,000 nats below the mode
    but still climbing (predicted further ascent 80–2,300 nats); no multimodality warning.
    (The Adam phases are asked for: on 200 groups Newton would go first and no start run.)"""
    from numpyro_sg.datasets.mixed import linear_mixed_model, simulate_linear_mixed

    X, Y, M = simulate_linear_mixed(G=200)
    kernel = nsg.SGLD(linear_mixed_model, warmup_options={"optimizer_steps": 500})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False).run(jax.random.PRNGKey(0), X, Y, M, 20)
    assert not [w for w in caught if "multimodal" in str(w.message)]
    fit = kernel.mode_fit
    far = np.asarray(fit.log_density) - np.asarray(fit.start_log_densities) > 100
    assert far.sum() >= 3 and np.all(np.asarray(fit.start_ascents)[far] > WarmupOptions().multimodal_gap)


def _random_slopes_model(x, mask, y=None):
    """Correlated random intercept and slope per group (LKJ), the locals in a subsample plate."""
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([2]).to_event(1))
    tau = numpyro.sample("tau", dist.HalfNormal(5).expand([2]).to_event(1))
    corr = numpyro.sample("L", dist.LKJCholesky(2, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(10))
    with numpyro.plate("group", x.shape[0], subsample_size=40):
        xb, mb = numpyro.subsample(x, event_dim=1), numpyro.subsample(mask, event_dim=1)
        yb = numpyro.subsample(y, event_dim=1) if y is not None else None
        u = numpyro.sample("u", dist.MultivariateNormal(0, scale_tril=tau[:, None] * corr))
        mu = beta[0] + u[:, :1] + (beta[1] + u[:, 1:]) * xb
        numpyro.sample("y", dist.Normal(mu, sigma).mask(mb).to_event(1), obs=yb)


def test_starts_on_a_ridge_of_a_unimodal_mixed_model_are_not_called_local_modes():
    """A random intercept-and-slope model (one mode): starts that stop on the ridge where a
    large group sd trades off with the intercept end 140–410 nats below the mode with a small
    diagonal Newton estimate of their further ascent (5–20 nats), which called them local
    modes; the full curvature there is not negative definite (no local maximum), so no
    multimodality warning.  (The Adam phases are asked for: on 160 groups Newton goes first, from
    the usual start, and reaches the same mode within 10⁻² Laplace sds.)"""
    rng = np.random.default_rng(1)
    G, rows = 160, 66
    sizes = rng.integers(14, 67, G)
    mask = np.arange(rows)[None, :] < sizes[:, None]
    x = rng.normal(size=(G, rows)).astype(np.float32)
    b = (rng.normal(size=(G, 2)) @ np.linalg.cholesky([[1.0, 0.3], [0.3, 1.0]]).T) * np.array([2.0, 0.7])
    y = np.where(mask, 12 + 2.5 * x + b[:, :1] + b[:, 1:] * x + 6 * rng.normal(size=x.shape), 0).astype(np.float32)
    kernel = nsg.SGLD(_random_slopes_model, warmup_options={"optimizer_steps": 500})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False).run(jax.random.PRNGKey(0), x, mask, y)
    assert not [w for w in caught if "multimodal" in str(w.message)]
    fit = kernel.mode_fit
    far = fit.log_density - np.asarray(fit.start_log_densities) > 100
    assert far.sum() >= 3  # the situation arose: starts ended far below the mode
    first = nsg.SGLD(_random_slopes_model)
    MCMC(first, num_warmup=10, num_samples=10, progress_bar=False).run(jax.random.PRNGKey(0), x, mask, y)
    gap = np.linalg.solve(np.asarray(fit.preconditioner.chol, np.float64), np.asarray(first.mode_fit.mode - fit.mode, np.float64))
    assert first.mode_fit.converged and not first.mode_fit.start_log_densities and np.max(np.abs(gap)) < 1e-2, gap


def test_the_first_rounds_concavity_check_stops_at_the_first_indefinite_start():
    """Every start of a hierarchical model's first round is indefinite (on the simulated
    MovieLens mixed model, all eight were): the check must not pay a full-data Hessian at
    each of them.  A log-concave round still checks every start."""
    from numpyro_sg.infer.multistart import first_round_concave

    starts, values = np.zeros((4, 2)), np.zeros(4)
    seen = []

    def curvature(neg_h):
        def at(x):
            seen.append(x)
            return neg_h
        return at

    ends = starts + 1.0
    assert not first_round_concave(starts, values, ends, curvature(np.diag([1.0, -1.0])))
    assert len(seen) == 1
    seen.clear()
    assert first_round_concave(starts, values, ends, curvature(np.eye(2)))
    assert len(seen) == 4
    assert not first_round_concave(starts, np.array([0.0, -np.inf, 0.0, 0.0]), ends, curvature(np.eye(2)))


def test_a_curvature_that_overflowed_at_a_start_is_read_at_its_end_and_never_crashes():
    """A Poisson regression on covariates 20 sds out overflows −H at a uniform start (inf or
    NaN entries, on which LAPACK's eigvalsh raised "Eigenvalues did not converge"): the check
    reads the curvature at that start's end point instead, and a curvature not finite there
    either shows nothing (not concave)."""
    from numpyro_sg.infer.multistart import first_round_concave

    starts, values, ends = np.zeros((2, 2)), np.zeros(2), np.ones((2, 2))
    overflowed = lambda x: np.full((2, 2), np.nan) if np.all(x == 0) else np.eye(2)
    assert first_round_concave(starts, values, ends, overflowed)
    assert not first_round_concave(starts, values, ends, lambda x: np.full((2, 2), np.inf))


def test_an_end_in_another_mode_does_not_rise_to_the_mode_and_one_on_its_slope_does():
    """The values-and-gradients check that spares the far starts' ends a Hessian: on a two-component
    mixture (modes at 0 and at (6, 6)), an end on the main mode's slope rises to it, an end at
    the other mode does not (a valley lies between), nor does one just past that mode."""
    from numpyro_sg.infer.multistart import rises_to_mode

    def log_density(x):
        return jnp.logaddexp(jnp.log(0.7) - 0.5 * jnp.sum(x**2), jnp.log(0.3) - 0.5 * jnp.sum((x - 6.0) ** 2))

    values_at = lambda xs: jax.vmap(jax.value_and_grad(log_density))(jnp.asarray(xs))
    ends = np.array([[-2.0, -2.5], [2.0, 1.5], [6.0, 6.0], [6.3, 5.9]], np.float32)
    grads = np.asarray(values_at(ends)[1])
    rises = rises_to_mode(values_at, np.zeros(2, np.float32), ends, grads, width=4)
    assert rises.tolist() == [True, True, False, False]
