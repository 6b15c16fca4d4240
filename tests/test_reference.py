"""NUTS ground truth, ``compare`` and the scale-aware KSD on a real stochastic-gradient run.

One concentrated posterior serves every test here: a logistic regression with N = 20,000,
d = 5, prior N(0, 10²) (posterior sd ≈ 0.02).  The reference is ``nuts_reference`` (500
warmup + 1,000 draws, cached on disk for the module); the runs are SGLD on 10% mini-batches
(n = 2,000) with

* a small step, ε = 1e-5 — accurate: gradient-noise inflation ε·τ̂²/4 ≈ 0.08 and
  discretisation ε/(4σ²) ≈ 0.01 of the variance;
* a deliberately too-large step, ε = 2e-4 — both terms grow 20×, predicted sd inflation
  ≈ 1.6–1.8×.

Measured with these seeds (the numbers the docs quote):

=================  ========  ===================  ===========  ===========  ===========
run                ξ(σ̂)      sd / NUTS sd          KSD common   KSD default  KSD raw
=================  ========  ===================  ===========  ===========  ===========
ε = 1e-5           0.11      0.96 – 1.22          0.30         0.32         18.0
ε = 2e-4           0.69      1.58 – 1.74          0.40         0.78         8.6
NUTS               —         1                    0.11         0.11         —
=================  ========  ===================  ===========  ===========  ===========

"KSD common" scores both runs with NUTS's unconstrained sd (``compare``); "KSD default" each
run with its own sd (``to_inference_data``'s default); "raw" is the papers' form
(``preconditioner=None``), which ranks the inflated chain as *better* — the failure that
made the scale-aware KSD the default (docs/background_ksd.md).
"""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.arviz_compat import from_dict, get_group, rename_vars, set_group
from numpyro_sg.diagnostics.model_scores import thin_indices

N, D = 20_000, 5
SUBSAMPLE = 2_000
SMALL_STEP, LARGE_STEP = 1e-5, 2e-4


def logistic(X, y=None):
    N, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=1000):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=yb)


def _sgld_idata(step_size, X, y, seed=1):
    mcmc = MCMC(
        nsg.SGLD(logistic, step_size=step_size, subsample_size=SUBSAMPLE, preconditioner=None,
                 gradient="plain", init_strategy=numpyro.infer.init_to_uniform),
        num_warmup=1000,
        num_samples=4000,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(seed), X, y)
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))
    return nsg.to_inference_data(mcmc, sampling_time=1.0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D)).astype(np.float32)
    theta = np.array([1.0, -0.5, 0.25, 0.8, -1.0])
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ theta))).astype(np.float32)
    cache = tmp_path_factory.mktemp("nuts_cache")
    ref = nsg.nuts_reference(
        logistic, X, y, num_warmup=500, num_samples=1000, cache_dir=cache, progress_bar=False
    )
    return dict(
        X=X,
        y=y,
        cache=cache,
        ref=ref,
        small=_sgld_idata(SMALL_STEP, X, y),
        large=_sgld_idata(LARGE_STEP, X, y),
    )


def test_nuts_reference_is_full_data_and_cached(runs):
    ref = runs["ref"]
    assert ref.posterior["theta"].shape == (1, 1000, D)
    assert ref.observed_data["y"].shape == (N,)  # full data, not a mini-batch
    assert ref.posterior.attrs["sampling_time"] > 0
    assert "ksd" in ref.sample_stats and np.isfinite(ref.sample_stats.attrs["ksd"])
    cached = list(runs["cache"].glob("nuts_reference_*.nc"))
    assert len(cached) == 1
    again = nsg.nuts_reference(
        logistic, runs["X"], runs["y"], num_warmup=500, num_samples=1000,
        cache_dir=runs["cache"], progress_bar=False,
    )
    assert again.posterior.attrs["cache_file"] == str(cached[0])
    np.testing.assert_array_equal(again.posterior["theta"].values, ref.posterior["theta"].values)
    # other data → another cache entry (keyed by the data's hash); short run, not kept
    y2 = runs["y"].copy()
    y2[0] = 1 - y2[0]
    nsg.nuts_reference(logistic, runs["X"], y2, num_warmup=20, num_samples=20,
                       cache_dir=runs["cache"], progress_bar=False, ksd_draws=10)
    assert len(list(runs["cache"].glob("nuts_reference_*.nc"))) == 2


