"""MAMBA-KSD against grid-search-KSD on paper 002's logistic regression (one process).

    python benchmarks/bench_mamba.py                       # T = 60 s of MAMBA chains
    python benchmarks/bench_mamba.py --budget 30 --json out.json

Problem: d = 10, N = 100,000, prior N(0, 10·I) (paper 002 Appendix B.1), SGLD, the paper's
step grid log10 h ∈ {−3, −3.5, …, −7.5} × batch fractions {10%, 1%, 0.1%}: 30 arms.

1. ``nsg.mamba`` with ``time_budget`` T (chain seconds over all arms and rounds).
2. ``nsg.grid_search`` over the same grid with every arm given the chain time the MAMBA
   winner had in total (R, "the same per-arm final budget").
3. Both score with full-data KSD on the same Laplace scale (the same start point and key),
   so their KSDs compare directly; the ratio of their wall times (everything included:
   set-up, compilation, scoring) is the speed-up.
4. The tuned SGLD is run again with ``MCMC`` (``--rerun-samples`` draws) and compared with
   NUTS on the full data: ξ(σ̂) = ‖σ̂ − σ_NUTS‖/‖σ_NUTS‖ (paper Table 1: 28.3% at N = 10⁶).
"""

import argparse
import json
import math
import time

import jax
import numpy as np
from numpyro.infer import MCMC, init_to_uniform

import numpyro_sg as nsg
from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression


def model(X, y=None, subsample_size=1000):
    return logistic_regression_model(X, y, subsample_size=subsample_size, prior_scale=math.sqrt(10.0))


def make(**kw):  # paper 002's SGLD: absolute step sizes, plain gradients
    return nsg.SGLD(model, preconditioner=None, gradient="plain", init_strategy=init_to_uniform, **kw)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--rerun-samples", type=int, default=20_000)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--init", default="laplace", choices=["laplace", "kernel"],
                        help="arms start at Laplace draws (near the mode, as paper 002 starts "
                        "near the MAP) or at the kernel's init_strategy (init_to_uniform)")
    args = parser.parse_args(argv)
    init = None if args.init == "kernel" else args.init

    N = args.num_data
    X, y, _ = simulate_logistic_regression(N, dim=10, seed=0)
    grid = {
        "step_size": [10.0**e for e in np.arange(-3.0, -7.51, -0.5)],
        "subsample_size": [N // 10, N // 100, N // 1000],
    }
    key = jax.random.PRNGKey(0)
    m = nsg.mamba(make, grid, (X, y), time_budget=args.budget, rng_key=key, init_params=init)
    best_arm = m.arms.index(m.best_params)
    R = float(m.rounds.loc[m.rounds["arm"] == best_arm, "seconds"].sum())
    m_ksd = float(m.rounds.loc[m.rounds["arm"] == best_arm, "score"].iloc[-1])
    print(f"MAMBA: {m.elapsed:.1f} s wall ({m.rounds['seconds'].sum():.1f} s chains; overhead "
          + ", ".join(f"{k} {v:.1f}" for k, v in m.overhead.items()) + f"); chose {m.best_params}, "
          f"KSD {m_ksd:.3f}, its chain time R = {R:.2f} s")
    g = nsg.grid_search(make, grid, (X, y), time_budget=R, rng_key=key, init_params=init)
    g_ksd = float(g.rounds["score"].min())
    print(f"grid search (R = {R:.2f} s per arm): {g.elapsed:.1f} s wall "
          f"({g.rounds['seconds'].sum():.1f} s chains; overhead "
          + ", ".join(f"{k} {v:.1f}" for k, v in g.overhead.items()) + f"); chose {g.best_params}, KSD {g_ksd:.3f}")
    assert np.allclose(m.scales, g.scales), "the two tuners must share one KSD scale"
    print(f"KSD ratio MAMBA / grid = {m_ksd / g_ksd:.2f} (target ≤ 1.5); "
          f"wall-time ratio MAMBA / grid = {m.elapsed / g.elapsed:.2f} (target ≤ 1/3)")

    ref = nsg.nuts_reference(model, X, y, num_warmup=1000, num_samples=2000,
                             cache_dir=args.cache_dir, progress_bar=False)
    xi_mamba_chain = nsg.compare(m.idata, ref).attrs["xi_sd"]
    mcmc = MCMC(make(**m.best_params), num_warmup=args.rerun_samples // 4,
                num_samples=args.rerun_samples, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(1), X, y)
    jax.block_until_ready(mcmc.get_samples())
    rerun = nsg.to_inference_data(mcmc, sampling_time=time.perf_counter() - start)
    table = nsg.compare(rerun, ref)
    print(f"NUTS: {ref.posterior.attrs['sampling_time']:.1f} s. Tuned SGLD rerun "
          f"({args.rerun_samples} draws, {rerun.posterior.attrs['sampling_time']:.1f} s): "
          f"ξ(σ̂) = {100 * table.attrs['xi_sd']:.1f}% (paper: 28.3%), KSD {table.attrs['ksd']:.3f} "
          f"(NUTS {table.attrs['ksd_reference']:.3f}); MAMBA's own chain: ξ(σ̂) = {100 * xi_mamba_chain:.1f}%")
    out = {
        "budget": args.budget, "init": args.init, "mamba_wall": m.elapsed, "mamba_overhead": m.overhead,
        "mamba_best": {k: float(v) for k, v in m.best_params.items()}, "mamba_ksd": m_ksd,
        "per_arm_budget": R, "grid_wall": g.elapsed, "grid_overhead": g.overhead,
        "grid_best": {k: float(v) for k, v in g.best_params.items()}, "grid_ksd": g_ksd,
        "ksd_ratio": m_ksd / g_ksd, "wall_ratio": m.elapsed / g.elapsed,
        "xi_sd_rerun": table.attrs["xi_sd"], "xi_sd_mamba_chain": xi_mamba_chain,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
