"""numpyro_sg.arviz_compat: the same behaviour with ArviZ 0.x (InferenceData) and ArviZ >= 1
(xarray DataTree), and a NUTS run converted by to_inference_data that the installed ArviZ's own
functions accept, KSD group and all."""

import arviz as az
import jax
import matplotlib
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import xarray as xr
from numpyro.infer import MCMC, NUTS

import numpyro_sg as nsg
from numpyro_sg import arviz_compat as compat

matplotlib.use("Agg")


def _run_data():
    rng = np.random.default_rng(0)
    return compat.from_dict(
        posterior={"theta": rng.normal(size=(3, 50, 2))},
        sample_stats={"diverging": np.zeros((3, 50), bool)},
        observed_data={"y": rng.normal(size=7)},
    )


def test_native_object_and_groups():
    data = _run_data()
    assert compat.is_run_data(data)
    assert isinstance(data, xr.DataTree) == compat.USES_DATATREE
    assert compat.group_names(data) == ["posterior", "sample_stats", "observed_data"]
    assert compat.has_group(data, "posterior") and not compat.has_group(data, "stein")
    assert not compat.has_group({"posterior": 1}, "posterior")  # a dict is not a run
    assert isinstance(compat.get_group(data, "posterior"), xr.Dataset)


def test_set_group_adds_and_replaces_in_place():
    data = _run_data()
    compat.set_group(data, "stein", xr.Dataset({"x": ("coordinate", np.arange(2.0))}, attrs={"a": 1}))
    compat.set_group(data, "stein", xr.Dataset({"x": ("coordinate", np.arange(3.0))}, attrs={"a": 2}))
    stein = compat.get_group(data, "stein")
    assert stein["x"].shape == (3,) and stein.attrs["a"] == 2
    assert compat.group_names(data).count("stein") == 1


def test_rename_and_select_chains_return_copies():
    data = _run_data()
    renamed = compat.rename_vars(data, {"theta": "beta"})
    assert "beta" in renamed.posterior and "theta" in data.posterior
    kept = compat.select_chains(data, [0, 2])
    assert kept.posterior.sizes["chain"] == 2 and data.posterior.sizes["chain"] == 3
    np.testing.assert_array_equal(kept.posterior["theta"].values[1], data.posterior["theta"].values[2])
    assert compat.get_group(kept, "observed_data")["y"].shape == (7,)  # no chain dim: kept as is


def test_netcdf_round_trip_keeps_attributes(tmp_path):
    data = _run_data()
    stats = compat.get_group(data, "sample_stats")
    stats.attrs.update({"diverged_chains": [1], "ksd_scales": np.array([0.5, 2.0]), "ksd": 0.25})
    compat.set_group(data, "sample_stats", stats)
    compat.to_netcdf(data, tmp_path / "run.nc")
    back = compat.from_netcdf(tmp_path / "run.nc")
    assert type(back) is type(data) and compat.group_names(back) == compat.group_names(data)
    for group in compat.group_names(data):
        xr.testing.assert_equal(compat.get_group(back, group), compat.get_group(data, group))
        for key, value in compat.get_group(data, group).attrs.items():
            # (netCDF stores a one-element list as a scalar: compare as arrays)
            np.testing.assert_array_equal(np.ravel(compat.get_group(back, group).attrs[key]), np.ravel(value))
    np.testing.assert_array_equal(back.sample_stats.attrs["ksd_scales"], [0.5, 2.0])


@pytest.fixture(scope="module")
def nuts_idata():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = np.random.default_rng(1).normal([1.0, -1.0], 1.0, size=(50, 2))
    mcmc = MCMC(NUTS(model), num_warmup=200, num_samples=200, num_chains=2,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y, extra_fields=("diverging",))
    return nsg.to_inference_data(mcmc, log_likelihood=True, ksd_draws=100)


def test_to_inference_data_is_native_with_every_group(nuts_idata, tmp_path):
    assert compat.is_run_data(nuts_idata)
    assert set(compat.group_names(nuts_idata)) == {
        "posterior", "sample_stats", "observed_data", "log_likelihood", "stein"}
    assert nuts_idata.sample_stats["ksd"].dims == ("chain",)
    compat.to_netcdf(nuts_idata, tmp_path / "run.nc")
    back = compat.from_netcdf(tmp_path / "run.nc")
    for group in compat.group_names(nuts_idata):
        xr.testing.assert_identical(compat.get_group(back, group), compat.get_group(nuts_idata, group))
    assert nsg.ksd(back) == pytest.approx(nuts_idata.sample_stats.attrs["ksd"])


def test_zarr_round_trip(nuts_idata, tmp_path):
    pytest.importorskip("zarr", reason="zarr is not installed")
    nuts_idata.to_zarr(str(tmp_path / "run.zarr"))
    back = az.from_zarr(str(tmp_path / "run.zarr"))
    for group in compat.group_names(nuts_idata):
        xr.testing.assert_allclose(compat.get_group(back, group), compat.get_group(nuts_idata, group))


def test_arviz_own_functions_accept_the_run(nuts_idata):
    import matplotlib.pyplot as plt

    table = az.summary(nuts_idata, round_to="none")
    assert list(table.index) == ["mu[0]", "mu[1]"] and np.all(table["r_hat"] < 1.05)
    az.plot_forest(nuts_idata)
    if compat.USES_DATATREE:
        az.plot_trace_dist(nuts_idata)
    else:
        az.plot_trace(nuts_idata)
    plt.close("all")
    ours = nsg.posterior_summary(nuts_idata)
    assert np.all(np.isfinite(ours["ksd"]))
    np.testing.assert_allclose(ours["mean"], table["mean"], atol=0.01)


def test_plot_densities_and_reference_comparison(nuts_idata):
    import matplotlib.pyplot as plt

    out = nsg.plot_reference_comparison(nuts_idata, nuts_idata, labels=("a", "b"))
    assert out is not None
    assert plt.gcf().axes  # something was drawn
    plt.close("all")
    table = nsg.compare_to_reference(nuts_idata, nuts_idata)
    np.testing.assert_allclose(table["mean_err"], 0.0, atol=1e-12)
    assert np.isfinite(table.attrs["ksd"])
