"""Models the warmup's mode search and the helpers must handle without failing silently:
an improper prior (``dist.ImproperUniform``, which has no prior draw) and a multimodal,
label-switching posterior (a Gaussian mixture)."""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.infer import MCMC

import numpyro_sg as nsg


def improper_location_model(y=None, N=2000):
    """Three ordered locations with a flat (improper) prior on the ordered cone."""
    mu = numpyro.sample("mu", dist.ImproperUniform(constraints.ordered_vector, (), (3,)))
    with numpyro.plate("data", N, subsample_size=200):
        yb = numpyro.subsample(y, event_dim=1)
        numpyro.sample("y", dist.Normal(mu, 1.0).to_event(1), obs=yb)


def test_every_helper_works_on_an_improper_prior():
    y = np.random.default_rng(0).normal(size=(2000, 3)) + np.array([-1.0, 0.0, 1.0])
    mcmc = MCMC(nsg.SGLD(improper_location_model), num_warmup=200, num_samples=500,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y)
    idata = nsg.to_inference_data(mcmc, check=False)
    mean = idata.posterior["mu"].mean(("chain", "draw")).values
    np.testing.assert_allclose(mean, y.mean(0), atol=0.1)  # posterior sd ≈ 0.022
    assert np.isfinite(nsg.ksd(mcmc))
    ref = nsg.nuts_reference(improper_location_model, y, num_warmup=100, num_samples=200,
                             progress_bar=False, ksd_draws=100)
    table = nsg.compare_to_reference(idata, ref)
    assert np.all(np.isfinite(table["mean"].values))
