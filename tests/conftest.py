import os

# Two host devices so chain_method="parallel" really runs in parallel (must precede jax init).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
import pytest  # noqa: E402
from numpyro.infer import init_to_uniform  # noqa: E402

from numpyro_sg.infer.programs import clear_programs  # noqa: E402

# scripts run in subprocesses by tests/test_sharding.py (they read sys.argv and set their own
# devices): not test modules, and --doctest-modules must not import them
collect_ignore = ["multiprocess_checks.py", "sharded_checks.py"]


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every compiled program after each test module.  Each XLA CPU executable holds memory
    mappings of its own, and the suite compiles thousands in one process: kept to the end, they
    reached the kernel's limit (vm.max_map_count, 65,530) and XLA's compiler crashed."""
    yield
    clear_programs()
    jax.clear_caches()

# The papers' kernels: absolute step sizes (no preconditioner), plain mini-batch gradients and
# NumPyro's random start — what the tests of the papers' algorithms run.
CLASSIC = dict(preconditioner=None, gradient="plain", init_strategy=init_to_uniform)


def logistic_model(X, y=None, subsample_size=50):
    N, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=subsample_size):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ theta), obs=yb)


def linear_model(X, y=None, subsample_size=100, prior_sd=2.0, noise_sd=1.0):
    """Gaussian linear regression with known noise sd: the posterior is Gaussian, in closed form."""
    N, d = X.shape
    theta = numpyro.sample("theta", dist.Normal(0.0, prior_sd).expand([d]).to_event(1))
    with numpyro.plate("data", N, subsample_size=subsample_size):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(Xb @ theta, noise_sd), obs=yb)


def linear_posterior(X, y, prior_sd=2.0, noise_sd=1.0):
    """Exact posterior mean and covariance of ``linear_model``."""
    X = np.asarray(X, np.float64)
    prec = X.T @ X / noise_sd**2 + np.eye(X.shape[1]) / prior_sd**2
    cov = np.linalg.inv(prec)
    mean = cov @ X.T @ np.asarray(y, np.float64) / noise_sd**2
    return mean, cov


@pytest.fixture(scope="session")
def logistic_data():
    rng = np.random.default_rng(1)
    N, d = 500, 3
    X = rng.normal(size=(N, d)).astype(np.float32)
    theta = np.array([1.0, -0.5, 0.25])
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ theta))).astype(np.float32)
    return X, y


@pytest.fixture(scope="session")
def linear_data():
    rng = np.random.default_rng(2)
    N, d = 1000, 3
    X = rng.normal(size=(N, d)).astype(np.float32)
    theta = np.array([0.5, -1.0, 2.0])
    y = (X @ theta + rng.normal(size=N)).astype(np.float32)
    return X, y


#: the longest statistical tests of the default suite (10–45 s each on CI's 2 cores): marked
#: ``heavy``, so that .ci/test_stacks.sh runs them on the pinned stack only (-m "not heavy" on
#: the current stack).  A test id without brackets marks every parametrisation of it; one
#: with brackets, that parametrisation.
HEAVY = (
    "tests/test_conjugate.py::test_recovers_gaussian_posterior",
    "tests/test_cyclical.py::test_recovers_the_gaussian_posterior",
    "tests/test_esgld.py::test_defaults_match_nuts_given_the_selected_model_on_breast_cancer",
    "tests/test_highdim.py::test_bpmf_small_sgld_reaches_information_bound",
    "tests/test_highdim.py::test_sparse_ratings_minibatch_stiffness_keeps_the_defaults_stable",
    "tests/test_ksd_var_names.py::test_diagnostics_of_chosen_sites_at_fifty_thousand_parameters",
    # the current stack keeps the local-latent state, draws and netCDF round trip
    "tests/test_local_latents.py::test_the_control_variate_anchor_is_computed_with_many_draws",
    "tests/test_local_latents.py::test_compare_to_reference_puts_both_ksds_on_the_globals_marginal",
    "tests/test_local_latents.py::test_a_kernel_accepts_the_users_marginalize_locals",
    "tests/test_mode_search.py::test_starts_stopped_on_a_slope_are_not_called_local_modes",
    # the two longest pages (the current stack runs the others)
    "tests/test_docs_snippets.py::test_page_code_runs[docs/local_latents.md]",
    "tests/test_docs_snippets.py::test_page_code_runs[docs/big_data.md]",
    "numpyro_sg/datasets/bpmf.py::numpyro_sg.datasets.bpmf.hierarchical_bpmf_model",
    "tests/test_readme.py::test_readme_use_snippet_converges_against_nuts",
    # the communication pattern on 4 forced host devices (the current stack keeps the API checks:
    # the clear errors, a two-axis mesh, a mesh of one device)
    "tests/test_sharding.py::test_stratified_estimator_is_unbiased_and_no_noisier_than_simple_random_sampling",
    "tests/test_sharding.py::test_the_diagonal_warmup_runs_shard_locally",
    "tests/test_sharding.py::test_esgld_runs_shard_locally_with_the_same_sums",
    "tests/test_sharding.py::test_sparse_async_runs_shard_locally_with_the_same_sums",
    "tests/test_sparse_async.py::test_async_relative_error_close_to_exact",
    "tests/test_sparse_async.py::test_default_async_update_gives_the_posterior_inclusion",
    "tests/test_sparse_async.py::test_exact_matches_enumeration_gaussian_draw",
    "tests/test_sparse_async.py::test_sgld_variant_fast_and_dense_agree_and_chain_methods",
    "tests/test_tuning.py::test_best_params_reproduce_the_tuned_accuracy_under_mcmc",
    "tests/test_tuning.py::test_mamba_finds_planted_arm_within_budget",
    "tests/test_tuning.py::test_tuning_example_runs",
    "tests/test_warmup.py::test_defaults_match_nuts",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in HEAVY or item.nodeid.split("[")[0] in HEAVY:
            item.add_marker(pytest.mark.heavy)
