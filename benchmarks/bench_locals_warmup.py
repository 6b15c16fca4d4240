"""Where the warmup of a model with local latents spends its time, phase by phase.

The MovieLens-shaped mixed model of ``movielens_mixed.py`` (28 globals, 6 Gaussian locals per
user, integrated out exactly) at ``--ratings`` simulated ratings: ``MCMC(nsg.SGLD(model),
num_warmup=1, num_samples=1)``, so that the run is the kernel's ``init`` (model trace, locals'
preparation, the warmup), with each of the warmup's compiled programs timed (compilation
included, results awaited): full-data passes, the starts' and the main phase's Adam ascents, the
dense Hessians, the per-user gradient noise.  Printed: the run's and the mode search's seconds,
the passes over the data, the Newton steps, the starts' gaps below the best end, and the phases.

    python benchmarks/bench_locals_warmup.py --ratings 2e5
    python benchmarks/bench_locals_warmup.py --ratings 1e7 --num-starts 32   # the former default
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC

import movielens_mixed as ml
import numpyro_sg as nsg
from numpyro_sg.infer import warmup

PHASES = ("full_value_and_grad", "full_value_and_grad_many", "value_and_grad_many", "adam_many", "dense_curvature",
          "curvatures", "row_noise", "on_full_scale", "prior_draws")


def timed(times: dict):
    """Wrap the warmup's programs so that each call's seconds (awaited) add up in ``times``."""
    for name in PHASES:
        method = getattr(warmup._WarmupPrograms, name)

        @functools.wraps(method)
        def wrapper(self, *args, _method=method, _name=name, **kwargs):
            start = time.perf_counter()
            out = jax.block_until_ready(_method(self, *args, **kwargs))
            seconds, calls = times.get(_name, (0.0, 0))
            times[_name] = (seconds + time.perf_counter() - start, calls + 1)
            return out
        setattr(warmup._WarmupPrograms, name, wrapper)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratings", type=float, default=2e5)
    parser.add_argument("--num-starts", type=int, default=None, help="warmup option num_starts (default: the kernel's)")
    args = parser.parse_args()
    user, W, y = ml.simulate(int(args.ratings), seed=0)
    stats = tuple(jnp.asarray(a) for a in ml.user_statistics(user, W, y))
    times: dict = {}
    timed(times)
    options = {} if args.num_starts is None else {"num_starts": args.num_starts}
    kernel = nsg.SGLD(ml.model, warmup_options=options)
    start = time.perf_counter()
    MCMC(kernel, num_warmup=1, num_samples=1, progress_bar=False).run(jax.random.PRNGKey(0), *stats)
    fit = kernel.mode_fit
    print(f"{int(args.ratings):,} ratings, {stats[0].shape[0]:,} users: run {time.perf_counter() - start:.1f} s, "
          f"mode search {fit.seconds:.1f} s, {fit.data_passes} passes, {fit.newton_steps} Newton steps, "
          f"converged {fit.converged}")
    gaps = fit.log_density - np.asarray(fit.start_log_densities)
    print("starts' ends below the best (nats):", np.round(gaps, 1).tolist())
    for name, (seconds, calls) in sorted(times.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:28s} {seconds:8.1f} s  ({calls} calls)")


if __name__ == "__main__":
    main()
