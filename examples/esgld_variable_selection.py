"""Reproduce Table 1 (linear) and Table S1 (logistic) of Song, Sun, Ye & Liang (2020), "Extended
stochastic gradient MCMC for large-scale Bayesian variable selection", with numpyro_sg.ESGLD.

Full scale (the paper's settings: N = 50,000, p = 2,000 + intercept, 5,000 iterations of which
2,000 burn-in, m = 10; linear n = 200, q = 50; logistic n = 300, q = 500), with the kernel's
default (informed moves, control-variate acceptance, h = 0.25 in units of the posterior
variance) or the paper's algorithm (``--algorithm paper``: ε = 1e-6 linear, 1e-5 logistic):

    python examples/esgld_variable_selection.py --seeds 5
    python examples/esgld_variable_selection.py --seeds 5 --algorithm paper

A small version (N = 5,000, p = 200, 2,000 iterations) that runs in about a minute:

    python examples/esgld_variable_selection.py --quick

Each run prints FSR, NSR, MSE₁, MSE₀ (β̂ = mean of the post-burn-in draws thinned by 10, the
median probability model for selection) and the wall time of ``MCMC.run`` (compilation
included; the data are passed with ``jit_model_args=True``).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from numpyro.infer import MCMC

from numpyro_sg import ESGLD, datasets
from numpyro_sg.results import selection

PAPER = {
    "linear": dict(FSR=0.0, NSR=0.0, MSE1=2.91e-3, MSE0=1.26e-7, minutes=3.3),
    "logistic": dict(FSR=0.0, NSR=0.0, MSE1=2.37e-2, MSE0=2.70e-4, minutes=2.9),
}


#: the paper's algorithm (its Algorithm 1, supplement §3): weighted birth/death/exchange moves
#: accepted on the plain mini-batch estimate, model-averaged plain gradients, an absolute step size
PAPER_ALGORITHM = {"proposal": "paper", "gradient": "plain", "preconditioner": None}


def run_one(which, seed, num_data, num_features, iters, burn_in, subsample=None, weights="auto",
            correction=None, step_size=None, algorithm="default"):
    if which == "linear":
        X, y, beta = datasets.simulate_esgld_linear(num_data, num_features, seed=seed)
        model, eps, n, q = datasets.esgld_linear_model, 1e-6, 200, 50
    else:
        X, y, beta = datasets.simulate_esgld_logistic(num_data, num_features, seed=seed)
        model, eps, n, q = datasets.esgld_logistic_model, 1e-5, 300, 500
    if algorithm == "paper":
        algorithm_options, weights_option = dict(PAPER_ALGORITHM), {"proposal_weights": weights}
        step_size = step_size or eps
    else:  # informed moves, control variates, step h in units of the posterior variance
        algorithm_options, weights_option = {}, {}
    kernel = ESGLD(
        model,
        step_size,
        num_models=10,
        max_model_size=min(q, X.shape[1]),
        subsample_size=subsample or n,
        options={"mh_correction": correction, **weights_option},
        **algorithm_options,
    )
    mcmc = MCMC(kernel, num_warmup=burn_in, num_samples=iters - burn_in, progress_bar=False,
                jit_model_args=True)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y, extra_fields=("model_size", "accept_prob", "diverging"))
    jax.block_until_ready(mcmc.get_samples()["theta"])
    wall = time.perf_counter() - t0
    table = selection.selection_summary(mcmc, beta, thin=10)
    out = dict(table.attrs, inclusion=table["inclusion"].to_numpy())
    true = beta != 0
    out.update(
        time=wall,
        incl_true_min=float(out["inclusion"][true].min()),
        incl_null_max=float(out["inclusion"][~true].max()),
        model_size=float(np.mean(mcmc.get_extra_fields()["model_size"])),
        accept_prob=float(np.mean(mcmc.get_extra_fields()["accept_prob"])),
        diverging=bool(np.any(mcmc.get_extra_fields()["diverging"])),
    )
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 5,000, p = 200, 2,000 iterations")
    ap.add_argument("--which", choices=["linear", "logistic", "both"], default="both")
    ap.add_argument("--seeds", type=int, default=1, help="number of data sets (seeds 0..k-1)")
    ap.add_argument("--subsample", type=int, default=None, help="override n")
    ap.add_argument("--weights", default="auto", help="proposal weights (auto/correlation/deviance/uniform)")
    ap.add_argument("--penalty", action="store_true", help="mh_correction='penalty'")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--algorithm", choices=["default", "paper"], default="default",
                    help="the kernel's default (informed moves, control variates) or the paper's")
    ap.add_argument("--first-seed", type=int, default=0)
    args = ap.parse_args(argv)
    N, p, iters = (5_000, 200, 2_000) if args.quick else (50_000, 2_000, 5_000)
    iters = args.iters or iters
    burn = int(0.4 * iters)
    kinds = ["linear", "logistic"] if args.which == "both" else [args.which]
    for which in kinds:
        rows = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            r = run_one(which, seed, N, p, iters, burn, subsample=args.subsample,
                        weights=args.weights, correction="penalty" if args.penalty else None,
                        algorithm=args.algorithm)
            rows.append(r)
            print(
                f"{args.algorithm:7s} {which:8s} seed {seed}: FSR {r['FSR']:.3f} NSR {r['NSR']:.3f} "
                f"MSE1 {r['MSE1']:.2e} MSE0 {r['MSE0']:.2e} time {r['time']:.1f}s  "
                f"(min true incl. {r['incl_true_min']:.3f}, max null incl. {r['incl_null_max']:.3f}, "
                f"mean |γ| {r['model_size']:.1f}, accept_prob {r['accept_prob']:.3f}"
                f"{', DIVERGED' if r['diverging'] else ''})",
                flush=True,
            )
        mean = {k: np.mean([r[k] for r in rows]) for k in ("FSR", "NSR", "MSE1", "MSE0", "time")}
        sd = {k: np.std([r[k] for r in rows]) for k in ("MSE1", "MSE0")}
        ref = PAPER[which]
        print(
            f"{which:8s} mean over {len(rows)}: FSR {mean['FSR']:.3f} NSR {mean['NSR']:.3f} "
            f"MSE1 {mean['MSE1']:.2e} ({sd['MSE1']:.1e}) MSE0 {mean['MSE0']:.2e} ({sd['MSE0']:.1e}) "
            f"time {mean['time']:.1f}s | paper: FSR {ref['FSR']} NSR {ref['NSR']} MSE1 {ref['MSE1']:.2e} "
            f"MSE0 {ref['MSE0']:.2e} {ref['minutes']} CPU min",
            flush=True,
        )


if __name__ == "__main__":
    main()