def test_compare_table_and_xi(runs):
    table = nsg.compare_to_reference(runs["small"], runs["ref"])
    print(table.round(3).to_string(), table.attrs)
    assert list(table.index) == [f"theta[{j}]" for j in range(D)]
    assert {"mean_err", "sd_rel_err", "ess_per_s"} <= set(table.columns)
    sd_run = runs["small"].posterior["theta"].values.reshape(-1, D).astype(float).std(0, ddof=1)
    sd_ref = runs["ref"].posterior["theta"].values.reshape(-1, D).astype(float).std(0, ddof=1)
    np.testing.assert_allclose(table["sd_rel_err"], sd_run / sd_ref - 1, rtol=1e-5)
    xi = np.linalg.norm(sd_run - sd_ref) / np.linalg.norm(sd_ref)
    assert table.attrs["xi_sd"] == pytest.approx(xi, rel=1e-6)
    # the accurate run: measured ξ = 0.11 and |mean error| ≤ 0.3 sd; ESS of 4,000
    # autocorrelated SGLD draws (≈ 150) and of 1,000 NUTS draws bound the noise: 0.3 and 0.6
    assert table.attrs["xi_sd"] < 0.3
    assert np.all(np.abs(table["mean_err"]) < 0.6)
    assert np.all(table["ess_per_s"] > 0)
    for key in ("ksd", "ksd_reference", "sampling_time", "reference_sampling_time"):
        assert np.isfinite(table.attrs[key]), key
    assert table.attrs["ksd_preconditioner"] == "reference sd"


def test_too_large_step_gives_larger_xi_and_ksd(runs):
    small = nsg.compare_to_reference(runs["small"], runs["ref"])
    large = nsg.compare_to_reference(runs["large"], runs["ref"])
    print("xi:", small.attrs["xi_sd"], large.attrs["xi_sd"])
    print("KSD common scale:", small.attrs["ksd"], large.attrs["ksd"], small.attrs["ksd_reference"])
    # measured ξ 0.11 vs 0.69: a 2× margin; KSD 0.30 vs 0.40 (common scale, the same for both)
    assert large.attrs["xi_sd"] > 2 * small.attrs["xi_sd"]
    assert large.attrs["ksd"] > small.attrs["ksd"]
    np.testing.assert_allclose(small.attrs["ksd_scales"], large.attrs["ksd_scales"])
    np.testing.assert_allclose(small.attrs["ksd_reference"], large.attrs["ksd_reference"])
    # NUTS draws are closest to the posterior
    assert small.attrs["ksd_reference"] < small.attrs["ksd"]


def test_default_ksd_ranks_inflated_chain_worse_where_raw_ksd_may_not(runs):
    """The failure of the papers' raw KSD on a concentrated posterior, and the fix."""
    sd = {k: runs[k].posterior["theta"].values.reshape(-1, D).std(0) for k in ("small", "large", "ref")}
    inflation = sd["large"] / sd["ref"]
    print("sd inflation of the large-step chain:", np.round(inflation, 2))
    assert np.mean(inflation) >= 1.5  # measured 1.58–1.74 (mean 1.69)
    default = {k: runs[k].sample_stats.attrs["ksd"] for k in ("small", "large")}
    raw = {k: nsg.ksd(runs[k], preconditioner=None) for k in ("small", "large")}
    print("default (own sd):", default, " raw (preconditioner=None):", raw)
    # measured 0.32 vs 0.78 with the default; raw 18.0 vs 8.6 (wrong way round)
    assert default["large"] > 1.5 * default["small"]
    assert runs["small"].sample_stats.attrs["ksd_preconditioner"] == "sd"


