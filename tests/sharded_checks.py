"""Checks of data sharded over 4 forced host devices, run in a subprocess by
``tests/test_sharding.py`` (the device count must be set before JAX starts):
``python tests/sharded_checks.py NAME`` prints a JSON dict of measurements."""

import os
import sys

if __name__ == "__main__":  # (imported by multiprocess_checks.py, which sets its own devices)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import numpyro_sg as nsg  # noqa: E402
from numpyro_sg.arviz_compat import group_names  # noqa: E402
from numpyro_sg.infer.minibatch import Anchor, Minibatcher  # noqa: E402
from numpyro_sg.infer.model_info import trace_model  # noqa: E402
from numpyro_sg.infer.plates import discover_plates  # noqa: E402
from numpyro_sg.infer.sharded_minibatch import make_minibatcher  # noqa: E402
from numpyro_sg.infer.sharding import auto_view, shard_rows  # noqa: E402

N, D, NB = 4000, 4, 100
PRIOR_SD = 3.0


def logistic(X, y, n=NB):
    N_, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0.0, PRIOR_SD).expand([d]).to_event(1))
    with numpyro.plate("data", N_, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=yb)


def hard_coded(X, y):
    theta = numpyro.sample("theta", dist.Normal(0.0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", N, subsample_size=NB):
        Xb = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=numpyro.subsample(y, event_dim=0))


def data(sort=True):
    """Logistic data; rows sorted by the first feature so that the four shards differ."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N, 3)).astype(np.float32)
    if sort:
        X = X[np.argsort(X[:, 0])]
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ np.array([1.0, -0.5, 0.25])))).astype(np.float32)
    return X, y


def mesh(kind="explicit", shape=(D,), names=("data",)):
    types = (AxisType.Explicit if kind == "explicit" else AxisType.Auto,) * len(shape)
    return jax.make_mesh(shape, names, axis_types=types)


def collectives(hlo: str) -> list:
    """``(op, element count)`` of every collective in a compiled program's text (a tuple-shaped
    one, e.g. ``(f32[12], f32[12,12]) all-reduce(...)``, counts all its elements)."""
    out = []
    for line in hlo.splitlines():
        m = re.search(r"=\s*(.*?)\s+(all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)"
                      r"(-start)?\(", line)
        if m:
            shapes = re.findall(r"\w+\[([\d,]*)\]", m.group(1))
            out.append((m.group(2), int(sum(np.prod([int(s) for s in d.split(",") if s]) for d in shapes))))
    return out


def largest_constant(hlo: str) -> int:
    """Element count of the largest literal constant of a compiled program."""
    sizes = [int(np.prod([int(s) for s in m.group(1).split(",") if s]))
             for m in re.finditer(r"\w+\[([\d,]*)\][^ ]*\s+constant\(", hlo)]
    return max(sizes, default=0)


def _setup(X, y, m):
    args = (shard_rows(X, m), shard_rows(y, m))
    plates = discover_plates(logistic, *auto_view(args, {}))
    info = trace_model(logistic, *auto_view(args, {}))
    _, unravel = ravel_pytree(info.unconstrained_example())
    return args, plates, unravel


def check_unbiased():
    """4,000 stratified estimates (plain and control variate) at θ against the exact gradient and
    the exact variances of simple random sampling and of stratified sampling."""
    X, y = data()
    args, plates, unravel = _setup(X, y, mesh())
    mb = make_minibatcher(logistic, plates, True, args, {})
    theta = np.array([0.5, -0.3, 0.2])
    x = jnp.asarray(theta, jnp.float32)
    u = (y - 1 / (1 + np.exp(-X.astype(np.float64) @ theta)))[:, None] * X  # ∇ log f_i, float64
    exact = u.sum(0) - theta / PRIOR_SD**2
    var_srs = N**2 / NB * u.var(0)
    var_strat = N**2 / NB * np.mean([b.var(0) for b in np.split(u, D)], axis=0)
    anchor_x = jnp.zeros(3, jnp.float32)
    full_grad = Minibatcher(logistic, plates).full_value_and_grad_fn(unravel, (X, y), {})(anchor_x)[1]
    anchor = Anchor(anchor_x, full_grad)

    def one(key, anc):
        idx, _ = mb.draw(key, None)
        est = mb.estimate_at(unravel, x, idx, anchor=anc, noise=True, model_args=args)
        return est.grad, est.noise_sd**2

    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    out = {"exact": exact.tolist(), "var_srs": var_srs.tolist(), "var_strat": var_strat.tolist()}
    for name, anc in (("plain", None), ("cv", anchor)):
        g, tau2 = jax.jit(jax.vmap(lambda k: one(k, anc)))(keys)
        g, tau2 = np.asarray(g, np.float64), np.asarray(tau2, np.float64)
        out[name] = {"mean": g.mean(0).tolist(), "se": (g.std(0) / np.sqrt(len(g))).tolist(),
                     "var": g.var(0).tolist(), "tau2": tau2.mean(0).tolist()}
    return out


def _kernel(name, model=logistic):
    return {"SGLD": nsg.SGLD, "SGBD": nsg.SGBD, "SGHMC": nsg.SGHMC}[name](model)


def check_hlo():
    """Collectives and constants of the compiled step (1 and 3 vectorized chains) and of the
    warmup's programs."""
    X, y = data()
    args, plates, unravel = _setup(X, y, mesh())
    out, fit = {}, None
    for name in ("SGLD", "SGBD", "SGHMC"):
        kernel = _kernel(name)
        if fit is not None:
            kernel.use_mode_fit(fit)
        mcmc = MCMC(kernel, num_warmup=5, num_samples=5, num_chains=3, chain_method="vectorized",
                    progress_bar=False, jit_model_args=True)
        mcmc.run(jax.random.PRNGKey(0), *args)
        fit = kernel.mode_fit
        for chains, state in ((3, mcmc.last_state), (1, jax.tree.map(lambda s: s[0], mcmc.last_state))):
            hlo = jax.jit(kernel.sample).lower(state, args, {}).compile().as_text()
            out[f"step {name} {chains}"] = {"collectives": collectives(hlo), "constant": largest_constant(hlo),
                                            "noise": kernel.estimate_noise}
    mb = make_minibatcher(logistic, plates, True, args, {})
    rows = mb.random_rows(2000, jax.random.PRNGKey(1))
    x0, v = jnp.zeros(3), jnp.ones(3)

    def ld(a):
        return lambda t, idx: mb.log_density_fn(a, {})(unravel(t), idx)

    programs = {
        "full data": lambda x, a: mb.full_value_and_grad_fn(unravel, a, {}, 256)(x),
        "optimizer batch": lambda x, a: jax.grad(ld(a))(x, mb.draw(jax.random.PRNGKey(0), None)[0]),
        "hessian": lambda x, a, r: jax.hessian(ld(a))(x, r),
        "hvp": lambda x, a, r: jax.jvp(jax.grad(lambda t: ld(a)(t, r)), (x,), (v,))[1],
    }
    programs["fisher"] = lambda x, a, r: mb.fisher_diagonal(unravel, x, r, 8, a, {})
    programs["prior hvp"] = lambda x, a: jax.jvp(jax.grad(lambda t: mb.prior_log_density_fn(a, {})(unravel(t))),
                                                 (x,), (v,))[1]
    programs["noise"] = lambda x, a: mb.cv_noise_sd(unravel, x, jax.random.PRNGKey(2), Anchor(x, x), a, {})
    for name, fn in programs.items():
        extra = (rows,) if name in ("hessian", "hvp", "fisher") else ()
        hlo = jax.jit(fn).lower(x0, args, *extra).compile().as_text()
        out[f"warmup {name}"] = {"collectives": collectives(hlo), "constant": largest_constant(hlo)}
    exact = Minibatcher(logistic, plates).full_value_and_grad_fn(unravel, (X, y), {})(x0)
    sharded = jax.jit(programs["full data"])(x0, args)
    out["full data error"] = float(np.max(np.abs(np.asarray(sharded[1]) - np.asarray(exact[1]))))
    out["full data value error"] = float(abs(sharded[0] - exact[0]))
    return out


