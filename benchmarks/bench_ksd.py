"""Speed and memory of numpyro_sg's blocked KSD against SGMCMCJax's ``imq_KSD``.

Problem: T draws of a d-dimensional Gaussian N(μ, diag(σ²)) (fixed numpy seed, float32) with
their exact scores −(θ − μ)/σ²; default T = 20,000, d = 50.  Both compute the raw IMQ KSD
(c = 1, β = −½, V-statistic, no preconditioner) of the same arrays:

* numpyro_sg: ``ksd(x, scores=s, preconditioner=None)`` — row blocks of ~2²² pair entries,
  each reduced by matrix products; memory O(T·block); end to end (input checks, host→device
  copy, float64 accumulation of block sums) — and ``per_coordinate=True`` for reference;
* SGMCMCJax 0.2.13: ``sgmcmcjax.ksd.imq_KSD(x, s)`` — a ``lax.scan`` over rows, each row a
  ``vmap`` of the pair kernel over all T draws; memory O(T·d); compiled ahead of time
  (``imq_KSD.lower(x, s).compile()``) so only its execution is timed.

Each is timed ``--repeats`` times after one warm-up call (ours) / the AOT compile (theirs) and
keeps its fastest time.  Our peak memory is the process's VmHWM read right after our runs,
before SGMCMCJax runs.

Usage::

    python benchmarks/bench_ksd.py                  # T = 20,000, d = 50
    python benchmarks/bench_ksd.py --quick          # T = 4,000
    python benchmarks/bench_ksd.py --size 10000 --dim 20 --json ksd.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

from numpyro_sg.diagnostics.ksd import ksd

DATA_SEED = 20240601


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (VmHWM on Linux, else ru_maxrss)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024 / (1024 if sys.platform == "darwin" else 1)


def make_problem(T: int, d: int):
    rng = np.random.default_rng(DATA_SEED)
    mu = rng.normal(size=d)
    sd = np.exp(rng.uniform(-1, 1, size=d))
    x = (mu + sd * rng.normal(size=(T, d))).astype(np.float32)
    s = (-(x - mu) / sd**2).astype(np.float32)
    return x, s


def best_of(fn, repeats: int):
    times, value = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return min(times), value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=20_000, help="number of draws T (default 20,000)")
    parser.add_argument("--dim", type=int, default=50, help="dimension d (default 50)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats, fastest kept (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: T = 4,000, 2 repeats")
    parser.add_argument("--skip-sgmcmcjax", action="store_true", help="time numpyro_sg only")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    T, d, repeats = args.size, args.dim, args.repeats
    if args.quick:
        T, repeats = 4_000, 2

    x, s = make_problem(T, d)
    print(f"KSD benchmark: T = {T:,}, d = {d}, float32, {os.cpu_count()} CPU cores, jax {jax.__version__}")
    results = dict(T=T, d=d, repeats=repeats, platform=platform.platform(), jax=jax.__version__)

    ours = lambda: ksd(x, scores=s, preconditioner=None)
    ours_pc = lambda: ksd(x, scores=s, preconditioner=None, per_coordinate=True)
    ours(), ours_pc()  # warm-up: compile
    t_ours, v_ours = best_of(ours, repeats)
    t_pc, v_pc = best_of(ours_pc, repeats)
    rss = peak_rss_mb()
    print(f"numpyro_sg ksd:                 {t_ours:8.2f} s   KSD = {v_ours:.6g}")
    print(f"numpyro_sg ksd per_coordinate:  {t_pc:8.2f} s   KSD = {v_pc:.6g}")
    print(f"numpyro_sg peak RSS (process, incl. imports): {rss:.0f} MB "
          f"(a T×T float32 matrix would be {T * T * 4 / 1e6:.0f} MB)")
    results.update(numpyro_sg_s=t_ours, numpyro_sg_ksd=v_ours, numpyro_sg_per_coordinate_s=t_pc,
                   numpyro_sg_per_coordinate_ksd=v_pc, numpyro_sg_peak_rss_mb=rss)

    if not args.skip_sgmcmcjax:
        from sgmcmcjax.ksd import imq_KSD

        xj, sj = jnp.asarray(x), jnp.asarray(s)
        compiled = imq_KSD.lower(xj, sj).compile()
        t_theirs, v_theirs = best_of(lambda: float(compiled(xj, sj)), repeats)
        print(f"SGMCMCJax imq_KSD:              {t_theirs:8.2f} s   KSD = {v_theirs:.6g}")
        print(f"ratio SGMCMCJax / numpyro_sg:   {t_theirs / t_ours:8.2f}×   "
              f"(values differ by {abs(v_theirs / v_ours - 1):.1e} relative)")
        results.update(sgmcmcjax_s=t_theirs, sgmcmcjax_ksd=v_theirs, ratio=t_theirs / t_ours)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
