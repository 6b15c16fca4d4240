"""jaxlib < 0.11's batched CPU LAPACK kernels can deadlock XLA's thread pool
(:mod:`numpyro_sg.infer.lapack_guard`): scoring draws of a model that calls LAPACK must finish,
and the guard must not change any result."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.scipy.linalg import solve_triangular

from numpyro_sg.diagnostics.model_scores import ModelScores
from numpyro_sg.infer.lapack_guard import lapack_pool_can_deadlock, map_over_draws, uses_lapack


def test_uses_lapack_sees_linear_algebra_inside_transformations():
    L, b = jnp.eye(2), jnp.ones((2, 1))
    assert uses_lapack(lambda L, b: solve_triangular(L, b, lower=True).sum(), L, b)
    assert uses_lapack(jax.grad(lambda L: jnp.linalg.cholesky(L).sum()), L)      # inside a custom_jvp
    assert uses_lapack(lambda L: jax.lax.fori_loop(0, 2, lambda i, a: jnp.linalg.inv(a), L), L)
    assert not uses_lapack(lambda L, b: (L @ b).sum(), L, b)


def test_map_over_draws_equals_vmap():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(5, 3, 3))
    A = jnp.asarray(A @ np.swapaxes(A, -1, -2) + 3 * np.eye(3), jnp.float32)
    x = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    for f in (lambda a, v: jnp.linalg.solve(a, v), lambda a, v: a @ v):
        np.testing.assert_allclose(jax.jit(lambda a, v: map_over_draws(f, a, v))(A, x), jax.vmap(f)(A, x), rtol=1e-5)


def test_map_over_draws_groups_points_below_the_parallel_size(monkeypatch):
    """Where the guard applies, a point's largest call sets the group size: a 2×2 triangular
    solve with 1,000 right-hand sides is about 4,000 flops, so 30 points go in groups of
    ``SAFE_BATCH_FLOPS // 4,000``; a point as large as the limit goes alone, and the results
    equal vmap's."""
    from numpyro_sg.infer import lapack_guard

    def solve(L, b):
        return solve_triangular(L, b, lower=True)

    L = jnp.tile(jnp.array([[1.0, 0.0], [0.5, 2.0]]), (30, 1, 1))
    small, large = jnp.ones((30, 2, 1000)), jnp.ones((30, 2, lapack_guard.SAFE_BATCH_FLOPS // 4))
    assert lapack_guard.lapack_flops(jax.make_jaxpr(solve)(L[0], small[0]).jaxpr) == 4000
    sizes = []
    monkeypatch.setattr(lapack_guard, "lapack_pool_can_deadlock", lambda: True)
    monkeypatch.setattr(jax.lax, "map", lambda f, xs, batch_size=None: sizes.append(batch_size) or jax.vmap(f)(xs))
    for b in (small, large):
        np.testing.assert_allclose(map_over_draws(solve, L, b), jax.vmap(solve)(L, b), rtol=1e-6)
    assert sizes == [lapack_guard.SAFE_BATCH_FLOPS // 4000, None], sizes


def mvn_model(y, z):
    """Two independent MultivariateNormal observations: two triangular solves XLA may run at once."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    corr = numpyro.sample("corr", dist.LKJCholesky(2, 2.0))
    with numpyro.plate("rows", y.shape[0], subsample_size=100):
        yb, zb = numpyro.subsample(y, event_dim=1), numpyro.subsample(z, event_dim=1)
        numpyro.sample("y", dist.MultivariateNormal(mu, scale_tril=corr), obs=yb)
        numpyro.sample("z", dist.MultivariateNormal(-mu, scale_tril=corr), obs=zb)


@pytest.mark.timeout(300, method="thread")   # a hang would block C code: end the run
def test_scores_of_a_model_with_batched_lapack_calls_finish():
    """64 draws × 60,000 rows of a MultivariateNormal's triangular solves in one program
    deadlocked jaxlib 0.10 on 2 cores (measured: hung on the first block); the guarded scores
    finish and equal the closed form at Σ = I (float32 sums of 120,000 terms: rtol 1e-3)."""
    rng = np.random.default_rng(1)
    y = rng.normal(size=(60_000, 2)).astype(np.float32) + np.array([1.0, -1.0], np.float32)
    z = rng.normal(size=(60_000, 2)).astype(np.float32) - np.array([1.0, -1.0], np.float32)
    scores = ModelScores(mvn_model, (y, z))
    draws = {"mu": 1.0 + 0.01 * rng.normal(size=(192, 2)).astype(np.float32),
             "corr": np.broadcast_to(np.eye(2, dtype=np.float32), (192, 2, 2))}
    s = scores.score(scores.unconstrain(draws))
    mu_cols = [i for i, site in enumerate(scores.coordinate_sites) if site == "mu"]
    # Σ = I at corr = I: ∇_μ = Σ_i (y_i − μ) − Σ_i (z_i + μ) − μ
    expected = y.sum(0)[None] - z.sum(0)[None] - (2 * len(y) + 1) * draws["mu"]
    np.testing.assert_allclose(s[:, mu_cols], expected, rtol=1e-3, atol=1.0)


@pytest.mark.parametrize("k", [1, 2, 3, 9])
def test_small_block_algebra_of_the_locals_is_lapacks(k):
    """The locals' k×k Cholesky factor and triangular solves are elementwise code up to
    ``SMALL_K`` (no LAPACK call in the sampling programs) and LAPACK above; both equal
    numpy's/scipy's in float32 (rtol 1e-4 on well-conditioned blocks)."""
    from numpyro_sg.locals import marginal

    assert uses_lapack(marginal._cholesky, jax.ShapeDtypeStruct((4, k, k), jnp.float32)) == (k > marginal.SMALL_K)
    rng = np.random.default_rng(k)
    A = rng.normal(size=(6, k, k))
    A = (A @ np.swapaxes(A, -1, -2) + k * np.eye(k)).astype(np.float32)
    B = rng.normal(size=(6, k, 2)).astype(np.float32)
    L = np.linalg.cholesky(A.astype(np.float64))
    np.testing.assert_allclose(marginal._cholesky(jnp.asarray(A)), L, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(marginal._solve_lower(jnp.asarray(L, jnp.float32), B), np.linalg.solve(L, B),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(marginal._solve_lower(jnp.asarray(L, jnp.float32), B, transpose=True),
                               np.linalg.solve(np.swapaxes(L, -1, -2), B), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not lapack_pool_can_deadlock(), reason="this jaxlib's LAPACK kernels cannot deadlock")
@pytest.mark.timeout(300, method="thread")   # a hang would block C code: end the run
def test_the_warmup_of_a_model_with_batched_lapack_calls_finishes():
    """The warmup's multi-start evaluates every start's full-data log density and gradient in one
    program; vectorised over starts, each start's ``scale_tril`` made a batch of triangular solves
    that deadlocked jaxlib 0.10 on 2 cores (a random intercept-and-slope model hung there for
    good; this model hung on its first pass).  Guarded, the run finishes, and the mean's draws
    sit at the data's mean difference (posterior sd 1/√(2N) ≈ 0.003: band 0.05)."""
    from numpyro.infer import MCMC

    import numpyro_sg as nsg

    rng = np.random.default_rng(2)   # 20,000 rows hung as well; 60,000 as in the scores' test
    y = rng.normal(size=(60_000, 2)).astype(np.float32) + np.array([1.0, -1.0], np.float32)
    z = rng.normal(size=(60_000, 2)).astype(np.float32) - np.array([1.0, -1.0], np.float32)
    mcmc = MCMC(nsg.SGLD(mvn_model), num_warmup=20, num_samples=50, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y, z)
    np.testing.assert_allclose(mcmc.get_samples()["mu"].mean(0), [1.0, -1.0], atol=0.05)



@pytest.mark.skipif(not lapack_pool_can_deadlock(), reason="this jaxlib's LAPACK kernels cannot deadlock")
def test_per_row_maps_keep_each_batched_solve_below_the_pools_size():
    """The warmup's per-row gradients (:func:`~numpyro_sg.infer.noise.row_noise_covariance`)
    ``lax.map`` over the rows 1,024 at a time, and each row evaluates the whole model, its prior's
    solves included: a MovieLens-shaped mixed model (a 6×6 Cholesky factor in its prior) hung there
    for good at 10⁶ ratings on jaxlib 0.10 (XLA's threads all waiting, one inside a batched ``strsm``).
    :func:`~numpyro_sg.infer.lapack_guard.map_in_batches` keeps each batched call below
    :data:`~numpyro_sg.infer.lapack_guard.SAFE_BATCH_FLOPS`, as ``map_over_draws`` does."""
    from numpyro_sg.infer.lapack_guard import SAFE_BATCH_FLOPS, lapack_flops, map_in_batches

    L = jnp.tril(jnp.ones((8, 8))) + 8 * jnp.eye(8)
    fn = lambda v: solve_triangular(L, v, lower=True)
    xs = jnp.ones((2048, 8, 8))   # a matrix solve per row, as the prior of a Cholesky factor makes
    plain = lapack_flops(jax.make_jaxpr(lambda a: jax.lax.map(fn, a, batch_size=1024))(xs).jaxpr)
    guarded = jax.make_jaxpr(lambda a: map_in_batches(fn, a, 1024))(xs)
    assert plain > 4 * SAFE_BATCH_FLOPS >= 4 * lapack_flops(guarded.jaxpr) > 0
    np.testing.assert_allclose(map_in_batches(fn, xs, 1024), jax.vmap(fn)(xs), rtol=1e-6)
