"""BPMF benchmark: every gradient kernel with its defaults on a simulated ratings matrix.

Four parts, each printing JSON lines:

``--part speed`` — iterations/s of each kernel's step at d = 50,040, n = 1,000, against a
hand-written ``lax.scan`` SGLD of the same model (one plain mini-batch gradient and one
Gaussian draw per step: the arithmetic floor).  Everything is compiled first, then the loops
are timed in interleaved rounds and the best round is kept, so that the *ratio* to the
hand-written loop is robust to other processes on the machine (the load average is printed).
``mcmc_it_s`` is the marginal rate inside ``numpyro.infer.MCMC.run`` (which also stores the
d-vector of every draw), from runs of 1,000 and 4,000 draws, and ``mcmc_fixed_s`` the per-run
cost besides the iterations (:func:`mcmc_rates`).

``--part gibbs`` — the exact posterior mean's test RMSE by Gibbs sampling
(:func:`gibbs_bpmf`): what a perfect sampler of the model reaches, 5% above the oracle limit;
``--part gibbs-check`` checks that Gibbs sampler against full-data NUTS on a small matrix.

``--part accuracy`` (default) — one kernel's full run (1,000 warmup + 2,000 sampling
iterations): test RMSE of the posterior-mean prediction against the oracle limit
σ·√(1 + k/n̄_user + k/n̄_item) (:func:`numpyro_sg.datasets.ratings.oracle_rmse`), warmup and
sampling seconds, divergence, and the running average's RMSE after 2,000, 5,000, … sampling
iterations (``--samples 100000 --thinning 50`` for the convergence table of the docs), and
what :func:`numpyro_sg.check_convergence` finds: the lowest bulk ESS, the largest drift and the
run length its warning asks for (bulk ESS 100, ESS growing in proportion to the draws).
Peak memory: run under ``/usr/bin/time -v``::

    python benchmarks/bench_bpmf.py --part speed
    for k in SGLD SGBD SGHMC SGNHT PSGLD BAOAB; do
      /usr/bin/time -v python benchmarks/bench_bpmf.py $k 2>&1 | grep -E '^\\{|Maximum resident'
    done
"""

import argparse
import json
import os
import time
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC
from numpyro.infer.util import potential_energy

import numpyro_sg as nsg
from numpyro_sg import datasets as ds
from numpyro_sg.infer.handlers import with_indices

KERNELS = ("SGLD", "SGBD", "SGHMC", "SGNHT", "PSGLD", "BAOAB")
#: sampling iterations at which the accuracy part reports the running average's RMSE
MARKS = (2_000, 5_000, 10_000, 25_000, 50_000, 100_000)


def hand_written_sgld(model, flat0, unravel, N, n, steps, step_size=1e-5):
    """A compiled ``(x, args, key) -> x`` running ``steps`` plain SGLD steps in a ``lax.scan``."""

    def run(x, args, key):
        def log_density(x, idx):
            return -potential_energy(with_indices(model, {"ratings": idx}), args, {}, unravel(x))

        grad = jax.grad(log_density)

        def body(carry, _):
            x, key = carry
            key, k_idx, k_noise = jax.random.split(key, 3)
            idx = jax.random.randint(k_idx, (n,), 0, N)
            noise = jax.random.normal(k_noise, x.shape, x.dtype)
            return (x + 0.5 * step_size * grad(x, idx) + np.sqrt(step_size) * noise, key), None

        return jax.lax.scan(body, (x, key), None, length=steps)[0][0]

    return run


def kernel_loop(kernel, steps):
    """``(state, args) -> state`` after ``steps`` iterations of the kernel's ``sample``."""

    def run(state, args):
        def body(s, _):
            return kernel.sample(s, args, {}), None

        return jax.lax.scan(body, state, None, length=steps)[0]

    return run


