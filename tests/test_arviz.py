"""``to_inference_data`` and ``summary`` on an SGBD run of a subsample model: full-data groups,
KSD in sample_stats, a lossless netCDF round trip, and ArviZ's own functions on the result."""

import warnings

import arviz as az
import jax
import matplotlib
import numpy as np
import pytest
import xarray as xr
from conftest import CLASSIC, logistic_model
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.arviz_compat import USES_DATATREE, from_netcdf, get_group, group_names, to_netcdf

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def sgbd_run(logistic_data):
    X, y = logistic_data
    mcmc = MCMC(
        nsg.SGBD(logistic_model, step_size=0.02, variant="corrected", adapt_step_size="always",
                 **CLASSIC),
        num_warmup=300,
        num_samples=400,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("step_size", "frac_past_breaking_point"))
    return mcmc


@pytest.fixture(scope="module")
def idata(sgbd_run):
    return nsg.to_inference_data(sgbd_run, log_likelihood=True, ksd_draws=200)


def test_full_data_groups_and_ksd(idata, logistic_data):
    X, y = logistic_data
    np.testing.assert_array_equal(idata.observed_data["y"], y)  # all N = 500, not a mini-batch
    assert idata.log_likelihood["y"].shape == (2, 400, 500)
    assert idata.posterior["theta"].shape == (2, 400, 3)
    stats = idata.sample_stats
    assert stats["ksd"].dims == ("chain",) and np.all(np.isfinite(stats["ksd"]))
    assert {"diverging", "step_size", "frac_past_breaking_point"} <= set(stats)
    # per-coordinate fields on a named dimension
    assert stats["step_size"].dims == ("chain", "draw", "coordinate")
    assert list(stats["coordinate"].values) == ["theta[0]", "theta[1]", "theta[2]"]
    attrs = stats.attrs
    assert attrs["ksd_preconditioner"] == "sd" and attrs["ksd_draws_per_chain"] == 200
    assert np.shape(attrs["ksd_scales"]) == (3,) and attrs["ksd_c"] == 1.0
    assert attrs["ksd_beta"] == -0.5 and attrs["ksd_statistic"] == "v"
    # the pooled KSD equals ksd() of the stored scored draws with the stored scales
    st = idata["stein"]
    x = st["unconstrained"].values.reshape(-1, 3)
    s = st["score"].values.reshape(-1, 3)
    assert attrs["ksd"] == pytest.approx(nsg.ksd(x, scores=s, preconditioner=attrs["ksd_scales"]))
    assert attrs["ksd"] == pytest.approx(nsg.ksd(idata))  # no model needed: stein group


def test_the_default_ksd_draws_stop_at_the_time_budget_spread_over_the_chain(sgbd_run, monkeypatch):
    """``ksd_draws="auto"`` scores draws in an order spread over the chain until the run's sampling
    time is spent (at least 100 per chain): here a budget of zero keeps the first blocks only."""
    from numpyro_sg.results import inference_data

    monkeypatch.setattr(inference_data, "MIN_KSD_SECONDS", 0.0)
    budgeted = nsg.to_inference_data(sgbd_run, sampling_time=0.0, check=False)
    kept = budgeted.stein["draw"].values
    assert 100 <= budgeted.sample_stats.attrs["ksd_draws_per_chain"] == len(kept) < 400
    assert np.all(np.diff(kept) > 0) and kept[0] == 0 and kept[-1] > 350  # the whole chain
    # each kept draw has its own full-data score, in (chain, draw) order
    full = nsg.to_inference_data(sgbd_run, ksd_draws=None, check=False)
    assert full.sample_stats.attrs["ksd_draws_per_chain"] == 400
    for name in ("unconstrained", "score", "log_density"):
        np.testing.assert_allclose(budgeted.stein[name], full.stein[name].sel(draw=kept), rtol=1e-5)


def test_pair_sums_past_the_budget_keep_fewer_draws_that_the_stored_ksd_used(sgbd_run, monkeypatch):
    """When the KSD's pairwise sums are projected past what the scores left of the budget,
    evenly spread fewer of the scored draws are kept (at least 100 per chain), and the stored
    ``stein`` group holds exactly the draws the stored KSD was computed from."""
    from numpyro_sg.results import inference_data, run_ksd

    real, budgets = run_ksd.chain_ksds, []

    def slow_pairs(stein, scales, kept=None, *, seconds=None, **options):
        budgets.append(seconds)
        if seconds is not None:
            return None, 100.0 * seconds + 1.0   # as if the pairs took 100× what is left
        return real(stein, scales, kept, **options)

    monkeypatch.setattr(run_ksd, "chain_ksds", slow_pairs)
    monkeypatch.setattr(inference_data, "MIN_KSD_SECONDS", 600.0)   # every draw scored in time
    idata = nsg.to_inference_data(sgbd_run, check=False)
    assert budgets[0] is not None and budgets[1] is None
    kept = idata.stein["draw"].values
    assert idata.sample_stats.attrs["ksd_draws_per_chain"] == len(kept) == 100
    assert kept[0] == 0 and kept[-1] == 399 and np.all(np.diff(kept) > 0)
    assert idata.sample_stats.attrs["ksd"] == pytest.approx(nsg.ksd(idata), rel=1e-6)


