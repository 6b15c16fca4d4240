"""Compile once per shape: the warmup reused by a second run, no host callback in the step."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

import numpyro_sg as nsg
import numpyro_sg.kernels.gradient as gradient_module
from numpyro_sg.diagnostics.model_scores import ModelScores


def logistic_model(X, y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=50):
        Xb = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=numpyro.subsample(y, event_dim=0))


def _data(n=500, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = (rng.random(n) < 1 / (1 + np.exp(-X @ np.ones(d)))).astype(np.float32)
    return X, y


def test_a_second_run_reuses_the_warmup_and_reset_warmup_forces_a_new_one(monkeypatch):
    """The same kernel on the same arrays: one mode search for two runs, with the same
    preconditioner; new arrays or ``reset_warmup()`` search again."""
    calls = []
    original = gradient_module.find_mode
    monkeypatch.setattr(gradient_module, "find_mode", lambda *a, **k: calls.append(1) or original(*a, **k))
    X, y = _data()
    kernel = nsg.SGLD(logistic_model)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=20, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    first = np.asarray(mcmc.last_state.precond.chol)
    mcmc.run(jax.random.PRNGKey(1), X, y)
    assert len(calls) == 1
    np.testing.assert_array_equal(np.asarray(mcmc.last_state.precond.chol), first)
    mcmc.run(jax.random.PRNGKey(1), X.copy(), y.copy())  # new arrays: a new search
    assert len(calls) == 2
    kernel.reset_warmup()
    mcmc.run(jax.random.PRNGKey(1), X, y)
    assert len(calls) == 3


def test_the_sampling_step_holds_no_host_callback():
    """NumPyro's progress bar calls the compiled step once per iteration from Python, where a step
    holding a host callback (an effect) leaves JAX's fast dispatch path; a callback would also
    keep the loop out of JAX's persistent compilation cache. No kernel's step holds one (the
    divergence report comes after the run; the run clock stamps from the progress bar's text)."""
    for path in pathlib.Path(nsg.__file__).parent.joinpath("kernels").rglob("*.py"):
        text = path.read_text()
        for name in ("jax.debug", "io_callback", "pure_callback"):
            assert name not in text, (path, name)
    X, y = _data()
    kernel = nsg.SGLD(logistic_model)
    for key in (jax.random.PRNGKey(0), jax.random.split(jax.random.PRNGKey(0), 2)):
        state = kernel.init(key, 10, None, (X, y), {})
        closed = jax.make_jaxpr(lambda s: kernel.sample(s, (X, y), {}))(state)
        assert "callback" not in str(closed) and not closed.effects
    assert int(jnp.max(jnp.asarray(state.guard.diverged_at))) == -1


def test_a_second_conversion_of_the_same_model_compiles_nothing():
    """The full-data score programs are shared by every ModelScores of one model, plates and
    sites: a second ``to_inference_data`` compiles nothing; other data sizes get their own."""
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(1) if event.endswith("backend_compile_duration") else None)
    X, y = _data()
    scores = [ModelScores(logistic_model, (X, y)) for _ in range(2)]
    theta = np.array([[0.1, 0.2, 0.3]])
    first = scores[0].score(theta)
    before = len(compiles)
    np.testing.assert_array_equal(scores[1].score(theta), first)
    assert len(compiles) == before
    X2, y2 = _data(n=700)
    expected = X2.T @ (y2 - 1 / (1 + np.exp(-X2 @ theta[0]))) - theta[0]
    np.testing.assert_allclose(ModelScores(logistic_model, (X2, y2)).score(theta)[0],
                               expected, rtol=1e-3)


