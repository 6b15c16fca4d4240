"""Spike-and-slab introspection (numpyro_sg.spike_slab): site discovery, the log-density
decomposition, per-coordinate prior terms, the GLM fast path and the structure errors."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints
from numpyro.infer import MCMC
from numpyro.infer.util import log_density

import numpyro_sg as nsg

from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.spike_slab import (
    GLM_FAMILIES,
    SpikeSlabError,
    find_spike_slab,
    initial_values,
    site_types,
    start_fn,
)


def lin_model(X, y=None, n=40, slab=2.0, spike=0.1, lam=0.2):
    N, p = X.shape
    g = numpyro.sample("gamma", dist.Bernoulli(lam).expand([p]).to_event(1))
    th = numpyro.sample("theta", dist.Normal(0.0, jnp.where(g == 1, slab, spike)).to_event(1))
    numpyro.deterministic("beta", th * g)
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(Xb @ (th * g), 1.0), obs=yb)


def logistic_indexed_model(X, y=None, n=40):
    """Bernoulli likelihood, X indexed by the plate's indices, an unselected intercept."""
    N, p = X.shape
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 2.0))
    g = numpyro.sample("gamma", dist.Bernoulli(0.3).expand([p]).to_event(1))
    th = numpyro.sample("theta", dist.Normal(0.0, jnp.where(g == 1, 2.0, 0.1)).to_event(1))
    with numpyro.plate("data", N, subsample_size=n) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=alpha + X[idx] @ (th * g)),
                       obs=None if y is None else y[idx])


def poisson_model(X, y=None, n=40):
    N, p = X.shape
    g = numpyro.sample("gamma", dist.Bernoulli(0.3).expand([p]).to_event(1))
    th = numpyro.sample("theta", dist.Normal(0.0, jnp.where(g == 1, 1.0, 0.1)).to_event(1))
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Poisson(jnp.exp(Xb @ (th * g))), obs=yb)


def size_dependent_model(X, y=None, n=40):
    """Slab variance exp(C0/|S|)/(2π) (Song, Sun, Ye & Liang 2020, Table S1): not a per-coordinate prior."""
    N, p = X.shape
    g = numpyro.sample("gamma", dist.Bernoulli(0.3).expand([p]).to_event(1))
    size = jnp.maximum(jnp.sum(g), 1)
    slab = jnp.sqrt(jnp.exp(10.0 / size) / (2 * jnp.pi))
    th = numpyro.sample("theta", dist.Normal(0.0, jnp.where(g == 1, slab, 0.15)).to_event(1))
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ (th * g)), obs=yb)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    N, p = 200, 6
    X = rng.normal(size=(N, p)).astype(np.float32)
    beta = np.array([1.0, -1.0, 0, 0, 0.5, 0])
    y = (X @ beta + rng.normal(size=N)).astype(np.float32)
    yb = (rng.random(N) < 1 / (1 + np.exp(-X @ beta))).astype(np.float32)
    yp = rng.poisson(np.exp(0.3 * X @ beta)).astype(np.float32)  # (the model has no 0.3)
    return X, y, yb, yp


def test_finds_sites_and_glm(data):
    X, y, _, _ = data
    ss = find_spike_slab(lin_model, (X, y))
    assert (ss.indicator, ss.coefficient, ss.num_coefficients) == ("gamma", "theta", 6)
    assert ss.plate.name == "data" and ss.plate.size == 200 and ss.plate.subsample_size == 40
    assert ss.per_coordinate_prior
    assert ss.glm is not None and ss.glm.family_name == "gaussian"
    assert ss.glm.source == ("subsample", 0)
    # subsample_size override
    assert find_spike_slab(lin_model, (X, y), subsample_size=7).plate.subsample_size == 7


