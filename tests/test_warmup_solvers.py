"""The warmup's solvers against exact answers: damped Newton (the Laplace approximation and the
warmup's mode search) on a logistic regression against scipy, the Hutchinson curvature diagonal
against the exact one, the mode search on a conjugate Gaussian model against its closed-form
posterior, and the report of a mode search that ran out of Newton steps."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import linear_model, logistic_model
from scipy import optimize, stats

import numpyro_sg as nsg
from numpyro_sg.infer import curvature, refinement
from numpyro_sg.infer.laplace import damped_newton_step, laplace_approximation, laplace_scales
from numpyro_sg.infer.curvature import laplace_preconditioner, whitened_top_eigenvalue
from numpyro_sg.infer.multistart import break_symmetry
from numpyro_sg.infer.warmup import WarmupOptions, fit_model_mode

PRIOR_SD = 3.0  # conftest.logistic_model's N(0, 3²) prior


def _logistic_reference(X, y):
    """Mode of the full-data log posterior of ``logistic_model`` by scipy (float64, exact
    gradient and Hessian, trust-region Newton to ‖∇‖ ≤ 1e-10) and −H there."""
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)

    def neg_log_post(t):
        eta = X @ t
        return -(y @ eta - np.logaddexp(0.0, eta).sum()) + t @ t / (2 * PRIOR_SD**2)

    def neg_hessian(t):
        p = 1 / (1 + np.exp(-X @ t))
        return (X.T * (p * (1 - p))) @ X + np.eye(X.shape[1]) / PRIOR_SD**2

    def grad(t):
        return -X.T @ (y - 1 / (1 + np.exp(-X @ t))) + t / PRIOR_SD**2

    res = optimize.minimize(neg_log_post, np.zeros(X.shape[1]), jac=grad, hess=neg_hessian,
                            method="trust-exact", options={"gtol": 1e-10})
    assert res.success, res
    return res.x, neg_hessian(res.x)


# -- damped Newton ---------------------------------------------------------------------------------
def test_damped_newton_step_solves_or_damps():
    """A concave point: the step is (−H)⁻¹·g exactly and sd = √diag((−H)⁻¹); a saddle (−H
    indefinite): damped, and the step still goes uphill (gᵀ·step > 0); the diagonal form the
    same coordinate by coordinate."""
    A = np.array([[3.0, 1.0], [1.0, 2.0]])
    g = np.array([1.0, -2.0])
    step, sd, damped = damped_newton_step(A, g)
    assert not damped
    np.testing.assert_allclose(step, np.linalg.solve(A, g), rtol=1e-12)
    np.testing.assert_allclose(sd, np.sqrt(np.diag(np.linalg.inv(A))), rtol=1e-12)
    saddle = np.array([[1.0, 0.0], [0.0, -2.0]])
    step, sd, damped = damped_newton_step(saddle, g)
    assert damped and g @ step > 0 and np.all(np.isfinite(sd))
    step, sd, damped = damped_newton_step(np.array([2.0, 4.0]), g)
    assert not damped
    np.testing.assert_allclose(step, g / np.array([2.0, 4.0]))
    step, _, damped = damped_newton_step(np.array([2.0, -4.0]), g)
    assert damped and g @ step > 0


def test_laplace_approximation_finds_the_exact_mode_and_curvature_of_a_logistic_regression(logistic_data):
    """Newton on the JAX score from a start 3 units away, against scipy's float64 optimum.
    Newton stops after a step below 1e-4 Laplace sds and converges quadratically, so the mode's
    error is far below that; the score is float32 (relative rounding ≈ 1e-7 of Σ|terms| for N =
    500, ≈ 1e-6 sd at the mode): tolerance 1e-3 sd.  The scales √diag((−H)⁻¹) from a float32
    Hessian: rtol 1e-4."""
    X, y = logistic_data
    mode_ref, neg_h = _logistic_reference(X, y)
    sd_ref = np.sqrt(np.diag(np.linalg.inv(neg_h)))
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def score(t):
        return Xj.T @ (yj - jax.nn.sigmoid(Xj @ t)) - t / PRIOR_SD**2

    mode, scales = laplace_approximation(score, jnp.array([-2.0, 2.0, -1.0]))
    np.testing.assert_array_less(np.abs(mode - mode_ref) / sd_ref, 1e-3)
    np.testing.assert_allclose(scales, sd_ref, rtol=1e-4)
    np.testing.assert_allclose(laplace_scales(score, jnp.zeros(3)), sd_ref, rtol=1e-4)
    with pytest.raises(ValueError, match="did not converge in 1 steps"):
        laplace_approximation(score, jnp.array([-2.0, 2.0, -1.0]), num_steps=1)


def test_mode_search_on_a_logistic_regression_is_scipys_mode_and_hessian(logistic_data):
    """The warmup's Newton loop alone (no Adam phase) from the zero point, on the full data (N
    = 500 ≤ hessian_rows: the Hessian is exact).  It stops *before* taking a last step that is
    below ``tolerance`` = 1e-3 Laplace sds, so the mode is within ≈ 1e-3 sd of scipy's
    (tolerance 2e-3 sd); L·Lᵀ is the inverse of scipy's −H there (float32 Hessian and factor:
    rtol 1e-3, which also covers the 1e-3 sd offset of the point it is computed at)."""
    X, y = logistic_data
    mode_ref, neg_h = _logistic_reference(X, y)
    cov_ref = np.linalg.inv(neg_h)
    sd_ref = np.sqrt(np.diag(cov_ref))
    fit, _, unravel = fit_model_mode(logistic_model, (X, y), options=WarmupOptions(optimizer_steps=0))
    assert fit.converged and 3 <= fit.newton_steps <= 8, fit.newton_steps
    mode = np.asarray(unravel(fit.mode)["theta"], np.float64)
    np.testing.assert_array_less(np.abs(mode - mode_ref) / sd_ref, 2e-3)
    L = np.asarray(fit.preconditioner.chol, np.float64)
    np.testing.assert_allclose(L @ L.T, cov_ref, rtol=1e-3, atol=1e-3 * sd_ref.max() ** 2)
    np.testing.assert_allclose(fit.scales, sd_ref, rtol=1e-3)
    # the full-data gradient at the mode is the control-variate anchor's: ≈ 0 there
    np.testing.assert_array_less(np.abs(np.asarray(fit.grad)) * sd_ref, 2e-3)


def test_too_few_newton_steps_from_a_far_start_is_reported(logistic_data):
    """From the zero point Newton needs ≥ 3 steps on this posterior (previous test); with 2
    the fit says converged=False and the kernel's init warns, naming the count."""
    kernel = nsg.SGLD(logistic_model, warmup_options=dict(optimizer_steps=0, newton_steps=2))
    with pytest.warns(nsg.ConvergenceWarning, match="did not converge in 2 Newton steps"):
        kernel.init(jax.random.PRNGKey(0), 10, None, logistic_data, {})
    assert kernel.mode_fit.converged is False and kernel.mode_fit.newton_steps == 2


