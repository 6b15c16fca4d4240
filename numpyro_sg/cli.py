"""Command line: ``numpyro-sg demo``."""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression


def demo(num_data=100_000, dim=10, subsample_size=1000, num_warmup=1000, num_samples=2000,
         num_chains=4, seed=0, progress_bar=True, out=print, nuts=True, nuts_samples=1000,
         cache_dir=None):
    """Simulate a logistic regression, run SGLD and SGBD with their defaults on it, print an
    ArviZ summary of each with its KSD; then run NUTS on the full data and compare both runs
    with it, effective samples per second included."""
    X, y, theta_true = simulate_logistic_regression(num_data, dim, seed)
    out(f"Logistic regression: N = {num_data:,}, d = {dim}, mini-batch n = {subsample_size} "
        f"({100 * subsample_size / num_data:.2g}% of the data), {num_chains} chains × "
        f"({num_warmup} warmup + {num_samples} draws).")
    # The defaults, no tuning: the warmup finds the mode, the Laplace preconditioner and the
    # control-variate anchor, and the chains start from draws of the Laplace approximation;
    # SGLD's ε = 0.7 and SGBD's σ = 0.8 are in units of that preconditioner.
    kernels = {"SGLD": nsg.SGLD(logistic_regression_model),
               "SGBD": nsg.SGBD(logistic_regression_model)}
    results = {}
    for i, (name, kernel) in enumerate(kernels.items()):
        mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples,
                    num_chains=num_chains, chain_method="vectorized", progress_bar=progress_bar)
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed + i), X, y, subsample_size=subsample_size,
                 extra_fields=("step_size",))
        jax.block_until_ready(mcmc.get_samples())
        elapsed = time.perf_counter() - start
        idata = nsg.to_inference_data(mcmc, sampling_time=elapsed)
        summary = nsg.posterior_summary(idata, var_names=["theta"])
        summary.insert(0, "true", np.asarray(theta_true))
        stats = idata.sample_stats
        out(f"\n{name}: {elapsed:.1f} s in all (the warmup's mode search "
            f"{kernel.mode_fit.seconds:.1f} s), step size {float(stats.step_size.mean()):.2g} "
            f"(in posterior sds), diverging draws {int(stats.diverging.sum())}")
        out(f"KSD {stats.attrs['ksd']:.3g} (per chain {np.round(stats.ksd.values, 3).tolist()}; "
            f"{stats.attrs['ksd_draws_per_chain']} draws per chain, full-data scores, "
            f"preconditioner '{stats.attrs['ksd_preconditioner']}', {stats.attrs['ksd_seconds']:.1f} s)")
        out(summary.to_string())
        results[name] = idata
    if not nuts:
        return results
    out(f"\nNUTS on the full data ({nuts_samples} warmup + {nuts_samples} draws, one chain) "
        "as the ground truth:")
    reference = nsg.nuts_reference(logistic_regression_model, X, y, num_warmup=nuts_samples,
                                   num_samples=nuts_samples, cache_dir=cache_dir,
                                   progress_bar=progress_bar, rng_key=jax.random.PRNGKey(seed))
    out(f"NUTS: {reference.posterior.attrs['sampling_time']:.1f} s")
    lines = []
    for name, idata in results.items():
        table = nsg.compare_to_reference(idata, reference)
        out(f"\n{name} vs NUTS:")
        out(table[["mean_err", "sd_rel_err", "ess_per_s", "ref_ess_per_s"]].round(3).to_string())
        lines.append(f"{name}  xi(sd) = {100 * table.attrs['xi_sd']:5.1f}%   max |mean err| = "
                     f"{table['mean_err'].abs().max():.2f} NUTS sd   min ESS/s {table['ess_per_s'].min():7.1f} "
                     f"(NUTS {table['ref_ess_per_s'].min():.1f})   KSD {table.attrs['ksd']:.3g} "
                     f"(NUTS {table.attrs['ksd_reference']:.3g})")
    out("\nRelative sd error xi(sd) = ||sd - sd_NUTS|| / ||sd_NUTS||, the largest mean error in "
        "NUTS sds, the smallest bulk ESS per second (wall time of MCMC.run, warmup and compilation "
        "included), and KSD of each run and of the NUTS draws on one common scale (NUTS's sd):")
    out("\n".join(lines))
    results["NUTS"] = reference
    return results


def main(argv=None):
    """The ``numpyro-sg`` command: parse ``argv`` (``sys.argv[1:]`` when None) and run its
    sub-command (``demo``, which prints its report); return the exit status, 0."""
    parser = argparse.ArgumentParser(prog="numpyro-sg", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="simulate a logistic regression, run SGLD and SGBD with "
                       "their defaults, report KSD and compare with NUTS (ESS/s included)")
    p.add_argument("--num-data", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=10)
    p.add_argument("--subsample-size", type=int, default=1000)
    p.add_argument("--num-warmup", type=int, default=1000)
    p.add_argument("--num-samples", type=int, default=2000)
    p.add_argument("--num-chains", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress-bar", action="store_true")
    p.add_argument("--no-nuts", action="store_true", help="skip the NUTS comparison")
    p.add_argument("--nuts-samples", type=int, default=1000,
                   help="NUTS warmup iterations and draws (default 1000 each)")
    p.add_argument("--cache-dir", default=None, help="cache the NUTS reference here")
    args = parser.parse_args(argv)
    if args.command == "demo":
        start = time.perf_counter()
        demo(args.num_data, args.dim, args.subsample_size, args.num_warmup, args.num_samples,
             args.num_chains, args.seed, progress_bar=not args.no_progress_bar,
             nuts=not args.no_nuts, nuts_samples=args.nuts_samples, cache_dir=args.cache_dir)
        print(f"\nTotal: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