def speed(data, model, args, steps=300, rounds=3, mcmc_samples=(1000, 4000)):
    """Print it/s of every kernel's step against the hand-written loop (JSON lines)."""
    jargs = tuple(jnp.asarray(a) for a in args)
    fit, loops = None, {}
    for name in KERNELS:
        kernel = getattr(nsg, name)(model)
        if fit is not None:
            kernel.use_mode_fit(fit)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = kernel.init(jax.random.PRNGKey(0), 0, None, jargs, {})
        fit = kernel.mode_fit
        t0 = time.perf_counter()
        compiled = jax.jit(kernel_loop(kernel, steps)).lower(state, jargs).compile()
        loops[name] = (compiled, (state, jargs), time.perf_counter() - t0, kernel)
    flat0 = fit.mode
    hand = jax.jit(hand_written_sgld(model, flat0, kernel.unravel, data.num_train, 1000, steps))
    loops["hand-written SGLD"] = (hand.lower(flat0, jargs, jax.random.PRNGKey(0)).compile(),
                                  (flat0, jargs, jax.random.PRNGKey(0)), 0.0, None)
    best = {k: np.inf for k in loops}
    for _ in range(rounds):  # interleaved, so that a burst of load hits every loop alike
        for name, (fn, fargs, _, _) in loops.items():
            jax.block_until_ready(fn(*fargs))  # warm
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*fargs))
            best[name] = min(best[name], time.perf_counter() - t0)
    floor = steps / best["hand-written SGLD"]
    for name, (_, _, compile_s, kernel) in loops.items():
        row = dict(kernel=name, d=int(flat0.shape[0]), n=1000, it_s=round(steps / best[name], 1),
                   ratio_to_hand_written=round(steps / best[name] / floor, 2),
                   scan_compile_s=round(compile_s, 1), load_average=os.getloadavg()[0])
        if kernel is not None:
            row.update(mcmc_rates(kernel, args, mcmc_samples))
        print(json.dumps(row), flush=True)


def mcmc_rates(kernel, args, lengths):
    """Rates inside ``MCMC.run``: runs of ``lengths[0]`` and ``lengths[1]`` draws (each twice, the
    faster kept; NumPyro compiles its loop again on each run), split into a per-run fixed cost
    ``mcmc_fixed_s`` (init and compilation) and the marginal rate ``mcmc_it_s`` = extra draws ÷
    extra seconds: what a long run gets.  ``mcmc_short_it_s`` is the shorter run's overall rate."""
    seconds = []
    for T in lengths:
        mcmc = MCMC(kernel, num_warmup=0, num_samples=T, progress_bar=False)
        best = np.inf
        for _ in range(2):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                mcmc.run(jax.random.PRNGKey(1), *args)
                jax.block_until_ready(mcmc.get_samples())
            best = min(best, time.perf_counter() - t0)
        seconds.append(best)
    (T1, T2), (s1, s2) = lengths, seconds
    rate = (T2 - T1) / (s2 - s1)
    return dict(mcmc_it_s=round(rate, 1), mcmc_fixed_s=round(s1 - T1 / rate, 2),
                mcmc_short_it_s=round(T1 / s1, 1))


