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


#: the validation suite's statistical tests (``.ci/validate`` runs them with the ``slow`` ones;
#: the test command leaves both out): the longest statistical runs, the docs pages' code blocks
#: and the example scripts, 10–140 s each on CI's 2 cores.  A test id without brackets marks
#: every parametrisation of it; one with brackets, that parametrisation.
HEAVY = (
    "tests/test_conjugate.py::test_recovers_gaussian_posterior",
    "tests/test_cyclical.py::test_recovers_the_gaussian_posterior",
    "tests/test_esgld.py::test_defaults_match_nuts_given_the_selected_model_on_breast_cancer",
    "tests/test_highdim.py::test_bpmf_small_sgld_reaches_information_bound",
    "tests/test_highdim.py::test_sparse_ratings_minibatch_stiffness_keeps_the_defaults_stable",
    "tests/test_ksd_var_names.py::test_diagnostics_of_chosen_sites_at_fifty_thousand_parameters",
    "tests/test_ksd_var_names.py::test_a_run_of_chosen_sites_compares_with_a_full_reference",
    "tests/test_local_latents.py::test_the_control_variate_anchor_is_computed_with_many_draws",
    "tests/test_local_latents.py::test_compare_to_reference_puts_both_ksds_on_the_globals_marginal",
    "tests/test_local_latents.py::test_a_kernel_accepts_the_users_marginalize_locals",
    "tests/test_local_latents.py::test_local_draws_of_chosen_groups_follow_their_conditional_and_round_trip",
    "tests/test_local_latents.py::test_nuts_reference_runs_on_the_joint_model_and_refuses_an_unaffordable_one",
    "tests/test_local_latents.py::test_gaussian_locals_give_the_exact_marginal_gradient_float64",
    "tests/test_local_latents.py::test_algorithm_s1_imputation_fits_and_scores_the_log_marginal",
    "tests/test_local_latents.py::test_sampled_locals_give_the_exact_gradient_on_gaussian_locals[importance]",
    "tests/test_mode_search.py::test_starts_stopped_on_a_slope_are_not_called_local_modes",
    "tests/test_mode_search.py::test_starts_on_a_ridge_of_a_unimodal_mixed_model_are_not_called_local_modes",
    "tests/test_mode_search.py::test_variational_centre_sits_in_the_bulk_where_the_joint_mode_collapses",
    # the docs pages' code blocks (the docs build itself stays in the test command)
    "tests/test_docs_snippets.py::test_page_code_runs",
    "numpyro_sg/datasets/bpmf.py::numpyro_sg.datasets.bpmf.hierarchical_bpmf_model",
    "tests/test_readme.py::test_readme_use_snippet_converges_against_nuts",
    # the example scripts and the demo, end to end
    "tests/test_kernels.py::test_demo_runs",
    "tests/test_kernels.py::test_example_script_runs",
    "tests/test_reference.py::test_diagnostics_example_runs",
    "tests/test_tuning.py::test_tuning_example_runs",
    # chain methods agree: SGLD's case stays in the test command, the other kernels' run here
    "tests/test_kernels.py::test_chain_methods_agree[sgld-corrected]",
    "tests/test_kernels.py::test_chain_methods_agree[sgbd]",
    "tests/test_kernels.py::test_chain_methods_agree[sgbd-adaptive]",
    "tests/test_kernels.py::test_chain_methods_agree[sgnht]",
    "tests/test_kernels.py::test_chain_methods_agree[baoab]",
    # the communication pattern on 4 forced host devices (the test command keeps the API checks:
    # the clear errors and a two-axis mesh)
    "tests/test_sharding.py::test_stratified_estimator_is_unbiased_and_no_noisier_than_simple_random_sampling",
    "tests/test_sharding.py::test_the_diagonal_warmup_runs_shard_locally",
    "tests/test_sharding.py::test_esgld_runs_shard_locally_with_the_same_sums",
    "tests/test_sharding.py::test_sparse_async_runs_shard_locally_with_the_same_sums",
    "tests/test_sharding.py::test_the_recipe_runs_on_a_mesh_of_one_device",
    "tests/test_sparse_async.py::test_async_relative_error_close_to_exact",
    "tests/test_sparse_async.py::test_default_async_update_gives_the_posterior_inclusion",
    "tests/test_sparse_async.py::test_exact_matches_enumeration_gaussian_draw",
    "tests/test_sparse_async.py::test_sgld_variant_fast_and_dense_agree_and_chain_methods",
    "tests/test_sparse_async.py::test_sgld_and_mala_on_logistic",
    "tests/test_tuning.py::test_best_params_reproduce_the_tuned_accuracy_under_mcmc",
    "tests/test_tuning.py::test_mamba_finds_planted_arm_within_budget",
    "tests/test_tuning.py::test_one_round_warns_and_grid_search_takes_a_metric",
    "tests/test_tuning.py::test_mamba_tunes_esgld_with_its_defaults_for_any_factory_form",
    "tests/test_tuning.py::test_tuners_run_the_spike_and_slab_kernels",
    "tests/test_tuning.py::test_fssd_metric_and_unvectorised_arms",
    "tests/test_warmup.py::test_defaults_match_nuts",
    "tests/test_reference.py::test_a_reference_started_at_the_warmups_mode_finds_the_mixtures_components",
    # 7-12 s each on 2 cores, with a sibling in the test command that checks the same code path:
    # chain methods (SGLD's case), the group noise estimate (the other two cases), SparseAsync's
    # exactness (the one-update second-order case), an improper prior (SparseAsync's case, and
    # the structure functions), the marginal model (the locals' detection test); and the PPMF
    # model's smoke run (the high-dimensional runs above cover it)
    "tests/test_kernels.py::test_chain_methods_agree[psgld]",
    "tests/test_esgld.py::test_chain_methods_agree",
    "tests/test_bpmf_speed.py::test_group_noise_sd_equals_group_estimators[True-True]",
    "tests/test_sparse_async.py::test_exact_matches_enumeration_dense_mala",
    "tests/test_spike_slab.py::test_kernels_run_with_an_improper_prior_on_an_unselected_site[ESGLD]",
    "tests/test_mode_search.py::test_every_helper_works_on_an_improper_prior",
    "tests/test_local_latents.py::test_the_kernel_state_holds_the_globals_only",
    "tests/test_highdim.py::test_ppmf_model_runs",
    # 35-67 s on 2 cores: a whole warmup that hung on jaxlib 0.10; its siblings in the test command
    # check that each batched call stays below the pool's size (map_over_draws, map_in_batches)
    # and that the scores of such a model finish
    "tests/test_lapack_guard.py::test_the_warmup_of_a_model_with_batched_lapack_calls_finishes",
    # 23-44 s on 2 cores, with siblings here: the Newton steps on importance-sampled locals (the
    # Poisson random-intercept model against NUTS runs the same warmup) and the 32 starts on a
    # wide mixture (the mixture tests from any seed and against NUTS need them too)
    "tests/test_local_latents.py::test_newton_converges_on_importance_sampled_locals",
    "tests/test_mode_search.py::test_mode_search_finds_well_separated_mixture_components",
    # 14-23 s each on 2 cores (the test command measured 1,297 s on CI, over its 20 minutes), each
    # with a sibling in the test command on the same code path: vectorised chains after
    # MCMC.warmup (NumPyro's progress text aside, the case without it), the group noise estimate
    # (the case without control variates), SparseAsync's exact one-update step (the excluded
    # point and the generic path), a warned step size's remedy (the defaults' mini-batch choice
    # under the same noise plan) and a pure step in a user's scan (ESGLD's case)
    "tests/test_kernels.py::test_vectorised_chains_show_their_text_and_run_after_mcmc_warmup[True]",
    "tests/test_bpmf_speed.py::test_group_noise_sd_equals_group_estimators[True-False]",
    "tests/test_sparse_async.py::test_async_with_one_update_and_second_order_is_exact[current-auto]",
    "tests/test_noise_plan.py::test_a_users_step_and_size_are_kept_with_a_warning_whose_remedy_meets_the_tolerance",
    "tests/test_functional.py::test_sparse_asyncs_pure_step_in_a_users_scan_gives_mcmcs_draws",
)

