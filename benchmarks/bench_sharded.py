"""Rows sharded over a mesh of every local device against the same rows on one device.

Problem: a logistic regression, N rows × d = 20 features (float32, simulated with a fixed seed),
mini-batch n = 1,000, SGLD with its defaults and 4 vectorized chains.  The same data are run
twice in one process:

* ``one device``: plain arrays (``jnp.asarray``, on the default device);
* ``sharded``: ``jax.device_put(X, NamedSharding(mesh, P("data")))`` over
  ``jax.make_mesh((D,), ("data",))`` of all D local devices (Explicit axes, the default);

and each reports ``seconds`` of ``MCMC.run`` (warmup and compilation included), ``it/s`` of
sampling alone (a second ``run`` from the first one's last state, compiled already), the
collectives of the compiled sampling step (op and element count), and the posterior means and
sds.  ``agreement`` gives the sharded means' distance in one-device sds and the sd ratios.

Where it ran: on GPUs (``jax.default_backend() == "gpu"``) this is the check that the
multi-device path is the same program there; on a CPU, force several host devices first::

    python benchmarks/bench_sharded.py --rows 10000000                  # every local device
    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \\
        python benchmarks/bench_sharded.py --rows 400000

Measured: one NVIDIA H200, ``--rows 10000000``: identical draws; ``MCMC.run`` 22.6 s (plain) and
16.4 s (mesh); a 5,000-draw run 2,800 and 1,978 it/s overall.  2-core CPU, ``--rows 1000000
--samples 4000``: marginal rates 4,885 and 4,812 it/s, fixed cost per run 1.05 and 2.10 s (the
mesh's program compiles longer).  docs/big_data.md ("GPUs") has the other GPU figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from numpyro.infer import MCMC

import numpyro_sg as nsg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from sharded_checks import collectives  # noqa: E402


def logistic(X, y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=1000):
        logits = numpyro.subsample(X, event_dim=1) @ theta
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))


def simulate(rows: int, d: int = 20, chunk: int = 1_000_000):
    """Logistic rows in chunks (float32), so that the simulation never holds float64 copies."""
    rng = np.random.default_rng(0)
    beta = rng.normal(size=d) / np.sqrt(d)
    X = np.empty((rows, d), np.float32)
    y = np.empty(rows, np.float32)
    for s in range(0, rows, chunk):
        x = rng.normal(size=(min(chunk, rows - s), d)).astype(np.float32)
        X[s:s + len(x)] = x
        y[s:s + len(x)] = rng.random(len(x)) < 1 / (1 + np.exp(-(x @ beta)))
    return X, y


def run(args, chains: int, samples: int) -> dict:
    kernel = nsg.SGLD(logistic)
    mcmc = MCMC(kernel, num_warmup=1000, num_samples=samples, num_chains=chains,
                chain_method="vectorized", progress_bar=False, jit_model_args=True)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), *args)
    draws = np.asarray(mcmc.get_samples()["theta"], np.float64)
    seconds = time.perf_counter() - start
    seconds_of = {}
    for length in (samples, 3 * samples):  # from the last state: compiled, no warmup
        mcmc.post_warmup_state = mcmc.last_state
        mcmc.num_samples = length
        start = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, *args)
        jax.block_until_ready(mcmc.get_samples())
        seconds_of[length] = time.perf_counter() - start
    marginal = 2 * samples / (seconds_of[3 * samples] - seconds_of[samples])
    hlo = jax.jit(kernel.sample).lower(mcmc.last_state, args, {}).compile().as_text()
    return {"seconds": round(seconds, 2), "it/s": round(samples / seconds_of[samples], 1),
            "marginal it/s": round(marginal, 1),
            "fixed s": round(seconds_of[samples] - samples / marginal, 2), "collectives": collectives(hlo),
            "mean": draws.mean(0), "sd": draws.std(0)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--samples", type=int, default=5000)
    opts = parser.parse_args()
    devices = jax.devices()
    X, y = simulate(opts.rows)
    mesh = jax.make_mesh((len(devices),), ("data",))
    rows = NamedSharding(mesh, P("data"))
    out = {"backend": jax.default_backend(), "devices": [str(d) for d in devices], "rows": opts.rows,
           "chains": opts.chains}
    one = run((jnp.asarray(X), jnp.asarray(y)), opts.chains, opts.samples)
    sharded = run((jax.device_put(X, rows), jax.device_put(y, rows)), opts.chains, opts.samples)
    out["agreement"] = {"max_mean_diff_sd": float(np.max(np.abs(sharded["mean"] - one["mean"]) / one["sd"])),
                        "sd_ratio_range": [float(np.min(sharded["sd"] / one["sd"])),
                                           float(np.max(sharded["sd"] / one["sd"]))]}
    for name, r in (("one device", one), ("sharded", sharded)):
        out[name] = {k: v for k, v in r.items() if k not in ("mean", "sd")}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
