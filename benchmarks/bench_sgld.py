"""Throughput of numpyro_sg's SGLD against a hand-written JAX loop, BlackJAX and SGMCMCJax.

Problem: Bayesian logistic regression, d = 10, N = 1,000,000 simulated data (fixed numpy seed,
float32), mini-batch n = 10,000 (1 %) drawn with replacement, prior N(0, 10²) per coordinate,
constant step size ε = 1e-6 in numpyro_sg's convention

    θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·I),   ĝ = ∇ log p(θ) + (N/n)·Σ_{i∈S} ∇ log f(x_i | θ).

All four samplers run one chain from θ = 0 and store every draw.  Iterations per second are
measured by the *difference of two run lengths*, (T_long − T_short)/(t_long − t_short), so that
fixed per-run costs (compilation, NumPyro's model initialisation, dispatch) cancel:

* numpyro_sg runs under ``numpyro.infer.MCMC``, which recompiles its collection loop at every
  ``run``; each ``run`` is timed end to end (init + compile + sampling), after one throw-away
  run that pays the process-wide one-off costs.
* the three peers are plain jitted ``lax.scan`` loops; both lengths are compiled ahead of time
  (``jax.jit(...).lower(...).compile()``) and only their execution is timed.

Each (method, length) is timed in `--repeats` interleaved rounds (default 2) and keeps its
fastest time, which damps interference from other processes on a shared machine.

Usage::

    python benchmarks/bench_sgld.py                 # default: 5,000 vs 20,000 iterations
    python benchmarks/bench_sgld.py --iterations 40000 --json results.json
    python benchmarks/bench_sgld.py --quick         # smoke run: N = 100,000, few iterations
"""

from __future__ import annotations

import argparse
from functools import partial
import json
import os
import platform
import sys
import time
import types
import warnings

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax, random

import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

import numpyro_sg as nsg

D = 10
PRIOR_SD = 10.0
STEP_SIZE = 1e-6  # ε in numpyro_sg's convention
DATA_SEED = 20240601


# --------------------------------------------------------------------------------------------
# data and log densities shared by the hand-written loop and the peers
# --------------------------------------------------------------------------------------------
def make_data(N, d=D, seed=DATA_SEED):
    rs = np.random.default_rng(seed)
    theta_true = rs.normal(size=d).astype(np.float32)
    X = rs.normal(size=(N, d)).astype(np.float32)
    p = 1.0 / (1.0 + np.exp(-(X @ theta_true)))
    y = (rs.uniform(size=N) < p).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y), theta_true


def log_prior(theta):
    return jnp.sum(dist.Normal(0.0, PRIOR_SD).log_prob(theta))


def log_lik_one(theta, x, y):
    """log f(x_i, y_i | θ) for one datum (Bernoulli with logits x·θ)."""
    z = jnp.dot(x, theta)
    return y * z - jax.nn.softplus(z)


# --------------------------------------------------------------------------------------------
# 1. numpyro_sg under numpyro.infer.MCMC
# --------------------------------------------------------------------------------------------
def make_model(batch):
    def model(X, y=None):
        N, d = X.shape
        theta = numpyro.sample("theta", dist.Normal(0, PRIOR_SD).expand([d]).to_event(1))
        with numpyro.plate("data", N, subsample_size=batch):
            Xb = numpyro.subsample(X, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0) if y is not None else None
            numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=yb)

    return model


def run_numpyro_sg(key, X, y, T, batch, theta0):
    mcmc = MCMC(
        # the peers' algorithm: absolute ε, plain mini-batch gradients, no mode search
        nsg.SGLD(make_model(batch), step_size=STEP_SIZE, preconditioner=None, gradient="plain"),
        num_warmup=0,
        num_samples=T,
        progress_bar=False,
        jit_model_args=True,
    )
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # a 20,000-draw chain from θ = 0 is not meant to converge
        warnings.simplefilter("ignore", nsg.ConvergenceWarning)
        mcmc.run(key, X, y, init_params={"theta": theta0})
    draws = jax.block_until_ready(mcmc.get_samples()["theta"])
    return time.perf_counter() - t0, draws


# --------------------------------------------------------------------------------------------
# 2. hand-written lax.scan SGLD
# --------------------------------------------------------------------------------------------
def randint_indices(key, batch, N):
    """The peers' way: ``random.randint`` (two threefry passes, one of them dead for N > 2¹⁶)."""
    return random.randint(key, (batch,), 0, N)


def onepass_indices(key, batch, N):
    """For N > 2¹⁶, ``random.randint(key, (n,), 0, N)`` equals ``random.bits(k2, (n,)) % N`` with
    ``k1, k2 = random.split(key)`` bit for bit: randint's "higher bits" are multiplied by
    (2¹⁶ mod N)² mod 2³², which is 0, so they are drawn for nothing.  This skips them."""
    _, k_lo = random.split(key)
    return (random.bits(k_lo, (batch,), jnp.uint32) % jnp.uint32(N)).astype(jnp.int32)


