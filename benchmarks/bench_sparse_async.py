"""SparseAsync (Atchadé & Wang 2023): speed per iteration and accuracy, exact vs async vs SA-SGLD.

Speed (``--part speed``): per-iteration time of the kernel's own step, measured by the
*difference of two run lengths* of a jitted ``lax.fori_loop`` over ``kernel.sample`` (compiled
ahead of time, so compilation cancels; no draws are collected, which would add an O(p) copy per
iteration that is MCMC's, not the kernel's).  Each chain starts at the true support (θ = θ*, |δ| = 10)
and runs 300 iterations first.  Fastest of ``--repeats`` rounds.

* ratio exact / async at p = 5,000, N = 2,500 (§4.1 set-up, ϱ = 0, J = 100);
* async time per iteration at p = 1,000, 5,000, 20,000 with N = 500, |δ| ≈ 10 and J = 100 fixed.

Scaling (``--part scaling``, ``--family linear`` or ``logistic``): per-iteration time of async
(and exact, for reference) at p = 1,000, 2,000, 4,000, 8,000 with N = 500, J = 100, measured as
above (the four sizes timed in interleaved rounds), and the ratio p = 8,000 / p = 1,000 (O(N·(size(δ) + J)) per iteration: flat in p).

Accuracy (``--part accuracy``): relative error 𝓔 (mean over the last 1,000 iterations of
‖θ·δ − θ*‖/‖θ*‖) of exact and async on §4.1 linear data, p = 1,000 (N = 500), ϱ ∈ {0, 0.9},
``--seeds`` data sets, 2,000 iterations (1,000 warmup + 1,000 kept), J = 100, paper priors
(ρ0 = N, ρ1 = 1, u = 1.5), start δ = 0 with θ from the spike, async with each ``--taylor`` term
(default: the paper's Q = 0 and the kernel's default second order); and (``--part logistic``)
exact (MALA), async (MALA; default Taylor terms: the paper's ½θ²G² and second order) and SA-SGLD (B = 100, ε = 0.01) on §4.2 logistic data, p = 1,000, N = 500,
started at the true support (the paper starts at a lasso fit).

Usage::

    python benchmarks/bench_sparse_async.py --part speed
    python benchmarks/bench_sparse_async.py --part scaling --repeats 3 --family linear
    python benchmarks/bench_sparse_async.py --part scaling --repeats 3 --family logistic
    python benchmarks/bench_sparse_async.py --part accuracy --seeds 3
    python benchmarks/bench_sparse_async.py --part accuracy --seeds 3 --rho 0.9 --taylor first second sensitive
    python benchmarks/bench_sparse_async.py --part accuracy --seeds 3 --p 5000 --rho 0
    python benchmarks/bench_sparse_async.py --part logistic --seeds 2
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg import datasets as ds
from numpyro_sg.results.selection import relative_error


def _loops(variant, X, y, truth, short=100, long=400, J=100, seed=0, model=ds.sparse_async_linear_model):
    """``(state after 300 iterations, args, {n: compiled loop of n iterations})``."""
    kernel = nsg.SparseAsync(model, variant=variant, update_size=J)
    args = (jnp.asarray(X), jnp.asarray(y))
    # start at the true support so that |δ| ≈ 10 in every configuration
    init = {"theta": jnp.asarray(truth), "delta": jnp.asarray((truth != 0).astype(np.int32))}
    state = kernel.init(jax.random.PRNGKey(seed), 0, init, args, {})

    def loop(n):
        def run(state, X, y):
            return jax.lax.fori_loop(0, n, lambda _, s: kernel.sample(s, (X, y), {}), state)

        return jax.jit(run).lower(state, *args).compile()

    state = jax.block_until_ready(loop(300)(state, *args))
    return state, args, {short: loop(short), long: loop(long)}


def _time_loops(configs, repeats):
    """Per-iteration seconds of each ``_loops`` result: the fastest of ``repeats`` rounds of each
    run length (the configurations interleaved within a round, so that a change of machine load
    hits them all), long minus short over the difference of lengths."""
    best = [{n: np.inf for n in loops} for _, _, loops in configs]
    for _ in range(repeats):
        for (state, args, loops), b in zip(configs, best):
            for n, f in loops.items():
                t = time.perf_counter()
                jax.block_until_ready(f(state, *args))
                b[n] = min(b[n], time.perf_counter() - t)
    out = []
    for b in best:
        short, long = sorted(b)
        out.append((b[long] - b[short]) / (long - short))
    return out


def _per_iteration(variant, X, y, truth, repeats=2, short=100, long=400, J=100, seed=0):
    state, args, loops = _loops(variant, X, y, truth, short, long, J, seed)
    return _time_loops([(state, args, loops)], repeats)[0], int(state.model_size)


def speed(repeats):
    out = {}
    X, y, truth = ds.simulate_sparse_linear(5000, seed=0)
    for variant in ("exact", "async"):
        t, k = _per_iteration(variant, X, y, truth, repeats)
        out[f"p5000_{variant}"] = t
        print(f"p = 5,000, N = 2,500, {variant:5s}: {t * 1e3:.3f} ms/iteration (|δ| = {k})", flush=True)
    out["ratio_exact_over_async_p5000"] = out["p5000_exact"] / out["p5000_async"]
    print(f"ratio exact / async at p = 5,000: {out['ratio_exact_over_async_p5000']:.1f}", flush=True)
    for p in (1000, 5000, 20000):
        X, y, truth = ds.simulate_sparse_linear(p, num_data=500, seed=0)
        t, k = _per_iteration("async", X, y, truth, repeats)
        out[f"async_N500_p{p}"] = t
        print(f"async, N = 500, p = {p:6d}: {t * 1e3:.3f} ms/iteration (|δ| = {k})", flush=True)
    out["growth_p1000_to_p20000"] = out["async_N500_p20000"] / out["async_N500_p1000"]
    print(f"growth of async's time per iteration, p = 1,000 → 20,000: {out['growth_p1000_to_p20000']:.2f}×")
    return out


def scaling(repeats, family="linear"):
    """Per-iteration ms at p = 1,000 … 8,000, N = 500, J = 100: async (and exact, for reference);
    the four sizes of a variant are compiled first, then timed in interleaved rounds."""
    out = {}
    simulate, model = {
        "linear": (ds.simulate_sparse_linear, ds.sparse_async_linear_model),
        "logistic": (ds.simulate_sparse_logistic, ds.sparse_async_logistic_model),
    }[family]
    sizes = (1000, 2000, 4000, 8000)
    for variant in ("async", "exact"):
        configs = [_loops(variant, *simulate(p, num_data=500, seed=0), model=model) for p in sizes]
        times = _time_loops(configs, repeats)
        for p, t, (state, _, _) in zip(sizes, times, configs):
            out[f"{family}_{variant}_p{p}"] = t
            print(f"{family} {variant:5s} N = 500, p = {p:5d}: {t * 1e3:.3f} ms/iteration "
                  f"(|δ| = {int(state.model_size)})", flush=True)
        ratio = out[f"{family}_{variant}_p8000"] / out[f"{family}_{variant}_p1000"]
        out[f"{family}_{variant}_ratio_p8000_over_p1000"] = ratio
        print(f"{family} {variant}: ratio p = 8,000 / p = 1,000: {ratio:.2f}", flush=True)
    return out


def _run(model, variant, X, y, seed, init=None, **kw):
    kernel = nsg.SparseAsync(model, variant=variant, update_size=100, **kw)
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=1000, progress_bar=False)
    t = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y, init_params=init, extra_fields=("model_size",))
    wall = time.perf_counter() - t
    return mcmc, wall


def accuracy(seeds, p=1000, rhos=(0.0, 0.9), taylors=("first", "second")):
    out = {}
    runs = [("exact", {})] + [(f"async-{t}", {"options": {"taylor": t}}) for t in taylors]
    for rho in rhos:
        for seed in range(seeds):
            X, y, truth = ds.simulate_sparse_linear(p, correlation=rho, seed=seed)
            for name, kw in runs:
                mcmc, wall = _run(ds.sparse_async_linear_model, name.split("-")[0], X, y, seed, **kw)
                err = relative_error(mcmc, truth)
                size = float(np.median(np.asarray(mcmc.get_extra_fields()["model_size"])))
                out.setdefault(f"rho{rho}_{name}", []).append(err)
                print(f"linear p={p} ϱ={rho} seed={seed} {name:14s}: 𝓔 = {err:.4f}, median |δ| = {size:.0f}, "
                      f"{wall:.1f} s", flush=True)
        e = np.mean(out[f"rho{rho}_exact"])
        for name, _ in runs[1:]:
            a = np.mean(out[f"rho{rho}_{name}"])
            print(f"ϱ = {rho}: mean 𝓔 exact {e:.4f}, {name} {a:.4f}, ratio {a / e:.2f}", flush=True)
    return out


def logistic(seeds, p=1000, taylors=("sensitive", "second")):
    out = {}
    runs = ([("exact", {})] + [(f"async-{t}", {"options": {"taylor": t}}) for t in taylors]
            + [("sgld", {"subsample_size": 100, "step_size": 0.01})])
    for seed in range(seeds):
        X, y, truth = ds.simulate_sparse_logistic(p, seed=seed)
        init = {"theta": jnp.asarray(truth), "delta": jnp.asarray((truth != 0).astype(np.int32))}
        for name, kw in runs:
            mcmc, wall = _run(ds.sparse_async_logistic_model, name.split("-")[0], X, y, seed, init=init, **kw)
            err = relative_error(mcmc, truth)
            out.setdefault(name, []).append(err)
            print(f"logistic p={p} seed={seed} {name:14s}: 𝓔 = {err:.4f}, {wall:.1f} s", flush=True)
    e = np.mean(out["exact"])
    for name, _ in runs[1:]:
        print(f"logistic: mean 𝓔 {name} {np.mean(out[name]):.4f} vs exact {e:.4f}: ratio {np.mean(out[name]) / e:.2f}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("speed", "scaling", "accuracy", "logistic"), default="speed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--p", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.9])
    ap.add_argument("--taylor", nargs="+", choices=("first", "sensitive", "second"), default=None,
                    help="the Taylor terms of the async runs (default: accuracy first and second, "
                         "logistic sensitive and second)")
    ap.add_argument("--family", choices=("linear", "logistic"), default="linear",
                    help="the likelihood of --part scaling")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.part == "speed":
        res = speed(a.repeats)
    elif a.part == "scaling":
        res = scaling(a.repeats, a.family)
    elif a.part == "accuracy":
        res = accuracy(a.seeds, a.p, tuple(a.rho), *([a.taylor] if a.taylor else []))
    else:
        res = logistic(a.seeds, a.p, *([a.taylor] if a.taylor else []))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