def test_ksds_are_compared_on_equal_numbers_of_draws(runs):
    """The V-statistic KSD of exact draws falls as 1/√T: a run scored on 100 draws (the default's
    floor on large data) is compared with the reference thinned to 100, not its 1,000."""
    ref = runs["ref"]
    stein = get_group(ref, "stein")
    few = ref.copy()
    set_group(few, "stein", stein.isel(draw=thin_indices(stein.sizes["draw"], 100)))
    table = nsg.compare_to_reference(few, ref)
    print(table.attrs["ksd"], table.attrs["ksd_reference"], table.attrs["ksd_draws"])
    assert table.attrs["ksd_draws"] == 100
    # the same 100 NUTS draws on both sides: the same KSD
    assert table.attrs["ksd"] == pytest.approx(table.attrs["ksd_reference"], rel=1e-6)
    # and the reason: all 1,000 give a smaller KSD by far (the diagonal's bias, 1/T of E k(θ, θ))
    assert nsg.ksd(ref, preconditioner=table.attrs["ksd_scales"]) < 0.7 * table.attrs["ksd"]


def test_posteriordb_reference_in_compare():
    from numpyro_sg.datasets.posteriordb import posteriordb_dir, posteriordb_reference

    if not (posteriordb_dir() / "draws" / "sblri-blr.json.zip").exists():
        pytest.skip("posteriordb reference folder not found")
    ref = posteriordb_reference("sblri-blr")
    assert ref.posterior["beta"].shape == (10, 1000, 5)
    # a run that *is* a sample of the reference (other chains): ξ ≈ 0, mean error ≈ 0
    run = from_dict(posterior={k: ref.posterior[k].values[:5] for k in ("beta", "sigma")})
    table = nsg.compare_to_reference(run, ref, ksd=False)
    assert list(table.index) == [f"beta[{j}]" for j in range(5)] + ["sigma"]
    assert table.attrs["xi_sd"] < 0.05  # 5,000 of the 10,000 draws: sampling noise only
    # renamed to the model's site names
    renamed = posteriordb_reference("sblri-blr", names={"beta": "coef"})
    assert "coef" in renamed.posterior and "beta" not in renamed.posterior
    with pytest.raises(ValueError, match="share no variable"):
        nsg.compare_to_reference(from_dict(posterior={"beta": run.posterior["beta"].values}),
                    renamed, var_names=None, ksd=False, reference_names={"sigma": "s"})
    table = nsg.compare_to_reference(rename_vars(run, {"beta": "coef"}), renamed, var_names="coef", ksd=False)
    assert list(table.index) == [f"coef[{j}]" for j in range(5)]


def test_plots_from_the_package(runs, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = nsg.plot_ksd_path({"small step": runs["small"], "large step": runs["large"]},
                           reference=runs["ref"])
    assert len(ax.get_lines()) == 2
    ax.figure.savefig(tmp_path / "ksd_path.png")
    nsg.plot_reference_comparison(runs["small"], runs["ref"])  # axes, or a PlotCollection (ArviZ >= 1)
    assert sum(bool(a.get_title()) for a in plt.gcf().axes) == D
    plt.close("all")


def test_diagnostics_example_runs(tmp_path, capsys):
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "ksd_diagnostics.py"
    module = runpy.run_path(str(script))
    out = tmp_path / "ksd.png"
    module["main"](["--num-data", "2000", "--num-samples", "200", "--out", str(out)])
    assert out.stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "too large" in printed and "ξ(σ̂)" in printed and "mean_err" in printed


def _never_called(*args, **kwargs):
    raise AssertionError("NUTS ran although its result could not be stored")


def test_unwritable_cache_directory_fails_before_nuts_runs(tmp_path, monkeypatch):
    """A cache directory that cannot take a file (here: below a regular file) is reported before
    NUTS runs, not after its draws are lost."""
    import numpyro_sg.results.reference as reference

    monkeypatch.setattr(reference, "_run_nuts", _never_called)
    (tmp_path / "a_file").write_text("")
    X, y = np.zeros((10, 2), np.float32), np.zeros(10, np.float32)
    with pytest.raises(OSError, match="cannot write to the cache directory"):
        nsg.nuts_reference(lambda X, y: None, X, y, cache_dir=tmp_path / "a_file" / "cache")


def test_missing_netcdf_backend_fails_before_nuts_runs(tmp_path, monkeypatch):
    """Without a netCDF backend (ArviZ 1.x brings none) the cache is refused up front, naming the
    packages to install."""
    import importlib.util

    import numpyro_sg.results.reference as reference

    monkeypatch.setattr(reference, "_run_nuts", _never_called)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("netCDF4", "h5netcdf", "h5py") else find_spec(name, *a))
    X, y = np.zeros((10, 2), np.float32), np.zeros(10, np.float32)
    with pytest.raises(ImportError, match="pip install h5netcdf h5py"):
        nsg.nuts_reference(lambda X, y: None, X, y, cache_dir=tmp_path / "cache")


