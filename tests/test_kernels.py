"""NumPyro integration of the kernels: chain methods, warmup/run, jit_model_args, determinism,
divergence detection, postprocessing, argument validation, conversion to ArviZ, the demo."""

import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import CLASSIC, linear_model, logistic_model
from numpyro.infer import MCMC, init_to_value

import numpyro_sg as nsg

KERNELS = {
    "sgld": lambda **kw: nsg.SGLD(logistic_model, 1e-3, **kw),
    "sgld-corrected": lambda **kw: nsg.SGLD(logistic_model, 1e-3, variant="corrected", **kw),
    "sgbd": lambda **kw: nsg.SGBD(logistic_model, 0.02, **kw),
    "sgbd-adaptive": lambda **kw: nsg.SGBD(logistic_model, 0.02, adapt_step_size=True, **kw),
    # SGNHT stands for both momentum kernels here (SGHMC shares its shell; tests/test_sghmc.py)
    "sgnht": lambda **kw: nsg.SGNHT(logistic_model, 1e-3, **kw),
    # pSGLD and BAOAB with the papers' settings (no mode search, to keep the suite fast; their
    # defaults: tests/test_psgld_baoab.py)
    "psgld": lambda **kw: nsg.PSGLD(logistic_model, 1e-3, **CLASSIC, **kw),
    "baoab": lambda **kw: nsg.BAOAB(logistic_model, 1e-4, friction=30.0, **CLASSIC, **kw),
}


def _samples(kernel, data, chain_method="sequential", num_chains=2, jit_model_args=False, key=0):
    mcmc = MCMC(
        kernel,
        num_warmup=50,
        num_samples=100,
        num_chains=num_chains,
        chain_method=chain_method,
        jit_model_args=jit_model_args,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(key), *data, extra_fields=("step_size", "grad_noise_sd"))
    return mcmc


@pytest.mark.parametrize("name", list(KERNELS))
def test_chain_methods_agree(name, logistic_data):
    """All three chain methods run and give the same draws for the same key."""
    if jax.default_backend() != "cpu" and jax.local_device_count() < 2:
        pytest.skip("needs two devices: conftest forces two host devices on the CPU only")
    assert jax.local_device_count() >= 2  # conftest forces two host devices: real pmap
    out = {
        cm: _samples(KERNELS[name](), logistic_data, chain_method=cm)
        for cm in ("sequential", "parallel", "vectorized")
    }
    ref = out["sequential"].get_samples(group_by_chain=True)["theta"]
    assert ref.shape == (2, 100, 3)
    assert not np.allclose(ref[0], ref[1])  # chains differ
    # same arithmetic, other XLA fusions: float32 rounding only. JAX ≥ 0.11 fuses the pmapped
    # program differently, and SGBD's adaptive step carries a 5e-6 rounding difference through
    # 150 iterations (≈ 2e-4 posterior sd); any real difference (keys, state) is ≥ 1e-2
    atol = 1e-6 if jax.__version_info__ < (0, 11) else 1e-5
    for cm in ("parallel", "vectorized"):
        np.testing.assert_allclose(
            out[cm].get_samples(group_by_chain=True)["theta"], ref, rtol=1e-4, atol=atol
        )
        for field in ("step_size", "grad_noise_sd", "diverging"):
            np.testing.assert_allclose(
                out[cm].get_extra_fields(group_by_chain=True)[field],
                out["sequential"].get_extra_fields(group_by_chain=True)[field],
                rtol=1e-4,
            )


def test_same_key_same_draws_and_different_key_different_draws(logistic_data):
    a = _samples(KERNELS["sgbd"](), logistic_data, key=1).get_samples()["theta"]
    b = _samples(KERNELS["sgbd"](), logistic_data, key=1).get_samples()["theta"]
    c = _samples(KERNELS["sgbd"](), logistic_data, key=2).get_samples()["theta"]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_jit_model_args(logistic_data):
    X, y = logistic_data
    plain = _samples(KERNELS["sgld"](), (X, y), num_chains=1)
    jitted = MCMC(KERNELS["sgld"](), num_warmup=50, num_samples=100, jit_model_args=True,
                  progress_bar=False)
    jitted.run(jax.random.PRNGKey(0), X, y)
    np.testing.assert_allclose(jitted.get_samples()["theta"], plain.get_samples()["theta"],
                               rtol=1e-4, atol=1e-6)
    # the compiled program takes the data as an argument: new data of the same shape is used
    jitted.run(jax.random.PRNGKey(0), X, 1.0 - y)
    flipped = jitted.get_samples()["theta"].mean(0)
    assert np.all(np.sign(flipped) == -np.sign(plain.get_samples()["theta"].mean(0)))


