"""Kernel Stein discrepancy: the blocked IMQ KSD against brute force, SGMCMCJax and stein_thinning,
its statistical behaviour, the preconditioner, memory and input validation."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sg.diagnostics.ksd import (
    imq_stein_kernel,
    imq_stein_kernel_per_coordinate,
    ksd,
    ksd_path,
    ksd_per_coordinate,
    ksd_sums,
    ksd_u_statistic,
)
from numpyro_sg.diagnostics.scales import resolve_scales
from numpyro_sg.infer.laplace import laplace_scales


# -- a brute-force O(T²·d) reference written straight from the definition (float64 numpy) ------------


def brute_terms(x, s, c=1.0, beta=-0.5, statistic="v"):
    """(d,) vector of (1/T²)·Σ_{t,t'} k_j (or the U-statistic with t ≠ t')."""
    x, s = np.asarray(x, np.float64), np.asarray(s, np.float64)
    T = len(x)
    r = x[:, None, :] - x[None, :, :]
    u = c**2 + np.sum(r * r, axis=-1, keepdims=True)
    sx, sy = s[:, None, :], s[None, :, :]
    kj = (
        sx * sy * u**beta
        - 2 * beta * u ** (beta - 1) * sx * r
        + 2 * beta * u ** (beta - 1) * sy * r
        - 2 * beta * u ** (beta - 1)
        - 4 * beta * (beta - 1) * u ** (beta - 2) * r * r
    )
    if statistic == "u":
        kj[np.arange(T), np.arange(T)] = 0.0
        return kj.sum((0, 1)) / (T * (T - 1))
    return kj.sum((0, 1)) / T**2


def signed_root(v):
    return np.sign(v) * np.sqrt(np.abs(v))


def brute_ksd(x, s, **kw):
    return np.sqrt(brute_terms(x, s, **kw).sum())


def gaussian(T, d, seed=0, sd=None, mean=None):
    rng = np.random.default_rng(seed)
    sd = np.linspace(0.5, 2.0, d) if sd is None else np.broadcast_to(sd, (d,))
    mean = np.linspace(-1.0, 1.0, d) if mean is None else mean
    x = mean + sd * rng.normal(size=(T, d))

    def score(z):
        return -(z - mean) / sd**2

    return x, score, mean, sd


# -- reference kernel --------------------------------------------------------------------------


def test_stein_kernel_hand_computed():
    # d = 1, x = 1, y = 0, s(x) = 2, s(y) = −1, c = 1, β = −½: r = 1, u = 2,
    # k = 2·(−1)·2^−½ + 2^−3/2·(2·1) − 2^−3/2·(−1·1) + 2^−3/2 − 3·2^−5/2·1
    expected = -2 * 2**-0.5 + 2 * 2**-1.5 + 2**-1.5 + 2**-1.5 - 3 * 2**-2.5
    got = imq_stein_kernel(jnp.array([1.0]), jnp.array([0.0]), jnp.array([2.0]), jnp.array([-1.0]))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # x = y: k = ‖s‖²·c^{2β} − 2β·d·c^{2(β−1)}
    s = jnp.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(
        imq_stein_kernel(jnp.zeros(3), jnp.zeros(3), s, s, c=2.0), 5.25 / 2 + 3 * 2.0**-3, rtol=1e-6
    )


def test_per_coordinate_kernel_sums_to_kernel_and_matches_sgmcmcjax():
    ksd_mod = pytest.importorskip("sgmcmcjax.ksd")
    rng = np.random.default_rng(0)
    x, y, sx, sy = (jnp.asarray(rng.normal(size=4)) for _ in range(4))
    for c, beta in [(1.0, -0.5), (0.7, -0.3)]:
        kj = imq_stein_kernel_per_coordinate(x, y, sx, sy, c, beta)
        assert kj.shape == (4,)
        k = imq_stein_kernel(x, y, sx, sy, c, beta)
        np.testing.assert_allclose(kj.sum(), k, rtol=1e-5)
        np.testing.assert_allclose(k, ksd_mod.k_0_fun(x, y, sx, sy, c, beta), rtol=1e-5)


# -- agreement with the other implementations --------------------------------------------------


def test_matches_sgmcmcjax_imq_ksd():
    ksd_mod = pytest.importorskip("sgmcmcjax.ksd")
    x, score, _, _ = gaussian(400, 4, seed=1)
    s = score(x) + 0.3  # a biased score so the value is not tiny
    # float64 on both sides: 1e-5 relative is then far above rounding (we measured ~1e-15)
    with jax.enable_x64(True):
        ours = ksd(x, scores=s, preconditioner=None)
        theirs = float(ksd_mod.imq_KSD(jnp.asarray(x), jnp.asarray(s)))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    # default float32: both accumulate 160,000 terms in float32; measured ~2e-6 apart
    ours32 = ksd(x, scores=s, preconditioner=None)
    theirs32 = float(ksd_mod.imq_KSD(jnp.asarray(x, jnp.float32), jnp.asarray(s, jnp.float32)))
    np.testing.assert_allclose(ours32, theirs32, rtol=1e-4)


def test_matches_stein_thinning_ksd_and_path():
    kernel = pytest.importorskip("stein_thinning.kernel")
    stein = pytest.importorskip("stein_thinning.stein")
    x, score, _, _ = gaussian(250, 3, seed=2)
    x = x * 1.2  # not exact draws
    s = score(x)
    vfk0 = kernel.make_imq(x, "id")  # IMQ, identity preconditioner, c = 1, β = −½
    path = stein.ksd(lambda i, j: vfk0(x[i], x[j], s[i], s[j]), len(x))  # KSD of the first k, k = 1..T
    with jax.enable_x64(True):
        ours = ksd(x, scores=s, preconditioner=None)
        steps, ours_path = ksd_path(x, scores=s, preconditioner=None, steps=np.arange(1, len(x) + 1))
    np.testing.assert_allclose(ours, path[-1], rtol=1e-5)
    np.testing.assert_array_equal(steps, np.arange(1, len(x) + 1))
    np.testing.assert_allclose(ours_path, path, rtol=1e-5)


# -- blocked computation against brute force ---------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 7, 64, 203, None])
@pytest.mark.parametrize("statistic", ["v", "u"])
def test_blocked_matches_brute_force(block_size, statistic):
    x, score, _, _ = gaussian(203, 3, seed=3)  # 203 is prime: never a multiple of the block
    x = x + 0.2
    s = score(x)
    ref = brute_terms(x, s, statistic=statistic)
    with jax.enable_x64(True):  # float64: agreement to rounding
        tot = ksd_sums(x, s, block_size=block_size, exclude_diagonal=statistic == "u")
        per = ksd_sums(x, s, block_size=block_size, exclude_diagonal=statistic == "u", per_coordinate=True)
        norm = 203**2 if statistic == "v" else 203 * 202
        np.testing.assert_allclose(tot / norm, ref.sum(), rtol=1e-10)
        np.testing.assert_allclose(per / norm, ref, rtol=1e-10)
        k = ksd(x, scores=s, preconditioner=None, statistic=statistic, block_size=block_size)
        kpc = ksd(x, scores=s, preconditioner=None, statistic=statistic, block_size=block_size, per_coordinate=True)
    np.testing.assert_allclose(k, signed_root(ref.sum()), rtol=1e-10)
    # per-coordinate KSD is Σ_j √V_j (Song, Sun, Ye & Liang 2020, supplement §4.4); U terms are signed roots
    np.testing.assert_allclose(kpc, np.sum(signed_root(ref)), rtol=1e-10)


@pytest.mark.parametrize("statistic", ["v", "u"])
def test_one_pass_over_chain_pairs_gives_per_chain_pooled_and_per_coordinate_terms(statistic):
    """``chain_pair_sums`` (what ``to_inference_data`` uses) against the separate sums, float64."""
    from numpyro_sg.diagnostics.ksd_blocks import chain_pair_sums

    x, score, _, _ = gaussian(3 * 67, 4, seed=5)   # 3 chains of 67 draws: never a whole block
    s = score(x + 0.3)
    x, s = x.reshape(3, 67, 4), s.reshape(3, 67, 4)
    ex = statistic == "u"
    with jax.enable_x64(True):
        sums, projected = chain_pair_sums(x, s, exclude_diagonal=ex, block_size=16)
        assert sums.shape == (3, 3, 4) and projected > 0
        for c in range(3):
            np.testing.assert_allclose(sums[c, c].sum(), ksd_sums(x[c], s[c], exclude_diagonal=ex), rtol=1e-10)
        kept = [0, 2]
        np.testing.assert_allclose(
            sums[np.ix_(kept, kept)].sum(axis=(0, 1)),
            ksd_sums(x[kept].reshape(-1, 4), s[kept].reshape(-1, 4), exclude_diagonal=ex, per_coordinate=True),
            rtol=1e-10)
        # a budget the projection (the second call's time × the calls) exceeds stops the pass
        stopped, projected = chain_pair_sums(x, s, exclude_diagonal=ex, block_size=16, seconds=0.0)
        assert stopped is None and projected > 0


def test_float32_accuracy_against_float64_reference():
    # Default float32 path (centred coordinates, float64 accumulation of block sums).  Measured
    # relative errors ~1e-6 (V) and ~1e-4 (U, a difference of larger sums); tolerance 10× that.
    x, score, _, _ = gaussian(1000, 8, seed=4)
    x = 1.3 * x + 3.0  # off-centre, inflated
    s = score(x)
    xs = x / x.std(0)
    ss = s * x.std(0)
    for statistic, rtol in [("v", 1e-5), ("u", 1e-3)]:
        ref = brute_terms(xs, ss, statistic=statistic)
        np.testing.assert_allclose(ksd(x, scores=s, statistic=statistic), signed_root(ref.sum()), rtol=rtol)
        np.testing.assert_allclose(
            ksd_per_coordinate(x, scores=s, statistic=statistic), signed_root(ref), rtol=rtol
        )


def test_default_preconditioner_is_sd_scaling():
    x, score, _, _ = gaussian(300, 3, seed=5)
    s = score(x)
    sd = x.std(0)
    ref = brute_ksd(x / sd, s * sd)
    np.testing.assert_allclose(ksd(x, scores=s), ref, rtol=1e-5)
    np.testing.assert_allclose(ksd(x, scores=s, preconditioner=sd), ref, rtol=1e-5)
    # the sd-preconditioned KSD does not change when a coordinate is rescaled (θ_j → a_j·θ_j + b_j,
    # scores transformed by the chain rule): the raw form does
    a, b = np.array([10.0, 0.01, 1.0]), np.array([5.0, -1.0, 0.0])
    np.testing.assert_allclose(ksd(a * x + b, scores=s / a), ksd(x, scores=s), rtol=1e-5)
    assert abs(ksd(a * x + b, scores=s / a, preconditioner=None) / ksd(x, scores=s, preconditioner=None) - 1) > 0.1


def test_per_coordinate_terms_and_score_function():
    x, score, _, _ = gaussian(256, 4, seed=6)
    x = x[::-1] * 0.8
    terms = ksd_per_coordinate(x, score)  # scores from the function
    assert terms.shape == (4,)
    np.testing.assert_allclose(terms.sum(), ksd(x, score, per_coordinate=True), rtol=1e-6)
    # Σ_j V_j = KSD² (the standard statistic)
    np.testing.assert_allclose(np.sum(terms**2), ksd(x, score) ** 2, rtol=1e-5)
    np.testing.assert_allclose(ksd(x, score), ksd(x, scores=np.asarray(jax.vmap(score)(x))), rtol=1e-6)


def test_u_statistic_negative_is_signed_root():
    # exact draws, small T: the unbiased KSD_U² is negative for this seed; reported as −√|U|
    x, score, _, _ = gaussian(40, 2, seed=0)
    s = score(x)
    u_terms = brute_terms(x / x.std(0), s * x.std(0), statistic="u")
    assert u_terms.sum() < 0
    got = ksd(x, scores=s, statistic="u")
    np.testing.assert_allclose(got, -np.sqrt(-u_terms.sum()), rtol=1e-4)
    np.testing.assert_allclose(
        ksd_per_coordinate(x, scores=s, statistic="u"), np.sign(u_terms) * np.sqrt(np.abs(u_terms)), rtol=1e-3
    )


def test_block_jackknife_se_covers_the_spread_on_an_autocorrelated_chain():
    """AR(1) chains with ρ = 0.98 and an exact N(0, 1) marginal (autocorrelation time ≈ 99,
    1,000 draws): over 100 replicate chains, the spread of KSD_U² is covered by the
    block-jackknife se (10 blocks of 100 draws) — empirical sd / mean se within 0.6–1.6
    (measured 1.12; the blocks are only about one autocorrelation time long, which biases
    the se low, and the sd of 100 replicates of this skewed statistic is itself uncertain by
    ~15%) — while the independent-draw se is several times too small (measured 7.5×)."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(1)
    T, rho = 1000, 0.98
    u, se_block, se_iid = [], [], []
    for r in range(100):
        e = rng.normal(size=(T, 1)) * np.sqrt(1 - rho**2)
        e[0] = rng.normal(size=1)
        x = lfilter([1.0], [1.0, -rho], e, axis=0)  # x_t = ρ·x_{t−1} + e_t
        value, se = ksd_u_statistic(x, -x, num_blocks=10)
        u.append(value)
        se_block.append(se)
        if r < 20:  # the independent-draw se is steady: 20 chains show it
            se_iid.append(ksd_u_statistic(x, -x)[1])
    spread = np.std(u, ddof=1)
    assert 0.6 < spread / np.mean(se_block) < 1.6
    assert spread / np.mean(se_iid) > 3.0
    with pytest.raises(ValueError, match="num_blocks"):
        ksd_u_statistic(x[:10], -x[:10], num_blocks=6)


