"""Models the warmup's mode search and the helpers must handle without failing silently:
an improper prior (``dist.ImproperUniform``, which has no prior draw) and a multimodal,
label-switching posterior (a Gaussian mixture)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.distributions import constraints, transforms
from numpyro.infer import MCMC, init_to_value

import numpyro_sg as nsg
from numpyro_sg.diagnostics.convergence import ConvergenceWarning
from numpyro_sg.infer.warmup import WarmupOptions


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


def mixture_model(y=None, N=10_000):
    """Three-component Gaussian mixture, Dirichlet weights, ordered means, as a user writes it."""
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(3)))
    mu = numpyro.sample("mu", dist.TransformedDistribution(dist.Normal(0.0, 10.0).expand([3]),
                                                           transforms.OrderedTransform()))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", N, subsample_size=500):
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.MixtureSameFamily(dist.Categorical(w), dist.Normal(mu, sigma)),
                       obs=yb)


def _mixture_data(N=10_000, seed=1):
    rng = np.random.default_rng(seed)
    z = rng.choice(3, N, p=[0.3, 0.5, 0.2])
    return np.array([2.0, 6.0, 10.0])[z] + rng.normal(size=N)


@pytest.mark.slow
def test_mode_search_finds_the_highest_mode_of_a_mixture_and_warns():
    """From the zero start alone Adam and Newton end in a local mode (means ≈ 3.2, 4.0, 7.9);
    the multi-start phase finds the components at 2, 6 and 10, and says that it saw lower modes."""
    y = _mixture_data()
    kernel = nsg.SGLD(mixture_model)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.warns(ConvergenceWarning, match="multimodal"):
        mcmc.run(jax.random.PRNGKey(0), y)
    fit = kernel.mode_fit
    mu = np.asarray(transforms.OrderedTransform()(kernel._unravel(fit.mode)["mu"]))
    np.testing.assert_allclose(mu, [2.0, 6.0, 10.0], atol=0.1)
    assert fit.local_modes().sum() >= 1


def test_progress_bar_option_defaults_to_quiet_off_a_terminal(capsys):
    assert WarmupOptions().show_progress() is False  # pytest captures stderr: not a terminal
    assert WarmupOptions(progress_bar=True).show_progress() is True


@pytest.mark.slow
def test_mixture_matches_nuts_with_sgld_defaults():
    y = _mixture_data()
    mcmc = MCMC(nsg.SGLD(mixture_model), num_warmup=1000, num_samples=2000, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y)
    idata = nsg.to_inference_data(mcmc, check=False)
    # NUTS from init_to_uniform ends in the local mode too: start it at the components
    start = init_to_value(values={"mu": np.array([2.0, 6.0, 10.0]), "sigma": 1.0,
                                  "w": np.array([0.3, 0.5, 0.2])})
    ref = nsg.nuts_reference(mixture_model, y, num_warmup=500, num_samples=1000,
                             progress_bar=False, ksd_draws=100, init_strategy=start)
    table = nsg.compare_to_reference(idata, ref, ksd=False)
    assert np.max(np.abs(table["mean_err"])) < 0.25, table
    assert table.attrs["xi_sd"] <= 0.1, table