def _draws(kernel_name, X, y, key=0, kind=None, chains=4, samples=2000):
    args = (X, y) if kind is None else (shard_rows(X, mesh(kind)), shard_rows(y, mesh(kind)))
    mcmc = MCMC(_kernel(kernel_name), num_warmup=500, num_samples=samples, num_chains=chains,
                chain_method="vectorized", progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.PRNGKey(key), *args)
    return np.asarray(mcmc.get_samples()["theta"], np.float64)


def check_posteriors():
    """Sharded (4 devices) against unsharded draws of SGLD, SGBD and SGHMC (defaults, the same
    keys: the chains share their injected noise, the mini-batches differ)."""
    X, y = data()
    out = {}
    for name in ("SGLD", "SGBD", "SGHMC"):
        ref, sharded = _draws(name, X, y), _draws(name, X, y, kind="explicit")
        sd = ref.std(0)
        out[name] = {"mean_diff_sd": ((sharded.mean(0) - ref.mean(0)) / sd).tolist(),
                     "sd_ratio": (sharded.std(0) / sd).tolist()}
    auto = _draws("SGLD", X, y, kind="auto", chains=2, samples=200)
    explicit = _draws("SGLD", X, y, kind="explicit", chains=2, samples=200)
    out["auto_equals_explicit"] = bool(np.array_equal(auto, explicit))
    return out


