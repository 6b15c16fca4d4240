"""BPMF benchmark: one kernel with defaults on a simulated ratings matrix.

Prints one JSON line: warmup-fit seconds, sampling iterations/s, test RMSE of the
posterior-mean prediction and of the warmup's mode, the noise floor.  Peak memory: run under
``/usr/bin/time -v`` (maximum resident set size)::

    for k in SGLD SGBD SGHMC SGNHT PSGLD BAOAB; do
      /usr/bin/time -v python benchmarks/bench_bpmf.py $k 2>&1 | grep -E '^\\{|Maximum resident'
    done
"""

import argparse
import json
import time
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg import datasets as ds


def main():
    """Run one kernel on the simulated matrix and print the measurements as JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel")
    ap.add_argument("--users", type=int, default=2000)
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--rank", type=int, default=10)
    ap.add_argument("--ratings", type=int, default=200_000)
    ap.add_argument("--noise-sd", type=float, default=0.5)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--subsample", type=int, default=1000)
    ap.add_argument("--step-size", type=float, default=None, help="default: the kernel's")
    args = ap.parse_args()
    data = ds.simulate_ratings(args.users, args.items, args.rank, args.ratings, args.noise_sd)
    model = partial(ds.bpmf_model, **data.model_kwargs(
        rank=args.rank, subsample_size=args.subsample, noise_precision=1.0 / args.noise_sd**2))
    kernel = getattr(nsg, args.kernel)(model, step_size=args.step_size)
    mcmc = MCMC(kernel, num_warmup=args.warmup, num_samples=args.samples, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        mcmc.warmup(jax.random.PRNGKey(0), *data.model_args())
        jax.block_until_ready(mcmc.last_state)
        t1 = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(1), *data.model_args())
        samples = mcmc.get_samples()
        jax.block_until_ready(samples)
        t2 = time.perf_counter()
    trace = ds.rmse_trace(samples, data, offset=0.0)
    mode = kernel.unravel(kernel.mode_fit.mode)
    pred = ds.bpmf_predict(mode["U"], mode["V"], data.test_users, data.test_items)
    truth = ds.bpmf_predict(jnp.asarray(data.user_factors), jnp.asarray(data.item_factors),
                            data.test_users, data.test_items)
    fit = kernel.mode_fit
    print(json.dumps(dict(
        kernel=args.kernel, step_size=args.step_size, d=int(fit.mode.shape[0]), n_train=data.num_train,
        warmup_fit_s=round(fit.seconds, 1), warmup_total_s=round(t1 - t0, 1),
        sampling_s=round(t2 - t1, 1), it_per_s=round(args.samples / (t2 - t1), 1),
        rmse_mean=float(trace.rmse_average.iloc[-1]), rmse_last_draw=float(trace.rmse_sample.iloc[-1]),
        rmse_mode=float(jnp.sqrt(jnp.mean((pred - data.test_ratings) ** 2))),
        rmse_true_factors=float(jnp.sqrt(jnp.mean((truth - data.test_ratings) ** 2))),
        noise_sd=args.noise_sd, ratio_to_noise=float(trace.rmse_average.iloc[-1] / args.noise_sd),
        stiffness=round(fit.stiffness, 2), converged=bool(fit.converged),
        diverged=bool(np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))),
        warnings=sorted({type(w.message).__name__ for w in caught}),
    )), flush=True)


if __name__ == "__main__":
    main()