def test_terms_decompose_the_log_density(data):
    """log_prior + Σ terms equals NumPyro's log density of the model with γ observed."""
    X, y, _, _ = data
    ss = find_spike_slab(lin_model, (X, y))
    rng = np.random.default_rng(1)
    theta = jnp.asarray(rng.normal(size=6), jnp.float32)
    gamma = jnp.array([1, 0, 1, 0, 0, 1])
    idx = {"data": jnp.arange(10, 50)}
    lp, terms = ss.terms_fn((X, y))({"theta": theta}, gamma, idx)
    assert terms.shape == (40,)
    from numpyro_sg.infer.minibatch import with_indices
    ref, _ = log_density(with_indices(ss.conditioned(gamma), idx), (X, y), {}, {"theta": theta})
    np.testing.assert_allclose(lp + terms.sum(), ref, rtol=1e-5)
    # per-datum terms are the scaled Gaussian log-likelihoods
    beta = theta * gamma
    manual = (200 / 40) * (-0.5 * np.log(2 * np.pi) - 0.5 * (y[10:50] - X[10:50] @ beta) ** 2)
    np.testing.assert_allclose(terms, manual, rtol=1e-4, atol=1e-4)
    # the prior alone
    np.testing.assert_allclose(ss.prior_fn((X, y))({"theta": theta}, gamma), lp, rtol=1e-6)
    # the effective log-likelihood at β = θ·γ is the same
    eff = ss.effective_loglik_terms_fn((X, y))({"theta": theta}, beta, idx)
    np.testing.assert_allclose(eff, terms, rtol=1e-5, atol=1e-5)
    # log_density_fn (unconstrained, θ real: the same value) and its gradient
    f = ss.log_density_fn((X, y))
    np.testing.assert_allclose(f({"theta": theta}, gamma, idx), ref, rtol=1e-5)
    g = jax.grad(f)({"theta": theta}, gamma, idx)["theta"]
    slab_spike = np.where(np.asarray(gamma) == 1, 2.0, 0.1)
    resid = y[10:50] - X[10:50] @ beta
    g_ref = -np.asarray(theta) / slab_spike**2 + np.asarray(gamma) * 5.0 * (X[10:50].T @ resid)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-3)


def test_coordinate_prior(data):
    X, y, _, _ = data
    ss = find_spike_slab(lin_model, (X, y))
    theta = jnp.linspace(-1, 1, 6)
    cp = ss.coordinate_prior_fn((X, y))({"theta": theta}, theta)
    np.testing.assert_allclose(cp.indicator0, np.log(0.8) * np.ones(6), rtol=1e-6)
    np.testing.assert_allclose(cp.indicator1, np.log(0.2) * np.ones(6), rtol=1e-6)
    np.testing.assert_allclose(cp.coefficient0, dist.Normal(0, 0.1).log_prob(theta), rtol=1e-6)
    np.testing.assert_allclose(cp.coefficient1, dist.Normal(0, 2.0).log_prob(theta), rtol=1e-6)


def test_size_dependent_prior_is_not_per_coordinate(data):
    X, _, yb, _ = data
    ss = find_spike_slab(size_dependent_model, (X, yb))
    assert not ss.per_coordinate_prior
    assert ss.glm is not None and ss.glm.family_name == "bernoulli"


@pytest.mark.parametrize("which", ["gaussian", "bernoulli", "poisson"])
def test_glm_batch(which, data):
    X, y, yb, yp = data
    model, obs = {
        "gaussian": (lin_model, y),
        "bernoulli": (logistic_indexed_model, yb),
        "poisson": (poisson_model, yp),
    }[which]
    ss = find_spike_slab(model, (X, obs))
    assert ss.glm is not None and ss.glm.family_name == which
    values = {"theta": jnp.zeros(6)}
    if which == "bernoulli":
        values["alpha"] = jnp.array(0.4)
        assert ss.glm.source == ("arg", 0)
        assert ss.continuous_sites == ("alpha", "theta")
    idx = {"data": jnp.array([3, 7, 7, 150])}
    beta = jnp.array([0.5, 0.0, -1.0, 0.0, 0.2, 0.0])
    b = ss.glm_batch_fn((X, obs))(values, beta, idx)
    np.testing.assert_allclose(b.X, X[[3, 7, 7, 150]])
    assert b.scale == 50.0
    terms = ss.effective_loglik_terms_fn((X, obs))(values, beta, idx)
    np.testing.assert_allclose(b.scale * ss.glm.family.loglik(b.eta, b.y, b.params), terms, rtol=1e-4, atol=1e-3)
    # O(n) update of the linear predictor for one changed coordinate
    beta2 = beta.at[3].set(0.7)
    b2 = ss.glm_batch_fn((X, obs))(values, beta2, idx)
    np.testing.assert_allclose(b2.eta, b.eta + b.X[:, 3] * 0.7, rtol=1e-5, atol=1e-5)
    # derivatives of the family are those of its log-likelihood
    fam = GLM_FAMILIES[which]
    d = jax.vmap(jax.grad(lambda e, yy, s: fam.loglik(e, yy, {"scale": s} if which == "gaussian" else {})))
    params = b.params.get("scale", jnp.ones_like(b.eta))
    np.testing.assert_allclose(fam.dloglik(b.eta, b.y, b.params), d(b.eta, b.y, params), rtol=1e-5, atol=1e-6)


