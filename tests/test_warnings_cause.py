"""The end-of-run warning names the cause where it can, with remedies that work: a chain frozen
by a step size given in the wrong units, chains stuck in different modes."""

import warnings

import jax
import numpy as np
import pytest
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.datasets import simulate_logistic_regression

from conftest import logistic_model


def _warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, nsg.ConvergenceWarning)]


def test_a_papers_absolute_step_with_the_laplace_preconditioner_is_named():
    """SGLD(model, 1e-6) — a paper's absolute step — with the default Laplace preconditioner is a
    step of 10⁻⁶ posterior sds: the chains are frozen (measured: spread 0.02 sds).  The warning
    says the units are the cause and how to give an absolute step, and does not blame the
    posterior's shape (before, it said "the posterior is far from Gaussian")."""
    X, y, _ = simulate_logistic_regression(10_000, 5)
    mcmc = MCMC(nsg.SGLD(logistic_model, 1e-6), num_warmup=300, num_samples=500, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    warned = _warnings(lambda: nsg.check_convergence(mcmc))
    assert len(warned) == 1, warned
    assert "posterior sds" in warned[0] and "preconditioner=None, gradient='plain'" in warned[0], warned
    assert "barely move" in warned[0], warned
    assert "far from Gaussian" not in warned[0] and "multimodal" not in warned[0], warned


def test_chains_in_far_apart_modes_are_called_multimodal():
    """Two chains, each well mixed, around modes 10 sds apart: R̂ is huge and neither drifts; the
    warning says the chains disagree (possible multimodality), names the chain, and does not
    suggest a longer run or a larger step (they do not help)."""
    rng = np.random.default_rng(0)
    draws = np.stack([rng.normal(-5.0, 1.0, (1000, 2)), rng.normal(5.0, 1.0, (1000, 2))])
    draws[..., 1] = rng.normal(0.0, 1.0, (2, 1000))  # the second coordinate agrees
    warned = _warnings(lambda: nsg.check_convergence({"mu": draws}))
    assert len(warned) == 1, warned
    assert "chains disagree" in warned[0] and "multimodality" in warned[0], warned
    assert "'mu'" in warned[0] and "longer num_warmup" not in warned[0], warned


def test_a_chain_still_travelling_is_not_called_multimodal():
    """A chain drifting towards the others (first and last thirds far apart) gets the generic
    remedies, not the multimodality diagnosis."""
    rng = np.random.default_rng(1)
    still = rng.normal(0.0, 1.0, (1000, 1))
    travelling = np.linspace(40.0, 2.0, 1000)[:, None] + rng.normal(0.0, 1.0, (1000, 1))
    warned = _warnings(lambda: nsg.check_convergence({"mu": np.stack([still, travelling])}))
    assert len(warned) == 1 and "multimodality" not in warned[0], warned
    assert "still drifting" in warned[0] and "longer num_warmup" in warned[0], warned
