"""BPMF benchmark: every gradient kernel with its defaults on a simulated ratings matrix.

Two parts, each printing JSON lines:

``--part speed`` — iterations/s of each kernel's step at d = 50,040, n = 1,000, against a
hand-written ``lax.scan`` SGLD of the same model (one plain mini-batch gradient and one
Gaussian draw per step: the arithmetic floor).  Everything is compiled first, then the loops
are timed in interleaved rounds and the best round is kept, so that the *ratio* to the
hand-written loop is robust to other processes on the machine (the load average is printed).
``mcmc_it_s`` is the rate inside ``numpyro.infer.MCMC.run`` (which also stores the d-vector of
every draw), from the faster of two identical runs of 1,000 draws.

``--part accuracy`` (default) — one kernel's full run (1,000 warmup + 2,000 sampling
iterations): test RMSE of the posterior-mean prediction against the oracle limit
σ·√(1 + k/n̄_user + k/n̄_item) (:func:`numpyro_sg.datasets.ratings.oracle_rmse`), warmup and
sampling seconds, divergence.  Peak memory: run under ``/usr/bin/time -v``::

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
from jax.flatten_util import ravel_pytree
from numpyro.infer import MCMC
from numpyro.infer.util import potential_energy

import numpyro_sg as nsg
from numpyro_sg import datasets as ds
from numpyro_sg.infer.handlers import with_indices

KERNELS = ("SGLD", "SGBD", "SGHMC", "SGNHT", "PSGLD", "BAOAB")


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


def speed(data, model, args, steps=300, rounds=3, mcmc_samples=(1000,)):
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
    """it/s inside ``MCMC.run`` for ``lengths[0]`` draws: the same run twice, the faster kept
    (NumPyro reuses the compiled loop the second time when it can); ``mcmc_first_s`` is the
    first run's seconds (compilation included)."""
    T, seconds = lengths[0], []
    mcmc = MCMC(kernel, num_warmup=0, num_samples=T, progress_bar=False)
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            mcmc.run(jax.random.PRNGKey(1), *args)
            jax.block_until_ready(mcmc.get_samples())
        seconds.append(time.perf_counter() - t0)
    return dict(mcmc_it_s=round(T / min(seconds), 1), mcmc_first_s=round(seconds[0], 1))


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
        noise_sd=data.noise_sd, stiffness=round(fit.stiffness, 2),
        diverged=bool(np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))),
        warnings=sorted({type(w.message).__name__ for w in caught}),
        load_average=os.getloadavg()[0],
    )), flush=True)


def main():
    """Parse the options and run the chosen part."""
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", nargs="?", default="SGLD")
    ap.add_argument("--part", choices=("accuracy", "speed"), default="accuracy")
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
    else:
        accuracy(args, data, model)


if __name__ == "__main__":
    main()