def test_thin_keeps_every_kth_draw():
    x, score, _, _ = gaussian(301, 2, seed=7)
    s = score(x)
    np.testing.assert_allclose(ksd(x, scores=s, thin=3), ksd(x[::3], scores=s[::3]), rtol=1e-6)
    np.testing.assert_allclose(ksd(x, score, thin=3), ksd(x[::3], scores=s[::3]), rtol=1e-6)


# -- KSD path ----------------------------------------------------------------------------------


def test_path_equals_prefix_ksd_on_one_scale():
    x, score, _, _ = gaussian(500, 3, seed=8)
    x = x + 0.1 * np.arange(500)[:, None] / 500  # drifting chain
    s = score(x)
    steps, vals = ksd_path(x, scores=s, num_steps=4, block_size=64)
    assert steps[-1] == 500 and len(steps) == 4 and np.all(np.diff(steps) > 0)
    sd_all = x.std(0)  # one scale for the whole path: the sd of all draws
    for k, v in zip(steps, vals):
        np.testing.assert_allclose(v, ksd(x[:k], scores=s[:k], preconditioner=sd_all), rtol=1e-5)
    np.testing.assert_allclose(vals[-1], ksd(x, scores=s), rtol=1e-6)
    # arbitrary steps (not multiples of the block), per-coordinate, U, thinning
    steps2 = np.array([3, 130, 499])
    _, pc = ksd_path(x, scores=s, steps=steps2, per_coordinate=True, statistic="u", thin=2, block_size=50)
    for k, v in zip(steps2, pc):
        ref = ksd(x[:k:2], scores=s[:k:2], preconditioner=x[::2].std(0), per_coordinate=True, statistic="u")
        np.testing.assert_allclose(v, ref, rtol=1e-4)
    with pytest.raises(ValueError, match=r"steps must lie in \[1, T\]"):
        ksd_path(x, scores=s, steps=[0, 10])