def test_warmup_then_run(logistic_data):
    X, y = logistic_data
    mcmc = MCMC(nsg.SGBD(logistic_model, 0.02, adapt_step_size=True, **CLASSIC), num_warmup=100,
                num_samples=60, progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(0), X, y, extra_fields=("step_size",), collect_warmup=True)
    warm = mcmc.get_samples()["theta"]
    sigma_warm = mcmc.get_extra_fields()["step_size"][-1]
    assert warm.shape == (100, 3)
    assert mcmc.post_warmup_state.i == 100
    mcmc.run(jax.random.PRNGKey(1), X, y, extra_fields=("step_size",))
    assert mcmc.last_state.i == 160  # the counter keeps counting across warmup() and run()
    draws = mcmc.get_samples()["theta"]
    assert draws.shape == (60, 3)
    # the run continues from the warmed-up chain and keeps the step size fixed after warmup
    assert np.abs(draws[0] - warm[-1]).max() < 0.2
    np.testing.assert_allclose(mcmc.get_extra_fields()["step_size"], np.tile(sigma_warm, (60, 1)))


def test_decaying_step_schedule(logistic_data):
    schedule = nsg.polynomial_schedule(1e-2, 1.0, 0.55)
    mcmc = MCMC(nsg.SGLD(logistic_model, schedule), num_warmup=10, num_samples=20,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *logistic_data, extra_fields=("step_size",))
    eps = mcmc.get_extra_fields()["step_size"]
    # the draw after iteration t used ε_t, t = 10..29
    np.testing.assert_allclose(eps, schedule(np.arange(10, 30.0)), rtol=1e-5)


def test_divergence_is_detected_and_reported(linear_data):
    # ε = 0.1 on a Gaussian posterior with variance 1e-3: |1 − ε·N/2| ≫ 1, the chain explodes
    mcmc = MCMC(nsg.SGLD(linear_model, 0.1, **CLASSIC), num_warmup=0, num_samples=100,
                progress_bar=False)
    with warnings.catch_warnings():  # nothing is reported from inside the compiled loop
        warnings.simplefilter("error", nsg.DivergenceWarning)
        mcmc.run(jax.random.PRNGKey(0), *linear_data)
    div = np.asarray(mcmc.get_extra_fields()["diverging"])  # collected by default
    draws = np.asarray(mcmc.get_samples()["theta"])
    assert div.any() and np.all(div[np.argmax(div):])  # sticky from the first divergence
    # the guard records the iteration (1-based; no warmup: draw index + 1) and the post-run
    # check names it
    assert mcmc.sampler.diverged_at(mcmc.last_state) == {0: int(np.argmax(div)) + 1}
    with pytest.warns(nsg.DivergenceWarning,
                      match=rf"chain 0 at iteration {np.argmax(div) + 1}, i.e. sampling draw index {np.argmax(div)}\)"):
        nsg.check_convergence(mcmc)
    assert np.all(np.isfinite(draws))  # never garbage: frozen at the last state before the blow-up
    assert np.abs(draws[np.argmax(div):]).max() < 1e3  # (the posterior sd is 0.03), not 1e15
    first = np.argmax(div)
    np.testing.assert_array_equal(draws[first:], np.broadcast_to(draws[first], draws[first:].shape))


def test_no_divergence_warning_for_a_sane_run(logistic_data):
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.DivergenceWarning)
        mcmc = _samples(KERNELS["sgld"](), logistic_data, chain_method="vectorized")
        nsg.check_convergence(mcmc)
    assert not mcmc.get_extra_fields()["diverging"].any()
    assert mcmc.sampler.diverged_at(mcmc.last_state) == {}


