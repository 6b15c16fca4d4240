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


def test_the_sampling_step_holds_no_host_callback_but_the_run_clock():
    """A host callback in NumPyro's loop keeps it out of JAX's persistent compilation cache: with
    that cache on, the step of every kernel has none (the divergence report comes after the
    run); without it, the only one is the run clock's stamp (under ``lax.cond``)."""
    for path in pathlib.Path(nsg.__file__).parent.joinpath("kernels").rglob("*.py"):
        text = path.read_text()
        for name in ("jax.debug", "io_callback", "pure_callback"):
            assert name not in text, (path, name)
    X, y = _data()
    kernel = nsg.SGLD(logistic_model)
    state = kernel.init(jax.random.PRNGKey(0), 10, None, (X, y), {})
    jaxpr = str(jax.make_jaxpr(lambda s: kernel.sample(s, (X, y), {}))(state))
    assert jaxpr.count("callback=") == 1 and "cond[" in jaxpr
    previous = jax.config.jax_compilation_cache_dir
    try:  # (tracing only: nothing is compiled, so the cache itself is never opened)
        jax.config.update("jax_compilation_cache_dir", "/nonexistent-cache-dir")
        jaxpr = str(jax.make_jaxpr(lambda s: kernel.sample(s, (X, y), {}))(state))
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)
    assert "callback" not in jaxpr
    assert int(jnp.asarray(state.guard.diverged_at)) == -1


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