def check_one_device():
    """The multi-device recipe on a mesh of one device (Explicit axes): it runs, and its SGLD
    draws match the unsharded ones' (same keys)."""
    X, y = data()
    one = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",), axis_types=(AxisType.Explicit,))
    rows = NamedSharding(one, P("data"))
    mcmc = MCMC(_kernel("SGLD"), num_warmup=500, num_samples=2000, num_chains=4, chain_method="vectorized",
                progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.PRNGKey(0), jax.device_put(X, rows), jax.device_put(y, rows))
    draws, ref = np.asarray(mcmc.get_samples()["theta"], np.float64), _draws("SGLD", X, y)
    sd = ref.std(0)
    return {"mean_diff_sd": ((draws.mean(0) - ref.mean(0)) / sd).tolist(), "sd_ratio": (draws.std(0) / sd).tolist()}


def check_diagonal():
    """The diagonal warmup (``dense_max`` below d: Fisher diagonal, gradient-noise heat) on 4
    shards against one device: its scales, and SGLD's draws with the same keys."""
    X, y = data()
    args, plates, unravel = _setup(X, y, mesh())
    mb, x = make_minibatcher(logistic, plates, True, args, {}), jnp.array([1.0, -0.5, 0.25])
    rows = mb.random_rows(2048, jax.random.PRNGKey(1))   # 512 rows per shard: whole groups and blocks
    fisher = jax.jit(lambda x, a, r: mb.fisher_diagonal(unravel, x, r, 8, a, {}))(x, args, rows)
    fisher_one = Minibatcher(logistic, plates).fisher_diagonal(unravel, x, {"data": np.asarray(rows["data"])},
                                                                8, (X, y), {})
    options = {"dense_max": 2}
    out = {"fisher_ratio": (np.asarray(fisher) / np.asarray(fisher_one)).tolist()}
    for where, args in (("one", (X, y)), ("sharded", (shard_rows(X, mesh()), shard_rows(y, mesh())))):
        kernel = nsg.SGLD(logistic, warmup_options=options)
        mcmc = MCMC(kernel, num_warmup=500, num_samples=2000, num_chains=4, chain_method="vectorized",
                    progress_bar=False, jit_model_args=True)
        mcmc.run(jax.random.PRNGKey(0), *args)
        fit = kernel.mode_fit
        out[where] = {"draws": np.asarray(mcmc.get_samples()["theta"], np.float64),
                      "scale": np.asarray(fit.preconditioner.scale, np.float64), "heat": fit.noise_heat}
    one, sharded = out["one"], out["sharded"]
    sd = one["draws"].std(0)
    return {"fisher_ratio": out["fisher_ratio"], "mean_diff_sd": ((sharded["draws"].mean(0) - one["draws"].mean(0)) / sd).tolist(),
            "sd_ratio": (sharded["draws"].std(0) / sd).tolist(),
            "scale_ratio": (sharded["scale"] / one["scale"]).tolist(),
            "heat": [one["heat"], sharded["heat"]]}


P_SS = 12


def spike_slab(X, y, n=NB, family="bernoulli"):
    """A spike-and-slab logistic regression (ESGLD's default informed, control-variate path);
    ``family="normal"``: the linear one (SparseAsync's exact Gaussian draw of the block)."""
    N_, p = X.shape
    g = numpyro.sample("gamma", dist.Bernoulli(0.1).expand([p]).to_event(1))
    th = numpyro.sample("theta", dist.Normal(0.0, jnp.where(g == 1, 2.0, 0.05)).to_event(1))
    with numpyro.plate("data", N_, subsample_size=n):
        eta = numpyro.subsample(X, event_dim=1) @ (th * g)
        likelihood = dist.Bernoulli(logits=eta) if family == "bernoulli" else dist.Normal(eta, 1.0)
        numpyro.sample("y", likelihood, obs=numpyro.subsample(y, event_dim=0))


