"""The functional core (``numpyro_sg.kernels.<kernel>.init``/``step``): a user's own ``lax.scan``
gives ``MCMC``'s draws (every kernel, ESGLD and SparseAsync through their pure steps), a user's
own gradient estimator and mini-batches sample the right posterior, and our control-variate
estimator drives a BlackJAX kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax, random
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.datasets import (esgld_linear_model, linear_regression_model, linear_regression_posterior,
                                 simulate_esgld_linear, simulate_linear_regression, simulate_sparse_linear,
                                 sparse_async_linear_model)
from numpyro_sg.infer.preconditioner import Preconditioner
from numpyro_sg.kernels import baoab, cyclical, psgld, sgbd, sghmc, sgld, sgnht
from numpyro_sg.kernels.esgld.step import esgld_step

#: (class, its functional module, options), the step's options as the class passes them
KERNELS = {
    "sgld": (nsg.SGLD, sgld, {}),
    "sgld-corrected": (nsg.SGLD, sgld, dict(variant="corrected")),
    "sgbd": (nsg.SGBD, sgbd, {}),
    "sgbd-adaptive": (nsg.SGBD, sgbd, dict(adapt_step_size="always", gradient="plain")),
    "sghmc": (nsg.SGHMC, sghmc, {}),
    "sgnht": (nsg.SGNHT, sgnht, {}),
    "psgld": (nsg.PSGLD, psgld, {}),
    "baoab": (nsg.BAOAB, baoab, {}),
    "cyclical": (nsg.CyclicalSGLD, cyclical, dict(cycle_length=20, exploration=0.25)),
}


@pytest.fixture(scope="module")
def data():
    X, y, _ = simulate_linear_regression(2_000, 3, seed=0)
    return X, y


@pytest.mark.parametrize("name", list(KERNELS))
def test_a_users_scan_over_the_functional_step_gives_mcmcs_draws(name, data):
    """Same key, same start, same estimator (the kernel's own): the user's loop and MCMC agree
    draw for draw (to float rounding: the two programs are compiled apart)."""
    cls, module, options = KERNELS[name]
    kernel = cls(linear_regression_model, **options)
    key, n = random.PRNGKey(1), 60
    mcmc = MCMC(kernel, num_warmup=0, num_samples=n, progress_bar=False)
    mcmc.run(key, *data)
    expected = np.asarray(mcmc.get_samples()["theta"])

    state = kernel.init(key, 0, None, data, {})            # the chain's start, as MCMC's
    estimate = kernel.gradient_estimator(state, data)      # the kernel's control-variate ĝ
    step_options = kernel.step_options()

    def one_step(state, _):
        key, key_batch, key_move = random.split(state.rng_key, 3)
        indices, batch_state = kernel.minibatcher.draw(key_batch, state.batch_state)
        state = module.step(key_move, state, estimate, indices, **step_options)
        return state._replace(rng_key=key, batch_state=batch_state), state.z["theta"]

    _, draws = jax.jit(lambda s: lax.scan(one_step, s, None, length=n))(state)
    np.testing.assert_allclose(np.asarray(draws), expected, rtol=1e-4, atol=1e-5)


def _users_regression(X, y, anchor):
    """A user's own control-variate gradient estimator (BlackJAX's gradient-estimator shape)
    for the conjugate linear regression of :func:`linear_regression_model`, θ a plain array:
    ĝ(θ) = ∇log π(θ̂) + ĝ_B(θ) − ĝ_B(θ̂), θ̂ = ``anchor``."""
    N = X.shape[0]

    def log_density(theta, batch):
        Xb, yb = batch
        return -0.5 * jnp.sum(theta**2) / 100.0 - 0.5 * N / yb.shape[0] * jnp.sum((yb - Xb @ theta) ** 2)

    grad = jax.grad(log_density)
    full = grad(anchor, (X, y))
    return lambda theta, batch: full + grad(theta, batch) - grad(anchor, batch)


#: the functional init's settings per kernel; ε in posterior sds (the user's preconditioner is
#: the exact posterior covariance), the class's defaults
FUNCTIONAL = {
    "sgld": (sgld, dict(step_size=0.7), dict(correct_discretisation=True)),
    "sgbd": (sgbd, dict(step_size=0.8), dict(variant="vanilla", correct_discretisation=True)),
    "sghmc": (sghmc, dict(step_size=0.35, friction=0.5), dict(correct_discretisation=True)),
    "sgnht": (sgnht, dict(step_size=0.15, friction=0.2), dict(correct_discretisation=True)),
    "psgld": (psgld, dict(step_size=0.8, rms_init=1.0), dict(correct_discretisation=True)),
    "baoab": (baoab, dict(step_size=0.35, friction=3.0), {}),
    "cyclical": (cyclical, dict(step_size=0.7, cycle_length=50), dict(cycle_length=50, correct_discretisation=True)),
}


@pytest.mark.parametrize("name", list(FUNCTIONAL))
def test_the_functional_kernels_sample_a_users_own_posterior(name):
    """A user's gradient estimator, mini-batches of 200 rows and keys, in their own scan: the draws
    match the exact posterior (4,000 draws from 2 chains after 500 dropped: means within
    0.25 sd and sds within 15 %, the kernels' doctest tolerances)."""
    module, init_options, step_options = FUNCTIONAL[name]
    X, y, _ = simulate_linear_regression(5_000, 3, seed=2)
    mean, cov = linear_regression_posterior(X, y)
    X, y = jnp.asarray(X), jnp.asarray(y)
    grad = _users_regression(X, y, jnp.asarray(mean, jnp.float32))
    precond = Preconditioner(chol=jnp.asarray(np.linalg.cholesky(cov), jnp.float32))
    n, steps = 200, 2_500

    def chain(key):
        key_start, key_batches, key_moves = random.split(key, 3)
        idx = random.randint(key_batches, (steps + 1, n), 0, X.shape[0])
        start = jnp.asarray(mean, jnp.float32) + precond.chol @ random.normal(key_start, (3,))
        state = module.init(start, grad, (X[idx[0]], y[idx[0]]), precond=precond, **init_options)

        def one_step(state, xs):
            key, rows = xs
            state = module.step(key, state, grad, (X[rows], y[rows]), **step_options)
            return state, state.z

        return lax.scan(one_step, state, (random.split(key_moves, steps), idx[1:]))[1]

    draws = np.asarray(jax.jit(jax.vmap(chain))(random.split(random.PRNGKey(0), 2))[:, 500:]).reshape(-1, 3)
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(draws.mean(0) - mean) < 0.25 * sd), (draws.mean(0) - mean) / sd
    assert np.all(np.abs(draws.std(0) / sd - 1) < 0.15), draws.std(0) / sd


