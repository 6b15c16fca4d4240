"""Effective samples per second of the default kernels against NUTS and HMCECS, in one process.

Problems (simulated, fixed seeds, float32): logistic regression (d = 20, prior N(0, 10²)) and
Poisson regression (d = 10: 9 slopes and an intercept) at N ∈ {10⁵, 10⁶, 10⁷}
(``--sizes``), mini-batch n = 1,000 for every subsampling method.

Methods, each timed end to end as a user runs it (``MCMC.run`` wall time including model
initialisation, compilation and — for our kernels — the warmup's mode search), with
``MCMC``'s defaults (``jit_model_args=False``) unless ``--jit-model-args``:

* ``NUTS`` on the full data (every subsample plate switched to all N rows), one chain,
  ``--nuts-warmup`` + ``--nuts-samples`` iterations (1,000 + 1,000);
* ``HMCECS`` (NumPyro's energy-conserving subsampling with its second-order Taylor proxy
  around the mode, the subsampling alternative users already have), one chain,
  ``num_blocks=10``, the same iterations as NUTS;
* ``nsg.SGLD(model)`` and ``nsg.SGBD(model)`` (or the kernels named by ``--kernels``, e.g.
  ``SGLD,SGBD,PSGLD,BAOAB``) with their defaults: 4 vectorised chains, 1,000 warmup + 2,000
  draws; ``--repeats K`` runs each K times (``SGLD#2``, …), every repeat a first run (a new
  kernel, the package's and JAX's in-process caches cleared, its own key), so that their
  range is measured against the same NUTS run in one process.

An untimed warm-up (every method briefly on N = 2,000) runs first, so that JAX's process-wide
one-off costs are not charged to the method timed first.  HMCECS's Taylor proxy stores a
per-datum Hessian (N·d² floats: 16 GB at N = 10⁷, d = 20): skip it there (``--no-hmcecs``).

Reported per method: wall time, min and median bulk ESS over the sampled coordinates
(ArviZ), min-ESS/s and median-ESS/s, ξ(σ̂) = ‖σ̂ − σ_NUTS‖/‖σ_NUTS‖ and the largest
|mean − mean_NUTS| in NUTS sds, and the ratio of min-ESS/s to NUTS's.  NUTS's own Monte Carlo
error is part of ξ (≈ 2–3% with 1,000 draws).  For the logistic and Poisson problems (every site
real-valued) our kernels' ξ is also given against the sds of the warmup's Laplace fit
(column ``ξ Lap``): at N ≥ 10⁶ the posterior is Gaussian to high accuracy, and that reference
has no Monte Carlo error (its curvature comes from 65,536 rows: ≈ 0.4% per sd).

Usage::

    python benchmarks/bench_vs_nuts.py                       # N = 1e5 and 1e6
    python benchmarks/bench_vs_nuts.py --sizes 1e7 --nuts-warmup 500 --nuts-samples 500
    python benchmarks/bench_vs_nuts.py --quick               # N = 2e4, short runs (smoke test)
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import HMCECS, MCMC, NUTS

import numpyro_sg as nsg
from numpyro_sg.infer.minibatch import discover_plates, full_data
from numpyro_sg.infer.fit_store import clear_store
from numpyro_sg.infer.programs import clear_programs

SUBSAMPLE = 1000


def logistic(X, y=None):
    N, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=yb)


def poisson(X, y=None):
    N, d = X.shape
    b0 = numpyro.sample("intercept", dist.Normal(0.0, 5.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Poisson(jnp.exp(b0 + Xb @ beta)), obs=yb)


def linear_sigma(X, y=None):
    N, d = X.shape
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([d]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))  # a constrained global site
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(Xb @ beta, sigma), obs=yb)


def negbin(X, y=None):
    N, d = X.shape
    b0 = numpyro.sample("intercept", dist.Normal(0.0, 5.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    phi = numpyro.sample("phi", dist.Exponential(0.1))  # a constrained global site
    with numpyro.plate("data", N, subsample_size=SUBSAMPLE):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(b0 + Xb @ beta), phi), obs=yb)


def simulate(kind, N, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "logistic":
        X = rng.normal(size=(N, 20)).astype(np.float32)
        y = (rng.random(N) < 1 / (1 + np.exp(-X @ (0.5 * rng.normal(size=20))))).astype(np.float32)
    elif kind == "poisson":
        X = (0.3 * rng.normal(size=(N, 9))).astype(np.float32)
        y = rng.poisson(np.exp(1.0 + X @ (0.5 * rng.normal(size=9)))).astype(np.float32)
    elif kind == "linear_sigma":
        X = rng.normal(size=(N, 4)).astype(np.float32)
        y = (X @ np.array([1.0, -0.5, 0.25, 2.0]) + 2.0 * rng.normal(size=N)).astype(np.float32)
    else:
        X = (0.3 * rng.normal(size=(N, 6))).astype(np.float32)
        mu = np.exp(1.5 + X @ (0.5 * rng.normal(size=6)))
        y = rng.negative_binomial(3.0, 3.0 / (3.0 + mu)).astype(np.float32)
    return X, y


#: logistic d = 20, Poisson d = 10 (the issue's problems); linear regression with unknown σ
#: (d = 5) and negative-binomial regression (d = 8) have a constrained global site
MODELS = {"logistic": logistic, "poisson": poisson, "linear_sigma": linear_sigma, "negbin": negbin}
#: problems whose sites are all real-valued (draws and Laplace fit in the same coordinates)
REAL_VALUED = ("logistic", "poisson")


def _timed_run(kernel, X, y, *, num_warmup, num_samples, num_chains, chain_method, jit_model_args, seed=1):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=False, jit_model_args=jit_model_args)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the convergence check's verdict is reported below
        mcmc.run(jax.random.PRNGKey(seed), X, y)
        jax.block_until_ready(mcmc.get_samples())
    return mcmc, time.perf_counter() - start


def _summary(samples: dict, seconds: float, reference=None) -> dict:
    """min/median bulk ESS per second, and ξ(σ̂) / max mean error against ``reference``."""
    post = {k: np.asarray(v, np.float64) for k, v in samples.items()}
    ess = np.concatenate([np.asarray(az.ess(az.convert_to_dataset({"x": v})).x).reshape(-1)
                          for v in post.values()])
    flat = np.concatenate([v.reshape(v.shape[0] * v.shape[1], -1) for v in post.values()], axis=1)
    out = dict(seconds=seconds, min_ess=float(ess.min()), median_ess=float(np.median(ess)),
               min_ess_per_s=float(ess.min() / seconds), median_ess_per_s=float(np.median(ess) / seconds),
               mean=flat.mean(0), sd=flat.std(0))
    if reference is not None:
        out["xi_sd"] = float(np.linalg.norm(out["sd"] - reference["sd"]) / np.linalg.norm(reference["sd"]))
        out["max_mean_err"] = float(np.max(np.abs(out["mean"] - reference["mean"]) / reference["sd"]))
    return out


def warm_up(args):
    """Untimed short runs of every method on small data, so that JAX's process-wide one-off
    costs are not charged to whichever method is timed first."""
    X, y = simulate("logistic", 2000)
    small = dict(jit_model_args=args.jit_model_args)
    full = full_data(logistic, discover_plates(logistic, (X, y), {}))
    _timed_run(NUTS(full), X, y, num_warmup=20, num_samples=20, num_chains=1,
               chain_method="sequential", **small)
    for make in (getattr(nsg, name) for name in args.kernels.split(",")):
        _timed_run(make(logistic), X, y, num_warmup=20, num_samples=20, num_chains=4,
                   chain_method="vectorized", **small)


def run_problem(kind, N, args):
    X, y = simulate(kind, N)
    model = MODELS[kind]
    results = {}
    common = dict(jit_model_args=args.jit_model_args)
    full = full_data(model, discover_plates(model, (X, y), {}))
    mcmc, t = _timed_run(NUTS(full), X, y, num_warmup=args.nuts_warmup, num_samples=args.nuts_samples,
                         num_chains=1, chain_method="sequential", **common)
    ref = _summary(mcmc.get_samples(group_by_chain=True), t)
    results["NUTS"] = ref
    for name, rep in ((n, r) for n in args.kernels.split(",") for r in range(args.repeats)):
        if rep:  # every repeat is a first run: a new kernel, nothing compiled or stored in the process
            clear_programs()
            clear_store()   # the warmup's fits
            jax.clear_caches()
            name_rep = f"{name}#{rep + 1}"
        else:
            name_rep = name
        kernel = getattr(nsg, name)(model)
        mcmc, t = _timed_run(kernel, X, y, num_warmup=args.warmup, num_samples=args.samples,
                             num_chains=4, chain_method="vectorized", seed=1 + rep, **common)
        name = name_rep
        results[name] = _summary(mcmc.get_samples(group_by_chain=True), t, ref)
        fit = kernel.mode_fit
        results[name]["mode_search_s"] = fit.seconds
        if kind in REAL_VALUED:
            laplace_sd = kernel.unravel(fit.scales)
            laplace_sd = np.concatenate([np.ravel(laplace_sd[k]) for k in mcmc.get_samples()])
            results[name]["xi_laplace"] = float(np.linalg.norm(results[name]["sd"] - laplace_sd)
                                                / np.linalg.norm(laplace_sd))
    if not args.no_hmcecs:
        # HMCECS's proxy needs a reference point: the mode our warmup found (constrained)
        mode = jax.tree.map(np.asarray, kernel.postprocess_fn((X, y), {})(kernel.unravel(fit.mode)))
        mode = {k: v for k, v in mode.items() if k in mcmc.get_samples()}
        ecs = HMCECS(NUTS(model), num_blocks=10, proxy=HMCECS.taylor_proxy(mode))
        mcmc, t = _timed_run(ecs, X, y, num_warmup=args.nuts_warmup, num_samples=args.nuts_samples,
                             num_chains=1, chain_method="sequential", **common)
        results["HMCECS"] = _summary(mcmc.get_samples(group_by_chain=True), t, ref)
    for r in results.values():
        r["vs_nuts"] = r["min_ess_per_s"] / ref["min_ess_per_s"]
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e5,1e6", help="comma-separated N (default 1e5,1e6)")
    parser.add_argument("--models", default="logistic,poisson",
                        help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--nuts-warmup", type=int, default=1000)
    parser.add_argument("--nuts-samples", type=int, default=1000)
    parser.add_argument("--jit-model-args", action="store_true")
    parser.add_argument("--no-hmcecs", action="store_true")
    parser.add_argument("--kernels", default="SGLD,SGBD",
                        help="comma-separated numpyro_sg kernels run with their defaults")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each of our kernels (each a first run: a new kernel and "
                             "JAX's caches cleared, its own key), against the one NUTS run")
    parser.add_argument("--quick", action="store_true", help="N = 2e4 and short runs")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.nuts_warmup, args.nuts_samples = "2e4", 300, 300
    rows, everything = [], {}
    header = (f"{'problem':>18s} {'method':>7s} {'wall s':>8s} {'min ESS':>8s} {'min ESS/s':>10s} "
              f"{'med ESS/s':>10s} {'ξ(σ̂)':>7s} {'max|Δμ|/σ':>10s} {'vs NUTS':>8s} {'ξ Lap':>6s}")
    warm_up(args)
    print(header, flush=True)
    for kind in args.models.split(","):
        for N in (int(float(s)) for s in args.sizes.split(",")):
            res = run_problem(kind, N, args)
            everything[f"{kind}-{N}"] = {m: {k: np.asarray(v).tolist() for k, v in r.items()}
                                         for m, r in res.items()}
            for method, r in res.items():
                line = (f"{kind + ' N=' + format(N, '.0e'):>18s} {method:>7s} {r['seconds']:8.1f} "
                        f"{r['min_ess']:8.0f} {r['min_ess_per_s']:10.1f} {r['median_ess_per_s']:10.1f} "
                        f"{r.get('xi_sd', 0.0):7.3f} {r.get('max_mean_err', 0.0):10.3f} {r['vs_nuts']:8.1f}"
                        + (f" {r['xi_laplace']:6.3f}" if "xi_laplace" in r else ""))
                print(line, flush=True)
                rows.append(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=2)
    return everything


if __name__ == "__main__":
    main()