def spike_slab_data():
    """Three clear effects, one borderline (inclusion ≈ 0.9), eight nulls; rows sorted by the
    first feature so that the four shards differ."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, P_SS)).astype(np.float32)
    b = np.zeros(P_SS)
    b[:4] = [1.0, -0.7, 0.5, 0.12]
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ b))).astype(np.float32)
    order = np.argsort(X[:, 0])
    return X[order], y[order]


def _esgld_draws(args, n, samples):
    mcmc = MCMC(nsg.ESGLD(functools.partial(spike_slab, n=n)), num_warmup=500, num_samples=samples,
                num_chains=4, chain_method="vectorized", progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.PRNGKey(0), *args)
    s = mcmc.get_samples()
    return mcmc, np.asarray(s["beta"], np.float64), np.asarray(s["inclusion_rb"], np.float64)


def check_esgld_posterior():
    """ESGLD (defaults, n = 100) on 4 shards against one device, the same keys: the first four
    coefficients' means and sds, and the mean Rao-Blackwellised inclusion."""
    X, y = spike_slab_data()
    _, b1, r1 = _esgld_draws((X, y), NB, 3000)
    _, b2, r2 = _esgld_draws((shard_rows(X, mesh()), shard_rows(y, mesh())), NB, 3000)
    sd = b1.std(0)[:4]
    return {"mean_diff_sd": ((b2.mean(0) - b1.mean(0))[:4] / sd).tolist(),
            "sd_ratio": (b2.std(0)[:4] / sd).tolist(),
            "inclusion_diff": float(np.max(np.abs(r2.mean(0) - r1.mean(0))))}


def check_esgld():
    """ESGLD with a full batch (n = N: the same sums, in another order) on 4 shards and on one
    device, the collectives of its compiled step, its InferenceData and what it refuses."""
    X, y = spike_slab_data()
    sharded = (shard_rows(X, mesh()), shard_rows(y, mesh()))
    _, b1, r1 = _esgld_draws((X, y), N, 200)
    mcmc, b2, r2 = _esgld_draws(sharded, N, 200)
    out = {"max_abs_diff": float(np.max(np.abs(b2 - b1))), "inclusion_diff": float(np.max(np.abs(r2 - r1)))}
    mcmc = MCMC(nsg.ESGLD(spike_slab), num_warmup=5, num_samples=5, progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.PRNGKey(0), *sharded)
    hlo = jax.jit(mcmc.sampler.sample).lower(mcmc.last_state, sharded, {}).compile().as_text()
    out["collectives"] = collectives(hlo)
    out["constant"] = largest_constant(hlo)
    out["idata_groups"] = sorted(group_names(nsg.to_inference_data(mcmc, check=False)))

    def run(kernel, jit=True):
        MCMC(kernel, num_warmup=3, num_samples=3, progress_bar=False, jit_model_args=jit).run(
            jax.random.PRNGKey(0), *sharded)

    out["paper"] = _error(lambda: run(nsg.ESGLD(spike_slab, proposal="paper")))
    out["jit_model_args"] = _error(lambda: run(nsg.ESGLD(spike_slab), jit=False))
    return out


def spike_slab_intercept(X, y, n=NB):
    """spike_slab with an intercept: a second continuous site, outside SparseAsync's fast path."""
    N_, p = X.shape
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    g = numpyro.sample("gamma", dist.Bernoulli(0.1).expand([p]).to_event(1))
    th = numpyro.sample("theta", dist.Normal(0.0, jnp.where(g == 1, 2.0, 0.05)).to_event(1))
    with numpyro.plate("data", N_, subsample_size=n):
        Xb = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Bernoulli(logits=a + Xb @ (th * g)), obs=numpyro.subsample(y, event_dim=0))


def linear_response(X):
    """Gaussian responses of spike_slab_data's design (the same four effects, noise sd 1)."""
    rng = np.random.default_rng(1)
    return (X[:, :4] @ np.array([1.0, -0.7, 0.5, 0.12]) + rng.normal(size=X.shape[0])).astype(np.float32)


def _sparse_async_draws(model, variant, args, chains=2, samples=100, kind=None):
    mcmc = MCMC(nsg.SparseAsync(model, variant=variant, update_size=6), num_warmup=samples,
                num_samples=samples, num_chains=chains, chain_method="vectorized", progress_bar=False,
                jit_model_args=True)
    mcmc.run(jax.random.PRNGKey(0), *args)
    return mcmc, np.asarray(mcmc.get_samples()["beta"], np.float64)