def test_nonlinear_predictor_has_no_glm_path(data):
    X, y, _, _ = data

    def model(X, y=None):
        N, p = X.shape
        g = numpyro.sample("gamma", dist.Bernoulli(0.2).expand([p]).to_event(1))
        th = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([p]).to_event(1))
        with numpyro.plate("data", N, subsample_size=20):
            Xb = numpyro.subsample(X, event_dim=1)
            numpyro.sample("y", dist.Normal(jnp.tanh(Xb @ (th * g)), 1.0),
                           obs=None if y is None else numpyro.subsample(y, event_dim=0))

    ss = find_spike_slab(model, (X, y))
    assert ss.glm is None
    assert ss.per_coordinate_prior
    with pytest.raises(SpikeSlabError, match="linear predictor is not"):
        find_spike_slab(model, (X, y), glm=True)
    assert find_spike_slab(lin_model, (X, y), glm=False).glm is None


def test_model_without_plate(data):
    X, y, _, _ = data

    def model(X, y=None):
        p = X.shape[1]
        g = numpyro.sample("gamma", dist.Bernoulli(0.2).expand([p]).to_event(1))
        th = numpyro.sample("theta", dist.Normal(0.0, jnp.where(g == 1, 2.0, 0.1)).to_event(1))
        numpyro.sample("y", dist.Normal(X @ (th * g), 1.0).to_event(1), obs=y)

    ss = find_spike_slab(model, (X, y))
    assert ss.plate is None
    theta = jnp.ones(6)
    gamma = jnp.array([1, 0, 0, 1, 0, 0])
    lp, terms = ss.terms_fn((X, y))({"theta": theta}, gamma, {})
    ref, _ = log_density(ss.conditioned(gamma), (X, y), {}, {"theta": theta})
    np.testing.assert_allclose(lp + terms.sum(), ref, rtol=1e-5)


# --- errors ---------------------------------------------------------------------------------
def _model_with(indicator_dist=None, likelihood="ok", coef_shape=None, two_binary=False):
    def model(X, y=None):
        N, p = X.shape
        g = numpyro.sample("gamma", indicator_dist(p) if indicator_dist else
                           dist.Bernoulli(0.2).expand([p]).to_event(1))
        if two_binary:
            numpyro.sample("other", dist.Bernoulli(0.5).expand([p]).to_event(1))
        th = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([coef_shape or p]).to_event(1))
        with numpyro.plate("data", N, subsample_size=20):
            Xb = numpyro.subsample(X, event_dim=1)
            if likelihood == "ok":
                loc = Xb @ (th * g)
            elif likelihood == "theta":  # ignores the indicator
                loc = Xb @ th
            else:  # depends on γ beyond θ·γ
                loc = Xb @ (th * g) + 0.5 * jnp.sum(g)
            numpyro.sample("y", dist.Normal(loc, 1.0),
                           obs=None if y is None else numpyro.subsample(y, event_dim=0))

    return model


def test_error_likelihood_not_through_product(data):
    X, y, _, _ = data
    with pytest.raises(SpikeSlabError, match="excluded variables"):
        find_spike_slab(_model_with(likelihood="theta"), (X, y))
    with pytest.raises(SpikeSlabError, match="other than through"):
        find_spike_slab(_model_with(likelihood="gamma"), (X, y))