def accuracy(args_ns, data, model):
    """One kernel's full run: JSON line with RMSE against the oracle limit."""
    kernel = getattr(nsg, args_ns.kernel)(model, step_size=args_ns.step_size)
    mcmc = MCMC(kernel, num_warmup=args_ns.warmup, num_samples=args_ns.samples,
                thinning=args_ns.thinning, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        mcmc.warmup(jax.random.PRNGKey(0), *data.model_args())
        jax.block_until_ready(mcmc.last_state)
        t1 = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(1), *data.model_args())
        samples = mcmc.get_samples()
        jax.block_until_ready(samples)
        t2 = time.perf_counter()
    trace = ds.rmse_trace(samples, data, offset=0.0)
    table = nsg.check_convergence(mcmc, warn=False)   # the end-of-run check a user would run
    ess_min, draws = float(table["ess_bulk"].min()), args_ns.samples // args_ns.thinning
    mode = kernel.unravel(kernel.mode_fit.mode)
    pred = ds.bpmf_predict(mode["U"], mode["V"], data.test_users, data.test_items)
    oracle = ds.oracle_rmse(data)
    fit = kernel.mode_fit
    rmse = float(trace.rmse_average.iloc[-1])
    print(json.dumps(dict(
        kernel=args_ns.kernel, d=int(fit.mode.shape[0]), n_train=data.num_train,
        warmup_fit_s=round(fit.seconds, 1), warmup_total_s=round(t1 - t0, 1),
        sampling_s=round(t2 - t1, 1), rmse_mean=round(rmse, 4),
        rmse_mode=round(float(jnp.sqrt(jnp.mean((pred - data.test_ratings) ** 2))), 4),
        oracle_limit=round(oracle, 4), ratio_to_oracle=round(rmse / oracle, 3),
        rmse_at_iterations={t: round(float(trace.rmse_average.iloc[t // args_ns.thinning - 1]), 4)
                            for t in MARKS if t <= args_ns.samples},
        noise_sd=data.noise_sd, stiffness=round(fit.stiffness, 2),
        diverged=bool(np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))),
        warnings=sorted({type(w.message).__name__ for w in caught}),
        ess_bulk_min=round(ess_min, 1), drift_max=round(float(table["drift"].max()), 2),
        iterations_for_ess_100=round(draws * 100 / ess_min * args_ns.thinning) if ess_min > 0 else None,
        load_average=os.getloadavg()[0],
    )), flush=True)


def gibbs_bpmf(data, rank, noise_precision, sweeps, burn, seed=0, a0=1.0, b0=5.0, mu0=0.0):
    """Posterior-mean test RMSE of :func:`~numpyro_sg.datasets.ratings.bpmf_model` (offset 0)
    by Gibbs sampling, the exact sampler of Salakhutdinov & Mnih (2008) for this model: each
    sweep draws every row of U given V and the hyperparameters (k × k Gaussian conditionals,
    precision diag(Λ_U) + α·Σ_i V_iV_iᵀ over the user's ratings), then Λ_U | U, μ_U (Gamma) and
    μ_U | U, Λ_U (Normal), then the same for V.  Returns the running-average RMSE after each of
    the ``sweeps − burn`` kept sweeps, and the last draw's mean precisions."""
    u, i = jnp.asarray(data.users), jnp.asarray(data.items)
    r = jnp.asarray(data.ratings, jnp.float32)
    tu, ti = jnp.asarray(data.test_users), jnp.asarray(data.test_items)
    truth = jnp.asarray(data.test_ratings)
    alpha = float(noise_precision)

    def rows(key, own, other_rows, other, prec, mu, size):
        gram = jax.ops.segment_sum(other[other_rows][:, :, None] * other[other_rows][:, None, :],
                                   own, size)
        rhs = jax.ops.segment_sum(r[:, None] * other[other_rows], own, size)
        P = jnp.diag(prec)[None] + alpha * gram

        def draw(args):  # N(P⁻¹b, P⁻¹) by one Cholesky factor
            P, b, z = args
            L = jnp.linalg.cholesky(P)
            return (jax.scipy.linalg.cho_solve((L, True), b)
                    + jax.scipy.linalg.solve_triangular(L.T, z, lower=False))

        # lax.map in batches of 64 rows: jaxlib 0.10's batched CPU LAPACK deadlocks on large
        # batches (numpyro_sg.infer.lapack_guard)
        z = jax.random.normal(key, rhs.shape)
        return jax.lax.map(draw, (P, prec * mu + alpha * rhs, z), batch_size=64)

    def hyper(key, F, mu):
        M = F.shape[0]
        k1, k2 = jax.random.split(key)
        rate = b0 + 0.5 * (jnp.sum((F - mu) ** 2, axis=0) + (mu - mu0) ** 2)
        prec = jax.random.gamma(k1, a0 + 0.5 * (M + 1), F.shape[1:]) / rate
        mu = (mu0 + F.sum(0)) / (M + 1) + jax.random.normal(k2, mu.shape) / jnp.sqrt((M + 1) * prec)
        return prec, mu

    @jax.jit
    def sweep(carry, key):
        U, V, pu, mu_u, pv, mu_v, total, t = carry
        keys = jax.random.split(key, 4)
        pu, mu_u = hyper(keys[0], U, mu_u)
        U = rows(keys[1], u, i, V, pu, mu_u, data.num_users)
        pv, mu_v = hyper(keys[2], V, mu_v)
        V = rows(keys[3], i, u, U, pv, mu_v, data.num_items)
        return (U, V, pu, mu_u, pv, mu_v, total, t), None

    key = jax.random.PRNGKey(seed)
    k1, k2, key = jax.random.split(key, 3)
    ones, zeros = jnp.ones(rank), jnp.zeros(rank)
    carry = (0.1 * jax.random.normal(k1, (data.num_users, rank)),
             0.1 * jax.random.normal(k2, (data.num_items, rank)), ones, zeros, ones, zeros,
             jnp.zeros_like(truth), 0.0)
    averages = []
    for s in range(sweeps):
        carry, _ = sweep(carry, jax.random.fold_in(key, s))
        if s >= burn:
            U, V, pu, mu_u, pv, mu_v, total, t = carry
            total, t = total + ds.bpmf_predict(U, V, tu, ti), t + 1
            carry = (U, V, pu, mu_u, pv, mu_v, total, t)
            averages.append(float(jnp.sqrt(jnp.mean((total / t - truth) ** 2))))
    return averages, np.asarray(carry[2]), np.asarray(carry[4])


def gibbs_check():
    """:func:`gibbs_bpmf` against full-data NUTS on a 40 × 60 rank-2 matrix (d = 208): the
    posterior-mean test RMSEs of both (JSON line)."""
    from numpyro.infer import NUTS

    from numpyro_sg.diagnostics.model_scores import full_data_model

    data = ds.simulate_ratings(40, 60, 2, 1500, noise_sd=0.5, seed=0)
    averages, _, _ = gibbs_bpmf(data, 2, 4.0, 4000, 1000)
    model = partial(ds.bpmf_model, **data.model_kwargs(rank=2, subsample_size=200,
                                                       noise_precision=4.0))
    mcmc = MCMC(NUTS(full_data_model(model, data.model_args())), num_warmup=1000,
                num_samples=3000, num_chains=2, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *data.model_args())
    nuts = ds.rmse_trace(mcmc.get_samples(), data, offset=0.0).rmse_average.iloc[-1]
    print(json.dumps(dict(check="Gibbs vs NUTS, 40 x 60 rank 2", gibbs=round(averages[-1], 5),
                          nuts=round(float(nuts), 5))), flush=True)


def main():
    """Parse the options and run the chosen part."""
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", nargs="?", default="SGLD")
    ap.add_argument("--part", choices=("accuracy", "speed", "gibbs", "gibbs-check"), default="accuracy")
    ap.add_argument("--sweeps", type=int, default=1000, help="gibbs: sweeps (a quarter burn-in)")
    ap.add_argument("--users", type=int, default=2000)
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--rank", type=int, default=10)
    ap.add_argument("--ratings", type=int, default=200_000)
    ap.add_argument("--noise-sd", type=float, default=0.5)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--thinning", type=int, default=1)
    ap.add_argument("--subsample", type=int, default=1000)
    ap.add_argument("--step-size", type=float, default=None, help="default: the kernel's")
    args = ap.parse_args()
    data = ds.simulate_ratings(args.users, args.items, args.rank, args.ratings, args.noise_sd)
    model = partial(ds.bpmf_model, **data.model_kwargs(
        rank=args.rank, subsample_size=args.subsample, noise_precision=1.0 / args.noise_sd**2))
    if args.part == "speed":
        speed(data, model, data.model_args())
    elif args.part == "gibbs-check":
        gibbs_check()
    elif args.part == "gibbs":
        t0 = time.perf_counter()
        averages, pu, pv = gibbs_bpmf(data, args.rank, 1.0 / args.noise_sd**2, args.sweeps,
                                      args.sweeps // 4)
        oracle = ds.oracle_rmse(data)
        print(json.dumps(dict(
            sampler="Gibbs", sweeps=args.sweeps, seconds=round(time.perf_counter() - t0, 1),
            rmse_mean=round(averages[-1], 4), oracle_limit=round(oracle, 4),
            ratio_to_oracle=round(averages[-1] / oracle, 3),
            rmse_after=[round(averages[int(f * len(averages)) - 1], 4) for f in (0.1, 0.25, 0.5, 1.0)],
            known_factors=ds.known_factors_rmse(data)["oracle"],
            prec_u=np.round(pu, 2).tolist(), prec_v=np.round(pv, 2).tolist())), flush=True)
    else:
        accuracy(args, data, model)


if __name__ == "__main__":
    main()
