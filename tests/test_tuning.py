"""MAMBA, grid search and the 1/N heuristic (paper 002 §3, Algorithm 1; SPEC §8).

A conjugate linear regression (N = 1,000, d = 2, noise sd 1, prior N(0, 2²); posterior sd
≈ 0.03) with SGLD on mini-batches of 100.  The planted grid has one good step size; the
others either barely move from the start (ε = 1e-9, 1e-10: the chain stays where
``init_to_uniform`` put it, KSD ≫ 1) or diverge (ε = 0.5, 1: ε·λ_max ≈ 500 ≫ 2).
"""

import functools

import jax
import numpy as np
import pytest
from conftest import CLASSIC, linear_model, linear_posterior

import numpyro_sg as nsg

GOOD = 2e-4  # ε·λ_max ≈ 0.2: stable, mixes in ~100 iterations, sd inflation ≈ 5%
PLANTED = [1e-10, 1e-9, GOOD, 0.5, 1.0]


@pytest.fixture(scope="module")
def data(linear_data):
    return linear_data


KEY = jax.random.PRNGKey(0)


def make_sgld(**kw):
    return nsg.SGLD(linear_model, **CLASSIC, **kw)


def test_heuristic_step_size():
    assert nsg.heuristic_step_size(100_000) == 1e-5
    with pytest.raises(ValueError, match="positive integer"):
        nsg.heuristic_step_size(0)


def test_mamba_finds_planted_arm_and_respects_budget(data):
    grid = {"step_size": PLANTED, "subsample_size": [100, 50]}  # 10 arms, 2 rounds
    res = nsg.mamba(make_sgld, grid, data, time_budget=3.0, rng_key=jax.random.PRNGKey(1))
    print(res, res.overhead)
    print(res.rounds.to_string())
    assert res.best_params["step_size"] == GOOD
    rounds = res.rounds
    assert list(rounds.columns[:2]) == ["round", "arm"]
    assert {"step_size", "subsample_size", "iterations", "seconds", "score", "kept"} <= set(rounds)
    assert rounds["round"].nunique() == 2  # ⌊log_3 10⌋
    assert (rounds["round"] == 0).sum() == 10 and (rounds["round"] == 1).sum() == 3
    # diverging arms score inf, and are flagged
    diverged = rounds[(rounds["round"] == 0) & (rounds["step_size"] >= 0.5)]
    assert diverged["diverged"].all() and np.isinf(diverged["score"]).all()
    # the chain time is the budget, split T/(|S_i|·rounds) per arm: within 20%
    assert rounds["seconds"].sum() == pytest.approx(3.0, rel=0.2)
    per_round = rounds.groupby("round")["seconds"].sum()
    np.testing.assert_allclose(per_round, 1.5, rtol=0.25)
    # one vectorised batch per subsample size: step sizes share a compiled batch
    assert sorted(len(b) for b in res.batches) == [5, 5]
    # after pruning, survivors of one batch get equal numbers of forked chains (5 slots,
    # 2 survivors: 2 chains each, the fifth slot's draws dropped), so equal iterations
    last = rounds[rounds["round"] == 1]
    for _, same_batch in last.groupby("subsample_size"):
        assert same_batch["iterations"].nunique() == 1
    assert res.elapsed >= rounds["seconds"].sum()
    assert set(res.overhead) >= {"setup", "compile", "score"}


def test_mamba_result_is_a_usable_posterior(data):
    X, y = data
    res = nsg.mamba(make_sgld, {"step_size": [1e-9, GOOD, 1.0]}, data, time_budget=2.0, rng_key=KEY)
    assert res.best_params == {"step_size": GOOD}
    idata = res.idata
    theta = idata.posterior["theta"].values.reshape(-1, 3)
    mean, cov = linear_posterior(X, y)
    # ~2 s of SGLD after a transient from init_to_uniform: the mean within 0.5 posterior sd
    # (the pooled draws include the transient; measured ≤ 0.2 sd)
    assert np.all(np.abs(theta.mean(0) - mean) < 0.5 * np.sqrt(np.diag(cov)))
    stats = idata.sample_stats
    assert np.isfinite(stats.attrs["ksd"]) and stats.attrs["ksd_preconditioner"] == "common (tuner)"
    np.testing.assert_allclose(stats.attrs["ksd_scales"], res.scales)
    # Laplace scales of a Gaussian posterior are its marginal sds
    np.testing.assert_allclose(res.scales, np.sqrt(np.diag(cov)), rtol=1e-3)
    assert idata.posterior.attrs["sampling_time"] == pytest.approx(
        res.rounds.loc[res.rounds["arm"] == 1, "seconds"].sum()
    )