def test_error_indicator_not_binary(data):
    X, y, _, _ = data
    cat = _model_with(indicator_dist=lambda p: dist.Categorical(jnp.ones(3) / 3).expand([p]).to_event(1))
    with pytest.raises(SpikeSlabError, match="not binary"):
        find_spike_slab(cat, (X, y), indicator="gamma")
    with pytest.raises(SpikeSlabError, match="No binary indicator"):
        find_spike_slab(cat, (X, y))
    with pytest.raises(SpikeSlabError, match="not binary"):
        find_spike_slab(_model_with(), (X, y), indicator="theta")


def test_error_ambiguous_or_missing_sites(data):
    X, y, _, _ = data
    with pytest.raises(SpikeSlabError, match="Several binary"):
        find_spike_slab(_model_with(two_binary=True), (X, y))
    with pytest.raises(SpikeSlabError, match="not a sample site"):
        find_spike_slab(_model_with(), (X, y), indicator="nope")
    with pytest.raises(SpikeSlabError, match="No coefficient site"):
        find_spike_slab(_no_coef_model, (X, y))
    with pytest.raises(SpikeSlabError, match="not a latent site"):
        find_spike_slab(_model_with(), (X, y), coefficient="beta")


def _no_coef_model(X, y=None):
    N, p = X.shape
    g = numpyro.sample("gamma", dist.Bernoulli(0.2).expand([p]).to_event(1))
    with numpyro.plate("data", N, subsample_size=20):
        Xb = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Normal(Xb @ g, 1.0),
                       obs=None if y is None else numpyro.subsample(y, event_dim=0))


def test_error_two_coefficient_candidates(data):
    X, y, _, _ = data

    def model(X, y=None):
        N, p = X.shape
        g = numpyro.sample("gamma", dist.Bernoulli(0.2).expand([p]).to_event(1))
        a = numpyro.sample("a", dist.Normal(0.0, 1.0).expand([p]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([p]).to_event(1))
        with numpyro.plate("data", N, subsample_size=20):
            Xb = numpyro.subsample(X, event_dim=1)
            numpyro.sample("y", dist.Normal(Xb @ (a * g) + 0.0 * jnp.sum(b), 1.0),
                           obs=None if y is None else numpyro.subsample(y, event_dim=0))

    with pytest.raises(SpikeSlabError, match="Several latent sites"):
        find_spike_slab(model, (X, y))
    assert find_spike_slab(model, (X, y), coefficient="a").coefficient == "a"


# --- one model trace, vectorised checks, starting values ----------------------------------
def test_given_model_info_is_not_traced_again_and_checks_run_once(data):
    """find_spike_slab reads a given ModelInfo; all the numerical checks (structure,
    per-coordinate prior, GLM affinity) run the model function once, vectorised."""
    X, y, _, _ = data
    calls = []

    def counted(X, y=None):
        calls.append(1)
        return lin_model(X, y)

    info = trace_model(counted, (X, y))
    assert len(calls) == 1
    ss = find_spike_slab(counted, (X, y), info=info)
    assert len(calls) == 2
    ref = find_spike_slab(lin_model, (X, y))
    assert (ss.indicator, ss.coefficient, ss.plate, ss.per_coordinate_prior, ss.glm) == (
        ref.indicator, ref.coefficient, ref.plate, ref.per_coordinate_prior, ref.glm)
    assert site_types(counted, (X, y), info=info) == info.site_types and len(calls) == 2
    find_spike_slab(counted, (X, y), info=info, check=False)
    assert len(calls) == 2


def test_start_draws_the_spike_and_reads_the_weights_rows(data):
    X, y, _, _ = data
    ss = find_spike_slab(lin_model, (X, y))
    start = start_fn(ss, (X, y), {}, rows=50)
    draws = jax.vmap(lambda k: start(k))(jax.random.split(jax.random.PRNGKey(0), 2000))
    theta = np.asarray(draws.params["theta"])
    np.testing.assert_allclose(theta.std(0), 0.1, rtol=0.1)  # the spike N(0, 0.1²), γ = 0
    rows = jax.tree.map(lambda a: np.asarray(a)[0], draws.glm_rows)
    np.testing.assert_allclose(rows.X, X[:50])
    np.testing.assert_allclose(rows.y, y[:50])
    np.testing.assert_allclose(rows.eta, 0.0)  # β = θ·0
    assert rows.scale == 200 / 50
    # the user's values are kept, and the rows read at them
    given = start(jax.random.PRNGKey(1), {"theta": jnp.ones(6)})
    np.testing.assert_array_equal(given.params["theta"], 1.0)
    params, gamma = initial_values(ss, jax.random.split(jax.random.PRNGKey(2), 3), None, None,
                                   (X, y), num_chains=3)
    assert params["theta"].shape == (3, 6) and gamma.shape == (3, 6) and not np.any(gamma)
    params, gamma = initial_values(ss, jax.random.PRNGKey(2), {"theta": jnp.ones(6), "gamma": jnp.ones(6)},
                                   None, (X, y))
    np.testing.assert_array_equal(params["theta"], 1.0)
    np.testing.assert_array_equal(gamma, 1)
    with pytest.raises(SpikeSlabError, match="GLM"):
        start_fn(find_spike_slab(lin_model, (X, y), glm=False), (X, y), rows=10)


def improper_intercept_model(X, y=None, n=100):
    """Logistic spike-and-slab with a flat (improper) prior on the unselected intercept."""
    N, p = X.shape
    alpha = numpyro.sample("alpha", dist.ImproperUniform(constraints.real, (), ()))
    g = numpyro.sample("gamma", dist.Bernoulli(0.3).expand([p]).to_event(1))
    th = numpyro.sample("theta", dist.Normal(0.0, jnp.where(g == 1, 2.0, 0.1)).to_event(1))
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=alpha + Xb @ (th * g)), obs=yb)