def test_our_control_variate_estimator_drives_a_blackjax_kernel(data):
    """BlackJAX's SGLD fed the kernel's control-variate gradient and mini-batches: the exact
    posterior (4,000 draws, absolute step 0.1·min posterior variance: means within 0.25 sd,
    sds within 15 %)."""
    blackjax = pytest.importorskip("blackjax")
    X, y = data
    mean, cov = linear_regression_posterior(X, y)
    kernel = nsg.SGLD(linear_regression_model)
    state = kernel.init(random.PRNGKey(0), 0, None, data, {})     # warmup: mode, anchor, start
    estimate = kernel.gradient_estimator(state, data)

    def grad_estimator(z, indices):
        return kernel.unravel(estimate(z, indices).grad)

    sampler = blackjax.sgld(grad_estimator)
    step_size = 0.1 * float(np.min(np.linalg.eigvalsh(cov)))

    def one_step(position, key):
        key_batch, key_move = random.split(key)
        indices, _ = kernel.minibatcher.draw(key_batch, None)
        position = sampler.step(key_move, position, indices, step_size)
        return position, position["theta"]

    _, draws = jax.jit(lambda z: lax.scan(one_step, z, random.split(random.PRNGKey(1), 5_000)))(state.z)
    draws = np.asarray(draws)[1_000:]
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(draws.mean(0) - mean) < 0.25 * sd), (draws.mean(0) - mean) / sd
    assert np.all(np.abs(draws.std(0) / sd - 1) < 0.15), draws.std(0) / sd


def _spike_slab_run(kernel, data, n):
    """MCMC's draws and the kernel's start for the same key (one chain, no warmup)."""
    key = random.PRNGKey(4)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=n, progress_bar=False)
    mcmc.run(key, *data)
    return mcmc.get_samples(), kernel.init(key, 0, None, data, {})


def test_esglds_functional_step_in_a_users_scan_gives_mcmcs_draws():
    """ESGLD's pure step (``esgld_step(setup, state, data)``, the setup built from the model at
    ``init``) in a user's scan: MCMC's indicators and coefficients, draw for draw."""
    X, y, _ = simulate_esgld_linear(500, 20, seed=0)
    data, n = (X, y), 40
    kernel = nsg.ESGLD(esgld_linear_model, num_models=3)
    expected, state = _spike_slab_run(kernel, data, n)

    def one_step(state, _):
        state = esgld_step(kernel.setup, state, data, {})
        return state, (state.z["gamma"], state.z["theta"])

    _, (gamma, theta) = jax.jit(lambda s: lax.scan(one_step, s, None, length=n))(state)
    np.testing.assert_array_equal(np.asarray(gamma), np.asarray(expected["gamma"]))
    np.testing.assert_allclose(np.asarray(theta), np.asarray(expected["theta"]), rtol=1e-4, atol=1e-5)


def test_sparse_asyncs_pure_step_in_a_users_scan_gives_mcmcs_draws():
    """SparseAsync's pure step (``kernel.step(state, model_args, model_kwargs)``, the plan built
    from the model at ``init``) in a user's scan: MCMC's indicators, draw for draw."""
    X, y, _ = simulate_sparse_linear(30, 200, num_nonzero=3, seed=0)
    data, n = (X, y), 40
    kernel = nsg.SparseAsync(sparse_async_linear_model)
    expected, state = _spike_slab_run(kernel, data, n)

    def one_step(state, _):
        state = kernel.step(state, data, {})
        return state, state.z["delta"]

    _, delta = jax.jit(lambda s: lax.scan(one_step, s, None, length=n))(state)
    np.testing.assert_array_equal(np.asarray(delta), np.asarray(expected["delta"]))
