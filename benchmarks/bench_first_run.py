"""What a first ``MCMC.run`` compiles: the SGLD defaults against NUTS, in one process.

Poisson regression, d = 12, N rows (``--sizes``, default 10⁶), ``MCMC(nsg.SGLD(model),
num_warmup=1000, num_samples=2000, num_chains=4, chain_method="vectorized")`` with ``MCMC``'s
default ``jit_model_args=False``, then, in the same process, NUTS on the full data (every
subsample plate switched to all N rows; 500 + 500 iterations, one chain).  Each run's XLA
compilations are counted from ``jax.monitoring``'s ``backend_compile`` events (every program
compiled: ours, NumPyro's loop, and the small programs JAX compiles for eager operations).
NUTS runs second, so it reuses the eager programs that SGLD compiled: the comparison is the
one a user makes who tries our kernel first.  Reported: programs and compile seconds of each
first run, their ratios, and the wall times.

Usage::

    python benchmarks/bench_first_run.py                # N = 10⁶
    python benchmarks/bench_first_run.py --sizes 1e5 --json first.json
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
from numpyro.infer import MCMC, NUTS

import numpyro_sg as nsg
from numpyro_sg.infer.minibatch import discover_plates, full_data

from bench_wall_split import CompileEvents  # (run from the repository root: benchmarks/ is on sys.path)

D = 12


def poisson(X, y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=1000):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Poisson(jnp.exp(Xb @ theta)), obs=yb)


def simulate(N, seed=0):
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(N, D)) / np.sqrt(D)).astype(np.float32)
    y = rng.poisson(np.exp(X @ (0.5 * rng.normal(size=D)))).astype(np.float32)
    return X, y


def first_run(mcmc, X, y, compilations: CompileEvents) -> dict:
    """Wall time, programs compiled and their seconds of one ``mcmc.run``."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(jax.random.PRNGKey(1), X, y)
        jax.block_until_ready(mcmc.get_samples())
    t1 = time.perf_counter()
    seconds, count, _ = compilations.between(t0, t1)
    return dict(wall=t1 - t0, programs=count, compile=float(seconds))


def measure(N, compilations) -> dict:
    X, y = simulate(N)
    sgld = first_run(MCMC(nsg.SGLD(poisson), num_warmup=1000, num_samples=2000, num_chains=4,
                          chain_method="vectorized", progress_bar=False), X, y, compilations)
    full = full_data(poisson, discover_plates(poisson, (X, y), {}))
    nuts = first_run(MCMC(NUTS(full), num_warmup=500, num_samples=500, progress_bar=False), X, y, compilations)
    return dict(N=N, sgld=sgld, nuts=nuts, program_ratio=sgld["programs"] / nuts["programs"],
                compile_ratio=sgld["compile"] / nuts["compile"], load=os.getloadavg()[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e6", help="comma-separated N (default 1e6)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    compilations = CompileEvents()
    print(f"jax {jax.__version__}, numpyro {numpyro.__version__}, {os.cpu_count()} CPU cores", flush=True)
    results = []
    for N in (int(float(s)) for s in args.sizes.split(",")):
        r = measure(N, compilations)
        results.append(r)
        for name in ("sgld", "nuts"):
            p = r[name]
            print(f"N = {N:.0e} {name.upper():4s} first run {p['wall']:6.1f} s, {p['programs']:3d} programs "
                  f"compiled in {p['compile']:5.2f} s", flush=True)
        print(f"  SGLD / NUTS: programs {r['program_ratio']:.2f}, compile seconds {r['compile_ratio']:.2f} "
              f"(load {r['load']:.2f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
