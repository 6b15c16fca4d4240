"""MAMBA's picks against NUTS, and MAMBA against grid search (one process).

    python benchmarks/bench_mamba.py                                  # the acceptance table
    python benchmarks/bench_mamba.py --models logistic --budgets 20 --seeds 0 --grids default
    python benchmarks/bench_mamba.py --versus-grid --json out.json    # + grid search, plain KSD

Problems (issue "MAMBA users can trust"): logistic regression d = 10, N = 100,000, prior
N(0, 10·I) (Coullon, South & Nemeth 2023, Appendix B.1), and Poisson regression d = 10, N = 200,000 (the model of
``bench_vs_nuts.py``).  Coarse grids of 5 × 3 = 15 arms (two rounds at η = 3):

* ``default``: ``nsg.SGLD(model)`` as the docs show it (warmup, Laplace preconditioner,
  control variates), step sizes {10, 1, 0.1, 0.01, 0.001} in the preconditioner's units
  (the default is 0.7, so 10 is an order of magnitude too large), subsample sizes
  {N/10, N/100, N/1000};
* ``paper``: Coullon, South & Nemeth's SGLD (``preconditioner=None, gradient="plain"``), absolute step
  sizes {10⁻³, …, 10⁻⁷}, the same subsample sizes.

For each budget T and seed, ``nsg.mamba(..., time_budget=T)`` is timed (the whole call), and
its pick is run again from ``make(**best_params)`` under ``MCMC`` (its own warmup; num_samples
from ``res.suggested_num_samples(400)``, at least 5,000, at most 10⁶, warmup a tenth of it)
and compared with NUTS on the full data (1 chain, 1,000 + 2,000, cached):
ξ(σ̂) = ‖σ̂ − σ_NUTS‖/‖σ_NUTS‖ and the largest |mean − mean_NUTS|/sd_NUTS.

``--versus-grid`` adds, for seed 0 of each problem: ``nsg.grid_search`` at the same budget and
at 3× it, and MAMBA with the plain KSD of Coullon, South & Nemeth (``criterion="plain"``).
"""

import argparse
import functools
import json
import time

import jax
import numpy as np
from bench_vs_nuts import poisson, simulate
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression


def logistic(X, y=None, subsample_size=1000):
    return logistic_regression_model(X, y, subsample_size=subsample_size, prior_scale=np.sqrt(10.0))


def data(kind):
    if kind == "logistic":
        X, y, _ = simulate_logistic_regression(100_000, dim=10, seed=0)
        return logistic, X, y
    X, y = simulate("poisson", 200_000)
    return poisson, X, y


def grid_of(name, model, N):
    sizes = [N // 10, N // 100, N // 1000]
    if name == "default":
        return functools.partial(nsg.SGLD, model), {"step_size": [10.0, 1.0, 0.1, 0.01, 0.001],
                                                    "subsample_size": sizes}
    return (functools.partial(nsg.SGLD, model, preconditioner=None, gradient="plain"),
            {"step_size": [1e-3, 1e-4, 1e-5, 1e-6, 1e-7], "subsample_size": sizes})


def accuracy(make, params, X, y, ref, num_samples, seed):
    """ξ(σ̂), max |mean error| (NUTS sds) and seconds of make(**params) under MCMC."""
    thinning = max(num_samples // 20_000, 1)
    mcmc = MCMC(make(**params), num_warmup=num_samples // 10, num_samples=num_samples,
                thinning=thinning, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(100 + seed), X, y)
    jax.block_until_ready(mcmc.get_samples())
    idata = nsg.to_inference_data(mcmc, sampling_time=time.perf_counter() - start)
    table = nsg.compare_to_reference(idata, ref, ksd=False)
    return float(table.attrs["xi_sd"]), float(np.max(np.abs(table["mean_err"]))), time.perf_counter() - start


def tuner_row(tuner, make, grid, X, y, ref, budget, seed, args, **kw):
    start = time.perf_counter()
    res = tuner(make, grid, (X, y), time_budget=budget, rng_key=jax.random.PRNGKey(seed), **kw)
    wall = time.perf_counter() - start
    num_samples = args.rerun_samples
    if np.isfinite(res.ess_per_iteration):  # as the docs say: the tuner's suggestion for ESS 400
        num_samples = int(np.clip(res.suggested_num_samples(400), args.rerun_samples, 1_000_000))
    xi, err, rerun_seconds = accuracy(make, res.best_params, X, y, ref, num_samples, seed)
    best = res.rounds[res.rounds["arm"] == res.arms.index(res.best_params)].iloc[-1]
    return {"budget": budget, "seed": seed, "wall": wall, "wall_ratio": wall / budget,
            "best": {k: float(v) for k, v in res.best_params.items()}, "ksd": float(best["ksd"]),
            "xi": xi, "max_mean_err": err, "rounds": res.num_rounds, "num_samples": num_samples,
            "rerun_seconds": rerun_seconds,
            "overhead": {k: round(v, 2) for k, v in res.overhead.items()},
            "chain_seconds": float(res.rounds["seconds"].sum())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="logistic,poisson")
    parser.add_argument("--grids", default="default,paper")
    parser.add_argument("--budgets", default="20,60")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rerun-samples", type=int, default=5000)
    parser.add_argument("--versus-grid", action="store_true")
    parser.add_argument("--cache-dir", default=".nuts_cache")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    out = []
    for kind in args.models.split(","):
        model, X, y = data(kind)
        ref = nsg.nuts_reference(model, X, y, num_warmup=1000, num_samples=2000,
                                 cache_dir=args.cache_dir, progress_bar=False)
        for grid_name in args.grids.split(","):
            make, grid = grid_of(grid_name, model, X.shape[0])
            for budget in budgets:
                for seed in seeds:
                    row = tuner_row(nsg.mamba, make, grid, X, y, ref, budget, seed, args)
                    row.update(model=kind, grid=grid_name, tuner="mamba")
                    out.append(row)
                    print(json.dumps(row), flush=True)
            if args.versus_grid:
                for tuner, budget, kw in ((nsg.grid_search, budgets[0], {}),
                                          (nsg.grid_search, 3 * budgets[0], {}),
                                          (nsg.mamba, budgets[0], {"criterion": "plain"})):
                    row = tuner_row(tuner, make, grid, X, y, ref, budget, 0, args, **kw)
                    row.update(model=kind, grid=grid_name, tuner=tuner.__name__ + ("-plain" if kw else ""))
                    out.append(row)
                    print(json.dumps(row), flush=True)
    print(f"\n{'model':9s} {'grid':8s} {'tuner':12s} {'T':>4s} {'seed':>4s} {'wall/T':>6s} {'ξ':>6s} "
          f"{'max err':>7s} {'draws':>8s} {'rerun s':>7s}  pick")
    for r in out:
        print(f"{r['model']:9s} {r['grid']:8s} {r['tuner']:12s} {r['budget']:4.0f} {r['seed']:4d} "
              f"{r['wall_ratio']:6.2f} {r['xi']:6.3f} {r['max_mean_err']:7.3f} {r['num_samples']:8d} "
              f"{r['rerun_seconds']:7.1f}  {r['best']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