# -- statistical behaviour ---------------------------------------------------------------------


def test_ksd_of_exact_draws_shrinks_like_inverse_root_T():
    vals = []
    for T in (100, 1000, 10000):
        x, score, _, _ = gaussian(T, 2, seed=10 + T)
        vals.append(ksd(x, score))
    print("KSD of exact draws at T = 100, 1000, 10000:", vals)
    assert vals[0] > vals[1] > vals[2]
    slope = np.polyfit(np.log([100, 1000, 10000]), np.log(vals), 1)[0]
    # V-statistic of exact draws: KSD² ≈ E k_π(θ, θ)/T, so slope −½; ±0.15 covers the seed noise
    assert -0.65 < slope < -0.35, slope


def _ar1(rng, rho, T, d):
    z = np.empty((T, d))
    z[0] = rng.normal(size=d)
    e = rng.normal(size=(T, d)) * np.sqrt(1 - rho**2)
    for t in range(1, T):
        z[t] = rho * z[t - 1] + e[t]
    return z


def test_default_ranks_samples_where_raw_form_misranks():
    # Concentrated Gaussian (sd 0.02, d = 5).  "correct": exact marginals, autocorrelated chain
    # (AR(1), ρ = 0.9, like a small-step SGLD run); "inflated": sd 2× too large; "shifted": mean
    # off by one sd; both mix faster (ρ = 0.5).  Measured with this seed, default (sd):
    # 0.18 vs 1.14 vs 1.32 — asserted with a 2× margin.  Raw form: 11.9 vs 9.9 vs 113 (misranks
    # the inflated sample above the correct one, as the scale-aware KSD does).
    rng = np.random.default_rng(3)
    T, d, sd = 2000, 5, 0.02
    mu = np.linspace(-1, 1, d)

    def score(x):
        return -(x - mu) / sd**2

    samples = {
        "correct": mu + sd * _ar1(rng, 0.9, T, d),
        "inflated": mu + 2 * sd * _ar1(rng, 0.5, T, d),
        "shifted": mu + sd * _ar1(rng, 0.5, T, d) + sd,
    }
    default = {k: ksd(v, scores=score(v)) for k, v in samples.items()}
    raw = {k: ksd(v, scores=score(v), preconditioner=None) for k, v in samples.items()}
    print("default (sd) preconditioner:", default)
    print("raw (preconditioner=None):  ", raw)
    assert 2 * default["correct"] < default["inflated"]
    assert 2 * default["correct"] < default["shifted"]
    pc = {k: ksd(v, scores=score(v), per_coordinate=True) for k, v in samples.items()}
    assert 2 * pc["correct"] < min(pc["inflated"], pc["shifted"])