# -- a conjugate Gaussian model --------------------------------------------------------------------
B0_SD, BETA_SD = 100.0, 2.0


def shifted_linear_model(X, y=None, n=100):
    """Linear regression with known noise sd 1 and an intercept far from 0 (a far start for the
    mode search): a Gaussian posterior in closed form, with two sites."""
    N, d = X.shape
    b0 = numpyro.sample("b0", dist.Normal(0.0, B0_SD))
    beta = numpyro.sample("beta", dist.Normal(0.0, BETA_SD).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(b0 + Xb @ beta, 1.0), obs=yb)


@pytest.mark.parametrize("d", [3, 80])
def test_mode_search_on_a_conjugate_gaussian_is_the_exact_posterior(d, monkeypatch):
    """Posterior N(m, S) with S = (ZᵀZ + diag(prior precisions))⁻¹, m = S·Zᵀy, Z = [1, X].  The
    log posterior is quadratic: one Newton step lands on the mode and the next one confirms it,
    so exactly 2 steps; mode within 1e-3 sd (float32 gradient of N = 1,000 rows at a start 40
    posterior sd·1000 away: relative rounding ≈ 1e-6 of the step), L·Lᵀ = S (rtol 1e-3) and
    log π(mode) the closed-form value (float32 sum over 1,000 rows: rtol 1e-5).  With d = 80
    the memory budget is cut to nothing, so −H is assembled one Hessian-vector product at a
    time (the path that keeps large models' dense Hessians within memory)."""
    if d > 64:
        monkeypatch.setattr(curvature, "HESSIAN_MEMORY", 1)
    rng = np.random.default_rng(3)
    N = 1000
    X = rng.normal(size=(N, d)).astype(np.float32)
    y = (40.0 + X @ np.resize([0.5, -1.0, 2.0], d) + rng.normal(size=N)).astype(np.float32)
    Z = np.column_stack([np.ones(N), X]).astype(np.float64)
    prec = Z.T @ Z + np.diag([B0_SD**-2] + [BETA_SD**-2] * d)
    S = np.linalg.inv(prec)
    m = S @ Z.T @ y.astype(np.float64)
    sd = np.sqrt(np.diag(S))
    fit, _, unravel = fit_model_mode(shifted_linear_model, (X, y), options=WarmupOptions(optimizer_steps=0))
    assert fit.converged and fit.newton_steps == 2, (fit.converged, fit.newton_steps)
    # the flat order of the sites (b0, beta) read from unravel, not assumed
    where = unravel(jnp.arange(d + 1, dtype=jnp.float32))
    order = np.concatenate([np.atleast_1d(where["b0"]), where["beta"]]).astype(int)
    mode = np.empty(d + 1)
    mode[order] = np.asarray(fit.mode, np.float64)
    np.testing.assert_array_less(np.abs(mode - m) / sd, 1e-3)
    L = np.asarray(fit.preconditioner.chol, np.float64)
    cov = np.empty_like(S)
    cov[np.ix_(order, order)] = L @ L.T
    np.testing.assert_allclose(cov, S, rtol=1e-3, atol=1e-3 * sd.max() ** 2)
    log_post = (stats.norm.logpdf(m[0], 0, B0_SD) + stats.norm.logpdf(m[1:], 0, BETA_SD).sum()
                + stats.norm.logpdf(y, Z @ m, 1.0).sum())
    assert fit.log_density == pytest.approx(log_post, rel=1e-5)