def test_constrained_sites_and_deterministic(linear_data):
    X, y = linear_data

    def model(X, y=None):
        theta = numpyro.sample("theta", dist.Normal(0, 2).expand([3]).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        numpyro.deterministic("theta_sum", theta.sum())
        with numpyro.plate("data", X.shape[0], subsample_size=100):
            Xb = numpyro.subsample(X, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0)
            numpyro.sample("y", dist.Normal(Xb @ theta, sigma), obs=yb)

    mcmc = MCMC(nsg.SGLD(model), num_warmup=1000, num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    s = mcmc.get_samples()
    assert np.all(s["sigma"] > 0)
    np.testing.assert_allclose(s["sigma"].mean(), 1.0, atol=0.1)  # data noise sd is 1
    np.testing.assert_allclose(s["theta_sum"], s["theta"].sum(-1), rtol=1e-5)


def test_deterministic_inside_plate_is_over_the_full_data(linear_data):
    X, y = linear_data

    def model(X, y=None, with_mu=True):
        theta = numpyro.sample("theta", dist.Normal(0, 2).expand([3]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=100):
            Xb = numpyro.subsample(X, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0)
            mu = Xb @ theta
            if with_mu:
                numpyro.deterministic("mu", mu)
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=yb)

    # without the site the plate is post-processed on one datum (cheap); with it, over all N
    no_mu = nsg.SGLD(model, 1e-4)
    MCMC(no_mu, num_warmup=1, num_samples=1, progress_bar=False).run(
        jax.random.PRNGKey(0), X, y, with_mu=False
    )
    assert no_mu._deterministic_in_plate is False
    kernel = nsg.SGLD(model, 1e-4)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=20, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    s = mcmc.get_samples()
    assert kernel._deterministic_in_plate is True
    assert s["mu"].shape == (20, X.shape[0])
    # the product on the same device (a GPU's float32 matmul may use TF32)
    np.testing.assert_allclose(s["mu"], jnp.asarray(s["theta"]) @ jnp.asarray(X).T, rtol=1e-4, atol=1e-4)


def test_kernel_subsample_size_override(linear_data):
    X, y = linear_data
    kernel = nsg.SGLD(linear_model, 1e-4, variant="corrected", subsample_size=1000,
                      minibatch_options={"replace": False})
    mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, extra_fields=("grad_noise_sd",))
    assert kernel.plates[0].subsample_size == 1000
    # the full data without replacement: no gradient noise at all
    np.testing.assert_allclose(mcmc.get_extra_fields()["grad_noise_sd"], 0.0, atol=1e-6)


def test_init_params_and_init_strategy(logistic_data):
    init = {"theta": jnp.array([0.5, 0.5, 0.5])}
    mcmc = MCMC(nsg.SGLD(logistic_model, 1e-9), num_warmup=0, num_samples=2, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *logistic_data, init_params=init)
    np.testing.assert_allclose(mcmc.get_samples()["theta"], 0.5, atol=1e-3)
    kernel = nsg.SGBD(logistic_model, 1e-9, init_strategy=init_to_value(values={"theta": jnp.ones(3)}))
    mcmc = MCMC(kernel, num_warmup=0, num_samples=2, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *logistic_data)
    np.testing.assert_allclose(mcmc.get_samples()["theta"], 1.0, atol=1e-3)


def test_diagnostics_string_and_model_property(logistic_data):
    kernel = KERNELS["sgbd"]()
    assert kernel.model is logistic_model and kernel.sample_field == "z"
    state = kernel.init(jax.random.PRNGKey(0), 10, None, logistic_data, {})
    assert "step size 2.00e-02" in kernel.get_diagnostics_str(state)


def test_the_progress_bars_text_reads_the_state_a_few_times_a_second(logistic_data, monkeypatch):
    """NumPyro asks for the bar's text at every iteration; reading it waits for the device, so the
    kernels read it every ``DIAGNOSTICS_INTERVAL`` seconds, and at the 1st, 2nd, 4th, … call (a
    short run still gets two stamps of its clock), and repeat it in between; each reading stamps
    the run clock with the iteration it read."""
    from numpyro_sg.kernels import progress

    kernel = KERNELS["sgbd"]()
    state = kernel.init(jax.random.PRNGKey(0), 10, None, logistic_data, {})
    reads = []
    text = kernel.diagnostics_text
    monkeypatch.setattr(kernel, "diagnostics_text", lambda s: reads.append(1) or text(s))
    monkeypatch.setattr(progress, "DIAGNOSTICS_INTERVAL", 60.0)
    slower = state._replace(step_size=state.step_size / 2, i=state.i + 5)
    shown = [kernel.get_diagnostics_str(s) for s in [state] + [slower] * 99]
    assert len(reads) == 7 and len(set(shown[1:])) == 1  # read at calls 1, 2, 4, …, 64
    assert "2.00e-02" in shown[0] and "1.00e-02" in shown[-1]
    assert [i for i, _ in kernel._clock.segments[-1][1]] == [0] + [5] * 6
    monkeypatch.setattr(progress, "DIAGNOSTICS_INTERVAL", 0.0)
    kernel.get_diagnostics_str(slower)
    assert len(reads) == 8


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: nsg.SGLD(logistic_model, -1.0), "step_size must be positive"),
        (lambda: nsg.SGLD(logistic_model, 1e-3, variant="fancy"), "variant must be one of"),
        (lambda: nsg.SGLD(logistic_model, 1e-3, temperature=0.0), "temperature must be positive"),
        (lambda: nsg.SGLD(logistic_model, 1e-3, variant="corrected", minibatch_options={"estimate_noise": False}),
         "needs estimate_noise"),
        (lambda: nsg.SGBD(logistic_model, 0.0), "positive finite"),
        (lambda: nsg.SGBD(logistic_model, 0.1, variant="wild"), "variant must be one of"),
        (lambda: nsg.SGBD(logistic_model, 0.1, adapt_step_size="sometimes"), "adapt_step_size"),
        (lambda: nsg.SGBD(logistic_model, 0.1, minibatch_options={"noise_ema_weight": 0.0}), "noise_ema_weight"),
        (lambda: nsg.SGBD("not a model"), "must be a NumPyro model"),
    ],
)
def test_bad_kernel_arguments(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


#: the most parameters a kernel's constructor may take (``self`` aside; an options object is one)
MAX_CONSTRUCTOR_PARAMETERS = 12


def test_kernel_constructors_take_at_most_twelve_parameters():
    """Every kernel class the package exports takes at most 12 constructor parameters: settings
    beyond them are grouped into options objects (``minibatch_options``, ``rmsprop``, ``sites``,
    ``options``)."""
    import inspect

    kernels = [obj for name in nsg.__all__ if inspect.isclass(obj := getattr(nsg, name))
               and issubclass(obj, nsg.kernels.SGKernel)]
    assert {"SGLD", "SGBD", "SGHMC", "SGNHT", "PSGLD", "BAOAB", "ESGLD", "SparseAsync"} <= {k.__name__ for k in kernels}
    counts = {k.__name__: len([p for p in inspect.signature(k.__init__).parameters if p != "self"])
              for k in kernels}
    assert max(counts.values()) <= MAX_CONSTRUCTOR_PARAMETERS, counts


def test_per_coordinate_step_size_shape_is_checked(logistic_data):
    with pytest.raises(ValueError, match=r"step_size has shape \(2,\).*3 unconstrained"):
        _samples(nsg.SGBD(logistic_model, jnp.array([0.1, 0.1])), logistic_data, num_chains=1)
    mcmc = _samples(nsg.SGBD(logistic_model, jnp.array([0.01, 0.02, 0.03])), logistic_data,
                    num_chains=1)
    np.testing.assert_allclose(mcmc.get_extra_fields()["step_size"][0], [0.01, 0.02, 0.03])


def test_sgld_per_coordinate_step_size(logistic_data):
    with pytest.raises(ValueError, match=r"step_size has shape \(2,\).*3 unconstrained"):
        _samples(nsg.SGLD(logistic_model, jnp.array([1e-3, 1e-3])), logistic_data, num_chains=1)
    eps = jnp.array([1e-3, 0.0, 2e-3])  # ε_j = 0 freezes coordinate j
    kernel = nsg.SGLD(logistic_model, eps + jnp.array([0.0, 1e-12, 0.0]), **CLASSIC)
    mcmc = _samples(kernel, logistic_data, num_chains=1)
    theta = mcmc.get_samples()["theta"]
    assert np.ptp(theta[:, 1]) < 1e-4 < np.ptp(theta[:, 0])


def test_to_inference_data_uses_full_data(logistic_data):
    X, y = logistic_data
    mcmc = _samples(KERNELS["sgbd"](), logistic_data)
    idata = nsg.to_inference_data(mcmc, log_likelihood=True)
    assert idata.observed_data["y"].shape == (500,)
    np.testing.assert_array_equal(idata.observed_data["y"], y)
    assert idata.log_likelihood["y"].shape == (2, 100, 500)
    assert set(idata.sample_stats.data_vars) >= {"diverging", "step_size", "grad_noise_sd"}
    assert idata.posterior["theta"].shape == (2, 100, 3)
    assert "theta[0]" in az.summary(idata).index
    with pytest.raises(ValueError, match="call mcmc.run"):
        nsg.to_inference_data(MCMC(numpyro.infer.NUTS(logistic_model), num_warmup=1, num_samples=1))
    with pytest.raises(TypeError, match="numpyro.infer.MCMC"):
        nsg.to_inference_data(idata)


def test_demo_runs(capsys):
    from numpyro_sg.cli import main

    main(["demo", "--num-data", "5000", "--num-warmup", "200", "--num-samples", "400",
          "--subsample-size", "100", "--nuts-samples", "300", "--no-progress-bar"])
    out = capsys.readouterr().out
    assert "\nSGLD: " in out and "\nSGBD: " in out and "r_hat" in out
    assert "SGLD vs NUTS" in out and "min ESS/s" in out


def test_example_script_runs(tmp_path, capsys):
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "logistic_regression.py"
    module = runpy.run_path(str(script))
    out = tmp_path / "trace.png"
    module["main"](["--num-data", "4000", "--num-samples", "200", "--out", str(out)])
    assert out.stat().st_size > 10_000
    assert "SGBD: the warmup" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(KERNELS))
