"""Mini-batch machinery: plates, index drawing, scaled gradients, per-datum gradients, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import logistic_model
from jax.flatten_util import ravel_pytree
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.infer.minibatch import (
    BatchState,
    Minibatcher,
    discover_plates,
    draw_without_replacement,
    find_subsample_plates,
)


def _minibatcher(X, y, subsample_size=None, replace=True):
    plates = discover_plates(logistic_model, (X, y), {}, subsample_size=subsample_size)
    return Minibatcher(logistic_model, plates, replace=replace)


def _analytic_loglik_grads(X, y, theta):
    p = 1 / (1 + np.exp(-(X @ theta)))
    return (y - p)[:, None] * X


def test_find_subsample_plates(logistic_data):
    X, y = logistic_data
    assert find_subsample_plates(logistic_model, (X, y)) == {"data": (500, 50)}
    plates = discover_plates(logistic_model, (X, y), {}, subsample_size=20)
    assert plates[0].size == 500 and plates[0].subsample_size == 20
    assert plates[0].model_subsample_size == 50 and plates[0].scale == 25.0


def test_full_data_log_density_is_exact(logistic_data):
    X, y = logistic_data
    mb = _minibatcher(X, y)
    theta = np.array([0.3, -0.2, 0.1], np.float32)
    ld = mb.log_density_fn((X, y))(dict(theta=theta), mb.full_indices())
    logits = X.astype(np.float64) @ theta
    loglik = np.sum(y * logits - np.logaddexp(0, logits))
    logprior = np.sum(-0.5 * (theta / 3.0) ** 2 - np.log(3.0) - 0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(ld, loglik + logprior, rtol=1e-5)


@pytest.mark.parametrize("replace", [True, False])
def test_minibatch_gradient_is_unbiased(logistic_data, replace):
    X, y = logistic_data
    mb = _minibatcher(X, y, subsample_size=10, replace=replace)
    ld = mb.log_density_fn((X, y))
    params = dict(theta=jnp.array([0.3, -0.2, 0.1]))
    full = jax.grad(ld)(params, mb.full_indices())["theta"]

    def one(carry, key):
        idx, batch = mb.draw(key, carry)
        return batch, jax.grad(ld)(params, idx)["theta"]

    keys = jax.random.split(jax.random.PRNGKey(0), 20_000)
    _, grads = jax.lax.scan(one, mb.init_batch_state(jax.random.PRNGKey(1)), keys)
    grads = np.asarray(grads, np.float64)
    # Tolerance: 4 standard errors of the Monte Carlo average (for sampling without
    # replacement the epoch structure makes draws negatively correlated, so this is generous).
    se = grads.std(0) / np.sqrt(len(grads))
    np.testing.assert_array_less(np.abs(grads.mean(0) - np.asarray(full)), 4 * se)
    # ... and the estimator is genuinely noisy, so the test has power.
    assert np.all(grads.std(0) > 10 * se)


def test_subsample_size_override_changes_scale(logistic_data):
    X, y = logistic_data
    mb = _minibatcher(X, y, subsample_size=7)
    idx, _ = mb.draw(jax.random.PRNGKey(3), None)
    assert idx["data"].shape == (7,)
    theta = np.array([0.3, -0.2, 0.1], np.float32)
    ld = mb.log_density_fn((X, y))(dict(theta=theta), idx)
    i = np.asarray(idx["data"])
    logits = X[i].astype(np.float64) @ theta
    loglik = np.sum(y[i] * logits - np.logaddexp(0, logits)) * 500 / 7
    logprior = np.sum(-0.5 * (theta / 3.0) ** 2 - np.log(3.0) - 0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(ld, loglik + logprior, rtol=1e-5)


def test_per_datum_gradients_match_analytic(logistic_data):
    X, y = logistic_data
    mb = _minibatcher(X, y)
    theta = np.array([0.3, -0.2, 0.1], np.float32)
    idx = {"data": jnp.arange(40, 90)}
    got = mb.per_datum_loglik_grads(dict(theta=theta), idx, (X, y))["theta"]
    want = _analytic_loglik_grads(X[40:90].astype(np.float64), y[40:90], theta)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("replace", [True, False])
def test_value_grad_noise(logistic_data, replace):
    X, y = logistic_data
    mb = _minibatcher(X, y, replace=replace)
    ld = mb.log_density_fn((X, y))
    params = dict(theta=jnp.array([0.3, -0.2, 0.1]))
    idx = {"data": jnp.arange(50)}
    value, ghat, tau = mb.value_grad_noise(ld, params, idx)
    np.testing.assert_allclose(value, ld(params, idx), rtol=1e-5)
    np.testing.assert_allclose(ghat, ravel_pytree(jax.grad(ld)(params, idx))[0], rtol=1e-4)
    per = _analytic_loglik_grads(X[:50].astype(np.float64), y[:50], np.array([0.3, -0.2, 0.1]))
    want = 500 / np.sqrt(50) * per.std(0, ddof=1)
    if not replace:
        want *= np.sqrt(1 - 50 / 500)
    np.testing.assert_allclose(tau, want, rtol=1e-4)


def test_without_replacement_walks_epochs():
    key = jax.random.PRNGKey(0)
    batch = BatchState(jax.random.permutation(key, 10).astype(jnp.int32), jnp.int32(0))
    seen = []
    for k in jax.random.split(jax.random.PRNGKey(1), 6):
        idx, batch = draw_without_replacement(k, batch, 3)
        seen.append(np.asarray(idx))
    # 3 batches per epoch of 10 (one datum left over, then a reshuffle)
    for epoch in (seen[:3], seen[3:]):
        flat = np.concatenate(epoch)
        assert len(set(flat)) == 9 and flat.min() >= 0 and flat.max() < 10


def test_without_replacement_of_the_whole_plate_is_every_row_in_order():
    """n = N (the defaults' exact gradient): every row, no permutation per draw (an O(N) sort
    per iteration made exact-gradient runs at 10⁵ rows several times slower)."""
    batch = BatchState(jax.random.permutation(jax.random.PRNGKey(0), 10).astype(jnp.int32), jnp.int32(0))
    idx, after = draw_without_replacement(jax.random.PRNGKey(1), batch, 10)
    np.testing.assert_array_equal(idx, np.arange(10))
    assert after is batch


def test_a_subsample_of_every_row_is_the_full_data(logistic_data):
    """``subsample_size=N`` is the full data, as in NumPyro's plate: the noise plan sees the
    exact gradient (no noise, no step cut), not N rows drawn with replacement (whose noise it
    predicted and warned about)."""
    X, y = logistic_data
    kernel = nsg.SGLD(logistic_model, subsample_size=len(y))
    MCMC(kernel, num_warmup=5, num_samples=5, progress_bar=False).run(jax.random.PRNGKey(3), X, y)
    plan = kernel.noise_plan
    assert (plan.replace, plan.subsample_size, plan.step_scale) == (False, len(y), 1.0), plan
    assert plan.inflation < 0.01, plan


# -- bad input -----------------------------------------------------------------------------


def _run(kernel, *args, **kwargs):
    MCMC(kernel, num_warmup=2, num_samples=2, progress_bar=False).run(
        jax.random.PRNGKey(0), *args, **kwargs
    )


def test_error_no_subsample_plate(logistic_data):
    X, y = logistic_data

    def model(X, y):
        theta = numpyro.sample("theta", dist.Normal(0, 1).expand([3]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ theta), obs=y)

    with pytest.raises(ValueError, match=r"no subsample plate \(its plates \['data'\] have no"):
        _run(nsg.SGLD(model, 1e-3), X, y)


def test_plate_declared_full_size_is_a_subsample_plate(logistic_data):
    X, y = logistic_data
    assert find_subsample_plates(logistic_model, (X, y), {"subsample_size": 500}) == {
        "data": (500, 500)
    }
    plates = discover_plates(logistic_model, (X, y), {"subsample_size": 500}, subsample_size=25)
    assert plates[0].subsample_size == 25


@pytest.mark.parametrize("size", [0, 501, -3])
def test_error_subsample_size_out_of_range(logistic_data, size):
    X, y = logistic_data
    with pytest.raises(ValueError, match=rf"subsample_size={size} for plate 'data'.*N=500"):
        _run(nsg.SGBD(logistic_model, 0.01, subsample_size=size), X, y)


def test_error_subsample_size_unknown_plate(logistic_data):
    X, y = logistic_data
    with pytest.raises(ValueError, match="unknown plate.*'other'"):
        _run(nsg.SGLD(logistic_model, 1e-3, subsample_size={"other": 3}), X, y)


def test_error_latent_site_in_plate(logistic_data):
    X, y = logistic_data

    def model(X, y):
        theta = numpyro.sample("theta", dist.Normal(0, 1).expand([3]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=10):
            Xb = numpyro.subsample(X, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0)
            u = numpyro.sample("u", dist.Normal(0, 1))
            numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta + u), obs=yb)

    # the gradient kernels integrate such a local out (tests/test_local_latents.py); the
    # mini-batcher itself, used directly, still refuses it with the site and plate named
    with pytest.raises(ValueError, match="Latent site 'u' is inside subsample plate 'data'"):
        discover_plates(model, (X, y), {})


def test_error_nonfinite_covariates(logistic_data):
    X, y = logistic_data
    X = X.copy()
    X[17, 2] = np.nan
    with pytest.raises(ValueError, match=r"positional argument 0.*non-finite.*\(17, 2\)"):
        _run(nsg.SGLD(logistic_model, 1e-3), X, y)


def test_error_nonfinite_observations(logistic_data):
    X, y = logistic_data
    y = y.copy()
    y[5] = np.inf
    with pytest.raises(ValueError, match=r"non-finite.*\(5,\)"):
        _run(nsg.SGLD(logistic_model, 1e-3), X, y)


def test_error_nonfinite_observations_in_kwargs(logistic_data):
    X, y = logistic_data

    def model(X, data=None):
        logistic_model(X, data["y"])

    bad = y.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match=r"keyword argument 'data'\['y'\].*\(3,\)"):
        _run(nsg.SGLD(model, 1e-3), X, data={"y": bad})


def test_score_estimator_is_exact_on_full_batches_and_unbiased_on_mini_batches():
    """Minibatcher.score_estimator: the full-data score when the batch covers the data; with
    a control-variate anchor, mini-batch estimates whose mean over 400 keys is within 4
    standard errors of the exact score (logistic regression, N = 500, d = 3)."""
    import jax.numpy as jnp
    from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
    from numpyro_sg.diagnostics.model_scores import ModelScores
    from numpyro_sg.infer.minibatch import Anchor
    from numpyro_sg.infer.warmup import fit_model_mode

    X, y, _ = simulate_logistic_regression(num_data=500, dim=3, seed=1)
    fit, mb, unravel = fit_model_mode(logistic_regression_model, (X, y))
    x = np.asarray(fit.mode) + 0.2 * np.array([[1.0, -1.0, 0.5], [0.3, 0.2, -0.4]])
    exact = ModelScores(logistic_regression_model, (X, y)).score(x)
    full = mb.score_estimator(unravel, None, 10_000, (X, y), {})(jnp.asarray(x, jnp.float32), jax.random.PRNGKey(0))
    np.testing.assert_allclose(full, exact, rtol=1e-3, atol=1e-2)
    cv = mb.score_estimator(unravel, Anchor(fit.mode, fit.grad), 50, (X, y), {})
    draws = np.stack([np.asarray(cv(jnp.asarray(x, jnp.float32), jax.random.PRNGKey(k))) for k in range(400)])
    se = draws.std(0) / np.sqrt(400)
    assert np.all(np.abs(draws.mean(0) - exact) < 4 * se + 1e-3)
    assert np.all(draws.std(0) > 0)  # a mini-batch estimate, not the exact score
