"""Finite set Stein discrepancy: against a brute-force formula, its statistical behaviour,
FSSD-opt, preconditioning and input validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sg.diagnostics.fssd import fssd, fssd_statistic, gaussian_locations, median_bandwidth

MU = np.array([1.0, -2.0, 0.5])
SD = np.array([0.5, 1.0, 2.0])


def score(x):
    return -(x - MU) / SD**2


def draws(T, seed=0):
    return MU + SD * np.random.default_rng(seed).normal(size=(T, 3))


def brute_fssd2(x, s, v, sigma):
    """(1/(dJ))·Σ_i Σ_j g_i(v_j)², g_i(v) = mean_t[s_i(x_t)·k(x_t, v) + ∂_{x_i} k(x_t, v)], loops
    over t, j with the kernel derivative taken by jax.grad (independent of the closed form)."""

    def k(a, b):
        return jnp.exp(-jnp.sum((a - b) ** 2) / (2 * sigma**2))

    dk = jax.jit(jax.grad(k))
    k = jax.jit(k)
    T, d = x.shape
    J = v.shape[0]
    g = np.zeros((J, d))
    for j in range(J):
        for t in range(T):
            g[j] += np.asarray(s[t]) * float(k(x[t], v[j])) + np.asarray(dk(x[t], v[j]))
    g /= T
    return np.sum(g**2) / (d * J)


def test_matches_brute_force():
    x = draws(60, seed=1) * 1.3
    s = score(x)
    v = np.random.default_rng(2).normal(size=(4, 3))
    with jax.enable_x64(True):
        ref = brute_fssd2(jnp.asarray(x), s, jnp.asarray(v), 1.7)
        np.testing.assert_allclose(fssd_statistic(x, s, v, 1.7), ref, rtol=1e-10)
        np.testing.assert_allclose(
            fssd(x, scores=s, locations=v, bandwidth=1.7, preconditioner=None), ref, rtol=1e-10
        )
    # float32 default: measured ~1e-7 relative
    np.testing.assert_allclose(
        fssd(x, scores=s, locations=v, bandwidth=1.7, preconditioner=None), ref, rtol=1e-5
    )


def test_preconditioning_applies_to_draws_scores_and_locations():
    x = draws(200, seed=3)
    s = score(x)
    v = draws(5, seed=4)
    scales = np.array([0.1, 1.0, 10.0])
    want = fssd_statistic(x / scales, s * scales, v / scales, 0.8)
    np.testing.assert_allclose(fssd(x, scores=s, locations=v, bandwidth=0.8, preconditioner=scales), want, rtol=1e-5)
    # default "sd": the sd of the draws
    sd = x.std(0)
    np.testing.assert_allclose(
        fssd(x, scores=s, locations=v, bandwidth=0.8), fssd_statistic(x / sd, s * sd, v / sd, 0.8), rtol=1e-5
    )
    # default bandwidth is the median pairwise distance of the preconditioned draws
    np.testing.assert_allclose(
        fssd(x, scores=s, locations=v), fssd_statistic(x / sd, s * sd, v / sd, median_bandwidth(x / sd)), rtol=1e-5
    )
    # the score function gives the same as precomputed scores
    np.testing.assert_allclose(fssd(x, score), fssd(x, scores=s), rtol=1e-5)


def test_default_locations_are_reproducible_gaussian_draws():
    x = draws(500, seed=5)
    s = score(x)
    a = fssd(x, scores=s)
    assert a == fssd(x, scores=s, rng_key=jax.random.PRNGKey(0))
    assert a != fssd(x, scores=s, rng_key=jax.random.PRNGKey(1))
    v = gaussian_locations(x, 4000, jax.random.PRNGKey(0))
    # the Gaussian fitted to the draws: mean and sd within ~4 standard errors (sd/√4000 ≈ 0.016·sd)
    np.testing.assert_allclose(v.mean(0), x.mean(0), atol=float(4 * 0.016 * SD.max()))
    np.testing.assert_allclose(v.std(0), x.std(0), rtol=0.05)


def test_exact_draws_near_zero_and_misfit_samples_larger():
    # Measured (seed 0, T = 2000): exact 2.4e-4, shifted 0.082, inflated 0.014 (FSSD², sd
    # preconditioner, 10 locations); asserted with a 10× margin on the ratios.
    x = draws(2000, seed=0)
    shifted = x + 0.5 * SD
    inflated = MU + 1.5 * (x - MU)
    f_exact = fssd(x, scores=score(x))
    f_shift = fssd(shifted, scores=score(shifted))
    f_infl = fssd(inflated, scores=score(inflated))
    print("FSSD² exact, shifted, inflated:", f_exact, f_shift, f_infl)
    assert 0 <= f_exact < 1e-3
    assert f_shift > 10 * f_exact
    assert f_infl > 10 * f_exact
    # plug-in statistic: for exact draws it is O(1/T); 10× the draws → several times smaller
    x_big = draws(20000, seed=0)
    f_big = fssd(x_big, scores=score(x_big))
    assert f_big < f_exact / 3, (f_big, f_exact)


def test_fssd_opt_at_least_initial_and_improves_on_misfit():
    x = draws(1000, seed=6)
    for sample in (x, x + 0.3 * SD):
        s = score(sample)
        init = fssd(sample, scores=s)
        opt = fssd(sample, scores=s, optimize=True)
        both = fssd(sample, scores=s, optimize=True, optimize_bandwidth=True)
        print("FSSD² initial, opt, opt with bandwidth:", init, opt, both)
        assert opt >= init
        assert both >= init
    # on a misfit sample the ascent finds markedly better locations (measured ~1.7×)
    assert opt > 1.2 * init
    # zero steps: the initial value
    assert fssd(sample, scores=s, optimize=True, num_opt_steps=0) == pytest.approx(init, rel=1e-6)


def test_thin():
    x = draws(301, seed=7)
    s = score(x)
    np.testing.assert_allclose(fssd(x, scores=s, thin=3), fssd(x[::3], scores=s[::3]), rtol=1e-6)


def test_bad_inputs():
    x = draws(30)
    s = score(x)
    with pytest.raises(ValueError, match="x must be 2-D"):
        fssd(x[:, 0], scores=s[:, 0])
    with pytest.raises(ValueError, match="scores must have the same shape"):
        fssd(x, scores=s[:10])
    bad = s.copy()
    bad[4, 2] = np.nan
    with pytest.raises(ValueError, match="scores has non-finite values.*row 4"):
        fssd(x, scores=bad)
    with pytest.raises(ValueError, match="locations must have shape"):
        fssd(x, scores=s, locations=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="bandwidth must be"):
        fssd(x, scores=s, bandwidth=-1.0)
    with pytest.raises(ValueError, match="num_locations must be"):
        fssd(x, scores=s, num_locations=0)
    with pytest.raises(ValueError, match="preconditioner must be"):
        fssd(x, scores=s, preconditioner="bogus")
    with pytest.raises(ValueError, match="learning_rate must be"):
        fssd(x, scores=s, optimize=True, learning_rate=0.0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        fssd(x, scores=s, bogus=1)


def test_run_like_input_is_dispatched(monkeypatch):
    from numpyro_sg.diagnostics import stein
    from numpyro_sg.diagnostics.stein import fssd

    calls = {}

    def fssd_of_run(run, **kw):
        calls.update(kw, run=run)
        return 0.25

    monkeypatch.setattr(stein, "fssd_of_run", fssd_of_run)

    class Run:
        def get_samples(self):
            return {}

    run = Run()
    assert fssd(run, model="m", optimize=True, extra=1) == 0.25
    assert calls["run"] is run and calls["model"] == "m" and calls["optimize"] is True and calls["extra"] == 1