def test_without_the_runs_clock_the_budget_is_the_time_since_init(sgbd_run, monkeypatch):
    """JAX's persistent compilation cache switches the run clock off (its programs may hold no
    host callback), so the run's time is unknown: the budget is then the time since the
    kernel's ``init`` began (here as if just now), not all 1,000 draws whatever they cost."""
    from numpyro_sg.infer.run_clock import seconds_since_init
    from numpyro_sg.results import inference_data

    since = seconds_since_init(sgbd_run)
    assert since is not None and since > 0 and seconds_since_init(object()) is None
    monkeypatch.setattr(inference_data, "run_seconds", lambda mcmc: None)
    monkeypatch.setattr(inference_data, "seconds_since_init", lambda mcmc: 0.0)
    monkeypatch.setattr(inference_data, "MIN_KSD_SECONDS", 0.0)
    idata = nsg.to_inference_data(sgbd_run, check=False)
    assert "sampling_time" not in idata.posterior.attrs
    assert 100 <= idata.sample_stats.attrs["ksd_draws_per_chain"] < 400


def test_netcdf_round_trip_is_lossless(idata, tmp_path):
    path = tmp_path / "run.nc"
    to_netcdf(idata, path)
    back = from_netcdf(path)
    assert type(back) is type(idata)
    assert set(group_names(back)) == set(group_names(idata)) >= {
        "posterior", "sample_stats", "observed_data", "log_likelihood", "stein"}
    for group in group_names(idata):
        xr.testing.assert_identical(get_group(back, group), get_group(idata, group))
        for key, value in get_group(idata, group).attrs.items():
            np.testing.assert_array_equal(get_group(back, group).attrs[key], value)
    assert nsg.ksd(back) == pytest.approx(idata.sample_stats.attrs["ksd"])
    table = nsg.posterior_summary(back)
    np.testing.assert_allclose(table["ksd"], nsg.posterior_summary(idata)["ksd"])


def test_arviz_functions_run(idata):
    import matplotlib.pyplot as plt

    if USES_DATATREE:  # ArviZ >= 1: the run is an xarray DataTree, KSD group and all
        assert isinstance(idata, xr.DataTree)
        az.plot_trace_dist(idata)
        az.plot_forest(idata)
        az.plot_dist(idata)
    else:
        az.plot_trace(idata)
        az.plot_forest(idata)
        az.plot_posterior(idata)
    plt.close("all")
    table = az.summary(idata, round_to="none")
    assert "theta[2]" in table.index and np.all(table["r_hat"] < 1.2)
    loo = az.loo(idata, pointwise=True)
    elpd = loo.elpd if USES_DATATREE else loo.elpd_loo
    assert loo.n_data_points == 500 and np.isfinite(elpd)


def test_summary_has_per_coordinate_ksd(idata):
    table = nsg.posterior_summary(idata)
    assert list(table.index) == ["theta[0]", "theta[1]", "theta[2]"]
    assert np.all(np.isfinite(table["ksd"])) and np.all(table["ksd"] > 0)
    assert "inclusion_prob" not in table  # no indicator sites
    # the column is Song, Sun, Ye & Liang's (2020) per-coordinate terms: they sum to the per-coordinate KSD
    st = idata["stein"]
    x = st["unconstrained"].values.reshape(-1, 3)
    s = st["score"].values.reshape(-1, 3)
    scales = idata.sample_stats.attrs["ksd_scales"]
    assert table["ksd"].sum() == pytest.approx(
        nsg.ksd(x, scores=s, preconditioner=scales, per_coordinate=True), rel=1e-6
    )
    raw = nsg.posterior_summary(idata, preconditioner=None)  # the papers' raw form, recomputed
    assert np.all(np.isfinite(raw["ksd"])) and not np.allclose(raw["ksd"], table["ksd"])
    # (stored terms come from one pass over every chain pair, the recomputed ones from the pooled
    # draws in other blocks: float32 sums in another order)
    np.testing.assert_allclose(nsg.posterior_summary(idata, preconditioner=scales)["ksd"], table["ksd"], rtol=1e-6)


def test_options_and_limits(sgbd_run):
    raw = nsg.to_inference_data(sgbd_run, preconditioner=None, ksd_draws=50,
                                ksd_options={"statistic": "u"})
    assert raw.sample_stats.attrs["ksd_preconditioner"] == "none"
    assert raw.sample_stats.attrs["ksd_statistic"] == "u"
    assert raw["stein"].sizes["draw"] == 50
    no_ksd = nsg.to_inference_data(sgbd_run, ksd=False)
    assert "ksd" not in no_ksd.sample_stats and "stein" not in group_names(no_ksd)
    with pytest.raises(MemoryError, match="log_likelihood_limit_gb"):
        nsg.to_inference_data(sgbd_run, log_likelihood=True, log_likelihood_limit_gb=1e-6)
    with pytest.raises(TypeError, match="unknown ksd_options"):
        nsg.to_inference_data(sgbd_run, ksd_options={"bandwidth": 1.0})


def test_conversion_checks_convergence_unless_told_not_to(logistic_data):
    """NumPyro's MCMC has no end-of-run hook: the conversion is where a run of our kernels is
    checked.  A chain started at a uniform draw with a tiny absolute step barely moves, so its
    draws fail the check (drift, ESS); ``check=False`` skips it."""
    X, y = logistic_data
    mcmc = MCMC(nsg.SGLD(logistic_model, step_size=1e-7, **CLASSIC), num_warmup=0, num_samples=200,
                num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X, y)
    with pytest.warns(nsg.ConvergenceWarning, match="theta"):
        nsg.to_inference_data(mcmc, ksd=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.ConvergenceWarning)
        nsg.to_inference_data(mcmc, ksd=False, check=False)