# -- preconditioner ----------------------------------------------------------------------------


def test_laplace_scales_equal_gaussian_marginal_sds():
    rng = np.random.default_rng(11)
    d = 4
    A = rng.normal(size=(d, d))
    corr = A @ A.T + d * np.eye(d)
    corr = corr / np.sqrt(np.outer(np.diag(corr), np.diag(corr)))
    sds = np.array([0.01, 0.1, 1.0, 10.0])  # very different scales, correlated
    cov = corr * np.outer(sds, sds)
    prec = np.linalg.inv(cov)
    mean = np.array([3.0, -1.0, 0.5, 10.0])

    def score(z):
        return -jnp.asarray(prec, z.dtype) @ (z - jnp.asarray(mean, z.dtype))

    with jax.enable_x64(True):
        scales = laplace_scales(score, np.zeros(d))
    # float64 linear algebra on an exact quadratic: one Newton step is exact
    np.testing.assert_allclose(scales, np.sqrt(np.diag(cov)), rtol=1e-8)
    scales32 = laplace_scales(score, mean + 0.1)
    # float32 scores and Hessian (condition number ~1e4 here): a few 1e-4 relative
    np.testing.assert_allclose(scales32, np.sqrt(np.diag(cov)), rtol=1e-3)
    x = mean + rng.normal(size=(50, d))
    np.testing.assert_allclose(resolve_scales("laplace", x, score), scales32, rtol=1e-3)
    # ksd with preconditioner="laplace" is ksd with those scales
    s = np.asarray(jax.vmap(score)(jnp.asarray(x, jnp.float32)))
    np.testing.assert_allclose(
        ksd(x, score, preconditioner="laplace"), ksd(x, scores=s, preconditioner=scales32), rtol=1e-4
    )


