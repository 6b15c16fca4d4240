"""Algorithm S1 against data-augmentation Gibbs on ten million simulated ratings: KSD of the fixed
effects against wall time, as Figure S1 of Song, Sun, Ye & Liang (2020), 'Extended stochastic
gradient MCMC for large-scale Bayesian variable selection' (supplement, MovieLens 10M).

    python benchmarks/bench_movielens_gibbs.py                     # 10⁷ ratings, 71,567 users
    python benchmarks/bench_movielens_gibbs.py --ratings 200000    # quicker
    python benchmarks/bench_movielens_gibbs.py --plot              # docs/images/movielens_gibbs_ksd.png

Data, model and both Gibbs samplers: :mod:`movielens_mixed`.  Runs, each timed from its start
(simulation and sufficient statistics excluded, compilation included):

* **Gibbs, all rows**: the paper's Gibbs sampler, a pass over the 10⁷ ratings per iteration
  (``--gibbs``, the paper's 500 iterations);
* **Gibbs, sufficient statistics**: the same sampler at O(users · q³) per iteration
  (``--gibbs-statistics``, 4,000);
* **SGLD defaults**: SGLD on 500 users per iteration with the users' effects integrated out
  exactly (``method="auto"``), 1,000 + 3,000 iterations (the paper's 4,000 in all);
* **S1 as written**: the same with the effects imputed by one draw each from their exact
  conditional (``method="imputation", num_draws=1``; ``--s1-step``); it reuses the defaults'
  warmup (the same exact-marginal mode search), whose time its time axis includes;
* **reference**: a long Gibbs run on the sufficient statistics, for the KSD's scale and errors.

Gibbs time axes: compilation plus iterations × the measured cost of one; SGLD's: the warmup plus
iterations × the rest of ``MCMC.run`` per iteration, and the same without the warmup ("sampling
only").  KSD: Σ over β's coordinates of the per-coordinate KSD (the paper's), from full-data
scores of β under the exact marginal posterior of (β, σ², D), at ``--scored`` thinned draws per
run, scaled by the reference's sds.

Measured (2-core CPU, pinned stack, ``--plot --s1-step 0.1``, 16 minutes): Gibbs on all rows
162 ms per iteration, KSD(β) 2.18 after 500 in 86 s; on the statistics 13.3 ms, the same KSD in
26 s; SGLD's warmup 372 s (240 s since its curvature check stops at the
first indefinite start), then the same KSD after 6.2 s (defaults) or 3.2 s (S1), and 0.70 and
0.86 at the end.  At the default step size S1 with one imputation diverged (iteration 263).
See docs/local_latents.md.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from movielens_mixed import P, RATINGS, gibbs_rows, gibbs_statistics, model, simulate, user_statistics
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.diagnostics.full_data_scores import ModelScores
from numpyro_sg.diagnostics.ksd import ksd_path
from numpyro_sg.locals import marginalize_locals
from numpyro_sg.locals.posterior import marginal_of

GLOBALS = ("beta", "sigma2", "prec_chol")


def run_gibbs(init, step, iterations: int, seed: int, burn_in: int = 0):
    """Draws of the globals (iterations, …), the seconds per iteration and the compile seconds."""
    @jax.jit
    def chain(state, keys):
        return jax.lax.scan(lambda st, k: (lambda o: (o[0], o[1][:3]))(step(st, k)), state, keys)

    state = init()
    if burn_in:
        state = chain(state, random.split(random.PRNGKey(seed + 1), burn_in))[0]
    keys = random.split(random.PRNGKey(seed), iterations)
    start = time.perf_counter()
    compiled = chain.lower(state, keys).compile()
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    _, (beta, sigma2, chol) = jax.block_until_ready(compiled(state, keys))
    per_iteration = (time.perf_counter() - start) / iterations
    draws = {"beta": np.asarray(beta), "sigma2": np.asarray(sigma2), "prec_chol": np.asarray(chol)}
    return draws, per_iteration, compile_seconds


def run_sgld(stats, method: str, num_draws: int, warmup: int, samples: int, fit=None, step_size=None):
    """SGLD's draws of the globals, its seconds and initialisation seconds, and its warmup's fit
    (``fit``: reuse one, the mode search then skipped)."""
    options = {} if step_size is None else {"step_size": step_size}
    kernel = nsg.SGLD(marginalize_locals(model, method=method, num_draws=num_draws), **options)
    if fit is not None:
        kernel.use_mode_fit(fit)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, num_chains=1, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(random.PRNGKey(0), *stats)
    seconds = time.perf_counter() - start
    draws = {k: np.asarray(v) for k, v in mcmc.get_samples().items() if k in GLOBALS}
    return draws, seconds, kernel.mode_fit.seconds if fit is None else 0.0, kernel.mode_fit


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratings", type=int, default=RATINGS)
    parser.add_argument("--gibbs", type=int, default=500, help="Gibbs iterations on all rows (the paper's 500)")
    parser.add_argument("--gibbs-statistics", type=int, default=4000, help="Gibbs iterations on the statistics")
    parser.add_argument("--reference", type=int, default=5000, help="reference Gibbs iterations")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--s1-draws", type=int, default=1, help="imputations per user and step of S1")
    parser.add_argument("--s1-step", type=float, default=0.1,
                        help="S1's step size (SGLD's default 0.7 diverged with one imputation at 10⁷)")
    parser.add_argument("--scored", type=int, default=200, help="draws scored per run for the KSD path")
    parser.add_argument("--plot", action="store_true", help="save docs/images/movielens_gibbs_ksd.png")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    user, W, y = simulate(args.ratings)
    simulated = time.perf_counter() - start
    stats = tuple(jnp.asarray(a) for a in user_statistics(user, W, y))
    U = stats[0].shape[0]
    print(f"{y.size:,} ratings of {U:,} users simulated in {simulated:.1f} s, statistics in "
          f"{time.perf_counter() - start - simulated:.1f} s; peak memory "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")

    ref, ref_per_iter, _ = run_gibbs(*gibbs_statistics(*stats), args.reference, seed=1, burn_in=500)
    runs, offsets = {}, {}
    rows = gibbs_rows(jnp.asarray(user), jnp.asarray(W), jnp.asarray(y), stats[0])
    del user, W, y
    for name, sampler, iterations in (("Gibbs, all rows", rows, args.gibbs),
                                      ("Gibbs, sufficient statistics", gibbs_statistics(*stats), args.gibbs_statistics)):
        draws, per_iter, compile_s = run_gibbs(*sampler, iterations, seed=0)
        runs[name] = (draws, compile_s + per_iter * np.arange(1, iterations + 1))
        print(f"{name}: {per_iter * 1e3:.1f} ms per iteration, compiled in {compile_s:.1f} s")
    del rows
    total, fit = args.warmup + args.samples, None
    s1 = f"S1 as written ({args.s1_draws} imputation{'s' * (args.s1_draws > 1)})"
    for name, method, m in (("SGLD defaults (exact)", "auto", 16), (s1, "imputation", args.s1_draws)):
        draws, seconds, init, found = run_sgld(stats, method, m, args.warmup, args.samples, fit,
                                               args.s1_step if method == "imputation" else None)
        if fit is None:   # the same mode search for both (the exact marginal's): run once, shared
            fit, warmup_seconds = found, init
        per_iter = (seconds - init) / total
        runs[name] = (draws, warmup_seconds + per_iter * (args.warmup + np.arange(1, args.samples + 1)))
        offsets[name] = warmup_seconds
        print(f"{name}: {seconds:.1f} s, {init:.1f} s of it initialisation, {per_iter * 1e3:.2f} ms per iteration")

    scores = ModelScores(marginal_of(model, stats), stats)   # the exact marginal of (β, σ², D)
    x_ref = scores.unconstrain({k: v[::max(1, args.reference // 1000)] for k, v in ref.items()})
    scale = x_ref.std(0)[:P]

    def path(draws, times):
        keep = np.unique(np.linspace(0, len(times) - 1, min(args.scored, len(times))).astype(int))
        x = scores.unconstrain({k: v[keep] for k, v in draws.items()})
        steps, values = ksd_path(x[:, :P], scores=scores.score(x)[:, :P], preconditioner=scale,
                                 per_coordinate=True, num_steps=20)
        return np.asarray(times)[keep][steps - 1], np.asarray(values)

    paths = {name: path(draws, times) for name, (draws, times) in runs.items()}
    for name, offset in offsets.items():
        paths[name + ", sampling only"] = (paths[name][0] - offset, paths[name][1])
    ref_mean, ref_sd = ref["beta"].mean(0), ref["beta"].std(0)
    for name, (draws, _) in runs.items():
        t, k = paths[name]
        draws = draws["beta"][len(draws["beta"]) // 4:]
        err = np.abs(draws.mean(0) - ref_mean) / ref_sd
        print(f"{name:>30}: final KSD(β) {k[-1]:.3g} at {t[-1]:.1f} s; β within {err.max():.2f} reference sd, "
              f"sds {np.min(draws.std(0) / ref_sd):.2f}–{np.max(draws.std(0) / ref_sd):.2f}× (last 3/4)")
    rows_k = paths["Gibbs, all rows"][1]
    for level in (rows_k[-1], rows_k[len(rows_k) // 2], rows_k[0]):   # levels the paper's Gibbs run reaches
        reach = {n: (t[np.argmax(k <= level)] if (k <= level).any() else np.nan) for n, (t, k) in paths.items()}
        print(f"  time to KSD(β) ≤ {level:.3g}: " + ", ".join(f"{n} {v:.1f} s" for n, v in reach.items()))
    print(f"reference: {args.reference} Gibbs iterations, {ref_per_iter * 1e3:.1f} ms each")
    if args.plot:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for (name, (t, k)), style in zip(paths.items(), ("s:", "d:", "^-", "o-", "^--", "o--")):
            ax.loglog(t, k, style, ms=3, label=name)
        ax.set(xlabel="wall time (s)", ylabel="KSD of β",
               title=f"{y_size(args.ratings)} simulated ratings, {U:,} users")
        ax.legend(fontsize=8)
        fig.savefig(Path(__file__).resolve().parents[1] / "docs" / "images" / "movielens_gibbs_ksd.png",
                    dpi=100, bbox_inches="tight")


def y_size(n: int) -> str:
    return f"{n / 1e6:.0f} million" if n >= 1e6 else f"{n:,}"


if __name__ == "__main__":
    main()
