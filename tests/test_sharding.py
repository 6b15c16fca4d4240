"""Data sharded over 4 forced host devices (each check in a subprocess: the device count must be
set before JAX starts; see ``tests/sharded_checks.py``).

Logistic regression, N = 4,000 rows sorted by the first feature (the four shards differ, so
stratification matters), d = 3, mini-batch n = 100 (25 rows per shard).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
D = 3  # coordinates


def _check(name):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(HERE / "sharded_checks.py"), name], capture_output=True,
                         text=True, env=env, cwd=HERE.parent, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_stratified_estimator_is_unbiased_and_no_noisier_than_simple_random_sampling():
    """4,000 estimates at a fixed θ: mean within 4 standard errors of the exact gradient (plain and
    control variate); variance ≤ 1.1× the exact variance of simple random sampling (measured
    0.97–1.00×: the strata differ little in this design, so the gain is small); the mean
    gradient-noise estimate τ̂² within 10% of the estimates' variance (their sampling error is
    ≈ 2% each with 4,000 estimates)."""
    out = _check("unbiased")
    exact, var_srs = np.array(out["exact"]), np.array(out["var_srs"])
    for kind in ("plain", "cv"):
        r = out[kind]
        z = (np.array(r["mean"]) - exact) / np.array(r["se"])
        assert np.all(np.abs(z) < 4), (kind, z)
        np.testing.assert_allclose(r["tau2"], r["var"], rtol=0.1)
    assert np.all(np.array(out["plain"]["var"]) <= 1.1 * var_srs), (out["plain"]["var"], var_srs)


@pytest.mark.slow
def test_one_all_reduce_of_o_d_floats_per_step_and_per_warmup_program():
    """The compiled step (1 and 3 vectorized chains) and each warmup program hold exactly one
    collective, an all-reduce of ≤ chains·(d + 1) floats (chains·(2d + 1) when the kernel
    estimates the gradient noise, SGBD: τ̂² rides along), the dense Hessian d·(d + 1); no
    all-gather or all-to-all, no constant as large as a shard's rows; the full-data pass is exact."""
    out = _check("hlo")
    for key, r in out.items():
        if not isinstance(r, dict):
            continue
        (op, size), = r["collectives"]
        assert op == "all-reduce", (key, r)
        if key.startswith("step"):
            chains = int(key.split()[-1])
            assert size <= chains * ((2 * D + 1) if r["noise"] else (D + 1)), (key, r)
        else:
            bound = {"warmup hessian": D * (D + 1), "warmup fisher": 2 * D, "warmup noise": 2 * D + 1}
            assert size <= bound.get(key, D + 1), (key, r)
        assert r["constant"] < 1000, (key, r)
    assert out["full data error"] < 1e-3 and out["full data value error"] < 1e-2, out


@pytest.mark.slow
def test_sharded_and_unsharded_posteriors_agree():
    """SGLD, SGBD, SGHMC with their defaults, 4 vectorized chains × 2,000 draws on 4 shards and on
    one device, the same keys (the injected noise is shared, the mini-batches differ): means
    within 0.05 posterior sd, sds within 5%; Explicit and Auto meshes give identical draws."""
    out = _check("posteriors")
    assert out["auto_equals_explicit"]
    for name in ("SGLD", "SGBD", "SGHMC"):
        r = out[name]
        assert np.all(np.abs(r["mean_diff_sd"]) < 0.05), (name, r)
        assert np.all(np.abs(np.array(r["sd_ratio"]) - 1) < 0.05), (name, r)


def test_the_recipe_runs_on_a_mesh_of_one_device():
    """Rows placed on a one-device mesh with Explicit axes (what ``jax.make_mesh`` gives on a
    machine with one device) once failed in the warmup with a sharding type error; now one shard.
    Same tolerances as the four-device comparison."""
    r = _check("one_device")
    assert np.all(np.abs(r["mean_diff_sd"]) < 0.05), r
    assert np.all(np.abs(np.array(r["sd_ratio"]) - 1) < 0.05), r


