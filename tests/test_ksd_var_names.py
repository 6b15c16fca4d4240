"""KSD and ``to_inference_data`` restricted to some sites (``var_names``): the way to diagnose
a model with tens of thousands of parameters."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.arviz_compat import from_dict, from_netcdf, to_netcdf
from numpyro_sg.diagnostics.ksd import ksd as ksd_of_arrays
from numpyro_sg.diagnostics.model_scores import stein_of, thin_indices

HERE = Path(__file__).resolve().parent
N, PRIOR_SD = 200, 10.0


def model(y):
    """μ ~ N(0, 10²), y_i ~ N(μ, 1) in a subsample plate; θ ~ N(0, I₃) untouched by the data."""
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=50):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=numpyro.subsample(y, event_dim=0))


@pytest.fixture(scope="module")
def exact():
    """Data and exact posterior draws (2 chains × 500): μ | y conjugate normal, θ its prior."""
    rng = np.random.default_rng(0)
    y = rng.normal(1.5, 1.0, size=N)
    precision = N + PRIOR_SD**-2
    mean, sd = y.sum() / precision, precision**-0.5
    draws = {"mu": mean + sd * rng.normal(size=(2, 500)), "theta": rng.normal(size=(2, 500, 3))}
    return y, draws, sd


def _ksd(draws, y, **options):
    return nsg.ksd(from_dict(posterior=draws), model=model, model_args=(y,), **options)


def test_kept_coordinates_are_the_full_scores_columns(exact):
    """``var_names`` keeps the sites' columns of the full-model draws and scores: the KSD equals
    the array KSD of those columns of the full ``stein`` group (same sd scales)."""
    y, draws, _ = exact
    full, _ = stein_of(from_dict(posterior=draws), model, (y,))
    columns = [j for j, site in enumerate(full["site"].values) if site == "theta"]
    x = full["unconstrained"].values.reshape(-1, 4)[:, columns]
    s = full["score"].values.reshape(-1, 4)[:, columns]
    np.testing.assert_allclose(_ksd(draws, y, var_names="theta"), ksd_of_arrays(x, scores=s), rtol=1e-6)
    assert _ksd(draws, y, var_names=["theta"], per_coordinate=True).shape == (3,)


def test_a_shifted_site_is_seen_by_its_own_ksd_only(exact):
    """μ's draws moved by one posterior sd: μ's KSD grows (measured ×15, bound ×3: the exact
    draws' KSD is Monte Carlo noise of order T^(−½)), θ's KSD is unchanged (θ's scores do not
    depend on μ here, and only θ's coordinates enter its kernel)."""
    y, draws, sd = exact
    shifted = {**draws, "mu": draws["mu"] + sd}
    assert _ksd(shifted, y, var_names="mu") > 3.0 * _ksd(draws, y, var_names="mu")
    np.testing.assert_allclose(_ksd(shifted, y, var_names="theta"), _ksd(draws, y, var_names="theta"),
                               rtol=1e-6)


def test_to_inference_data_keeps_the_chosen_sites(tmp_path):
    """The posterior and the ``stein`` group hold only ``var_names``; the stored group answers
    ``ksd(var_names=…)`` of a subset without the model, and survives a netCDF round trip."""
    y = np.random.default_rng(1).normal(1.5, 1.0, size=N)
    mcmc = MCMC(nsg.SGLD(model), num_warmup=200, num_samples=300, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y)
    idata = nsg.to_inference_data(mcmc, var_names=["mu"])
    assert list(idata.posterior.data_vars) == ["mu"]
    assert list(idata.stein["coordinate"].values) == ["mu"]
    assert np.isfinite(idata.sample_stats.attrs["ksd"])
    both = nsg.to_inference_data(mcmc)
    np.testing.assert_allclose(nsg.ksd(both, var_names="mu"), nsg.ksd(idata), rtol=1e-6)
    to_netcdf(idata, tmp_path / "run.nc")
    again = from_netcdf(tmp_path / "run.nc")
    np.testing.assert_allclose(nsg.ksd(again, var_names="mu"), nsg.ksd(idata), rtol=1e-6)


def test_var_names_errors_name_the_fault(exact):
    y, draws, _ = exact
    with pytest.raises(KeyError, match="'sigma'.*continuous latent sites"):
        _ksd(draws, y, var_names=["sigma"])
    with pytest.raises(ValueError, match="laplace.*every coordinate"):
        _ksd(draws, y, var_names="mu", preconditioner="laplace")
    with pytest.raises(TypeError, match="var_names"):
        nsg.ksd(np.zeros((10, 2)), lambda z: -z, var_names="mu")
    stored = nsg.to_inference_data(_tiny_run(y), var_names="theta")
    with pytest.raises(KeyError, match="no coordinates of \\['mu'\\]"):
        nsg.ksd(stored, var_names="mu")


def _tiny_run(y):
    mcmc = MCMC(nsg.SGLD(model), num_warmup=50, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), y)
    return mcmc


def test_diagnostics_of_chosen_sites_at_fifty_thousand_parameters():
    """BPMF with d = 50,040 (2,000 × 3,000, rank 10, 160,000 ratings), its own process:
    ``to_inference_data(var_names=hyperparameters, ksd_draws=200)`` and per-coordinate KSD grow
    the process's memory by less than 1 GB (measured 425 MB; without the memory-bounded score
    blocks it was 2.3 GB, the full-data gradients of 64 draws at once), and keep 40
    coordinates."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(HERE / "highdim_checks.py"), "200"], env=env,
                         capture_output=True, text=True, timeout=1200, cwd=HERE.parent)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["d"] == 50_040 and out["coordinates"] == 40 and out["per_coordinate"] == 20, out
    assert out["posterior"] == ["mu_u", "mu_v", "prec_u", "prec_v"] and out["finite"], out
    assert out["growth_mb"] < 1024, out


def test_a_run_of_chosen_sites_compares_with_a_full_reference(exact):
    """``compare_to_reference`` of a run converted with ``var_names`` against a NUTS reference
    of every site: the table and the common-scale KSD use the run's sites (the reference's
    ``stein`` group is cut to them; it used to refuse the different coordinates), on as many
    draws (the reference's 500 thinned to the run's 50)."""
    y, _, _ = exact
    idata = nsg.to_inference_data(_tiny_run(y), var_names="mu")
    ref = nsg.nuts_reference(model, y, num_warmup=300, num_samples=500, progress_bar=False)
    table = nsg.compare_to_reference(idata, ref)
    assert list(table.index) == ["mu"] and np.isfinite(table.attrs["ksd"]) and table.attrs["ksd_draws"] == 50
    scale = ref.stein["unconstrained"].sel(coordinate=["mu"]).values.reshape(-1, 1).std(axis=0, ddof=1)
    thinned = ref.stein.sel(coordinate=["mu"]).isel(draw=thin_indices(500, 50))
    x, s = (thinned[name].values.reshape(-1, 1) for name in ("unconstrained", "score"))
    np.testing.assert_allclose(table.attrs["ksd_reference"], nsg.ksd(x, scores=s, preconditioner=scale), rtol=1e-5)
