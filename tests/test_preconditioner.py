"""The preconditioner's working frame and its moments, tested alone (no model, no kernel).

θ = θ₀ + L·u with M = L·Lᵀ in three forms (identity, diagonal ``scale``, dense ``chol``);
the running moments of the draws, their pooling over chains, the adapted preconditioner and
the draws' distance from the Laplace Gaussian (``laplace_misfit``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sg.infer.preconditioner import (
    Moments,
    Preconditioner,
    adapted_preconditioner,
    from_working,
    identity_preconditioner,
    init_moments,
    laplace_misfit,
    pool_moments,
    rows_to_working,
    to_working,
    update_moments,
)

D = 4


def _covariance(seed=0, d=D):
    """A well-conditioned covariance with strong correlations (not diagonal)."""
    A = np.random.default_rng(seed).normal(size=(d, d))
    return A @ A.T + 0.5 * np.eye(d)


def _forms():
    """The three forms with their L as an explicit float64 matrix."""
    C = _covariance()
    L = np.linalg.cholesky(C)
    scale = np.array([0.1, 2.0, 0.5, 3.0])
    return {
        "identity": (identity_preconditioner(), np.eye(D)),
        "diagonal": (Preconditioner(scale=jnp.asarray(scale, jnp.float32)), np.diag(scale)),
        "dense": (Preconditioner(chol=jnp.asarray(L, jnp.float32)), L),
    }


FORMS = ["identity", "diagonal", "dense"]


# -- the working frame ------------------------------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_kind_and_maps_are_l_and_l_transpose(form):
    """to_working is Lᵀ·g and from_working is L·u (float32 products: rtol 1e-5)."""
    P, L = _forms()[form]
    assert P.kind == form
    rng = np.random.default_rng(1)
    g, u = rng.normal(size=D), rng.normal(size=D)
    np.testing.assert_allclose(to_working(P, jnp.asarray(g, jnp.float32)), L.T @ g, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(from_working(P, jnp.asarray(u, jnp.float32)), L @ u, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", FORMS)
def test_working_gradient_is_the_chain_rule_of_theta_equals_theta0_plus_l_u(form):
    """The round trip that makes the kernels correct: for f(θ) and θ = θ₀ + from_working(P, u),
    ∇_u f = to_working(P, ∇_θ f(θ)) (autodiff through from_working against to_working; both
    in float32, rtol 1e-5), and the pairing ⟨to_working(g), u⟩ = ⟨g, from_working(u)⟩."""
    P, _ = _forms()[form]
    theta0 = jnp.array([0.3, -1.0, 2.0, 0.5])

    def f(theta):
        return jnp.sum(jnp.sin(theta) * theta**2) + theta[0] * theta[3]

    u = jnp.array([0.2, -0.4, 0.1, 0.7])
    theta = theta0 + from_working(P, u)
    by_autodiff = jax.grad(lambda v: f(theta0 + from_working(P, v)))(u)
    np.testing.assert_allclose(by_autodiff, to_working(P, jax.grad(f)(theta)), rtol=1e-5, atol=1e-5)
    g = jnp.array([1.0, -2.0, 0.5, 0.25])
    np.testing.assert_allclose(jnp.vdot(to_working(P, g), u), jnp.vdot(g, from_working(P, u)), rtol=1e-5)


@pytest.mark.parametrize("form", FORMS)
def test_rows_to_working_is_to_working_row_by_row(form):
    P, _ = _forms()[form]
    G = jnp.asarray(np.random.default_rng(2).normal(size=(7, D)), jnp.float32)
    np.testing.assert_allclose(rows_to_working(P, G), jax.vmap(lambda g: to_working(P, g))(G),
                               rtol=1e-5, atol=1e-6)


def test_a_gaussian_whitened_by_its_own_covariance_has_working_gradient_minus_u():
    """log N(θ; μ, C) with θ = μ + L·u, L·Lᵀ = C: ∇_u = Lᵀ·(−C⁻¹·L·u) = −u, for the dense
    factor and, with a diagonal C, for the diagonal one (float32: atol 1e-4 for |u| ≤ 3)."""
    C = _covariance(3)
    mu = np.array([1.0, -2.0, 0.5, 4.0])
    u = np.array([1.5, -3.0, 0.25, 2.0])
    for cov, P in (
        (C, Preconditioner(chol=jnp.asarray(np.linalg.cholesky(C), jnp.float32))),
        (np.diag(np.diag(C)), Preconditioner(scale=jnp.asarray(np.sqrt(np.diag(C)), jnp.float32))),
    ):
        prec = jnp.asarray(np.linalg.inv(cov), jnp.float32)
        theta = jnp.asarray(mu, jnp.float32) + from_working(P, jnp.asarray(u, jnp.float32))
        g = -prec @ (theta - jnp.asarray(mu, jnp.float32))
        np.testing.assert_allclose(to_working(P, g), -u, atol=1e-4)


# -- moments ------------------------------------------------------------------------------------
def _scan_moments(x, dense, active=None):
    m = init_moments(x.shape[1], dense)
    active = np.ones(len(x), bool) if active is None else active
    return jax.lax.scan(lambda mm, xa: (update_moments(mm, xa[0], xa[1]), None), m,
                        (jnp.asarray(x, jnp.float32), jnp.asarray(active)))[0]


@pytest.mark.parametrize("dense", [True, False])
def test_welford_moments_are_numpy_mean_and_covariance(dense):
    """Welford's update over 500 points (offset by 10 so a naive Σx² would lose digits in
    float32) against numpy in float64: rtol 1e-4 (float32 accumulation over 500 terms ≈ 1e-5);
    inactive points are skipped exactly."""
    rng = np.random.default_rng(4)
    x = 10.0 + rng.multivariate_normal(np.zeros(D), _covariance(4), size=500)
    m = _scan_moments(x, dense)
    assert float(m.count) == 500
    np.testing.assert_allclose(m.mean, x.mean(0), rtol=1e-4)
    cov = np.asarray(m.m2, np.float64) / (500 - 1)
    ref = np.cov(x.T)
    np.testing.assert_allclose(cov, ref if dense else np.diag(ref), rtol=1e-4, atol=1e-4 * ref.max())
    active = rng.random(500) < 0.5
    masked = _scan_moments(x, dense, active)
    assert float(masked.count) == active.sum()
    np.testing.assert_allclose(masked.mean, x[active].mean(0), rtol=1e-4)
    ref = np.cov(x[active].T)
    np.testing.assert_allclose(np.asarray(masked.m2) / (active.sum() - 1), ref if dense else np.diag(ref),
                               rtol=1e-4, atol=1e-4 * ref.max())


@pytest.mark.parametrize("dense", [True, False])
def test_pooled_moments_of_chains_are_the_moments_of_all_draws(dense):
    """Three chains of different lengths and different centres (so the between-chain term
    matters): pool_moments is numpy's mean and covariance of the concatenated draws
    (rtol 1e-4, float32 per-chain moments)."""
    rng = np.random.default_rng(5)
    chains = [rng.normal(loc=c, size=(n, D)) @ np.linalg.cholesky(_covariance(5)).T
              for c, n in ((0.0, 300), (2.0, 200), (-1.0, 450))]
    ms = [_scan_moments(x, dense) for x in chains]
    n, mean, cov = pool_moments([m.count for m in ms], [m.mean for m in ms], [m.m2 for m in ms])
    allx = np.concatenate(chains)
    assert n == len(allx)
    np.testing.assert_allclose(mean, allx.mean(0), rtol=1e-4, atol=1e-5)
    ref = np.cov(allx.T)
    np.testing.assert_allclose(cov, ref if dense else np.diag(ref), rtol=1e-4, atol=1e-5)
    within_only = sum(np.asarray(m.m2, np.float64) for m in ms) / (n - 1)
    assert not np.allclose(within_only, cov, rtol=0.05)  # the between-chain term was needed


# -- the adapted preconditioner -------------------------------------------------------------------
def _moments_with_covariance(C, n):
    """Moments of n draws whose sample covariance is exactly C."""
    m2 = (n - 1.0) * C
    return Moments(jnp.asarray(float(n), jnp.float32), jnp.zeros(C.shape[0], jnp.float32),
                   jnp.asarray(m2, jnp.float32))


def test_adapted_preconditioner_is_the_shrunk_sample_covariance():
    """Exact moments (no sampling): L·Lᵀ = (n/(n+5))·S + (5/(n+5))·M for the dense form,
    the diagonal analogue for the diagonal and identity forms (float32: rtol 1e-5)."""
    C, n = _covariance(6), 45  # weight n/(n+5) = 0.9: the shrinkage is visible
    M_old = np.diag([4.0, 1.0, 0.25, 1.0])
    dense = adapted_preconditioner(Preconditioner(chol=jnp.asarray(np.sqrt(M_old), jnp.float32)),
                                   _moments_with_covariance(C, n))
    L = np.asarray(dense.chol, np.float64)
    np.testing.assert_allclose(L @ L.T, 0.9 * C + 0.1 * M_old, rtol=1e-5)
    assert np.allclose(L, np.tril(L))  # a Cholesky factor
    diag_m = Moments(jnp.asarray(float(n)), jnp.zeros(D), jnp.asarray((n - 1.0) * np.diag(C), jnp.float32))
    diagonal = adapted_preconditioner(Preconditioner(scale=jnp.asarray([2.0, 1.0, 0.5, 1.0], jnp.float32)), diag_m)
    np.testing.assert_allclose(np.asarray(diagonal.scale) ** 2, 0.9 * np.diag(C) + 0.1 * np.diag(M_old), rtol=1e-5)
    identity = adapted_preconditioner(identity_preconditioner(), diag_m)
    np.testing.assert_allclose(np.asarray(identity.scale) ** 2, 0.9 * np.diag(C) + 0.1, rtol=1e-5)
    # (from sampled draws: tests/test_warmup.py::test_adapted_preconditioner_estimates_the_covariance)


def test_a_failed_factorisation_keeps_the_preconditioner():
    """Non-finite moments (a diverged chain): the factorisation is not finite and P is kept."""
    bad = _moments_with_covariance(_covariance(8), 50)._replace(m2=jnp.full((D, D), jnp.nan))
    P = Preconditioner(chol=jnp.asarray(np.linalg.cholesky(_covariance(9)), jnp.float32))
    np.testing.assert_array_equal(adapted_preconditioner(P, bad).chol, P.chol)
    Pd = Preconditioner(scale=jnp.asarray([1.0, 2.0, 3.0, 4.0], jnp.float32))
    bad_d = Moments(bad.count, bad.mean, jnp.full((D,), jnp.nan))
    np.testing.assert_array_equal(adapted_preconditioner(Pd, bad_d).scale, Pd.scale)


# -- the misfit report -------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["diagonal", "dense"])
def test_laplace_misfit_is_small_for_laplace_draws_and_large_otherwise(form):
    """4,000 draws of N(mode, L·Lᵀ): the whitened mean offset has sd 1/√4000 = 0.016 per
    coordinate (tolerance 0.08, 5 sd) and the whitened covariance's eigenvalues are within
    ≈ 2·√(d/n) = 0.06 of 1 (tolerance [0.85, 1.15]).  Draws shifted by 3 sds along one
    coordinate report an offset ≈ 3, draws with sds 2× too wide eigenvalues ≈ 4."""
    P, L = _forms()[form]
    mode = np.array([1.0, -1.0, 0.5, 2.0])
    rng = np.random.default_rng(10)
    z = rng.normal(size=(4000, D))
    draws = mode + z @ L.T

    def misfit(x):
        return laplace_misfit(P, mode, x.mean(0), np.cov(x.T))

    offset, low, high = misfit(draws)
    assert offset < 0.08 and 0.85 < low <= high < 1.15, (offset, low, high)
    shift = np.zeros(D)
    shift[1] = 3.0
    offset, low, high = misfit(mode + (z + shift) @ L.T)
    assert 2.9 < offset < 3.1 and 0.85 < low <= high < 1.15, (offset, low, high)
    offset, low, high = misfit(mode + 2.0 * z @ L.T)
    assert offset < 0.16 and 3.4 < low <= high < 4.6, (offset, low, high)
    # a (d,) variance vector (diagonal moments) reads as the diagonal covariance matrix
    var = np.var(draws, 0, ddof=1)
    assert laplace_misfit(P, mode, draws.mean(0), var) == pytest.approx(
        laplace_misfit(P, mode, draws.mean(0), np.diag(var)))


def test_misfit_report_allows_for_the_sampling_noise_of_many_dimensions():
    """300 exact draws (2 chains) of a 200-dimensional Gaussian that the Laplace approximation
    fits: their sample covariance's whitened eigenvalues spread over about (1 ± √(200/300))²
    ≈ [0.03, 3.3] (Marchenko–Pastur), below the raw lower limit 0.25, so the report would call a
    perfect fit a misfit; with the sampling-noise allowance it says nothing.  The same draws
    shifted by 10 Laplace sds along one coordinate are still reported."""
    from types import SimpleNamespace

    from numpyro_sg.kernels.gradient import GradientKernel
    from numpyro_sg.kernels.report import misfit_report

    d, draws = 200, 300
    rng = np.random.default_rng(0)
    L = np.tril(0.1 * rng.normal(size=(d, d))) + np.eye(d)
    fit = SimpleNamespace(preconditioner=Preconditioner(chol=jnp.asarray(L, jnp.float32)), mode=np.zeros(d))
    limits = (GradientKernel.MISFIT_OFFSET, GradientKernel.MISFIT_EIGENVALUES)

    def report(x):
        chains = np.split(x, 2)
        counts = np.array([len(c) for c in chains], np.float64)
        means = np.stack([c.mean(0) for c in chains])
        m2s = np.stack([(c - c.mean(0)).T @ (c - c.mean(0)) for c in chains])
        return misfit_report(fit, counts, means, m2s, limits)

    z = rng.normal(size=(draws, d))
    _, low, _ = laplace_misfit(fit.preconditioner, fit.mode, (z @ L.T).mean(0), np.cov((z @ L.T).T))
    assert low < limits[1][0], low       # the raw limits would flag these exact draws
    assert report(z @ L.T) == []
    shift = np.zeros(d)
    shift[3] = 10.0
    assert len(report((z + shift) @ L.T)) == 1