def make_handwritten(T, batch, draw_indices=randint_indices):
    """Hand-written jitted ``lax.scan`` SGLD; ``draw_indices=onepass_indices`` for ``--onepass``."""

    def run(key, theta0, X, y):
        N = X.shape[0]

        def log_post(theta, Xb, yb):
            z = Xb @ theta
            return log_prior(theta) + (N / batch) * jnp.sum(yb * z - jax.nn.softplus(z))

        grad_fn = jax.grad(log_post)

        def step(carry, _):
            theta, key = carry
            key, k_idx, k_noise = random.split(key, 3)
            idx = draw_indices(k_idx, batch, N)
            g = grad_fn(theta, X[idx], y[idx])
            xi = random.normal(k_noise, theta.shape, theta.dtype)
            theta = theta + 0.5 * STEP_SIZE * g + jnp.sqrt(STEP_SIZE) * xi
            return (theta, key), theta

        _, draws = lax.scan(step, (theta0, key), None, length=T)
        return draws

    return run


# --------------------------------------------------------------------------------------------
# 3. BlackJAX
# --------------------------------------------------------------------------------------------
def make_blackjax(T, batch):
    import blackjax
    from blackjax.sgmcmc.gradients import grad_estimator

    # blackjax.sgmcmc.diffusions.overdamped_langevin:  θ' = θ + h·ĝ + √(2·τ·h)·ξ
    # numpyro_sg:                                        θ' = θ + (ε/2)·ĝ + √ε·ξ   ⇒ h = ε/2.
    h = STEP_SIZE / 2.0

    def run(key, theta0, X, y):
        N = X.shape[0]

        def loglik(theta, datum):  # one datum; grad_estimator vmaps it and scales by N/n
            x, yy = datum
            return log_lik_one(theta, x, yy)

        sgld = blackjax.sgld(grad_estimator(log_prior, loglik, N))

        def step(carry, _):
            theta, key = carry
            key, k_idx, k_step = random.split(key, 3)
            idx = random.randint(k_idx, (batch,), 0, N)
            theta = sgld.step(k_step, theta, (X[idx], y[idx]), h)
            return (theta, key), theta

        _, draws = lax.scan(step, (sgld.init(theta0), key), None, length=T)
        return draws

    return run


# --------------------------------------------------------------------------------------------
# 4. SGMCMCJax
# --------------------------------------------------------------------------------------------
def import_sgmcmcjax():
    """Import sgmcmcjax 0.2.13 on jax ≥ 0.4.3x, which removed ``jax.experimental.host_callback``.

    Only its tqdm progress bar uses ``host_callback.id_tap``; the stand-in fails loudly if that
    path is ever taken (we never ask for a progress bar).
    """
    name = "jax.experimental.host_callback"
    try:
        from jax.experimental import host_callback  # noqa: F401
    except ImportError:
        stub = types.ModuleType(name)

        def id_tap(*args, **kwargs):
            raise RuntimeError("host_callback stand-in: sgmcmcjax progress bars are disabled")

        stub.id_tap = id_tap
        sys.modules[name] = stub
        import jax.experimental

        jax.experimental.host_callback = stub
    import sgmcmcjax
    from sgmcmcjax.kernels import build_sgld_kernel

    return sgmcmcjax, build_sgld_kernel


def make_sgmcmcjax(T, batch):
    _, build_sgld_kernel = import_sgmcmcjax()

    # sgmcmcjax.diffusions.sgld:  θ' = θ + dt·ĝ + √(2·dt)·ξ   ⇒ dt = ε/2.
    dt = STEP_SIZE / 2.0

    def loglik(theta, x, yy):  # one datum; build_grad_log_post vmaps it and scales by N/n
        return log_lik_one(theta, x, yy)

    def run(key, theta0, X, y):
        # Built inside jit so the data enter as arguments (like the other methods), not as
        # 40 MB constants baked into the executable.  The kernel draws its own indices:
        # random.choice(key, jnp.arange(N), (n,)) with replacement.
        init_fn, kernel, get_params = build_sgld_kernel(dt, loglik, log_prior, (X, y), batch)
        key, k_init = random.split(key)
        state = init_fn(k_init, theta0)

        def body(carry, i):
            key, state = carry
            key, subkey = random.split(key)
            state = kernel(i, subkey, state)
            return (key, state), get_params(state)

        _, draws = lax.scan(body, (key, state), jnp.arange(T))
        return draws

    return run


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------
def compile_jitted(make, key, theta0, X, y, T, batch):
    t0 = time.perf_counter()
    compiled = jax.jit(make(T, batch)).lower(key, theta0, X, y).compile()
    return compiled, time.perf_counter() - t0


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _load():
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


