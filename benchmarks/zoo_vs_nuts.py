"""The model zoo (tests/zoo.py) against full-data NUTS: every kernel's defaults, several seeds.

For each family (real rows, or bootstrapped to ``--rows``), SGLD, SGBD and SGHMC with their
defaults (4 vectorised chains × (1,000 + 2,000)) against ``nsg.nuts_reference`` on the same data:
ξ(σ̂), the worst mean error in NUTS sds, the mini-batch size the defaults chose
(``kernel.noise_plan``), the ConvergenceWarnings, and each run's wall time beside NUTS's.

    python benchmarks/zoo_vs_nuts.py weibull_aft poisson_lab --rows 200000 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import jax
from numpyro.infer import MCMC

import numpyro_sg as nsg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from zoo import FAMILIES, nuts_settings  # noqa: E402

KERNELS = ("SGLD", "SGBD", "SGHMC")


def run_one(family, kernel: str, seed: int) -> dict:
    """One run of ``kernel``'s defaults on ``family``: draws, the chosen plan and the warnings."""
    sampler = getattr(nsg, kernel)(family.model)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", nsg.ConvergenceWarning)
        mcmc = MCMC(sampler, num_warmup=1000, num_samples=2000, num_chains=4, chain_method="vectorized",
                    progress_bar=False)
        mcmc.run(jax.random.PRNGKey(seed), *family.args, **family.kwargs)
        jax.block_until_ready(mcmc.get_samples())   # run returns before the draws are computed
        seconds = time.perf_counter() - start
        idata = nsg.to_inference_data(mcmc)
    said = [str(w.message) for w in caught if issubclass(w.category, nsg.ConvergenceWarning)]
    return dict(idata=idata, plan=sampler.noise_plan, warnings=said, seconds=seconds)


def compare(family, run: dict, reference) -> dict:
    """ξ(σ̂) and the worst |mean error| in NUTS sds over the family's sites."""
    table = nsg.compare_to_reference(run["idata"], reference, var_names=list(family.sites) or None)
    return dict(xi=float(table.attrs["xi_sd"]), mean_error=float(table["mean_err"].abs().max()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--rows", type=int, default=None, help="bootstrap to this many rows (default: real rows)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS))
    parser.add_argument("--cache", default=".nuts_cache")
    args = parser.parse_args(argv)
    for name in args.families:
        family = FAMILIES[name](args.rows) if args.rows else FAMILIES[name]()
        reference = nsg.nuts_reference(family.model, *family.args, model_kwargs=family.kwargs, cache_dir=args.cache,
                                       progress_bar=False, **nuts_settings(family))
        nuts_seconds = reference.posterior.attrs.get("sampling_time", float("nan"))
        for kernel in args.kernels:
            for seed in args.seeds:
                run = run_one(family, kernel, seed)
                score = compare(family, run, reference)
                plan = run["plan"]
                n = (f"n={plan.subsample_size}" + ("" if plan.replace else " (all rows)")
                     + ("" if plan.step_scale == 1 else f" step×{plan.step_scale:.2f}")) if plan else "n=plate"
                print(f"{name:22s} {kernel:6s} seed {seed}: xi {score['xi']:.3f}  max|mean err| "
                      f"{score['mean_error']:.3f} NUTS sd  {n:28s} run {run['seconds']:6.1f} s "
                      f"(NUTS {nuts_seconds:.1f} s)  warnings {len(run['warnings'])}", flush=True)
                for message in run["warnings"]:
                    print(f"    warned: {message[:300]}", flush=True)


if __name__ == "__main__":
    main()