def test_laplace_scales_errors():
    # log π = +‖θ‖²/2: Hessian positive definite everywhere, no mode
    with pytest.raises(ValueError, match="not negative definite"):
        laplace_scales(lambda z: z, jnp.ones(2))
    # log π = −θ⁴/4: Newton converges only linearly (θ ← 2θ/3) and −H → 0
    with pytest.raises(ValueError, match="did not converge"):
        laplace_scales(lambda z: -(z**3), jnp.ones(1), num_steps=5)
    with pytest.raises(ValueError, match="needs the score function"):
        resolve_scales("laplace", np.zeros((3, 2)))


def test_sd_scales_zero_sd_guard():
    x = np.random.default_rng(0).normal(size=(50, 3))
    x[:, 1] = 2.0
    with pytest.warns(UserWarning, match=r"coordinates \[1\] have zero sd"):
        scales = resolve_scales("sd", x)
    assert np.all(np.isfinite(scales) & (scales > 0))
    with pytest.warns(UserWarning):
        assert np.isfinite(ksd(x, scores=-x))


# -- input validation --------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    x = np.random.default_rng(0).normal(size=(20, 2))
    s = -x
    with pytest.raises(ValueError, match=r"x must be 2-D.*reshape\(-1, 1\)"):
        ksd(x[:, 0], scores=s[:, 0])
    with pytest.raises(ValueError, match="scores must have the same shape as x"):
        ksd(x, scores=s[:, :1])
    with pytest.raises(ValueError, match="exactly one of score"):
        ksd(x)
    with pytest.raises(ValueError, match="exactly one of score"):
        ksd(x, lambda z: -z, scores=s)
    bad = x.copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="x has non-finite values.*row 7"):
        ksd(bad, scores=s)
    bad_s = s.copy()
    bad_s[3, 0] = np.inf
    with pytest.raises(ValueError, match="scores has non-finite values.*row 3"):
        ksd(x, scores=bad_s)
    with pytest.raises(ValueError, match=r"scores \(score evaluated at the draws\) has non-finite.*row 0"):
        ksd(np.zeros((5, 2)), lambda z: 1.0 / z)
    with pytest.raises(ValueError, match="score must map a point"):
        ksd(x, lambda z: z[:1])
    with pytest.raises(ValueError, match="preconditioner must be 'sd', 'laplace', None or an array of 2"):
        ksd(x, scores=s, preconditioner="median")
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        ksd(x, scores=s, preconditioner=np.ones(3))
    with pytest.raises(ValueError, match="positive and finite"):
        ksd(x, scores=s, preconditioner=np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="statistic must be"):
        ksd(x, scores=s, statistic="w")
    with pytest.raises(ValueError, match="c must be"):
        ksd(x, scores=s, c=0.0)
    with pytest.raises(ValueError, match="beta must be negative"):
        ksd(x, scores=s, beta=0.5)
    with pytest.raises(ValueError, match="thin must be"):
        ksd(x, scores=s, thin=0)
    with pytest.raises(ValueError, match="block_size must be"):
        ksd(x, scores=s, block_size=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        ksd(x, scores=s, bogus=1)


def test_run_like_input_is_dispatched(monkeypatch):
    from numpyro_sg.diagnostics import stein
    from numpyro_sg.diagnostics.stein import ksd

    calls = {}

    def ksd_of_run(run, **kw):
        calls.update(kw, run=run)
        return 1.5

    monkeypatch.setattr(stein, "ksd_of_run", ksd_of_run)

    class Run:
        posterior = None

    run = Run()
    assert ksd(run, model="m", thin=2, extra=3) == 1.5
    assert calls["run"] is run and calls["model"] == "m" and calls["thin"] == 2 and calls["extra"] == 3
    assert calls["preconditioner"] == "sd" and calls["statistic"] == "v"
    with pytest.raises(TypeError, match="takes arrays"):
        ksd_path(run)


# -- memory ------------------------------------------------------------------------------------

_MEMORY_SCRIPT = textwrap.dedent(
    """
    import resource, time, numpy as np
    from numpyro_sg.diagnostics.ksd import ksd
    T, d = 20000, 50
    x = np.random.default_rng(0).normal(size=(T, d)).astype(np.float32)
    t0 = time.perf_counter()
    v = ksd(x, scores=-x)
    seconds = time.perf_counter() - t0
    try:  # this process's own peak RSS (reset at exec), in kB
        with open("/proc/self/status") as f:
            peak_kb = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    except OSError:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(v, seconds, peak_kb)
    """
)


def test_memory_is_bounded_at_T_20000():
    # A T×T float32 matrix at T = 20,000 is 1.6 GB; the blocked KSD needs O(T·block).  Measured
    # peak RSS ~0.57 GB (~0.3 GB of it is the JAX/numpyro import) and 6–12 s on 2 shared cores.
    # The peak is read in the child (VmHWM): getrusage(RUSAGE_CHILDREN).ru_maxrss is not usable
    # here, because Linux carries the forking parent's RSS (pytest's, ~1 GB) into the child's
    # ru_maxrss across exec.
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT], check=False, capture_output=True, text=True, timeout=600,
        env={**os.environ, "XLA_FLAGS": ""},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    value, seconds, peak_kb = map(float, out.stdout.split())
    peak_mb = peak_kb / 1024
    print(f"T=20000, d=50: KSD {value:.4f} in {seconds:.1f} s, peak RSS {peak_mb:.0f} MB")
    assert peak_mb < 1200
    assert 0 < value < 0.5  # exact draws: KSD² ≈ E k_π(θ, θ)/T = O(d/T)