def test_a_models_keyword_passed_to_nuts_names_model_kwargs(monkeypatch):
    """``nuts_reference(model, X, y, subsample_size=200)`` is how ``mcmc.run`` takes a model's
    keyword; here it would reach ``NUTS`` as an unknown argument: the error says where it goes."""
    import numpyro_sg.results.reference as reference

    monkeypatch.setattr(reference, "_run_nuts", _never_called)
    X, y = np.zeros((10, 2), np.float32), np.zeros(10, np.float32)
    with pytest.raises(TypeError, match=r"model_kwargs=\{'subsample_size'"):
        nsg.nuts_reference(lambda X, y, subsample_size=None: None, X, y, subsample_size=5)


def _with_constant_entries(rng, scale=1.0):
    """Draws (2 chains × 500) of a 2×2 Cholesky factor whose first row is fixed (1, 0), as
    ``LKJCholesky`` gives."""
    L = np.zeros((2, 500, 2, 2))
    L[..., 0, 0] = 1.0
    L[..., 1, 0] = scale * rng.normal(size=(2, 500)) * 0.1
    L[..., 1, 1] = np.sqrt(1 - L[..., 1, 0] ** 2)
    return {"L": L}


def test_constant_coordinates_are_left_out_of_the_comparison_without_warnings():
    """An LKJ factor's fixed entries have sd 0 in both runs: no row, no RuntimeWarning."""
    import warnings

    rng = np.random.default_rng(0)
    run, ref = from_dict(posterior=_with_constant_entries(rng)), from_dict(posterior=_with_constant_entries(rng))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        table = nsg.compare_to_reference(run, ref, ksd=False)
    assert list(table.index) == ["L[1, 0]", "L[1, 1]"]
    assert np.all(np.isfinite(table[["mean_err", "sd_rel_err"]].to_numpy()))