def test_laplace_start(data):
    X, y = data
    mean, cov = linear_posterior(X, y)
    sd = np.sqrt(np.diag(cov))
    res = nsg.mamba(make_sgld, {"step_size": PLANTED}, data, time_budget=1.0,
                    init_params="laplace", rng_key=KEY)
    assert res.best_params["step_size"] == GOOD
    # the Laplace approximation of a Gaussian posterior is exact: a barely moving chain
    # stays where it started, at a draw from the posterior (within 5 sd)
    theta = res.idata.posterior["theta"].values.reshape(-1, 3)
    assert np.all(np.abs(theta.mean(0) - mean) < 5 * sd)
    with pytest.raises(ValueError, match="init_params must be"):
        nsg.mamba(make_sgld, {"step_size": [GOOD]}, data, init_params="map", rng_key=KEY)


def test_fssd_metric_and_unvectorised_arms(data):
    res = nsg.mamba(make_sgld, {"step_size": [1e-9, GOOD, 1.0]}, data, time_budget=1.0,
                    metric="fssd", vectorize=False, rng_key=KEY)
    assert res.best_params["step_size"] == GOOD
    assert sorted(len(b) for b in res.batches) == [1] * 3
    assert res.idata.sample_stats.attrs["tuning_metric"] == "fssd"


def test_vectorised_batch_runs_each_arm_with_its_own_values(data):
    # SGBD keeps σ in its state (set at init); SGLD reads ε at every step: both must be the
    # arm's own value inside the shared batch
    from numpyro_sg.tuning import _make_batches, grid_arms

    arms = grid_arms({"step_size": [1e-3, 2e-3, 3e-3]})
    for factory in (make_sgld, functools.partial(nsg.SGBD, linear_model, variant="vanilla", **CLASSIC)):
        (batch,) = _make_batches(factory, arms, True, jax.random.PRNGKey(0), None, data, {}, 10)
        batch.compile()
        batch.run(0.05)
        np.testing.assert_allclose(
            np.asarray(batch.state.step_size).reshape(3, -1)[:, 0], [1e-3, 2e-3, 3e-3], rtol=1e-6
        )


def test_grid_search_runs_every_arm_the_budget_and_takes_a_metric(data):
    X, y = data
    res = nsg.grid_search(make_sgld, {"step_size": [1e-9, GOOD]}, data, time_budget=0.5, rng_key=KEY)
    assert res.best_params["step_size"] == GOOD
    np.testing.assert_allclose(res.rounds["seconds"], 0.5, rtol=0.25)
    assert res.rounds["round"].nunique() == 1

    def held_out_rmse(samples):  # a user metric on constrained draws: lower is better
        pred = X[:100] @ samples["theta"].mean(0)
        return float(np.sqrt(np.mean((pred - y[:100]) ** 2)))

    res = nsg.grid_search(make_sgld, {"step_size": [1e-9, GOOD]}, data, time_budget=0.5,
                          metric=held_out_rmse, rng_key=KEY)
    assert res.best_params["step_size"] == GOOD
    assert res.rounds["score"].min() == pytest.approx(1.0, abs=0.15)  # noise sd 1


def test_bad_grids_and_arguments(data):
    with pytest.raises(ValueError, match="non-empty dict"):
        nsg.mamba(make_sgld, {}, data, rng_key=KEY)
    with pytest.raises(ValueError, match=r"grid\['step_size'\] is empty"):
        nsg.mamba(make_sgld, {"step_size": []}, data, rng_key=KEY)
    with pytest.raises(ValueError, match="step_sise.*argument of the kernel factory"):
        nsg.mamba(make_sgld, {"step_sise": [1e-3, 1e-4]}, data, rng_key=KEY)
    with pytest.raises(ValueError, match="eta"):
        nsg.mamba(make_sgld, {"step_size": [1e-3]}, data, eta=1, rng_key=KEY)
    with pytest.raises(ValueError, match="metric"):
        nsg.mamba(make_sgld, {"step_size": [1e-3]}, data, metric="mmd", rng_key=KEY)
    with pytest.raises(ValueError, match="different scales"):
        nsg.mamba(make_sgld, {"step_size": [1e-3]}, data, preconditioner="sd", rng_key=KEY)
    with pytest.raises(ValueError, match="subsample_size=5000 .* outside"):
        nsg.mamba(make_sgld, {"step_size": [1e-3], "subsample_size": [5000]}, data, rng_key=KEY)
    with pytest.raises(RuntimeError, match="every arm diverged"):
        nsg.mamba(make_sgld, {"step_size": [1.0, 2.0]}, data, time_budget=0.2, rng_key=KEY)


def test_tuning_example_runs(capsys):
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "mamba_tuning.py"
    module = runpy.run_path(str(script))
    module["main"](["--num-data", "1000", "--budget", "1.0", "--num-samples", "200", "--quick"])
    out = capsys.readouterr().out
    assert "MAMBA for SGLD" in out and "MAMBA for SGBD" in out and "chosen:" in out
    assert out.count("ξ(σ̂) =") == 3