def test_hessian_from_blocks_of_products_is_the_hessian():
    """Any block size gives jax.hessian's matrix (float32 products: rtol 1e-5); the block sizes
    follow the memory budget, clipped to 1..d."""
    A = np.random.default_rng(0).normal(size=(10, 10)).astype(np.float32)
    f = lambda x: jnp.sum(jnp.sin(A @ x)) + x @ x   # noqa: E731
    x0 = jnp.linspace(-1.0, 1.0, 10)
    products = jax.vmap(lambda v: jax.jvp(jax.grad(f), (x0,), (v,))[1])
    for block in (1, 3, 10):
        np.testing.assert_allclose(curvature.hessian_from_products(products, 10, block, x0.dtype),
                                   jax.hessian(f)(x0), rtol=1e-5, atol=1e-5)
    assert curvature.columns_within_memory(10**6, 500, budget=10**8) == 100
    assert curvature.columns_within_memory(10**9, 500, budget=10**8) == 1
    assert curvature.columns_within_memory(1, 500, budget=10**8) == 500


def test_laplace_preconditioner_factors_the_inverse():
    """L·Lᵀ = (−H)⁻¹ (L stored in float32: rtol 1e-5 on a well-conditioned −H)."""
    neg_h = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
    L = np.asarray(laplace_preconditioner(neg_h).chol, np.float64)
    np.testing.assert_allclose(L @ L.T, np.linalg.inv(neg_h), rtol=1e-5)