def test_posterior_summary_of_constant_coordinates_gives_no_runtime_warning():
    import warnings

    run = from_dict(posterior=_with_constant_entries(np.random.default_rng(1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        table = nsg.posterior_summary(run)
    assert len(table) == 4 and np.isfinite(table.loc["L[1, 0]", "r_hat"])


def test_an_unconverged_reference_warns_and_records_it(tmp_path):
    """A NUTS reference too short to serve as ground truth (bulk ESS far below 100) says so,
    naming the site, and records its diagnostics in its attrs (kept in the disk cache)."""
    from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression

    X, y, _ = simulate_logistic_regression(num_data=200, dim=2)
    with pytest.warns(nsg.ConvergenceWarning, match=r"NUTS has not converged on \['theta'\]"):
        ref = nsg.nuts_reference(logistic_regression_model, X, y, num_warmup=5, num_samples=40,
                                 progress_bar=False, ksd_draws=20, cache_dir=tmp_path)
    attrs = ref.posterior.attrs
    assert attrs["reference_converged"] == 0 and attrs["reference_suspect_sites"] == "theta"
    assert attrs["reference_ess_bulk_min"] < 100
    cached = nsg.nuts_reference(logistic_regression_model, X, y, num_warmup=5, num_samples=40,
                                progress_bar=False, ksd_draws=20, cache_dir=tmp_path)
    assert cached.posterior.attrs["reference_suspect_sites"] == "theta"


def test_a_converged_reference_does_not_warn():
    import warnings

    from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression

    X, y, _ = simulate_logistic_regression(num_data=200, dim=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.ConvergenceWarning)
        ref = nsg.nuts_reference(logistic_regression_model, X, y, num_warmup=300, num_samples=600,
                                 num_chains=2, progress_bar=False, ksd_draws=50)
    assert ref.posterior.attrs["reference_converged"] == 1 and ref.posterior.attrs["reference_rhat_max"] < 1.05


def _normal_mean(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=100):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=numpyro.subsample(y, event_dim=0))


@pytest.mark.parametrize("progress_bar", [True, False])
@pytest.mark.parametrize("chain_method", ["vectorized", "sequential"])
def test_the_run_records_its_sampling_time_for_ess_per_second(chain_method, progress_bar):
    """Without ``sampling_time=`` the kernel's own clock gives it, so that ``ess_per_s`` is known.
    With NumPyro's progress bar (its loop in Python) the bar's readings stamp it (the last
    iteration extrapolated from the last two stamps, and not past the conversion): most of the
    wall time of ``run`` (the warmup, compiles and loop are inside; only NumPyro's bookkeeping
    after the loop is not), a second run's too.  Without the bar, it is the time from ``init``
    to the conversion's start."""
    import time

    y = np.random.default_rng(0).normal(1.0, 1.0, 5_000)
    mcmc = MCMC(nsg.SGLD(_normal_mean), num_warmup=300, num_samples=700, num_chains=2,
                chain_method=chain_method)
    mcmc.progress_bar = progress_bar  # (NumPyro turns it off under pytest-xdist)
    for key in range(2):
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(key), y)
        jax.block_until_ready(mcmc.get_samples())
        elapsed = time.perf_counter() - start
        idata = nsg.to_inference_data(mcmc, ksd=False)
        seconds = idata.posterior.attrs["sampling_time"]
        assert 0.3 * elapsed < seconds <= time.perf_counter() - start
        assert len(mcmc.sampler._clock.segments[-1][1]) >= (2 if progress_bar else 0)  # stamps
    draws = np.random.default_rng(1).normal(y.mean(), 0.0141, (2, 500))
    ref = from_dict(posterior={"mu": draws})
    ref.posterior.attrs["sampling_time"] = 1.0
    table = nsg.compare_to_reference(idata, ref, ksd=False)
    assert np.isfinite(table.loc["mu", "ess_per_s"]) and table.loc["mu", "ess_per_s"] > 0


def test_a_reference_started_at_the_warmups_mode_finds_the_mixtures_components():
    """On three components at −10, 0 and 10 (N = 2,000) NUTS from NumPyro's default start
    settles with two components merged (means ≈ −5.4, −5.2, 4.4 with this key); from the
    warmup's multi-start mode it samples the components (posterior sds ≈ 0.04–0.07: 0.3 is
    over 4 sds)."""
    from test_mode_search import WIDE, _mixture_data

    centers, weights, seed, model = WIDE
    y = _mixture_data(N=2000, seed=seed, centers=centers, weights=weights)
    ref = nsg.nuts_reference(model, y, model_kwargs={"N": 2000}, num_warmup=150, num_samples=150,
                             progress_bar=False, ksd_draws=50, start="mode")
    means = np.sort(ref.posterior["mu"].mean(("chain", "draw")).values)
    np.testing.assert_allclose(means, centers, atol=0.3)


def _collinear_regression(N=2000, seed=0):
    """y = X·w + N(0, 1) noise with two columns correlated 0.999, w ~ N(0, 10²): the posterior is
    Gaussian with covariance (XᵀX + I/100)⁻¹ (a near-singular direction 30× narrower)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=N)
    X = np.column_stack([a, a + 0.045 * rng.normal(size=N), rng.normal(size=N)]).astype(np.float32)
    y = (X @ np.array([1.0, -0.5, 0.3]) + rng.normal(size=N)).astype(np.float32)

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 10).expand([3]).to_event(1))
        with numpyro.plate("data", N, subsample_size=100):
            numpyro.sample("y", dist.Normal(numpyro.subsample(X, event_dim=1) @ w, 1.0),
                           obs=numpyro.subsample(y, event_dim=0))

    return model, X, y, np.linalg.inv(X.T.astype(np.float64) @ X + np.eye(3) / 100)


@pytest.mark.parametrize("dense", [True, False])
def test_a_reference_from_the_mode_starts_nuts_with_the_laplace_mass(dense):
    """``start="mode"`` also gives NUTS the Laplace covariance as its initial inverse mass matrix
    (its diagonal for a diagonal mass): on a Gaussian posterior that is the exact covariance, up
    to the float32 Newton solve (1 %)."""
    from numpyro_sg.results.reference_start import reference_start

    model, X, y, cov = _collinear_regression()
    mass = reference_start(model, (X, y), {}, "mode", dense_mass=dense)["inverse_mass_matrix"]
    np.testing.assert_allclose(mass, cov if dense else np.diag(cov), rtol=0.01, atol=1e-6)


def _stein_run(log_density, dim=4, seed=0):
    """A run with a ``stein`` group whose draws have the given full-data log densities."""
    import xarray as xr

    from numpyro_sg.arviz_compat import set_group

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1, len(log_density), dim))
    idata = from_dict(posterior={"theta": x})
    stein = xr.Dataset({"unconstrained": (("chain", "draw", "coordinate"), x),
                        "score": (("chain", "draw", "coordinate"), -x),
                        "log_density": (("chain", "draw"), np.asarray(log_density)[None])},
                       coords={"coordinate": [f"theta[{j}]" for j in range(dim)]},
                       attrs={"model_dim": dim})
    set_group(idata, "stein", stein)
    return idata


def test_a_reference_far_below_the_run_in_log_density_warns():
    """Draws of one posterior (d = 4) have log densities −χ²₄/2: equal means, no warning; a
    reference 50 nats lower (a merged mode) is no ground truth and says so."""
    import warnings

    rng = np.random.default_rng(0)
    run = _stein_run(-0.5 * rng.chisquare(4, 400))
    same = _stein_run(-0.5 * rng.chisquare(4, 400), seed=1)
    lower = _stein_run(-50 - 0.5 * rng.chisquare(4, 400), seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.ConvergenceWarning)
        table = nsg.compare_to_reference(run, same)
    assert abs(table.attrs["log_density"] - table.attrs["reference_log_density"]) < 0.5
    with pytest.warns(nsg.ConvergenceWarning, match="nats below the run's"):
        nsg.compare_to_reference(run, lower)


def test_sequential_chains_segments_end_where_the_next_one_starts():
    """Sequential chains open one clock segment each; the first chain's end, extrapolated from
    its last two stamps, must not run past the second chain's start (a run's sampling time
    then exceeded its wall time on the current stack's CI)."""
    import time

    from numpyro_sg.infer.run_clock import RunClock

    now = time.perf_counter()
    clock = RunClock()
    # chain 1: stamps at iterations 10 and 20, 1 s apart, then the run stopped at 20 (not 100)
    clock.segments = [(now - 10.0, [(10, now - 9.0), (20, now - 8.0)]),
                      (now - 7.5, [(10, now - 7.0), (100, now - 1.0)])]
    seconds = clock.seconds(100, segments=2)
    # chain 1 capped at chain 2's start (2.5 s), chain 2 extrapolated to iteration 100 (6.5 s)
    assert abs(seconds - 9.0) < 0.05
    assert seconds <= time.perf_counter() - (now - 10.0)
