"""Coullon, South & Nemeth (2023), §4.3 and Table 3, on scikit-learn's digits (one process).

    python benchmarks/repro_mamba_network.py                       # the table in docs/reproductions.md
    python benchmarks/repro_mamba_network.py --samplers SGLD --seconds 10 --budget 20   # quick

The paper tunes six samplers (SGLD, SGHMC, SGNHT, each with plain and control-variate
gradients) on a one-hidden-layer network (100 units, softmax activations, N(0, 1) priors) on
MNIST by (i) MAMBA with the KSD, (ii) grid search scored by log-loss and (iii) the heuristic
step 1/N with a tenth of the data per mini-batch; then runs each tuned sampler for 300 s from
the maximum a posteriori value, drops the burn-in and reports ECE and MCE (Table 3) and test
accuracy (Table 10).  Here: the same network on the 8×8 digits (64 inputs, 7,510 parameters;
tanh hidden units by default: with the paper's softmax ones, 2,000 Adam steps reached 96.4 %
test accuracy with ECE 0.10, an underfitted start),
1,150 training, 287 validation and 360 test rows; the papers' conventions
(``preconditioner=None``, absolute step sizes 10⁻² … 10⁻⁷·⁵, mini-batches of 100 %, 10 % and
1 % of the rows); the grid search's log-loss on the validation rows
(:func:`numpyro_sg.held_out_score`); each sampler's run lasts ``--seconds`` (one chain, the
second half kept).  Our SGHMC takes one step per iteration (the paper's L ∈ {5, 10} leapfrog
steps are not a setting of ours).  Rows for comparison: MAP (Adam) and the defaults
(``nsg.SGLD(model)``, ``nsg.SGHMC(model)``), run for the same time, and MAMBA over the
defaults' step sizes (in posterior sds), scored by the KSD and by held-out log-loss.
"""

import argparse
import functools
import gc
import time

import jax
import numpy as np
import optax
from numpyro.infer import MCMC, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta

import numpyro_sg as nsg
from numpyro_sg.arviz_compat import from_dict
from numpyro_sg.datasets.networks import load_digits_split, mlp_classifier

KERNELS = {"SGLD": nsg.SGLD, "SGHMC": nsg.SGHMC, "SGNHT": nsg.SGNHT}
PAPER_STEPS = [10.0 ** -e for e in np.arange(2.0, 8.0, 0.5)]   # 10^-2 … 10^-7.5


def metrics(samples, model, test):
    idata = from_dict(posterior={k: np.asarray(v)[None] for k, v in samples.items()})
    row = nsg.predictive_metrics(idata, *test, model=model).loc["y"]
    return {"ece": row["ece"], "mce": row["mce"], "accuracy": row["accuracy"], "nll": -row["lpd"]}


def map_fit(model, train, steps=2000):
    svi = SVI(model, AutoDelta(model), optax.adam(1e-2), Trace_ELBO())
    t0 = time.perf_counter()
    res = svi.run(jax.random.PRNGKey(0), steps, *train, progress_bar=False)
    params = {k.removesuffix("_auto_loc"): v for k, v in res.params.items()}   # (all sites real)
    jax.block_until_ready(params)
    return {k: np.asarray(v)[None] for k, v in params.items()}, time.perf_counter() - t0


