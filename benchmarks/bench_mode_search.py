"""The warmup's mode search in passes over the data: its count and its time in units of one pass.

Logistic regression (d = 20, float32, the model of ``bench_wall_split.py``) at N ∈ ``--sizes``,
the data given as NumPy arrays (as users pass them) and as JAX arrays.  Per N and kind, in one
process: ``fit_model_mode`` (the warmup a kernel's ``init`` runs, compilation included) and,
after it, the time of one full-data log density and gradient (the unit: a compiled pass over
the data in chunks, as the warmup's Newton steps make them, timed on its second call).  Printed:
the search's seconds (compilation included: the programs are cleared before each search),
``ModeFit.data_passes`` (its passes over all the data), its Newton steps, and its seconds
divided by one pass's.

    python benchmarks/bench_mode_search.py --sizes 1e6,1e7
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_sg.infer.full_density import full_value_and_grad_fn
from numpyro_sg.infer.programs import clear_programs
from numpyro_sg.infer.warmup import fit_model_mode

D, SUBSAMPLE = 20, 1000


def simulate(N: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D)).astype(np.float32)
    w = rng.normal(0, 0.5, D)
    y = (rng.uniform(size=N) < 1 / (1 + np.exp(-X @ w))).astype(np.float32)
    return X, y


def model(X, y):
    b = numpyro.sample("b", dist.Normal(0, 1).expand([D]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=SUBSAMPLE):
        logits = numpyro.subsample(X, event_dim=1) @ b
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))


def one_pass_seconds(fit, mb, unravel, data) -> float:
    """Seconds of one compiled full-data value and gradient at the mode (second call)."""
    step = jax.jit(lambda x, X, y: full_value_and_grad_fn(mb.model, mb.plates, unravel, (X, y))(x))
    jax.block_until_ready(step(fit.mode, *data))
    start = time.perf_counter()
    jax.block_until_ready(step(fit.mode, *data))
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e5,1e6")
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__}, {os.cpu_count()} CPU cores; logistic regression d = {D}")
    for N in (int(float(s)) for s in args.sizes.split(",")):
        X, y = simulate(N)
        for kind, data in (("NumPy", (X, y)), ("JAX", (jnp.asarray(X), jnp.asarray(y)))):
            clear_programs()   # each kind compiles its own programs
            jax.clear_caches()
            start = time.perf_counter()
            fit, mb, unravel = fit_model_mode(model, data)
            seconds = time.perf_counter() - start
            unit = one_pass_seconds(fit, mb, unravel, tuple(jnp.asarray(a) for a in data))
            print(f"N = {N:.0e} {kind:5s}: mode search {seconds:6.2f} s, {fit.data_passes} passes over the data, "
                  f"{fit.newton_steps} Newton steps; one pass {unit:.3f} s; search = {seconds / unit:6.1f} passes' time; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