def test_structure_functions_trace_an_improper_prior_without_its_value(data):
    """Every function of the structure traces the model; a site not among the values is drawn
    from its prior, which an improper prior (``ImproperUniform``: no sampler) has not — it
    takes ``init_to_uniform``'s value instead (the functions' results do not depend on it)."""
    X, _, yb, _ = data
    p = X.shape[1]
    ss = find_spike_slab(improper_intercept_model, (X, yb))
    key, zeros = jax.random.PRNGKey(0), jnp.zeros(p)
    assert ss.design_fn((X, yb))({}).shape == X.shape
    assert ss.spike_sample_fn((X, yb))(key, {}).shape == (p,)
    assert ss.glm_batch_fn((X, yb))({}, zeros).X.shape == X.shape
    assert np.isfinite(ss.prior_fn((X, yb))({"theta": zeros}, zeros.astype(jnp.int32)))
    np.testing.assert_allclose(ss.coordinate_normal_fn((X, yb))({}).slab_scale, 2.0)
    assert np.all(np.isfinite(ss.coordinate_prior_fn((X, yb))({}, zeros).coefficient1))


@pytest.mark.parametrize("kernel", [nsg.ESGLD, nsg.SparseAsync])
def test_kernels_run_with_an_improper_prior_on_an_unselected_site(kernel):
    """N = 1,000, intercept 0.5 and effects (1.5, −1.5, 0, 0, 1, 0): both kernels select the
    three effects and find the intercept (posterior sd ≈ 0.08; tolerance 0.3 for a short run)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 6)).astype(np.float32)
    logits = 0.5 + X @ np.array([1.5, -1.5, 0, 0, 1.0, 0])
    y = (rng.random(1000) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    mcmc = MCMC(kernel(improper_intercept_model), num_warmup=300, num_samples=500,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    draws = mcmc.get_samples()
    assert abs(float(draws["alpha"].mean()) - 0.5) < 0.3
    inclusion = np.asarray(draws["gamma"].mean(0))
    assert np.all(inclusion[[0, 1, 4]] > 0.9) and np.all(inclusion[[2, 3, 5]] < 0.5), inclusion