def test_the_diagonal_warmup_runs_shard_locally():
    """Above ``dense_max`` coordinates the warmup's Fisher diagonal and gradient-noise heat run on
    the shards (they once refused sharded data): on the same 2,048 rows the sharded Fisher
    diagonal equals one device's (the same groups; float32 sums in another order, so rtol 1e-4),
    the noise heat is estimated, and SGLD's draws (each run with its own diagonal warmup) agree:
    means within 0.05 sd; sds within 8%, not 5%, because the two warmups estimate their
    scales from different rows (20–30% apart here) and SGLD's discretisation widens the sd with
    the step (measured 0.3–4.5%)."""
    r = _check("diagonal")
    np.testing.assert_allclose(r["fisher_ratio"], 1.0, rtol=1e-4)
    assert all(h > 0 for h in r["heat"]), r
    assert np.all(np.abs(r["mean_diff_sd"]) < 0.05), r
    assert np.all(np.abs(np.array(r["sd_ratio"]) - 1) < 0.08), r


def test_clear_errors_and_a_two_axis_mesh():
    out = _check("errors")
    assert "jit_model_args=True" in out["jit_model_args"]
    assert "chain_method='vectorized'" in out["parallel"]
    assert "take the plate size from the data" in out["hard_coded"]
    assert "choose subsample_size = 104" in out["batch"]
    assert "replace=False is not supported" in out["replace"]
    assert "non-finite" in out["nan"] and "(2500, 1)" in out["nan"]  # found without fetching X
    assert "divide" in out["rows"] or "multiple of 4" in out["rows"]
    np.testing.assert_allclose(out["two_axis_mean"], [1.0, -0.5, 0.25], atol=0.25)
    assert out["idata_groups"] == ["observed_data", "posterior", "sample_stats", "stein"]


def test_esgld_runs_shard_locally_with_the_same_sums():
    """ESGLD's default (informed moves, control-variate gradient) on 4 shards with a full batch
    (n = N) computes the same sums as one device in another order, with the same keys: the
    draws agree to float32 rounding (1e-4 allows for an accept decision moved by an ulp; measured
    1.2e-7 over 700 iterations × 4 chains).  Its compiled step holds three all-reduces and
    nothing else: one float per informed move (Σ_i Δ(N/n)r_i, inside the loop over moves), p for
    the gradient's Xᵀa, and p + p² for the anchor's g and H (in the branch taken at the anchor
    iterations only); no all-gather, no constant of the data's size."""
    out = _check("esgld")
    assert out["max_abs_diff"] < 1e-4 and out["inclusion_diff"] < 1e-4, out
    p = 12
    assert sorted(map(tuple, out["collectives"])) == [("all-reduce", 1), ("all-reduce", p), ("all-reduce", p + p * p)], out
    assert out["constant"] < 1000, out
    assert out["idata_groups"] == ["observed_data", "posterior", "sample_stats", "stein"]
    assert "runs the informed proposals with the control-variate gradient" in out["paper"]
    assert "jit_model_args=True" in out["jit_model_args"]


def test_sparse_async_runs_shard_locally_with_the_same_sums():
    """SparseAsync's fast path on 4 shards and on one device with the same keys computes the
    same sums in another order: "async" (MALA block, logistic, Explicit mesh) and "exact"
    (Gaussian block draw, linear, Auto mesh) draws agree to float32 rounding (1e-3 allows for
    MALA accept decisions moved by an ulp; measured 8e-6 and 3.6e-7 over 200 iterations × 2
    chains).  The compiled step of one chain holds all-reduces only: per bucket of the active
    block (widths 8 and 12 here) the MALA log-likelihood and gradient at the point and at the
    proposal, 2·(1 + width) floats (XLA may split them over two all-reduces), or one gradient,
    1 + width, for SGLD; the J = 6 asynchronous G and H (the default second-order term) in one
    all-reduce, or one float per coordinate of the exact sweep; no all-gather, no constant of the data's size; and the models it cannot split are
    refused with the reason."""
    out = _check("sparse_async")
    assert out["async"]["max_abs_diff"] < 1e-3, out["async"]
    assert out["exact"]["max_abs_diff"] < 1e-3, out["exact"]
    np.testing.assert_allclose(out["exact"]["mean"][:3], [1.0, -0.7, 0.5], atol=0.1)
    mala = 2 * (1 + 8) + 2 * (1 + 12)
    expected = {"async": (mala + 12, 12), "exact": (mala + 1, 1), "sgld": ((1 + 8) + (1 + 12) + 12, 12)}
    for variant, (total, step2) in expected.items():
        hlo = out[variant + "_hlo"]
        ops = [op for op, _ in hlo["collectives"]]
        sizes = [size for _, size in hlo["collectives"]]
        assert set(ops) == {"all-reduce"} and sum(sizes) == total and step2 in sizes, (variant, hlo)
        assert hlo["constant"] < 1000, (variant, hlo)
    assert out["idata_groups"] == ["observed_data", "posterior", "sample_stats", "stein"]
    assert "runs the GLM fast path" in out["dense"] and "dense path" in out["dense"]
    assert "replace=False is not supported" in out["replace"]


