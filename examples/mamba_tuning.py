"""Tune SGLD and SGBD with MAMBA, then check the tuned chains against NUTS.

    python examples/mamba_tuning.py                      # N = 100,000, 20 s per tuner, all in
    python examples/mamba_tuning.py --num-data 20000 --budget 10

Coullon, South & Nemeth's (2023) logistic regression (Appendix B.1): d = 10, prior N(0, 10·I), simulated data.
MAMBA (:func:`numpyro_sg.mamba`) picks SGLD's step size from decades in the units of its
default Laplace preconditioner (posterior sds; the default is 0.7) and the batch size from
{10%, 1%, 0.1%} of N, then the corrected SGBD's absolute step size σ on Coullon, South & Nemeth's (2023) style of
grid (``preconditioner=None``).  The arms share one warmup (mode, Laplace scales,
control-variate anchor) and start at draws of the Laplace approximation; they are scored by
the KSD of their ESS-thinned draws (an estimate of their bias) with mini-batch scores, and
``time_budget`` is the wall time of each call.  Each tuned kernel is then run with ``numpyro.infer.MCMC`` and compared with NUTS on
the full data (:func:`numpyro_sg.nuts_reference`, :func:`numpyro_sg.compare_to_reference`): mean and sd
errors per coordinate, ξ(σ̂) and KSD on NUTS's scale.  The 1/N heuristic
(:func:`numpyro_sg.heuristic_step_size`) at a 10% batch is run for comparison.
"""

import argparse
import functools
import math
import time

import jax
import numpy as np
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression

PRIOR_SD = math.sqrt(10.0)  # Coullon, South & Nemeth (2023), Appendix B.1: prior covariance 10·I


def model(X, y=None, subsample_size=1000):
    return logistic_regression_model(X, y, subsample_size=subsample_size, prior_scale=PRIOR_SD)


def run_tuned(kernel, X, y, num_samples, seed):
    mcmc = MCMC(kernel, num_warmup=num_samples // 2, num_samples=num_samples, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y)
    jax.block_until_ready(mcmc.get_samples())
    return nsg.to_inference_data(mcmc, sampling_time=time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--budget", type=float, default=20.0, help="wall seconds of each MAMBA call")
    parser.add_argument("--num-samples", type=int, default=5000, help="draws of each tuned rerun")
    parser.add_argument("--cache-dir", default=None, help="cache the NUTS reference here")
    parser.add_argument("--quick", action="store_true", help="a small grid (a smoke test)")
    args = parser.parse_args(argv)

    N = args.num_data
    X, y, _ = simulate_logistic_regression(N, dim=10, seed=0)
    batches = [max(N // 10, 1), max(N // 100, 1), max(N // 1000, 1)]
    sgld_steps = [10.0, 1.0, 0.1, 0.01, 0.001]  # posterior sds (Laplace preconditioner)
    sgbd_steps = [10.0**e for e in np.arange(-1.0, -4.01, -0.5)]  # absolute σ
    if args.quick:  # a 3 × 2 grid per kernel: checks that the script runs
        batches, sgld_steps, sgbd_steps = batches[:2], sgld_steps[::2][:3], sgbd_steps[1::2][:3]
    classic = dict(preconditioner=None, gradient="plain")  # Coullon, South & Nemeth's absolute step sizes
    tuners = {
        "SGLD": (functools.partial(nsg.SGLD, model),
                 {"step_size": sgld_steps, "subsample_size": batches}),
        "SGBD": (functools.partial(nsg.SGBD, model, variant="corrected", **classic),
                 {"step_size": sgbd_steps, "subsample_size": batches}),
    }
    ref = nsg.nuts_reference(model, X, y, num_warmup=500, num_samples=1000,
                             cache_dir=args.cache_dir, progress_bar=False)
    print(f"NUTS on the full data: {ref.posterior.attrs['sampling_time']:.1f} s")
    tuned = {}
    for name, (factory, grid) in tuners.items():
        res = nsg.mamba(factory, grid, (X, y), time_budget=args.budget, rng_key=jax.random.PRNGKey(0))
        print(f"\nMAMBA for {name}: {len(res.arms)} arms, {res.num_rounds} round(s), budget "
              f"{args.budget:.0f} s, {res.elapsed:.1f} s in all ({res.rounds['seconds'].sum():.1f} s "
              "of chains; overhead: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in res.overhead.items()) + ")")
        last = res.rounds[res.rounds["round"] == res.rounds["round"].max()]
        print(last.drop(columns=["arm"]).to_string(index=False))
        print(f"chosen: {res.best_params}")
        tuned[f"{name} (MAMBA)"] = res.best_kernel()
    tuned["SGLD (h = 1/N, 10%)"] = nsg.SGLD(model, step_size=nsg.heuristic_step_size(N),
                                           subsample_size=batches[0], **classic)

    print(f"\nTuned kernels, {args.num_samples} draws each, against NUTS:")
    for i, (name, kernel) in enumerate(tuned.items()):
        idata = run_tuned(kernel, X, y, args.num_samples, seed=i + 1)
        table = nsg.compare_to_reference(idata, ref)
        print(f"{name:22s} ξ(σ̂) = {100 * table.attrs['xi_sd']:5.1f}%   max |mean err| = "
              f"{table['mean_err'].abs().max():.2f} sd   KSD {table.attrs['ksd']:.3f} "
              f"(NUTS {table.attrs['ksd_reference']:.3f})   {idata.posterior.attrs['sampling_time']:.1f} s")


if __name__ == "__main__":
    main()