def check_sparse_async():
    """SparseAsync (fast path) on 4 shards and on one device, the same keys: "async" with MALA
    (logistic, Explicit mesh) and "exact" with the Gaussian block draw (linear, Auto mesh) give
    the same draws up to rounding; the collectives of the compiled steps of one chain ("async",
    "exact", "sgld"); what it refuses."""
    X, y = spike_slab_data()
    ylin = linear_response(X)
    linear = functools.partial(spike_slab, family="normal")
    out = {}
    for name, model, variant, yy, kind in [("async", spike_slab, "async", y, "explicit"),
                                           ("exact", linear, "exact", ylin, "auto")]:
        m = mesh(kind)
        _, b1 = _sparse_async_draws(model, variant, (X, yy))
        _, b2 = _sparse_async_draws(model, variant, (shard_rows(X, m), shard_rows(yy, m)))
        out[name] = {"max_abs_diff": float(np.max(np.abs(b2 - b1))), "mean": b1.mean(0)[:4].tolist()}
    sharded = (shard_rows(X, mesh()), shard_rows(y, mesh()))
    for variant in ("async", "exact", "sgld"):
        mcmc, _ = _sparse_async_draws(spike_slab, variant, sharded, chains=1, samples=5)
        hlo = jax.jit(mcmc.sampler.sample).lower(mcmc.last_state, sharded, {}).compile().as_text()
        out[variant + "_hlo"] = {"collectives": collectives(hlo), "constant": largest_constant(hlo)}
    out["idata_groups"] = sorted(group_names(nsg.to_inference_data(mcmc, check=False)))

    def run(model, **kw):
        MCMC(nsg.SparseAsync(model, **kw), num_warmup=3, num_samples=3, progress_bar=False,
             jit_model_args=True).run(jax.random.PRNGKey(0), *sharded)

    out["dense"] = _error(lambda: run(spike_slab_intercept))
    out["replace"] = _error(lambda: run(spike_slab, variant="sgld", minibatch_options={"replace": False}))
    return out


def check_sparse_async_posterior():
    """SA-SGLD (n = 100) on 4 shards against one device: the first four coefficients' means
    and sds, 4 chains × 4,000 draws each."""
    X, y = spike_slab_data()
    _, b1 = _sparse_async_draws(spike_slab, "sgld", (X, y), chains=4, samples=4000)
    _, b2 = _sparse_async_draws(spike_slab, "sgld", (shard_rows(X, mesh()), shard_rows(y, mesh())),
                                chains=4, samples=4000)
    sd = b1.std(0)[:4]
    return {"mean_diff_sd": ((b2.mean(0) - b1.mean(0))[:4] / sd).tolist(),
            "sd_ratio": (b2.std(0)[:4] / sd).tolist()}


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError) as e:
        return str(e)
    return ""


def check_errors():
    """The clear errors: jit_model_args=False, chain_method='parallel', a hard-coded plate size,
    n not a multiple of D, replace=False, rows not divisible by D; and a two-axis mesh runs."""
    X, y = data(sort=False)
    m = mesh()
    args = (shard_rows(X, m), shard_rows(y, m))
    key = jax.random.PRNGKey(0)

    def run(kernel, *a, jit=True, method="vectorized", chains=1):
        MCMC(kernel, num_warmup=3, num_samples=3, num_chains=chains, chain_method=method,
             progress_bar=False, jit_model_args=jit).run(key, *a)

    out = {
        "jit_model_args": _error(lambda: run(nsg.SGLD(logistic), *args, jit=False)),
        "parallel": _error(lambda: run(nsg.SGLD(logistic), *args, method="parallel", chains=2)),
        "hard_coded": _error(lambda: run(nsg.SGLD(hard_coded), *args)),
        "batch": _error(lambda: run(nsg.SGLD(logistic, subsample_size=102), *args)),
        "replace": _error(lambda: run(nsg.SGLD(logistic, minibatch_options={"replace": False}), *args)),
    }
    Xnan = X.copy()
    Xnan[2500, 1] = np.nan
    out["nan"] = _error(lambda: run(nsg.SGLD(logistic), shard_rows(Xnan, m), args[1]))
    try:
        odd = (shard_rows(X[:N - 2], m), shard_rows(y[:N - 2], m))
        out["rows"] = _error(lambda: run(nsg.SGLD(logistic), *odd))
    except ValueError as e:  # JAX refuses the placement itself
        out["rows"] = "jax: " + str(e)
    two = jax.make_mesh((2, 2), ("data", "model"))
    mcmc = MCMC(nsg.SGLD(logistic), num_warmup=50, num_samples=50, progress_bar=False, jit_model_args=True)
    mcmc.run(key, shard_rows(X, two, "data"), shard_rows(y, two, "data"))
    out["two_axis_mean"] = np.asarray(mcmc.get_samples()["theta"]).mean(0).tolist()
    out["idata_groups"] = sorted(group_names(nsg.to_inference_data(mcmc, check=False)))
    return out


if __name__ == "__main__":
    print(json.dumps(globals()["check_" + sys.argv[1]]()))
