"""Does the advice "full-data NUTS would be faster" hold?  The estimate against NUTS measured.

    python benchmarks/bench_nuts_estimate.py                       # the four problems below
    python benchmarks/bench_nuts_estimate.py --problems groups1000

Per problem, in one process: ``nsg.SGLD`` with its defaults (2 vectorised chains, 1,000 + 2,000
iterations, timed from ``MCMC.run`` to its last draw), then ``nsg.to_inference_data`` (its
estimate of NUTS's time to the run's smallest bulk ESS, ``posterior.attrs
["nuts_estimated_seconds"]``, and whether it issued a ``PreferNUTSWarning``), then NumPyro's NUTS
on the full data (the decentred joint model for local latents) measured to that ESS: a pilot of
500 + 1,000 iterations gives its ESS per draw, a second run of 500 warmup iterations and as many
draws as that ESS needs is timed (compilation included).  The estimate is meant to be pessimistic
for NUTS: ``estimate / NUTS`` ≥ 1 where the advice is given.

Problems: ``groups1000`` (1,000 groups of 5 Bernoulli rows with a random intercept,
``bench_locals_scale.py``'s model), ``clinics60`` (60 clinics of 40 Poisson counts with a random
intercept), ``logistic:2e4``, ``poisson:1e5``, ``logistic:2e5``
(``bench_vs_nuts.py``'s regressions and data).
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

import numpyro_sg as nsg
from numpyro_sg.diagnostics.convergence import convergence_table
from numpyro_sg.results.nuts_estimate import NUTS_WARMUP, nuts_model
from numpyro_sg.locals import marginalize_locals

import bench_locals_scale
import bench_vs_nuts

PROBLEMS = ("groups1000", "clinics60", "logistic:2e4", "poisson:1e5", "logistic:2e5")


def clinics_model(x, y=None):
    """Poisson counts of 40 visits per clinic with a Normal random intercept per clinic."""
    a = numpyro.sample("a", dist.Normal(0.0, 3.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("clinics", x.shape[0], subsample_size=20):
        u = numpyro.sample("u", dist.Normal(0.0, s))
        xx = numpyro.subsample(x, event_dim=1)
        yy = numpyro.subsample(y, event_dim=1) if y is not None else None
        numpyro.sample("y", dist.Poisson(jnp.exp(a + b * xx + u[:, None])).to_event(1), obs=yy)


def simulate_clinics(G: int, R: int = 40, seed: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(G, R)).astype(np.float32)
    return x, rng.poisson(np.exp(0.5 + 0.3 * x + 0.4 * rng.normal(size=(G, 1)))).astype(np.float32)


def problem(name: str):
    """``(model the kernel runs, data)``."""
    if name.startswith("clinics"):
        return marginalize_locals(clinics_model), simulate_clinics(int(name[7:]))
    if name.startswith("groups"):
        return marginalize_locals(bench_locals_scale.logistic_model), bench_locals_scale.simulate_logistic(int(name[6:]))
    kind, size = name.split(":")
    return bench_vs_nuts.MODELS[kind], bench_vs_nuts.simulate(kind, int(float(size)))


def _min_ess(samples, sites) -> float:
    return float(convergence_table({k: np.asarray(v) for k, v in samples.items() if k in sites})["ess_bulk"].min())


def _nuts(full, data, num_samples, seed):
    mcmc = MCMC(NUTS(full), num_warmup=NUTS_WARMUP, num_samples=num_samples, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), *data)
    samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    return samples, time.perf_counter() - start


def run(name: str) -> dict:
    model, data = problem(name)
    mcmc = MCMC(nsg.SGLD(model), num_warmup=1000, num_samples=2000, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(jax.random.PRNGKey(1), *data)
        samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    seconds = time.perf_counter() - start
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = nsg.to_inference_data(mcmc, ksd=False, sampling_time=seconds)
    advised = any(w.category is nsg.PreferNUTSWarning for w in caught)
    ess = _min_ess(samples, set(samples))
    full, _ = nuts_model(model, data, {})
    pilot, _ = _nuts(full, data, 1000, 2)
    per_draw = _min_ess(pilot, set(samples)) / 1000
    draws = int(np.ceil(ess / per_draw))
    nuts, nuts_seconds = _nuts(full, data, draws, 3)
    row = dict(problem=name, sgld_s=seconds, ess=ess, estimate_s=idata.posterior.attrs.get("nuts_estimated_seconds"),
               advised=advised, nuts_s=nuts_seconds, nuts_draws=draws, nuts_ess=_min_ess(nuts, set(samples)))
    est = row["estimate_s"]
    print(f"{name}: SGLD {seconds:.1f} s, min ESS {ess:.0f}; NUTS estimate "
          f"{'-' if est is None else f'{est:.1f} s'}{' (PreferNUTSWarning)' if advised else ''}; NUTS measured "
          f"{NUTS_WARMUP} + {draws} draws: {nuts_seconds:.1f} s, min ESS {row['nuts_ess']:.0f}"
          + ("" if est is None else f"; estimate / NUTS {est / nuts_seconds:.2f}"), flush=True)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    args = parser.parse_args(argv)
    return [run(name) for name in args.problems.split(",")]


if __name__ == "__main__":
    main()