@pytest.mark.slow
def test_sharded_and_unsharded_sparse_async_posteriors_agree():
    """SA-SGLD (``variant="sgld"``, n = 100 of N = 4,000, its default absolute ε = 0.01) on 4
    shards and on one device (4 chains × 4,000 draws, the same keys; the mini-batches differ):
    the four non-null coefficients' means within 0.05 posterior sd and sds within 5%, the
    gradient kernels' tolerances."""
    r = _check("sparse_async_posterior")
    assert np.all(np.abs(r["mean_diff_sd"]) < 0.05), r
    assert np.all(np.abs(np.array(r["sd_ratio"]) - 1) < 0.05), r


@pytest.mark.slow
def test_sharded_and_unsharded_esgld_posteriors_agree():
    """ESGLD's defaults on 4 shards and on one device (n = 100 of N = 4,000, 4 chains × 3,000
    draws, the same keys; the mini-batches differ): the four non-null coefficients' means
    within 0.05 posterior sd and sds within 5% (the gradient kernels' tolerances), the mean
    inclusion within 0.02 (measured: 0.0085 sd, 0.6%, 0.003)."""
    r = _check("esgld_posterior")
    assert np.all(np.abs(r["mean_diff_sd"]) < 0.05), r
    assert np.all(np.abs(np.array(r["sd_ratio"]) - 1) < 0.05), r
    assert r["inclusion_diff"] < 0.02, r


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_give_the_draws_of_one_process_with_two_devices(tmp_path):
    """``jax.distributed.initialize`` on 2 localhost processes (one CPU device each, gloo
    collectives, half of the rows each through ``jax.make_array_from_process_local_data``) against
    1 process with 2 forced devices: SGLD's draws (warmup included) are identical, and so is
    ``to_inference_data``'s KSD."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    script, port = str(HERE / "multiprocess_checks.py"), str(_free_port())
    two = [subprocess.Popen([sys.executable, script, str(k), "2", port, str(tmp_path / f"two{k}.npy")],
                            cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for k in range(2)]
    one = subprocess.run([sys.executable, script, "0", "1", "0", str(tmp_path / "one.npy")], cwd=HERE,
                         env=env, capture_output=True, text=True, timeout=1800)
    assert one.returncode == 0, one.stderr[-3000:]
    for proc in two:
        _, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, err[-3000:]
    assert not (tmp_path / "two1.npy").exists()  # only process 0 writes
    np.testing.assert_array_equal(np.load(tmp_path / "two0.npy"), np.load(tmp_path / "one.npy"))
    # to_inference_data on every process: the same KSD (float32 sums in another order); no
    # observed_data group, whose rows no one process holds
    two, one = (json.loads((tmp_path / f"{n}.npy.json").read_text()) for n in ("two0", "one"))
    np.testing.assert_allclose(two["ksd"], one["ksd"], rtol=1e-5)
    assert two["auto_draws"] == one["auto_draws"] == 300   # process 0's budget decided for both
    assert two["groups"] == sorted(set(one["groups"]) - {"observed_data"}), (two, one)
