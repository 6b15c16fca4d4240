"""The update maths as pure functions, against hand-computed values and the paper's results."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_sg.kernels.sgbd import (
    adapted_step_size,
    barker_alpha,
    barker_increment,
    keep_sign_probability,
    past_breaking_point,
    sgbd_update,
)
from numpyro_sg.kernels.moves import langevin_move, langevin_noise_variance
from numpyro_sg.kernels.step_size import polynomial_schedule


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# -- SGBD -----------------------------------------------------------------------------------


def test_barker_alpha_hand_computed():
    # z = 0.5, τ̂ = 2: α = 1.702 / √(1.702² − 4·0.25) = 1.702 / √1.896804
    np.testing.assert_allclose(barker_alpha(0.5, 2.0), 1.702 / np.sqrt(1.896804), rtol=1e-6)
    # no noise: α = 1
    np.testing.assert_allclose(barker_alpha(0.7, 0.0), 1.0)
    # past the breaking point it is not defined; we return 1 (and the caller uses the extreme rule)
    assert np.isfinite(barker_alpha(1.0, 2.0))


def test_breaking_point_hand_computed():
    # breaking point |z|·τ̂ = 1.702
    assert not past_breaking_point(0.85, 2.0)  # 1.70 < 1.702
    assert past_breaking_point(0.851, 2.0)  # 1.702 ≥ 1.702
    assert past_breaking_point(-1.0, 2.0)
    assert not past_breaking_point(100.0, 0.0)


def test_keep_sign_probability_variants():
    z, g, tau = 0.5, 1.2, 2.0
    np.testing.assert_allclose(keep_sign_probability(z, g, tau, "vanilla"), sigmoid(0.6), rtol=1e-6)
    alpha = 1.702 / np.sqrt(1.702**2 - 1.0)
    np.testing.assert_allclose(
        keep_sign_probability(z, g, tau, "corrected"), sigmoid(alpha * 0.6), rtol=1e-6
    )
    # extreme estimator: 1{z·ĝ > 0}
    assert keep_sign_probability(z, g, tau, "extreme") == 1.0
    assert keep_sign_probability(z, -g, tau, "extreme") == 0.0
    assert keep_sign_probability(-z, -g, tau, "extreme") == 1.0
    # corrected past the breaking point = extreme
    assert keep_sign_probability(1.0, g, tau, "corrected") == 1.0
    assert keep_sign_probability(1.0, -g, tau, "corrected") == 0.0
    # corrected with no noise = vanilla
    np.testing.assert_allclose(
        keep_sign_probability(z, g, 0.0, "corrected"), keep_sign_probability(z, g, 0.0, "vanilla")
    )
    with pytest.raises(ValueError, match="unknown SGBD variant"):
        keep_sign_probability(z, g, tau, "bogus")


def test_adapted_step_size():
    np.testing.assert_allclose(adapted_step_size(jnp.array([1.0, 2.0]), 0.3), [1.702 / 1.233, 1.702 / 2.466], rtol=1e-6)
    np.testing.assert_allclose(adapted_step_size(jnp.array([0.0]), 0.3), [0.3])


def test_barker_increment_distribution():
    z = barker_increment(jax.random.PRNGKey(0), jnp.full((200_000,), 0.5))
    # N(σ, (0.1σ)²): mean 0.5, sd 0.05; standard errors ≈ 1e-4
    np.testing.assert_allclose(z.mean(), 0.5, atol=1e-3)
    np.testing.assert_allclose(z.std(), 0.05, rtol=1e-2)


def test_sgbd_update_moves_by_plus_minus_z():
    theta = jnp.zeros(100_000)
    grad = jnp.full(100_000, 2.0)
    new, z, p = sgbd_update(jax.random.PRNGKey(1), theta, grad, 0.5, jnp.zeros(100_000), "vanilla")
    np.testing.assert_allclose(jnp.abs(new), z, rtol=1e-6)
    # P(move up) = sigmoid(z·ĝ) ≈ sigmoid(1.0); 4 standard errors
    np.testing.assert_allclose((new > 0).mean(), p.mean(), atol=4 * 0.5 / np.sqrt(1e5))


@pytest.mark.parametrize("noise", ["normal", "laplace", "student_t"])
@pytest.mark.parametrize("z,g", [(0.8, 1.3), (0.5, -2.0), (1.5, 0.4)])
def test_proposition_1_vanilla_shrinks_toward_half(noise, z, g):
    """Mauri & Zanella (2024), Prop. 1: under symmetric gradient noise E[p̂] is shrunk toward ½."""
    key = jax.random.PRNGKey(0)
    m = 400_000
    eta = {
        "normal": jax.random.normal(key, (m,)),
        "laplace": jax.random.laplace(key, (m,)),
        "student_t": jax.random.t(key, 3.0, (m,)),
    }[noise] * 1.5
    p_true = float(keep_sign_probability(z, g, 0.0, "vanilla"))
    p_hat = np.asarray(keep_sign_probability(z, g + eta, 0.0, "vanilla"), np.float64)
    se = p_hat.std() / np.sqrt(m)
    shrink = abs(p_true - 0.5) - abs(p_hat.mean() - 0.5)
    # Monte Carlo: the shrinkage is positive by many standard errors (a sign error would fail).
    assert shrink > 6 * se, (shrink, se)
    assert np.sign(p_hat.mean() - 0.5) == np.sign(p_true - 0.5)


@pytest.mark.parametrize("z,g,tau", [(0.8, 1.3, 1.5), (0.5, -2.0, 3.0), (1.0, 0.7, 1.2)])
def test_proposition_4_corrected_is_nearly_unbiased(z, g, tau):
    """Mauri & Zanella (2024), Prop. 4: under Gaussian noise with τ < 1.702/|z|, |E p̃ − p| < 0.019."""
    m = 400_000
    eta = tau * jax.random.normal(jax.random.PRNGKey(1), (m,))
    p_true = float(keep_sign_probability(z, g, 0.0, "vanilla"))
    p_tilde = np.asarray(keep_sign_probability(z, g + eta, tau, "corrected"), np.float64)
    p_hat = np.asarray(keep_sign_probability(z, g + eta, tau, "vanilla"), np.float64)
    se = p_tilde.std() / np.sqrt(m)
    assert abs(p_tilde.mean() - p_true) < 0.019 + 4 * se
    # and the correction helps relative to the vanilla estimator
    assert abs(p_tilde.mean() - p_true) < abs(p_hat.mean() - p_true)


# -- SGLD -----------------------------------------------------------------------------------


def test_corrected_noise_variance_hand_computed():
    # ε = 0.1, τ = 1, τ̂ = 4: 0.1 − 0.01·16/4 = 0.06
    np.testing.assert_allclose(langevin_noise_variance(0.1, 1.0, 4.0), 0.06, rtol=1e-6)
    # gradient noise larger than the Langevin variance: inject nothing
    assert langevin_noise_variance(0.1, 1.0, 100.0) == 0.0
    np.testing.assert_allclose(langevin_noise_variance(0.1, 2.0, 0.0), 0.2)


def test_sgld_update():
    theta = jnp.array([1.0, -1.0])
    out = langevin_move(theta, jnp.array([2.0, 4.0]), 0.1, jnp.array([1.0, -1.0]), 0.04)
    np.testing.assert_allclose(out, [1.0 + 0.1 + 0.2, -1.0 + 0.2 - 0.2], rtol=1e-6)


def test_polynomial_schedule():
    f = polynomial_schedule(0.1, 10.0, 0.5)
    np.testing.assert_allclose(f(0), 0.1 / np.sqrt(10.0), rtol=1e-6)
    np.testing.assert_allclose(f(90), 0.01, rtol=1e-6)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="kappa"):
            polynomial_schedule(0.1, 1.0, bad)