# -- the diagonal curvature above dense_max --------------------------------------------------------
def test_hutchinson_diagonal_against_the_exact_diagonal():
    """Above ``dense_max`` the preconditioner is 1/√diag(−H) with diag(−H) estimated by
    Hutchinson's v ⊙ (−H·v), v Rademacher.  On the Gaussian linear model −H = XᵀX + I/4 is
    constant and known.  Three equicorrelated features (ρ = 0.5: large off-diagonal entries)
    and three independent ones (off-diagonal entries ≈ √N from sampling only).  The estimate
    of (−H)_jj is unbiased with variance Σ_{l≠j} H_jl²/K for K probes (K = 16 with
    ``diagonal="hutchinson"``; more would only shrink it): tolerance 4 sd per coordinate
    (fixed seed), which is 6–8% of (−H)_jj for the independent features (checked: a 10% bias
    of the estimator fails) and ≈ 70% for the correlated ones (a test of the variance
    formula rather than of the bias).  The stiffness λ (top eigenvalue of S·(−H)·S by power
    iteration, S the estimated scales) against numpy's: eigenvalue gap ≈ 2 : 1, 60
    iterations: converged, rtol 1e-3."""
    rng = np.random.default_rng(11)
    N, d, rho = 1000, 6, 0.5
    C = np.eye(d)
    C[:3, :3] = (1 - rho) * np.eye(3) + rho
    X = (rng.normal(size=(N, d)) @ np.linalg.cholesky(C).T).astype(np.float32)
    y = (X @ rng.normal(size=d) + rng.normal(size=N)).astype(np.float32)
    neg_h = X.astype(np.float64).T @ X.astype(np.float64) + np.eye(d) / 2.0**2
    options = WarmupOptions(optimizer_steps=0, dense_max=2, diagonal="hutchinson",
                            stabilise_diagonal=False, max_noise_heat=None, max_minibatch_stiffness=None,
                            seed=0)
    fit, _, _ = fit_model_mode(linear_model, (X, y), options=options)
    estimate = 1.0 / np.asarray(fit.preconditioner.scale, np.float64) ** 2
    exact = np.diag(neg_h)
    sd = np.sqrt((np.sum(neg_h**2, axis=1) - exact**2) / 16)
    z = (estimate - exact) / sd
    assert np.all(np.abs(z) < 4.0), z
    assert np.any(np.abs(z) > 0.05), z  # a real estimate, not the exact diagonal
    S = np.diag(1.0 / np.sqrt(estimate))
    assert fit.stiffness == pytest.approx(np.linalg.eigvalsh(S @ neg_h @ S)[-1], rel=1e-3)


def test_whitened_top_eigenvalue_is_the_top_eigenvalue():
    """Power iteration on S·(−H)·S with known eigenvalues 1, 1.5, 6 (ratio 1/4 per iteration:
    converged to float32 precision in 60), and the floor λ ≥ 1."""
    Q = np.linalg.qr(np.random.default_rng(12).normal(size=(3, 3)))[0]
    A = jnp.asarray(Q @ np.diag([1.0, 1.5, 6.0]) @ Q.T, jnp.float32)
    scale = jnp.asarray([0.5, 2.0, 1.0], jnp.float32)
    neg_h = A / jnp.outer(scale, scale)  # S·(−H)·S = A
    lam = whitened_top_eigenvalue(lambda v: neg_h @ v, scale, jax.random.PRNGKey(0))
    assert lam == pytest.approx(6.0, rel=1e-4)
    assert whitened_top_eigenvalue(lambda v: 0.1 * v, jnp.ones(3), jax.random.PRNGKey(0)) == 1.0