def test_init_traces_the_model_twice_or_nine_times_with_the_warmup(name, logistic_data):
    """One trace for the structure (plates, sites, initial values) and one for the initial
    gradient (per-datum gradients included, one vmapped trace); with the warmup's mode search
    seven more: the multi-start's prior draws, its vmapped Adam runs and the batched full-data
    pass over its end points, the Adam scan, the chunked full-data pass, the Hessian and the
    rows' gradient noise (one more, for the end points' Hessian diagonals, only when some end
    point lies far below the best: none does here).  Counted as Python calls of the model
    function (each jit/vmap trace calls it once); measured: exactly 2 and 9 for every kernel
    here, so any extra trace fails."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return logistic_model(*args, **kwargs)

    keys = jax.random.split(jax.random.PRNGKey(0), 3)  # vectorised chains: still one trace
    make = type(KERNELS[name]())
    options = {"sgld-corrected": dict(variant="corrected"), "sgbd-adaptive": dict(adapt_step_size=True),
               "baoab": dict(friction=30.0)}
    classic = make(counting, 0.01, **options.get(name, {}), **CLASSIC)
    classic.init(keys, 10, None, logistic_data, {})
    assert len(calls) <= 2, len(calls)  # structure trace, initial gradient (with per-datum noise)
    calls.clear()
    defaults = make(counting, **options.get(name, {}))
    defaults.init(keys, 10, None, logistic_data, {})
    assert len(calls) <= 9, len(calls)  # + multi-start (3), Adam scan, full-data pass, Hessian, row noise


@pytest.mark.parametrize("progress_bar", [True, False])
def test_vectorised_chains_show_their_text_and_run_after_mcmc_warmup(progress_bar):
    """The kernels are NumPyro "ensemble kernels" once ``init`` saw vectorised chains (NumPyro
    then shows their progress text); NumPyro gives such a kernel's ``run`` after ``MCMC.warmup``
    one key for all chains, from which each iteration splits one per chain: the chains differ
    and sample the posterior of a normal mean (one chain's state still steps alone) (exact: mean ȳ·N/(N + 1/100), sd ≈ 1/√N; the
    tolerance, 5 sds of the mean of 3 × 400 autocorrelated draws, is loose for SGLD's
    bias at this step)."""
    y = np.random.default_rng(0).normal(1.0, 1.0, 5_000)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("data", y.shape[0], subsample_size=100):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=numpyro.subsample(y, event_dim=0))

    kernel = nsg.SGLD(model)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=400, num_chains=3, chain_method="vectorized")
    mcmc.progress_bar = progress_bar  # (NumPyro turns it off under pytest-xdist)
    mcmc.warmup(jax.random.PRNGKey(0), y)
    assert kernel.is_ensemble_kernel
    mcmc.run(jax.random.PRNGKey(1), y)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])
    assert draws.shape == (3, 400) and len({float(d) for d in draws[:, -1]}) == 3
    exact_mean, exact_sd = y.sum() / (y.size + 1e-2), 1.0 / np.sqrt(y.size + 1e-2)
    assert abs(draws.mean() - exact_mean) < 5 * exact_sd
    assert 0.5 * exact_sd < draws.std() < 2.0 * exact_sd
    sequential = nsg.SGLD(model)
    sequential.init(jax.random.PRNGKey(0), 10, None, (y,), {})
    assert not sequential.is_ensemble_kernel
    batch = kernel.init(jax.random.split(jax.random.PRNGKey(2), 3), 10, None, (y,), {})
    one = kernel.sample(jax.tree.map(lambda leaf: leaf[0], batch), (y,), {})  # one chain of them
    assert np.shape(one.z["mu"]) == () and int(one.i) == 1
