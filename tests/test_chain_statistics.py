"""ArviZ's convergence statistics computed for all coordinates at once equal ArviZ's own."""

import warnings

import arviz as az
import numpy as np
import pytest

import numpyro_sg as nsg
from numpyro_sg.arviz_compat import ARVIZ_MAJOR, from_dict
from numpyro_sg.diagnostics.chain_statistics import ess_bulk, rank_rhat_and_ess_bulk, summary_diagnostics


def _ar1(rng, chains, draws, d, phi):
    x = np.zeros((chains, draws, d))
    noise = rng.normal(size=(chains, draws, d))
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + noise[:, t]
    return x


def _cases():
    rng = np.random.default_rng(0)
    with_nan = rng.normal(size=(4, 100, 3))
    with_nan[..., 1] = 2.0            # a constant coordinate
    with_nan[0, 5, 2] = np.nan
    return {
        "iid": rng.normal(size=(4, 500, 7)),
        "autocorrelated": _ar1(rng, 4, 300, 5, 0.95) + np.arange(5),
        "nearly_stuck": _ar1(rng, 3, 101, 4, 0.999),     # odd draws: split chains drop the middle one
        "one_chain": _ar1(rng, 1, 200, 3, 0.5),
        "five_draws": rng.normal(size=(2, 5, 3)),
        "three_draws": rng.normal(size=(2, 3, 2)),
        "separated_chains": np.concatenate([rng.normal(size=(2, 400, 3)), 3 + rng.normal(size=(2, 400, 3))]),
        "heavy_skew": rng.exponential(size=(4, 250, 3)) ** 3,
        "ties": rng.integers(0, 3, size=(4, 100, 3)).astype(float),
        "constant_and_nan": with_nan,
    }


@pytest.mark.skipif(ARVIZ_MAJOR >= 1, reason="the reference is ArviZ 0.x's summary (ArviZ 1.x computes its own)")
@pytest.mark.parametrize("name", list(_cases()))
def test_the_diagnostics_equal_arvizs_to_float64_rounding(name):
    """Every column of ``arviz.summary(kind="diagnostics")`` (and ``arviz.ess``/``arviz.rhat``)
    on chains ArviZ's loop treats in each of its branches: Geyer's sequence cut by a negative
    pair or by the chain's length, ties, one chain (R̂ NaN), fewer than 4 draws (NaN), a
    constant coordinate (ESS = draws) and a NaN. Tolerance 1e-9 relative: the same float64
    operations in another order (measured 5e-15)."""
    x = _cases()[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = az.summary({"x": x}, kind="diagnostics", round_to="none")
        ref_ess = np.asarray(az.ess({"x": x}, method="bulk")["x"].values).reshape(-1)
        ref_rhat = np.asarray(az.rhat({"x": x})["x"].values).reshape(-1) if x.shape[0] > 1 else None
    for column, values in summary_diagnostics(x).items():
        np.testing.assert_allclose(values, ref[column].to_numpy(float), rtol=1e-9, atol=1e-12, err_msg=column)
    rhat, ess = rank_rhat_and_ess_bulk(x)
    np.testing.assert_allclose(ess_bulk(x), ref_ess, rtol=1e-9)
    np.testing.assert_allclose(ess, ref_ess, rtol=1e-9)
    if ref_rhat is not None:
        np.testing.assert_allclose(rhat, ref_rhat, rtol=1e-9)


@pytest.mark.skipif(ARVIZ_MAJOR >= 1, reason="the fast path is for ArviZ 0.x")
@pytest.mark.parametrize("options", [{}, {"round_to": "none"}, {"round_to": 4}, {"var_names": ["w"]},
                                     {"var_names": ["~b"], "hdi_prob": 0.9}, {"kind": "stats"}])
def test_posterior_summary_of_many_coordinates_is_arvizs_table(options):
    """A posterior of 306 coordinates (over the 200 from which the diagnostics are vectorised):
    the same rows, columns and numbers as ``az.summary`` with each option (rounded as ArviZ rounds)."""
    rng = np.random.default_rng(1)
    posterior = {"w": rng.normal(size=(4, 300, 20, 15)) + np.linspace(0, 1, 15),
                 "b": rng.standard_t(3, size=(4, 300, 5)), "s": rng.exponential(size=(4, 300))}
    posterior["w"][:, :, 3, 4] = 1.0
    idata = from_dict(posterior=posterior)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, ref = nsg.posterior_summary(idata, **options), az.summary(idata, **options)
    assert list(ours.index) == list(ref.index) and list(ours.columns) == list(ref.columns)
    np.testing.assert_allclose(ours.to_numpy(float), ref.to_numpy(float), rtol=1e-9, atol=1e-12)


@pytest.mark.skipif(ARVIZ_MAJOR >= 1, reason="the fast path is for ArviZ 0.x")
def test_statistics_columns_of_float32_draws_with_named_coordinates_are_arvizs():
    """The statistics columns (mean, sd, HDI) and row labels of the vectorised table, on float32
    draws with string and float coordinates and an odd draw count: exactly ArviZ's."""
    rng = np.random.default_rng(2)
    posterior = {"w": rng.normal(size=(4, 301, 20, 15)).astype(np.float32),
                 "c": rng.standard_t(2, size=(4, 301, 4)).astype(np.float32)}
    idata = from_dict(posterior=posterior, coords={"row": [f"r{i}" for i in range(20)], "k": np.arange(4) * 0.5},
                      dims={"w": ["row", "col"], "c": ["k"]})
    columns = ["mean", "sd", "hdi_25%", "hdi_75%"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = nsg.posterior_summary(idata, hdi_prob=0.5, round_to="none")
        ref = az.summary(idata, hdi_prob=0.5, round_to="none")
    assert list(ours.index) == list(ref.index) and ours.index[0] == "w[r0, 0]" and ours.index[-1] == "c[1.5]"
    np.testing.assert_array_equal(ours[columns].to_numpy(), ref[columns].to_numpy())