#: what the current stack (Python 3.12/3.13, today's JAX, NumPyro and ArviZ 1.x) runs of the test
#: command: what differs between the stacks — ArviZ's run object and netCDF, plots, the kernels'
#: API and compiled programs on the newer JAX, LAPACK's thread pool, sharding's errors, Parquet
#: — and a sample of the statistical tests; everything else runs once, on the pinned stack.
#: Module paths mark every test of the module.
CURRENT_STACK = (
    "tests/test_arviz.py", "tests/test_arviz_compat.py", "tests/test_reference.py",
    "tests/test_docs_figures.py", "tests/test_skeleton.py", "tests/test_architecture.py",
    "tests/test_programs.py", "tests/test_lapack_guard.py", "tests/test_disk_rows.py",
    "tests/test_sharding.py::test_clear_errors_and_a_two_axis_mesh",
    "numpyro_sg/arviz_compat.py", "numpyro_sg/results/",
    # the statistical sample: one kernel of each family against its exact posterior
    "tests/test_warmup.py::test_defaults_recover_a_gaussian_posterior",
    "tests/test_sghmc.py::test_defaults_recover_a_gaussian_posterior",
    "tests/test_esgld.py::test_inclusion_matches_exact_enumeration",
    "tests/test_local_latents.py::test_sampled_locals_give_the_exact_gradient_on_gaussian_locals",
)

#: default tests allowed over 30 s on CI's 2 cores, each with its reason (the test command runs
#: two pytest-xdist workers there, so a test shares the cores with another file's tests)
LONG_DEFAULT_TESTS: dict = {
    "tests/test_sharding.py::test_clear_errors_and_a_two_axis_mesh":
        "one subprocess on 4 forced host devices builds and compiles four meshes' programs: "
        "17-20 s alone, up to 30 s beside a second worker",
    "tests/test_docs.py::test_docs_build_without_warnings":
        "Sphinx builds every page of the documentation with -W (the API pages import every "
        "module): under 30 s in earlier runs, 31.2 s beside a second worker in one",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in HEAVY or item.nodeid.split("[")[0] in HEAVY:
            item.add_marker(pytest.mark.heavy)
        if any(item.nodeid == c or item.nodeid.split("[")[0] == c or item.nodeid.startswith(c.rstrip("/") + ("/" if c.endswith("/") else "::"))
               for c in CURRENT_STACK):
            item.add_marker(pytest.mark.stacks)


_long = []


def pytest_runtest_logreport(report):
    """Note default tests whose call ran over 30 s (not failing: the time depends on the machine)."""
    if report.when == "call" and report.duration > 30 and report.nodeid not in LONG_DEFAULT_TESTS \
            and "heavy" not in report.keywords and "slow" not in report.keywords:
        _long.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter):
    if _long:
        terminalreporter.write_sep("=", "default tests over 30 s (move them to HEAVY or LONG_DEFAULT_TESTS)")
        for nodeid, seconds in _long:
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