def test_u_statistic_matrix_form_and_its_standard_error():
    """ksd_u_statistic (Gram-matrix form) equals the blocked U-statistic of ksd(); its se
    matches the spread of KSD_U² over 200 independent samples within 25% (T = 200, N(1, I)
    draws scored against N(0, I), d = 3: a non-degenerate U-statistic)."""
    from numpyro_sg.diagnostics.ksd import ksd, ksd_u_statistic, stein_kernel_matrix, imq_stein_kernel

    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3)) + 3.0
    s = rng.normal(size=(50, 3))
    K = stein_kernel_matrix(x, s, c=1.3, beta=-0.4)
    i, j = 7, 31
    assert K[i, j] == pytest.approx(float(imq_stein_kernel(x[i], x[j], s[i], s[j], 1.3, -0.4)), rel=1e-4)
    u, _ = ksd_u_statistic(x, s)
    assert np.sign(u) * np.sqrt(abs(u)) == pytest.approx(
        ksd(x, scores=s, statistic="u", preconditioner=None), rel=1e-4)
    values, ses = [], []
    for _ in range(200):
        z = rng.normal(size=(200, 3)) + 1.0
        u, se = ksd_u_statistic(z, -z)
        values.append(u)
        ses.append(se)
    assert np.mean(ses) == pytest.approx(np.std(values), rel=0.25)
    with pytest.raises(ValueError, match="T ≥ 2"):
        ksd_u_statistic(x[:1], s[:1])
