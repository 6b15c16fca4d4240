"""Held-out predictive checks: ``predictive_metrics`` against NumPyro's own log-likelihood and a
direct computation, calibration errors on known cases, and the errors a user meets."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS, log_likelihood

import numpyro_sg as nsg
from numpyro_sg.arviz_compat import from_dict
from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression
from numpyro_sg.diagnostics.predictive import calibration_errors


@pytest.fixture(scope="module")
def logistic_run():
    X, y, _ = simulate_logistic_regression(num_data=800, dim=3)
    mcmc = MCMC(NUTS(logistic_regression_model), num_warmup=300, num_samples=300, num_chains=2,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X[:500], y[:500])
    return mcmc, X[500:], y[500:]


def test_log_predictive_density_accuracy_and_calibration_are_those_of_the_draws(logistic_run):
    """lpd from NumPyro's ``log_likelihood`` at the same draws; accuracy and ECE from the mean of
    the per-draw probabilities, computed here directly (to float32 rounding: 1e-6)."""
    mcmc, X, y = logistic_run
    table = nsg.predictive_metrics(mcmc, X, y, block=64)   # 600 draws: the last block padded
    row = table.loc["y"]
    assert row["n"] == 300 and row["draws"] == 600 and np.isnan(row["rmse"])
    theta = np.asarray(mcmc.get_samples()["theta"], np.float64)
    log_p = np.asarray(log_likelihood(logistic_regression_model, mcmc.get_samples(), X, y)["y"], np.float64)
    lpd = np.mean(np.log(np.mean(np.exp(log_p), axis=0)))
    assert row["lpd"] == pytest.approx(lpd, rel=1e-6)
    p1 = np.mean(1.0 / (1.0 + np.exp(-(theta @ np.asarray(X, np.float64).T))), axis=0)
    probs = np.stack([1 - p1, p1], axis=1)
    assert row["accuracy"] == pytest.approx(np.mean((p1 > 0.5) == y))
    np.testing.assert_allclose([row["ece"], row["mce"]], calibration_errors(probs, y), atol=1e-6)


def test_per_chain_rows_are_each_chains_own_predictive(logistic_run):
    """``per_chain=True``: a row per chain from that chain's draws alone (here: the first chain
    of the run alone, checked against the run cut to it) and the pooled row as chain "all"
    (the default table's).  Fails if a chain's row mixed the chains' draws."""
    mcmc, X, y = logistic_run
    table = nsg.predictive_metrics(mcmc, X, y, per_chain=True)
    assert list(table.index) == [("y", 0), ("y", 1), ("y", "all")] and table.index.names == ["site", "chain"]
    pooled = nsg.predictive_metrics(mcmc, X, y).loc["y"]
    np.testing.assert_allclose(table.loc[("y", "all")].to_numpy(float), pooled.to_numpy(float))
    first = from_dict(posterior={"theta": np.asarray(mcmc.get_samples(group_by_chain=True)["theta"])[:1]})
    alone = nsg.predictive_metrics(first, X, y, model=logistic_regression_model).loc["y"]
    assert table.loc[("y", 0), "draws"] == 300 and table.loc[("y", 0), "lpd"] == pytest.approx(alone["lpd"], rel=1e-6)
    assert table.loc[("y", 0), "ece"] == pytest.approx(alone["ece"], abs=1e-9)


def test_overconfident_draws_are_less_calibrated_than_the_posterior(logistic_run):
    """The NUTS posterior of a well-specified model is calibrated on held-out rows within the
    noise of 300 labels (ECE measured 0.046; bound 0.08); the same draws scaled by 4 (logits 4×
    too confident) have a larger ECE and a lower lpd.  Fails if ECE ignored the confidence."""
    mcmc, X, y = logistic_run
    honest = nsg.predictive_metrics(mcmc, X, y).loc["y"]
    scaled = from_dict(posterior={"theta": 4.0 * np.asarray(mcmc.get_samples(group_by_chain=True)["theta"])})
    over = nsg.predictive_metrics(scaled, X, y, model=logistic_regression_model).loc["y"]
    print(honest.to_dict(), over.to_dict())
    assert honest["ece"] < 0.08 and over["ece"] > honest["ece"] + 0.05
    assert over["lpd"] < honest["lpd"]


def test_categorical_and_gaussian_likelihoods():
    """A softmax regression gets accuracy and ECE from the class probabilities; a linear
    regression the RMSE of the predictive mean (here: draws at the truth, so the noise sd)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2))
    W = np.array([[2.0, -1.0, 0.0], [0.0, 1.0, -2.0]])
    labels = np.array([rng.choice(3, p=np.exp(l) / np.exp(l).sum()) for l in X @ W])

    def softmax_model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0, 3).expand([2, 3]).to_event(2))
        with numpyro.plate("n", X.shape[0]):
            numpyro.sample("y", dist.Categorical(logits=X @ w), obs=y)

    draws = from_dict(posterior={"w": np.broadcast_to(W, (1, 50, 2, 3))})
    row = nsg.predictive_metrics(draws, jnp.asarray(X), jnp.asarray(labels), model=softmax_model).loc["y"]
    probs = np.exp(X @ W) / np.exp(X @ W).sum(axis=1, keepdims=True)
    assert row["accuracy"] == pytest.approx(np.mean(probs.argmax(1) == labels))
    assert row["lpd"] == pytest.approx(np.mean(np.log(probs[np.arange(400), labels])), rel=1e-5)
    np.testing.assert_allclose([row["ece"], row["mce"]], calibration_errors(probs, labels), atol=1e-6)

    def linear_model(X, y=None):
        b = numpyro.sample("b", dist.Normal(0, 3).expand([2]).to_event(1))
        numpyro.sample("y", dist.Normal(X @ b, 0.5), obs=y)

    y = X @ np.array([1.0, -1.0]) + 0.5 * rng.normal(size=400)
    row = nsg.predictive_metrics(from_dict(posterior={"b": np.broadcast_to([1.0, -1.0], (2, 20, 2))}),
                                 jnp.asarray(X), jnp.asarray(y), model=linear_model).loc["y"]
    assert row["rmse"] == pytest.approx(np.sqrt(np.mean((y - X @ np.array([1.0, -1.0])) ** 2)), rel=1e-5)
    assert np.isnan(row["ece"]) and np.isnan(row["accuracy"])


def test_held_out_score_is_the_tables_value_lower_is_better(logistic_run):
    """``held_out_score`` (a tuner's metric) returns predictive_metrics's figures on the same
    draws, turned so that lower is better; a score the likelihood has not is an error."""
    mcmc, X, y = logistic_run
    row = nsg.predictive_metrics(mcmc, X, y).loc["y"]
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
    for score, value in [("nll", -row["lpd"]), ("error", 1 - row["accuracy"]), ("ece", row["ece"]),
                         ("mce", row["mce"])]:
        assert nsg.held_out_score(logistic_regression_model, X, y, score=score)(samples) == pytest.approx(value, rel=1e-6)
    nll = nsg.held_out_score(logistic_regression_model, X, y, block=64)
    assert nll({"theta": samples["theta"][:10]}) == pytest.approx(
        -nsg.predictive_metrics(from_dict(posterior={"theta": samples["theta"][None, :10]}), X, y,
                                model=logistic_regression_model).loc["y", "lpd"], rel=1e-6)
    with pytest.raises(ValueError, match="score='rmse' needs a mean likelihood at 'y', which is 'bernoulli'"):
        nsg.held_out_score(logistic_regression_model, X, y, score="rmse")(samples)
    with pytest.raises(ValueError, match="score must be one of"):
        nsg.held_out_score(logistic_regression_model, X, y, score="loss")


def test_calibration_errors_of_known_bins():
    # two bins: confidence 0.95 right 1/2 of the time (gap 0.45), 0.6 right always (gap 0.4)
    probs = np.array([[0.95, 0.05], [0.95, 0.05], [0.6, 0.4], [0.4, 0.6]])
    labels = np.array([0, 1, 0, 1])
    ece, mce = calibration_errors(probs, labels)
    assert ece == pytest.approx(0.5 * 0.45 + 0.5 * 0.4) and mce == pytest.approx(0.45)
    assert calibration_errors(np.array([0.95, 0.95, 0.4, 0.6]), np.array([1, 0, 0, 1])) == pytest.approx((ece, mce))
    with pytest.raises(ValueError, match="probs must be"):
        calibration_errors(np.ones((3, 2)) / 2, np.zeros(4, int))


def test_errors_name_what_is_missing(logistic_run):
    mcmc, X, y = logistic_run
    with pytest.raises(ValueError, match="pass model="):
        nsg.predictive_metrics(from_dict(posterior={"theta": np.zeros((1, 5, 3))}), X, y)
    with pytest.raises(KeyError, match="theta"):
        nsg.predictive_metrics(from_dict(posterior={"beta": np.zeros((1, 5, 3))}), X, y,
                               model=logistic_regression_model)
    with pytest.raises(ValueError, match="no observed site"):
        nsg.predictive_metrics(mcmc, X)   # y=None: nothing observed


def test_digits_split_and_network_classifier():
    """The digits' split (pixels in [0, 1]) and the network's sites (64–100–10:
    7,510 parameters) with its log-likelihood over a mini-batch of the plate."""
    from numpyro_sg.datasets.networks import load_digits_split, mlp_classifier

    data = load_digits_split(test=360, validation=287)
    (Xt, yt), (Xv, _), (_, ys) = data["train"], data["validation"], data["test"]
    assert (len(yt), len(Xv), len(ys)) == (1150, 287, 360) and Xt.dtype == np.float32
    assert 0.0 <= Xt.min() and Xt.max() == 1.0 and set(np.unique(ys)) == set(range(10))
    tr = numpyro.handlers.trace(numpyro.handlers.seed(mlp_classifier, 0)).get_trace(
        jnp.asarray(Xt), jnp.asarray(yt), hidden=100, subsample_size=64)
    assert sum(np.size(s["value"]) for s in tr.values() if s["type"] == "sample" and not s["is_observed"]) == 7510
    assert tr["y"]["value"].shape == (64,)


def test_posterior_predictive_is_numpyros_predictive_over_every_row_and_an_arviz_group(logistic_run):
    """Without subsampling the draws are NumPyro's ``Predictive`` ones (same keys: 600 draws, a
    multiple of the block, so the keys split alike), reshaped (chain, draw, row); with a
    subsample plate of 50 every one of the 300 rows is still predicted (``Predictive`` gives
    50).  ``to_inference_data(predictions=...)`` stores them as ArviZ's ``predictions`` group."""
    from numpyro.infer import Predictive

    from numpyro_sg.arviz_compat import get_group

    mcmc, X, y = logistic_run
    key = jax.random.PRNGKey(5)
    ours = nsg.posterior_predictive(mcmc, X, rng_key=key, subsample_size=len(y))
    theirs = Predictive(logistic_regression_model, mcmc.get_samples())(key, X, subsample_size=len(y))["y"]
    assert set(ours) == {"y"} and ours["y"].shape == (2, 300, 300)
    np.testing.assert_array_equal(ours["y"].reshape(600, 300), np.asarray(theirs))
    sub = nsg.posterior_predictive(mcmc, X, subsample_size=50)["y"]
    assert sub.shape == (2, 300, 300)
    assert Predictive(logistic_regression_model, mcmc.get_samples())(key, X, subsample_size=50)["y"].shape == (600, 50)
    # the predictive frequency of y = 1 follows the posterior mean probability, row by row
    theta = np.asarray(mcmc.get_samples()["theta"], np.float64)
    p1 = np.mean(1.0 / (1.0 + np.exp(-(theta @ np.asarray(X, np.float64).T))), axis=0)
    assert np.max(np.abs(sub.reshape(600, 300).mean(0) - p1)) < 0.1   # 600 Bernoulli draws: sd ≤ 0.02
    idata = nsg.to_inference_data(mcmc, ksd=False, check=False, predictions={"y": sub})
    assert get_group(idata, "predictions")["y"].shape == (2, 300, 300)
    with pytest.raises(ValueError, match="leave the observations out"):
        nsg.posterior_predictive(mcmc, X, y)