def test_break_symmetry_moves_only_the_coordinates_with_an_exactly_zero_gradient():
    x = jnp.zeros(5)
    grad = jnp.array([0.0, 1.0, 0.0, -2.0, 1e-30])
    out = np.asarray(break_symmetry(x, grad, jax.random.PRNGKey(0), 0.1))
    assert np.all(out[[1, 3, 4]] == 0.0) and np.all(out[[0, 2]] != 0.0)
    assert np.all(np.abs(out) < 0.5)  # 0.1·ξ: 5 sd


def test_within_tolerance_is_the_root_mean_square_newton_step_in_laplace_sds():
    """The skip test of the diagonal Newton refinement: at θ̂ + δ of a diagonal Gaussian with
    curvatures c, g = −c·δ and the Newton step is δ, i.e. δ_j·√c_j sds per coordinate; the
    test passes exactly when their root mean square is at most the tolerance."""
    c = np.array([1.0, 100.0, 1e4, 0.01])
    steps_in_sds = np.array([0.1, 0.3, 0.2, 0.28])          # rms 0.2345
    g = -c * (steps_in_sds / np.sqrt(c))
    assert refinement.within_tolerance(g, c, 0.25) and not refinement.within_tolerance(g, c, 0.23)
    assert not refinement.within_tolerance(np.array([0.0, np.nan, 0.0, 0.0]), c, 0.25)


def _tanh_network(X, y=None, subsample_size=50):
    """One hidden layer of 16 tanh units, 20 inputs, a Bernoulli output: 353 weights."""
    W1 = numpyro.sample("W1", dist.Normal(0, 1).expand([20, 16]).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(0, 1).expand([16]).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(0, 1).expand([16]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0, 1))
    with numpyro.plate("N", X.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=jnp.tanh(X[idx] @ W1 + b1) @ w2 + b2),
                       obs=None if y is None else y[idx])


def test_network_warmup_takes_no_diagonal_newton_step_from_an_optimum_and_reports_convergence():
    """Above dense_max coordinates a network's Adam end is a mode by the Fisher diagonal (within
    0.25 sds in root mean square), where the Hutchinson diagonal is indefinite in many
    coordinates and its Newton steps never met their per-coordinate test (the false "did not
    converge" warning): no step is taken, the fit is converged, and the data are read twice (the
    start's check and the gradient at the end; one start, to keep the test short)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 20)).astype(np.float32)
    y = (X[:, 0] * X[:, 1] + 0.5 * X[:, 2] + 0.3 * rng.normal(size=400) > 0).astype(np.float32)
    fit, _, _ = fit_model_mode(_tanh_network, (jnp.asarray(X), jnp.asarray(y)),
                               options=WarmupOptions(optimizer_steps=500, num_starts=1, seed=0))
    assert fit.mode.shape == (353,) and fit.preconditioner.chol is None
    assert fit.converged and fit.newton_steps == 0
    assert np.all(np.isfinite(np.asarray(fit.grad))) and fit.data_passes == 2


def test_an_unconverged_diagonal_fit_does_not_advise_more_steps():
    """Above dense_max coordinates (a diagonal preconditioner) an unconverged Newton phase is
    reported with the remedy that works (held-out predictions), not more steps; a dense fit
    keeps the advice to raise them; a converged fit says nothing."""
    from numpyro_sg.infer.preconditioner import Preconditioner
    from numpyro_sg.infer.warmup_options import ModeFit

    common = dict(mode=np.zeros(3), grad=np.ones(3), log_density=0.0, newton_steps=8, seconds=1.0)
    diagonal = ModeFit(preconditioner=Preconditioner(scale=np.array([1.0, 0.1, 0.01])), converged=False, **common)
    text = diagonal.nonconvergence()
    assert "do not help" in text and "predictive_metrics" in text and "newton_steps" not in text
    dense = ModeFit(preconditioner=Preconditioner(chol=np.eye(3)), converged=False, **common)
    assert "newton_steps" in dense.nonconvergence()
    assert ModeFit(preconditioner=Preconditioner(chol=np.eye(3)), converged=True, **common).nonconvergence() is None
