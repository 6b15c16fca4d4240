"""Throughput of numpyro_sg's SGHMC and SGNHT against BlackJAX's sghmc and sgnht.

The problem, data, log densities and timing method are those of ``bench_sgld.py`` (imported
from it): Bayesian logistic regression, d = 10, N = 1,000,000 (float32), mini-batches of
n = 10,000 drawn with replacement, prior N(0, 10²), one chain from θ = 0, every draw stored;
iterations per second = (T_long − T_short)/(t_long − t_short), the fastest of ``--repeats``
interleaved rounds per (method, length).

Parameters, matched through :func:`numpyro_sg.kernels.momentum.blackjax_parameters`: our
ε = 1e-6 (η = ε/2 = 5e-7) and friction α = a = 0.1 are BlackJAX's ``step_size`` h = √(ε/2)
and ``alpha`` = α/h, ``beta`` = 0.

* numpyro_sg: ``nsg.SGHMC`` / ``nsg.SGNHT`` with ``preconditioner=None, gradient="plain"``
  under ``numpyro.infer.MCMC`` (``jit_model_args=True``); each ``MCMC.run`` timed whole.
* BlackJAX, one gradient per iteration on a fresh mini-batch, in a jitted ``lax.scan``
  (AOT-compiled, execution timed):

  - ``blackjax sghmc diffusion``: ``blackjax.sgmcmc.diffusions.sghmc`` stepped once per
    iteration (the same algorithm as ours up to the order of position and momentum updates);
  - ``blackjax sghmc (L=10)``: the public ``blackjax.sghmc(grad_estimator,
    num_integration_steps=10)``, whose ``step`` resamples the momentum and takes 10 steps on
    one mini-batch; counted as 10 iterations per call (so it draws 10× fewer mini-batches);
  - ``blackjax sgnht``: the public ``blackjax.sgnht(grad_estimator, alpha)``, one step per call.

Usage::

    python benchmarks/bench_momentum.py               # 5,000 vs 20,000 iterations, 2 rounds
    python benchmarks/bench_momentum.py --quick       # smoke run: N = 100,000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax import lax, random
from numpyro.infer import MCMC

import numpyro_sg as nsg
from bench_sgld import (
    D,
    PRIOR_SD,
    _load,
    compile_jitted,
    log_lik_one,
    log_prior,
    make_data,
    make_model,
    rate_from,
    timed,
)
from numpyro_sg.kernels.momentum import blackjax_parameters

STEP_SIZE = 1e-6  # ε in numpyro_sg's convention (as bench_sgld.py)
FRICTION = 0.1  # α (SGHMC) and a (SGNHT)
LEAPFROG = 10  # BlackJAX sghmc's num_integration_steps (its default)


def run_ours(kernel_cls, key, X, y, T, batch, theta0):
    """One ``MCMC.run`` of our kernel (papers' settings), timed end to end."""
    kernel = kernel_cls(make_model(batch), STEP_SIZE, friction=FRICTION, preconditioner=None,
                        gradient="plain")
    mcmc = MCMC(kernel, num_warmup=0, num_samples=T, progress_bar=False, jit_model_args=True)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # a chain from θ = 0 is not meant to converge here
        warnings.simplefilter("ignore", nsg.ConvergenceWarning)
        mcmc.run(key, X, y, init_params={"theta": theta0})
    draws = jax.block_until_ready(mcmc.get_samples()["theta"])
    return time.perf_counter() - t0, draws


def _grad_estimator(N):
    from blackjax.sgmcmc.gradients import grad_estimator

    def loglik(theta, datum):  # one datum; grad_estimator vmaps it and scales by N/n
        x, yy = datum
        return log_lik_one(theta, x, yy)

    return grad_estimator(log_prior, loglik, N)


def make_blackjax_diffusion(T, batch):
    """``blackjax.sgmcmc.diffusions.sghmc``, one step per iteration on a fresh mini-batch."""
    from blackjax.sgmcmc.diffusions import sghmc

    p = blackjax_parameters(STEP_SIZE, FRICTION)

    def run(key, theta0, X, y):
        N = X.shape[0]
        grad_fn, one_step = _grad_estimator(N), sghmc(p["alpha"], p["beta"])

        def step(carry, _):
            theta, mom, key = carry
            key, k_idx, k_step = random.split(key, 3)
            idx = random.randint(k_idx, (batch,), 0, N)
            g = grad_fn(theta, (X[idx], y[idx]))
            theta, mom = one_step(k_step, theta, mom, g, p["step_size"])
            return (theta, mom, key), theta

        _, draws = lax.scan(step, (theta0, jnp.zeros_like(theta0), key), None, length=T)
        return draws

    return run


def make_blackjax_sghmc(T, batch):
    """The public ``blackjax.sghmc`` (momentum resampled per call, LEAPFROG steps per call)."""
    import blackjax

    p = blackjax_parameters(STEP_SIZE, FRICTION)
    calls = T // LEAPFROG

    def run(key, theta0, X, y):
        N = X.shape[0]
        sghmc = blackjax.sghmc(_grad_estimator(N), num_integration_steps=LEAPFROG,
                               alpha=p["alpha"], beta=p["beta"])

        def step(carry, _):
            theta, key = carry
            key, k_idx, k_step = random.split(key, 3)
            idx = random.randint(k_idx, (batch,), 0, N)
            theta = sghmc.step(k_step, theta, (X[idx], y[idx]), p["step_size"])
            return (theta, key), theta

        _, draws = lax.scan(step, (sghmc.init(theta0), key), None, length=calls)
        return draws

    return run


def make_blackjax_sgnht(T, batch):
    """The public ``blackjax.sgnht``, one step per call."""
    import blackjax

    p = blackjax_parameters(STEP_SIZE, FRICTION)

    def run(key, theta0, X, y):
        N = X.shape[0]
        sgnht = blackjax.sgnht(_grad_estimator(N), alpha=p["alpha"], beta=p["beta"])
        key, k_init = random.split(key)

        def step(carry, _):
            state, key = carry
            key, k_idx, k_step = random.split(key, 3)
            idx = random.randint(k_idx, (batch,), 0, N)
            state = sgnht.step(k_step, state, (X[idx], y[idx]), p["step_size"])
            return (state, key), state.position

        _, draws = lax.scan(step, (sgnht.init(theta0, k_init), key), None, length=T)
        return draws

    return run


#: (name, label, our kernel class or the builder of a jitted BlackJAX loop)
METHODS = [
    ("sghmc", "numpyro_sg SGHMC (MCMC)", nsg.SGHMC),
    ("bj_sghmc_diffusion", "blackjax sghmc diffusion", make_blackjax_diffusion),
    ("bj_sghmc", f"blackjax sghmc (L={LEAPFROG})", make_blackjax_sghmc),
    ("sgnht", "numpyro_sg SGNHT (MCMC)", nsg.SGNHT),
    ("bj_sgnht", "blackjax sgnht", make_blackjax_sgnht),
]
RATIOS = {
    "SGHMC / blackjax sghmc diffusion": ("sghmc", "bj_sghmc_diffusion"),
    f"SGHMC / blackjax sghmc (L={LEAPFROG})": ("sghmc", "bj_sghmc"),
    "SGNHT / blackjax sgnht": ("sgnht", "bj_sgnht"),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=None,
                    help="long run length T_long (default 20,000; --quick: 10,000)")
    ap.add_argument("--short", type=int, default=None, help="T_short (default T_long // 4)")
    ap.add_argument("--repeats", type=int, default=2, help="timing rounds (default 2)")
    ap.add_argument("--quick", action="store_true", help="smoke run: N = 100,000, one round")
    ap.add_argument("--n-data", type=int, default=None, help="N (default 1,000,000)")
    ap.add_argument("--json", metavar="PATH", default=None, help="write the results as JSON")
    ap.add_argument("--seed", type=int, default=0, help="PRNG seed of the chains")
    args = ap.parse_args(argv)

    N = args.n_data or (100_000 if args.quick else 1_000_000)
    batch = max(1, N // 100)
    T_long = args.iterations or (10_000 if args.quick else 20_000)
    T_short = args.short or max(LEAPFROG, T_long // 4)
    repeats = 1 if args.quick else args.repeats
    if not 0 < T_short < T_long or T_short % LEAPFROG or T_long % LEAPFROG:
        ap.error(f"need 0 < short < iterations, both multiples of {LEAPFROG}")
    lengths = (T_short, T_long)
    t_start = time.perf_counter()
    print(f"jax {jax.__version__} ({jax.default_backend()}, {os.cpu_count()} CPU cores, "
          f"{platform.machine()}), numpyro {numpyro.__version__}, numpyro_sg {nsg.__version__}; "
          f"load average {_load()}")
    X, y, _ = make_data(N)
    p = blackjax_parameters(STEP_SIZE, FRICTION)
    print(f"logistic regression: N = {N:,}, d = {D}, batch n = {batch:,}, prior N(0, {PRIOR_SD:g}²), "
          f"float32, θ₀ = 0; ε = {STEP_SIZE:g} (η = {STEP_SIZE / 2:g}), friction {FRICTION} "
          f"= BlackJAX step_size {p['step_size']:.3e}, alpha {p['alpha']:.1f}")
    print(f"timing: (T_long − T_short)/(t_long − t_short), T = {T_short:,} / {T_long:,}, fastest "
          f"of {repeats} interleaved round(s)\n")

    key = random.PRNGKey(args.seed)
    theta0 = jnp.zeros(D, jnp.float32)
    runners, compile_s = {}, {}
    for name, _, make in METHODS:
        if isinstance(make, type):  # ours: one throw-away run pays the one-off costs
            run_ours(make, key, X, y, 10, batch, theta0)
            runners[name] = {T: (lambda T=T, k=make: run_ours(k, key, X, y, T, batch, theta0)[1])
                             for T in lengths}
        else:
            runners[name], c = {}, []
            for T in lengths:
                compiled, t = compile_jitted(make, key, theta0, X, y, T, batch)
                runners[name][T] = lambda f=compiled: jax.block_until_ready(f(key, theta0, X, y))
                c.append(t)
            compile_s[name] = sum(c) / len(c)
    print("compile (not timed): " + ", ".join(f"{k} {v:.1f}s" for k, v in compile_s.items()))

    times = {name: {T: [] for T in lengths} for name, *_ in METHODS}
    draws = {}
    for r in range(repeats):
        order = lengths if r % 2 == 0 else lengths[::-1]
        for name, *_ in METHODS:
            for T in order:
                t, out = timed(runners[name][T])
                times[name][T].append(t)
                if T == T_long:
                    draws[name] = np.asarray(out)
        print(f"round {r + 1}/{repeats}: " + ", ".join(
            f"{name} {rate_from(times[name][T_short][-1], times[name][T_long][-1], *lengths):,.0f}"
            for name, *_ in METHODS) + " it/s")

    results = {}
    for name, label, *_ in METHODS:
        ts, tl = min(times[name][T_short]), min(times[name][T_long])
        rate = rate_from(ts, tl, *lengths)
        results[name] = dict(label=label, rate=rate, t_short=ts, t_long=tl,
                             per_round_rates=[rate_from(a, b, *lengths) for a, b in
                                              zip(times[name][T_short], times[name][T_long])],
                             compile_s=compile_s.get(name))

    print(f"\n{'method':<28}{'it/s':>10}{'t_short (s)':>13}{'t_long (s)':>12}{'per-round it/s':>22}")
    print("-" * 85)
    for res in results.values():
        pr = "/".join(f"{x:,.0f}" for x in res["per_round_rates"])
        print(f"{res['label']:<28}{res['rate']:>10,.0f}{res['t_short']:>13.2f}{res['t_long']:>12.2f}"
              f"{pr:>22}")
    ratios = {k: results[a]["rate"] / results[b]["rate"] for k, (a, b) in RATIOS.items()}
    print()
    for k, v in ratios.items():
        verdict = "n/a (timing noise)" if np.isnan(v) else ("met" if v >= 1.0 else "NOT met")
        print(f"  {k:<40} = {v:5.2f}   (target ≥ 1.0: {verdict})")

    half = (T_long // LEAPFROG) // 2  # the L=10 run stores one draw per call
    print("\nsanity (second half of each long run): mean[:4], sd[:4]")
    for name, d in draws.items():
        tail = d[half:] if name == "bj_sghmc" else d[T_long // 2:]
        print(f"  {name:<22} {np.array2string(tail.mean(0)[:4], precision=4)}   "
              f"{np.array2string(tail.std(0)[:4], precision=4)}")
    total = time.perf_counter() - t_start
    print(f"\ntotal wall time {total:.0f} s; load average {_load()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(config=dict(N=N, d=D, batch=batch, step_size=STEP_SIZE,
                                       friction=FRICTION, blackjax=p, T_long=T_long,
                                       T_short=T_short, repeats=repeats),
                           results=results, ratios=ratios, total_wall_s=total), f, indent=2)
        print(f"wrote {args.json}")
    return results, ratios


if __name__ == "__main__":
    main()
