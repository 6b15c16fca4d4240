"""When full-data NUTS is the better choice: the estimate and the advice after a run."""

import warnings

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.results import nuts_estimate as ne
from numpyro_sg.locals import marginalize_locals


def test_leapfrog_steps_match_the_trajectories_nuts_took():
    # NumPyro's NUTS took 7 steps on logistic regressions (d = 20, condition 2.7-3.3) and 15 on a
    # 1,000-group decentred joint (d = 1,004, the globals' condition 2.5); never fewer than 3
    assert ne.leapfrog_steps(2.7, 20) == 7
    assert ne.leapfrog_steps(3.3, 20) == 7
    assert ne.leapfrog_steps(2.5, 1004) == 15
    assert ne.leapfrog_steps(1.0, 1) == 3
    assert ne.leapfrog_steps(1.3, 63, doublings=1) == 15   # a 60-group joint: 15 steps
    assert ne.leapfrog_steps(400.0, 20) > ne.leapfrog_steps(4.0, 20)   # ill-conditioned: longer
    assert ne.nuts_seconds(1e-3, 7, ess=500, ess_per_draw=0.5) == pytest.approx(
        ne.NUTS_COMPILE_SECONDS + 1e-3 * 7 * (ne.NUTS_WARMUP + 1000))


def test_correlation_condition_ignores_scale_and_reads_correlation():
    assert ne.correlation_condition(np.diag([1e-4, 1.0, 1e4])) == pytest.approx(1.0)
    rho = 0.9
    assert ne.correlation_condition(np.array([[4.0, 2 * rho], [2 * rho, 1.0]])) == pytest.approx((1 + rho) / (1 - rho))


def _groups_model(X, y=None):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 2.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", X.shape[0], subsample_size=50):
        b = numpyro.sample("b", dist.Normal(0.0, tau))
        x = numpyro.subsample(X, event_dim=1)
        yy = numpyro.subsample(y, event_dim=1) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=alpha + x + b[:, None]).to_event(1), obs=yy)


def test_a_model_with_local_latents_is_timed_on_its_decentred_joint():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5)).astype(np.float32)
    y = (rng.random((200, 5)) < 0.5).astype(np.float32)
    full, has_locals = ne.nuts_model(marginalize_locals(_groups_model), (X, y), {})
    assert has_locals
    seconds, dim = ne.time_gradient(full, (X, y), {}, too_slow=1.0)
    assert dim == 200 + 2 and 0 < seconds < 1   # b_decentered (200), alpha, tau
    assert ne.time_gradient(full, (X, y), {}, too_slow=1e-9) is None   # too slow for the run: ruled out


def _glm(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 3.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=100):
        numpyro.sample("y", dist.Bernoulli(logits=numpyro.subsample(X, event_dim=1) @ w),
                       obs=numpyro.subsample(y, event_dim=0) if y is not None else None)


@pytest.fixture(scope="module")
def glm_run():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(5000, 3)).astype(np.float32)
    y = (rng.random(5000) < 1 / (1 + np.exp(-X @ np.array([1.0, -0.5, 0.2])))).astype(np.float32)
    mcmc = MCMC(nsg.SGLD(_glm), num_warmup=100, num_samples=200, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    return mcmc


def test_a_run_slower_than_nuts_is_told_so_once_with_both_times(glm_run):
    # 5,000 rows and 3 coordinates: NUTS takes seconds; a run said to take 10^4 s is slower
    glm_run.sampler._nuts_advised = None
    with pytest.warns(nsg.PreferNUTSWarning, match=r"took 10000\.0 s .* NUTS would take about") as record:
        estimate = ne.advise_nuts(glm_run, 400.0, 1e4)
    assert len([w for w in record if w.category is nsg.PreferNUTSWarning]) == 1
    assert estimate.dim == 3 and estimate.ess_per_draw == ne.ESS_PER_DRAW
    assert 0 < estimate.gradient_seconds < 1 and estimate.nuts_seconds < 1e4 / ne.MARGIN
    assert "nuts_reference" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.PreferNUTSWarning)   # the same run again: silent
        assert ne.advise_nuts(glm_run, 400.0, 1e4) is not None


def test_to_inference_data_records_the_estimate_and_a_fast_run_is_not_advised(glm_run):
    glm_run.sampler._nuts_advised = None
    with pytest.warns(nsg.PreferNUTSWarning):
        idata = nsg.to_inference_data(glm_run, ksd=False, sampling_time=1e4)
    assert ne.NUTS_COMPILE_SECONDS < idata.posterior.attrs["nuts_estimated_seconds"] < 1e4 / ne.MARGIN
    glm_run.sampler._nuts_advised = None
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.PreferNUTSWarning)   # NUTS's compilation alone is 2.5 s
        nsg.to_inference_data(glm_run, ksd=False, sampling_time=3.0)
        assert "nuts_estimated_seconds" not in nsg.to_inference_data(   # too short to ask
            glm_run, ksd=False, sampling_time=1.0).posterior.attrs


def test_the_warmup_pass_rules_nuts_out_without_compiling_its_gradient(glm_run, monkeypatch):
    assert 0 < glm_run.sampler.mode_fit.gradient_seconds < 1   # the warmup timed its full-data pass

    def no_timing(*args):
        raise AssertionError("NUTS's gradient compiled")
    monkeypatch.setattr(ne, "time_gradient", no_timing)
    assert ne.advise_nuts(glm_run, 300.0, ne.NUTS_COMPILE_SECONDS * 1.1) is None   # NUTS's compile alone is slower
    with pytest.raises(AssertionError, match="compiled"):   # a slow run: NUTS's gradient is timed
        ne.nuts_estimate(glm_run, 300.0, 1e4)