def rate_from(t_short, t_long, T_short, T_long):
    """(T_long − T_short)/(t_long − t_short); NaN when timing noise swamps the difference."""
    dt = t_long - t_short
    return (T_long - T_short) / dt if dt > 0 else float("nan")


METHODS = [
    ("numpyro_sg", "numpyro_sg SGLD (MCMC)", None),
    ("handwritten", "hand-written lax.scan", make_handwritten),
    ("blackjax", "BlackJAX sgld", make_blackjax),
    ("sgmcmcjax", "SGMCMCJax sgld", make_sgmcmcjax),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=None,
                    help="long run length T_long (default 20,000; --quick: 10,000)")
    ap.add_argument("--short", type=int, default=None,
                    help="short run length T_short (default T_long // 4)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="timing rounds; each (method, length) keeps its fastest time (default 2)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: N = 100,000, 10,000 vs 2,500 iterations, one round")
    ap.add_argument("--n-data", type=int, default=None, help="N (default 1,000,000)")
    ap.add_argument("--onepass", action="store_true",
                    help="also time a hand-written loop drawing its indices with one threefry pass "
                         "(bit-identical to randint for N > 2^16); reported, not used in the ratios")
    ap.add_argument("--json", metavar="PATH", default=None, help="write the results as JSON")
    ap.add_argument("--seed", type=int, default=0, help="PRNG seed of the chains")
    args = ap.parse_args(argv)

    N = args.n_data or (100_000 if args.quick else 1_000_000)
    batch = max(1, N // 100)
    T_long = args.iterations or (10_000 if args.quick else 20_000)
    T_short = args.short or max(1, T_long // 4)
    repeats = 1 if args.quick else args.repeats
    if N <= 2**16 and args.onepass:
        ap.error("--onepass needs N > 65,536")
    methods = METHODS + ([("handwritten_onepass", "hand-written, 1-pass idx",
                           partial(make_handwritten, draw_indices=onepass_indices))]
                         if args.onepass else [])
    if not 0 < T_short < T_long:
        ap.error("need 0 < short < iterations")
    if repeats < 1:
        ap.error("need --repeats >= 1")
    t_start = time.perf_counter()

    print(f"jax {jax.__version__} ({jax.default_backend()}, {os.cpu_count()} CPU cores, "
          f"{platform.machine()}), numpyro {numpyro.__version__}, numpyro_sg {nsg.__version__}; "
          f"load average {_load()}")
    X, y, theta_true = make_data(N)
    print(f"logistic regression: N = {N:,}, d = {D}, batch n = {batch:,} ({batch / N:.0%}, with "
          f"replacement), ε = {STEP_SIZE:g}, prior N(0, {PRIOR_SD:g}²), float32, θ₀ = 0")
    print(f"timing: iterations/s = (T_long − T_short)/(t_long − t_short), T_long = {T_long:,}, "
          f"T_short = {T_short:,}, fastest of {repeats} interleaved round(s) per (method, length).\n"
          f"  numpyro_sg: each MCMC.run timed whole (init + compile + sampling; the fixed part "
          f"cancels in the difference).\n  peers: compiled ahead of time, execution timed.\n")

    key = random.PRNGKey(args.seed)
    theta0 = jnp.zeros(D, jnp.float32)
    lengths = (T_short, T_long)

    runners, compile_s = {}, {}
    # numpyro_sg: one throw-away run pays the process-wide one-off costs first
    run_numpyro_sg(key, X, y, 10, batch, theta0)
    runners["numpyro_sg"] = {
        T: (lambda T=T: run_numpyro_sg(key, X, y, T, batch, theta0)[1]) for T in lengths
    }
    for name, _, make in methods[1:]:
        runners[name], c = {}, []
        for T in lengths:
            compiled, t = compile_jitted(make, key, theta0, X, y, T, batch)
            runners[name][T] = lambda f=compiled: jax.block_until_ready(f(key, theta0, X, y))
            c.append(t)
        compile_s[name] = sum(c) / len(c)
    print("compile (not timed): " + ", ".join(f"{k} {v:.1f}s" for k, v in compile_s.items()))

    times = {name: {T: [] for T in lengths} for name, _, _ in methods}
    draws = {}
    for r in range(repeats):
        order = lengths if r % 2 == 0 else lengths[::-1]
        for name, _, _ in methods:
            for T in order:
                t, out = timed(runners[name][T])
                times[name][T].append(t)
                if T == T_long:
                    draws[name] = np.asarray(out)
        print(f"round {r + 1}/{repeats}: " + ", ".join(
            f"{name} {rate_from(times[name][T_short][-1], times[name][T_long][-1], *lengths):,.0f}"
            for name, _, _ in methods) + " it/s")

    results = {}
    for name, label, _ in methods:
        ts, tl = min(times[name][T_short]), min(times[name][T_long])
        rate = rate_from(ts, tl, *lengths)
        per_round = [rate_from(a, b, *lengths) for a, b in zip(times[name][T_short],
                                                              times[name][T_long])]
        results[name] = dict(
            label=label, rate=rate, t_short=ts, t_long=tl, fixed_s=ts - T_short / rate,
            times_short=times[name][T_short], times_long=times[name][T_long],
            per_round_rates=per_round, compile_s=compile_s.get(name),
        )

    # ---- table
    ref = results["handwritten"]["rate"]
    print(f"\n{'method':<25}{'it/s':>9}{'× hand-written':>16}{'t_short (s)':>13}{'t_long (s)':>12}"
          f"{'fixed (s)':>11}{'per-round it/s':>20}")
    print("-" * 106)
    for res in results.values():
        pr = "/".join(f"{x:,.0f}" for x in res["per_round_rates"])
        print(f"{res['label']:<25}{res['rate']:>9,.0f}{res['rate'] / ref:>16.2f}"
              f"{res['t_short']:>13.2f}{res['t_long']:>12.2f}{res['fixed_s']:>11.2f}{pr:>20}")
    print("(fixed = t_short − T_short/rate: for numpyro_sg the per-run init + compile cost; ≈ 0 "
          "for the pre-compiled peers)")
    ours = results["numpyro_sg"]["rate"]
    ratios = {
        "numpyro_sg/handwritten": ours / ref,
        "numpyro_sg/blackjax": ours / results["blackjax"]["rate"],
        "numpyro_sg/sgmcmcjax": ours / results["sgmcmcjax"]["rate"],
    }
    targets = {"numpyro_sg/handwritten": 0.8, "numpyro_sg/blackjax": 1.0,
               "numpyro_sg/sgmcmcjax": 1.0}
    print()
    if "handwritten_onepass" in results:
        v = ours / results["handwritten_onepass"]["rate"]
        print(f"  {'numpyro_sg/handwritten_onepass':<31} = {v:5.2f}   (informational)")
    for k, v in ratios.items():
        if np.isnan(v):
            verdict = "n/a: timing noise swamped the difference, use more --iterations"
        else:
            verdict = "met" if v >= targets[k] else "NOT met"
        print(f"  {k:<31} = {v:5.2f}   (target ≥ {targets[k]:.1f}: {verdict})")

    # ---- sanity: the four chains run the same algorithm on the same posterior
    half = T_long // 2
    means = {k: d[half:].mean(0) for k, d in draws.items()}
    sds = {k: d[half:].std(0) for k, d in draws.items()}
    M = np.stack(list(means.values()))
    max_diff = float(np.max(M.max(0) - M.min(0)))
    mean_sd = float(np.mean(np.stack(list(sds.values()))))
    print(f"\nsanity: posterior means over the last {T_long - half:,} draws of each chain agree to "
          f"max |Δ| = {max_diff:.1e} across the {len(draws)} (chain sd ≈ {mean_sd:.1e}; "
          f"max |mean − θ_true| = {float(np.max(np.abs(M - theta_true))):.1e})")
    for k, m in means.items():
        print(f"  {k:<20} mean[:4] = {np.array2string(m[:4], precision=4)}   "
              f"sd[:4] = {np.array2string(sds[k][:4], precision=4)}")
    total = time.perf_counter() - t_start
    print(f"\ntotal wall time {total:.0f} s; load average {_load()}")

    if args.json:
        payload = dict(
            config=dict(N=N, d=D, batch=batch, step_size=STEP_SIZE, prior_sd=PRIOR_SD,
                        T_long=T_long, T_short=T_short, repeats=repeats, seed=args.seed,
                        quick=args.quick, dtype="float32",
                        peer_step_size=dict(blackjax=STEP_SIZE / 2, sgmcmcjax=STEP_SIZE / 2),
                        timing=("difference of two run lengths, fastest of the rounds per "
                                "(method, length); numpyro_sg: whole MCMC.run (init + compile "
                                "included, cancels); peers: AOT-compiled, execution only")),
            load_average_end=_load(),
            platform=dict(jax=jax.__version__, numpyro=numpyro.__version__,
                          numpyro_sg=nsg.__version__, backend=jax.default_backend(),
                          cpu_count=os.cpu_count(), machine=platform.machine(),
                          python=platform.python_version()),
            results={k: v | dict(posterior_mean=means[k].tolist()) for k, v in results.items()},
            ratios=ratios,
            targets=targets,
            sanity=dict(max_abs_mean_diff=max_diff, mean_chain_sd=mean_sd),
            total_wall_s=total,
        )
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {args.json}")
    return results, ratios


if __name__ == "__main__":
    main()
