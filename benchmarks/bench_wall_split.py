"""Where the defaults' ``MCMC.run`` wall time goes: trace / mode search / compile / loop / checks.

Setting of ``benchmarks/bench_vs_nuts.py``: logistic regression, d = 20, float32, mini-batch
n = 1,000, ``MCMC(nsg.SGLD(model), num_warmup=1000, num_samples=2000, num_chains=4,
chain_method="vectorized", progress_bar=False)`` at N ∈ {10⁵, 10⁶, 10⁷} (``--sizes``).

Per N, in one process, after an untimed run on N = 2,000 (JAX's process-wide one-off costs):

* **first run** — a fresh ``MCMC`` and kernel, timed whole and split into: *init* (the kernel's
  ``init``: model trace, plate discovery, data check, first-gradient program), of which *mode
  search* (``kernel.mode_fit.seconds``); *collection loop* (from the end of ``init`` to the end
  of ``run``: NumPyro's loop, compiled and run); compilation inside each phase from
  ``jax.monitoring``'s ``backend_compile`` events (cache hits of the persistent cache are
  counted apart); and *checks* (:func:`numpyro_sg.check_convergence` afterwards);
* **conversion** — ``to_inference_data`` of the first run with its defaults (the KSD's
  full-data scores stop once the run's sampling time is spent; ``--ksd-draws 1000`` scores
  1,000 draws per chain whatever they cost): its seconds against the run's;
* **second run** — ``run`` again on the same ``MCMC`` object and data (what a notebook re-run
  does when it keeps the object; NumPyro re-jits its loop for a new ``MCMC`` object);
* **new objects** — a new ``MCMC`` and a new kernel on the same data (a re-executed cell);
* **loop alone** — the same 3,000 vectorised iterations of ``kernel.sample`` collecting the
  draws, compiled ahead of time (``jax.jit(...).lower(...).compile()``) with the data as
  arguments, and run alone: the reference of the ratios ``run / loop``.

``--jit-model-args`` runs ``MCMC(..., jit_model_args=True)``; ``--progress-bar`` runs NumPyro's
default ``progress_bar=True``, whose loop calls one compiled step per iteration from Python (and
keeps it across runs: a second ``run`` compiles nothing), where ``progress_bar=False`` compiles
the whole loop as one program, again at every ``run``; ``--cache DIR`` enables the
persistent compilation cache (:func:`numpyro_sg.enable_compilation_cache`) in ``DIR``: run the
script twice with the same ``DIR`` to measure a fresh process with a warm cache.  The load
average (``os.getloadavg()``) is printed with every result: the machine's other processes
inflate every time, and the ratios are measured in one process so that load affects both
sides.

Usage::

    python benchmarks/bench_wall_split.py --sizes 1e6
    python benchmarks/bench_wall_split.py --sizes 1e5,1e6,1e7 --json split.json
    python benchmarks/bench_wall_split.py --sizes 1e6 --cache /tmp/nsg-cache   # twice
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

import numpyro_sg as nsg

SUBSAMPLE = 1000
D = 20
WARMUP, SAMPLES, CHAINS = 1000, 2000, 4


def logistic(X, y=None):
    N, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=yb)


def simulate(N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D)).astype(np.float32)
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ (0.5 * rng.normal(size=D))))).astype(np.float32)
    return X, y


class CompileEvents:
    """``jax.monitoring`` listener: (end time, seconds) of every XLA compilation, and the
    persistent cache's hits."""

    def __init__(self):
        self.compiles, self.hits = [], []
        jax.monitoring.register_event_duration_secs_listener(self._duration)
        jax.monitoring.register_event_listener(self._event)

    def _duration(self, event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.compiles.append((time.perf_counter(), seconds))

    def _event(self, event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            self.hits.append(time.perf_counter())

    def between(self, t0, t1):
        """(seconds compiling, number of compilations, cache hits) in [t0, t1]."""
        c = [s for t, s in self.compiles if t0 <= t <= t1]
        return sum(c), len(c), sum(t0 <= t <= t1 for t in self.hits)


def load():
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def timed_run(mcmc, X, y, events, key=1):
    """One ``mcmc.run`` split into init (mode search inside) and the collection loop."""
    kernel = mcmc.sampler
    marks = {}
    init = type(kernel).init

    def timed_init(*args, **kwargs):
        marks["init0"] = time.perf_counter()
        out = init(kernel, *args, **kwargs)
        jax.block_until_ready(out)
        marks["init1"] = time.perf_counter()
        return out

    kernel.init = timed_init  # instance attribute: what MCMC calls
    fit_seconds_before = getattr(kernel.mode_fit, "seconds", None)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the convergence check's verdict is timed below
        mcmc.run(jax.random.PRNGKey(key), X, y)
        jax.block_until_ready(mcmc.get_samples())
    t1 = time.perf_counter()
    del kernel.init
    fit = kernel.mode_fit
    searched = fit is not None and getattr(fit, "seconds", None) != fit_seconds_before
    mode = fit.seconds if searched else 0.0
    out = dict(total=t1 - t0, init=marks["init1"] - marks["init0"], mode_search=mode,
               loop=t1 - marks["init1"])
    out["init_compile"], out["init_compiles"], out["init_hits"] = events.between(marks["init0"], marks["init1"])
    out["loop_compile"], out["loop_compiles"], out["loop_hits"] = events.between(marks["init1"], t1)
    t2 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nsg.check_convergence(mcmc)
    out["checks"] = time.perf_counter() - t2
    out["load"] = load()
    return out


def loop_alone(kernel, X, y, repeats=3):
    """The run's sampling loop compiled ahead of time, data as arguments, timed alone (fastest
    of ``repeats``): ``(seconds, compile seconds)``."""
    keys = jax.random.split(jax.random.PRNGKey(2), CHAINS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = kernel.init(keys, WARMUP, None, (X, y), {})
    T = WARMUP + SAMPLES

    def loop(state, X, y):
        post = jax.vmap(kernel.postprocess_fn((X, y), {}))

        def body(i, carry):
            st, buf = carry
            st = kernel.sample(st, (X, y), {})
            buf = jax.tree.map(lambda b, v: b.at[jnp.maximum(i - WARMUP, 0)].set(v), buf, post(st.z))
            return st, buf

        buf = jax.tree.map(lambda v: jnp.zeros((SAMPLES,) + v.shape, v.dtype), post(state.z))
        return jax.lax.fori_loop(0, T, body, (state, buf))

    t0 = time.perf_counter()
    compiled = jax.jit(loop).lower(state, X, y).compile()
    compile_s = time.perf_counter() - t0
    Xd, yd = jnp.asarray(X), jnp.asarray(y)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(state, Xd, yd))
        times.append(time.perf_counter() - t0)
    return min(times), compile_s


def timed_conversion(mcmc, ksd_draws="auto"):
    """``to_inference_data(mcmc, ksd_draws=ksd_draws)`` (by default, the KSD's full-data scores
    within the run's sampling time): seconds, and the draws per chain it scored."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = nsg.to_inference_data(mcmc, check=False, ksd_draws=ksd_draws)
    return dict(total=time.perf_counter() - t0, ksd_draws_per_chain=idata.sample_stats.attrs["ksd_draws_per_chain"],
                sampling_time=idata.posterior.attrs["sampling_time"])


def new_mcmc(args):
    return MCMC(nsg.SGLD(logistic), num_warmup=WARMUP, num_samples=SAMPLES, num_chains=CHAINS,
                chain_method="vectorized", progress_bar=args.progress_bar, jit_model_args=args.jit_model_args)


def measure(N, args, events):
    X, y = simulate(N)
    mcmc = new_mcmc(args)
    first = timed_run(mcmc, X, y, events)
    conversion = timed_conversion(mcmc, args.ksd_draws)
    second = timed_run(mcmc, X, y, events, key=3)
    fresh = timed_run(new_mcmc(args), X, y, events, key=4)
    loop, loop_compile = loop_alone(mcmc.sampler, X, y)
    return dict(N=N, first=first, conversion=conversion, second=second, new_objects=fresh, loop_alone=loop,
                loop_alone_compile=loop_compile,
                ratios=dict(first=first["total"] / loop, second=second["total"] / loop,
                            new_objects=fresh["total"] / loop))


def report(r):
    lines = [f"N = {r['N']:.0e}: loop alone {r['loop_alone']:.2f} s (AOT compile "
             f"{r['loop_alone_compile']:.2f} s)"]
    for name in ("first", "second", "new_objects"):
        p = r[name]
        lines.append(
            f"  {name:<11} total {p['total']:6.2f} s = init {p['init']:5.2f} (mode search "
            f"{p['mode_search']:5.2f}; compiling {p['init_compile']:5.2f} in {p['init_compiles']} "
            f"programs, {p['init_hits']} cache hits) + loop {p['loop']:5.2f} (compiling "
            f"{p['loop_compile']:5.2f} in {p['loop_compiles']}, {p['loop_hits']} hits); checks "
            f"{p['checks']:4.2f} s; ratio to loop {r['ratios'][name]:5.2f}; load {p['load']}")
        if name == "first":
            c = r["conversion"]
            lines.append(f"  conversion  to_inference_data {c['total']:6.2f} s = {c['total'] / p['total']:4.2f}× "
                         f"the first run (sampling time {c['sampling_time']:.2f} s); KSD on "
                         f"{c['ksd_draws_per_chain']} draws per chain")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e5,1e6", help="comma-separated N (default 1e5,1e6)")
    parser.add_argument("--jit-model-args", action="store_true")
    parser.add_argument("--progress-bar", action="store_true",
                        help="MCMC(progress_bar=True), NumPyro's default: its loop runs from Python, a step at a time")
    parser.add_argument("--cache", default=None, help="persistent compilation cache directory")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--ksd-draws", default="auto", type=lambda v: v if v == "auto" else int(v),
                        help="to_inference_data's ksd_draws for the conversion row (default auto)")
    args = parser.parse_args(argv)
    if args.cache:
        nsg.enable_compilation_cache(args.cache)
    events = CompileEvents()
    print(f"jax {jax.__version__}, numpyro {numpyro.__version__}, {os.cpu_count()} CPU cores; "
          f"jit_model_args={args.jit_model_args}, progress_bar={args.progress_bar}, cache={args.cache}; "
          f"load {load()}", flush=True)
    t0 = time.perf_counter()
    X, y = simulate(2000)
    timed_run(new_mcmc(args), X, y, events)  # process-wide one-off costs
    print(f"untimed warm-up on N = 2,000: {time.perf_counter() - t0:.1f} s", flush=True)
    results = []
    for N in (int(float(s)) for s in args.sizes.split(",")):
        results.append(measure(N, args, events))
        print(report(results[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