def run_for(kernel, seconds, train, key, chunk=1000, keep=1000):
    """Run one chain in chunks of ``chunk`` iterations until ``seconds`` of sampling have passed
    (the first chunk, which compiles, is not counted); the second half of the iterations is
    kept, thinned to at most ``keep`` draws.  Returns (draws, iterations, seconds)."""
    mcmc = MCMC(kernel, num_warmup=0, num_samples=chunk, progress_bar=False)
    mcmc.run(key, *train)
    pieces, spent, t0 = [], 0.0, time.perf_counter()
    while spent < seconds:
        mcmc.post_warmup_state = mcmc.last_state
        mcmc.run(mcmc.last_state.rng_key, *train)
        pieces.append({k: np.asarray(v) for k, v in mcmc.get_samples().items()})
        spent = time.perf_counter() - t0
    kept = pieces[len(pieces) // 2:]
    samples = {k: np.concatenate([p[k] for p in kept]) for k in kept[0]}
    step = max(len(next(iter(samples.values()))) // keep, 1)
    return {k: v[::step] for k, v in samples.items()}, chunk * len(pieces), spent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samplers", nargs="+", default=["SGLD", "SGLD-CV", "SGHMC", "SGHMC-CV", "SGNHT", "SGNHT-CV"])
    p.add_argument("--seconds", type=float, default=30.0, help="each tuned sampler's run")
    p.add_argument("--budget", type=float, default=60.0, help="each tuner's time_budget")
    p.add_argument("--activation", choices=["softmax", "tanh"], default="tanh")
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--no-defaults", action="store_true", help="skip the rows of our defaults")
    p.add_argument("--json")
    args = p.parse_args(argv)

    data = load_digits_split(test=360, validation=287)
    train, val, test = data["train"], data["validation"], data["test"]
    N = len(train[1])
    act = jax.nn.softmax if args.activation == "softmax" else jax.numpy.tanh
    model = functools.partial(mlp_classifier, hidden=args.hidden, activation=act)
    log_loss = nsg.held_out_score(model, *val, score="nll")
    rows, key = [], jax.random.PRNGKey(0)

    draws, wall = map_fit(model, train)
    rows.append({"sampler": "MAP (Adam, 2,000 steps)", "tuner": "-", "seconds": wall, **metrics(draws, model, test)})
    print(rows[-1], flush=True)

    def record(sampler, tuner, kernel, params, tune_seconds):
        samples, n, wall = run_for(kernel, args.seconds, train, key)
        rows.append({"sampler": sampler, "tuner": tuner, **params, "tune_seconds": tune_seconds,
                     "iterations": n, "seconds": wall, **metrics(samples, model, test)})
        print(rows[-1], flush=True)

    batches = [N, N // 10, N // 100]
    for name in args.samplers:
        family, cv = name.split("-")[0], name.endswith("-CV")
        make = functools.partial(KERNELS[family], model, preconditioner=None, gradient="cv" if cv else "plain")
        grid = {"step_size": PAPER_STEPS, "subsample_size": batches}
        for tuner, metric in [("MAMBA-KSD", "ksd"), ("grid, log-loss", log_loss)]:
            fn = nsg.mamba if tuner.startswith("MAMBA") else nsg.grid_search
            t0 = time.perf_counter()
            res = fn(make, grid, train, time_budget=args.budget, metric=metric, rng_key=key)
            record(name, tuner, res.best_kernel(), res.best_params, time.perf_counter() - t0)
        heuristic = {"step_size": 1.0 / N, "subsample_size": N // 10}
        record(name, "heuristic 1/N", make(**heuristic), heuristic, 0.0)
        # compiled programs pile up over the many tuner calls of one process; without this
        # the CPU backend ran out of memory maps (vm.max_map_count) during the fifth sampler
        jax.clear_caches()
        gc.collect()

    if not args.no_defaults:
        for family in ("SGLD", "SGHMC"):
            make = functools.partial(KERNELS[family], model)
            record(family + " defaults", "-", make(), {}, 0.0)
            grid = {"step_size": [0.3, 0.7, 1.5, 3.0], "subsample_size": [N // 2, N // 10, N // 100]}
            for tuner, metric in [("MAMBA-KSD", "ksd"), ("MAMBA, log-loss", log_loss)]:
                t0 = time.perf_counter()
                res = nsg.mamba(make, grid, train, time_budget=args.budget, metric=metric, rng_key=key)
                unscored = res.rounds[np.isinf(res.rounds["score"])]
                print(f"{family} {tuner}: {res!r}; inf scores: {unscored['reason'].value_counts().to_dict()}")
                record(family + " defaults", tuner, res.best_kernel(), res.best_params, time.perf_counter() - t0)

    import pandas as pd

    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(4).to_string())
    if args.json:
        table.to_json(args.json, orient="records", indent=1)


if __name__ == "__main__":
    main()