def test_a_second_kernel_on_a_model_with_local_latents_compiles_nothing_at_init():
    """Two kernels on one model with local latents hold equal (not identical) marginals: the
    second's init — trace, method check, mode search, Laplace fit, first state — reuses every
    program the first compiled (before: the whole warmup again, 13 of its 16 s here)."""
    from numpyro_sg.datasets.mixed import linear_mixed_model, simulate_linear_mixed

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(1) if event.endswith("backend_compile_duration") else None)
    args = simulate_linear_mixed(G=40, seed=3) + (10,)
    first, second = nsg.SGLD(linear_mixed_model), nsg.SGLD(linear_mixed_model)
    first.init(jax.random.PRNGKey(0), 100, None, args, {})
    before = len(compiles)
    second.init(jax.random.PRNGKey(0), 100, None, args, {})
    assert len(compiles) == before, len(compiles) - before
    assert second.model == first.model and second.model is not first.model
    assert second.model != first.model.with_num_draws(first.model.num_draws + 1)


def test_a_new_kernel_on_the_same_model_and_data_reuses_the_warmups_fit(monkeypatch):
    """The process keeps the warmup's fits: another kernel on the same model, settings and data
    (NumPy arrays equal in content, a JAX array the same object) does not search again, and gets
    the same mode and preconditioner; data changed in place, another JAX array or other warmup
    options search again."""
    import numpyro_sg.infer.warmup as warmup_module

    searches = []
    original = warmup_module._mode_fit
    monkeypatch.setattr(warmup_module, "_mode_fit", lambda *a, **k: searches.append(1) or original(*a, **k))
    X, y = _data(n=600, seed=5)

    def init(kernel, *data, seed=0):
        kernel.init(jax.random.PRNGKey(seed), 10, None, data, {})
        return kernel.mode_fit

    first = init(nsg.SGLD(logistic_model), X, y)
    again = init(nsg.SGHMC(logistic_model), X.copy(), y.copy(), seed=1)   # the run's key: not the search's
    assert len(searches) == 1
    np.testing.assert_array_equal(np.asarray(again.mode), np.asarray(first.mode))
    np.testing.assert_array_equal(np.asarray(again.preconditioner.chol), np.asarray(first.preconditioner.chol))
    assert again.seconds < first.seconds
    changed = X.copy()
    changed[0, 0] += 1.0   # one number changed in place: new data
    init(nsg.SGLD(logistic_model), changed, y)
    assert len(searches) == 2
    X_jax = jnp.asarray(X)
    init(nsg.SGLD(logistic_model), X_jax, y)
    init(nsg.SGLD(logistic_model), X_jax, y)
    assert len(searches) == 3
    init(nsg.SGLD(logistic_model), jnp.asarray(X), y)   # an equal JAX array, not the same one
    init(nsg.SGLD(logistic_model, warmup_options={"seed": 1}), X, y)
    assert len(searches) == 5
    kernel = nsg.SGLD(logistic_model)
    kernel.reset_warmup()   # empties the process's store: the next init searches
    init(kernel, X, y)
    assert len(searches) == 6


def test_a_new_step_size_compiles_no_first_state_and_given_init_params_start_the_chains():
    """The first-state program reads the step size from its arguments: a kernel with another
    step size compiles nothing at ``init``.  A kernel given ``init_params`` after one started at
    the Laplace draws gets a program of its own (the shared one drew from the Laplace fit: a
    crash on the user's values)."""
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(1) if event.endswith("backend_compile_duration") else None)
    X, y = (jnp.asarray(a) for a in _data(n=400, seed=7))
    nsg.SGLD(logistic_model, step_size=0.1).init(jax.random.PRNGKey(0), 10, None, (X, y), {})
    before = len(compiles)
    state = nsg.SGLD(logistic_model, step_size=0.3).init(jax.random.PRNGKey(0), 10, None, (X, y), {})
    assert len(compiles) == before, len(compiles) - before
    np.testing.assert_allclose(np.asarray(state.hyper.step_size), 0.3, rtol=1e-6)
    start = {"theta": jnp.array([2.0, -1.0, 0.5])}
    state = nsg.SGLD(logistic_model, step_size=0.3).init(jax.random.PRNGKey(0), 10, start, (X, y), {})
    np.testing.assert_array_equal(np.asarray(state.z["theta"]), np.asarray(start["theta"]))
