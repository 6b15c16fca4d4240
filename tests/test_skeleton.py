"""The pure pieces of the one step skeleton every kernel is assembled from, tested alone: the
divergence guard and freeze, the MALA step, and step-size resolution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from numpyro_sg.kernels.guard import (
    BLOWUP_FACTOR,
    GUARD_BURN_IN,
    freeze,
    guard_norm,
    guard_step,
    guarded_update,
    init_guard,
)
from numpyro_sg.kernels.sparse_async.updates import mala_step
from numpyro_sg.kernels.step_size import (
    CallableSchedule,
    PolynomialSchedule,
    resolve_step_size,
    step_size_at,
)


# -- the guard ---------------------------------------------------------------------------------
def _walk(norms, points=None):
    """Feed a sequence of gradient norms (and points) through guarded_update from a start at 0."""
    points = np.arange(len(norms), dtype=np.float32)[:, None] + 1.0 if points is None else points
    guard, diverging, flat = init_guard(jnp.zeros(1), jnp.asarray(norms[0])), jnp.array(False), jnp.zeros(1)
    kept, flags = [], []
    for x, n in zip(points[1:], norms[1:]):
        out = guarded_update(guard, diverging, flat, jnp.asarray(x), jnp.asarray(n), jnp.array(np.isfinite(n)))
        guard, diverging, flat = out.guard, out.diverging, out.flat
        kept.append(float(flat[0]))
        flags.append(bool(diverging))
    return np.array(kept), np.array(flags)


def test_a_steady_chain_is_never_flagged():
    rng = np.random.default_rng(0)
    norms = np.abs(1.0 + 0.3 * rng.normal(size=500))
    kept, flags = _walk(norms)
    assert not flags.any()
    np.testing.assert_array_equal(kept, np.arange(1, 500) + 1.0)  # every proposal is kept


def test_a_geometric_blow_up_freezes_at_the_last_safe_point_and_stays_flagged():
    """Norm ≈ 1 for 50 steps, then ×2 per step: flagged when it passes 1000× the reference,
    i.e. 10 doublings later; the kept point is the last whose norm was ≤ 10× the reference
    (3 doublings after the start of the blow-up), and nothing moves after."""
    norms = np.concatenate([np.ones(50), 2.0 ** np.arange(1, 30)])
    kept, flags = _walk(norms)
    first = int(np.argmax(flags))
    assert flags[first:].all() and not flags[:first].any()
    assert norms[first + 1] > BLOWUP_FACTOR and norms[first] <= BLOWUP_FACTOR  # 1,024 vs 512
    last_safe = 52  # the step with norm 8 (≤ 10 × 1); the point at index k is k + 1
    assert kept[first] == last_safe + 1.0
    np.testing.assert_array_equal(kept[first:], kept[first])


def test_non_finite_values_are_a_divergence_at_once():
    norms = np.array([1.0, 1.0, 1.0, np.nan, 1.0, 1.0])
    kept, flags = _walk(norms)
    np.testing.assert_array_equal(flags, [False, False, True, True, True])
    assert kept[-1] == 3.0  # the point before the non-finite one


def test_a_chain_that_starts_far_out_and_moves_in_is_not_flagged():
    """Decreasing norms (a chain arriving from the tail) never trip the guard."""
    norms = np.concatenate([1e4 * 0.8 ** np.arange(40), np.ones(200)])
    _, flags = _walk(norms)
    assert not flags.any()


def test_guard_step_reference_follows_the_lowest_level_after_burn_in():
    g = init_guard(jnp.zeros(2), jnp.asarray(5.0))
    for _ in range(GUARD_BURN_IN + 40):
        _, g = guard_step(g, jnp.zeros(2), jnp.asarray(1.0), jnp.array(True))
    assert float(g.reference) == pytest.approx(1.0, rel=0.05)


def test_freeze_keeps_old_values_where_diverging():
    old, new = {"a": jnp.zeros(3), "b": jnp.ones(())}, {"a": jnp.ones(3), "b": 2 * jnp.ones(())}
    assert jax.tree.map(float, freeze(jnp.array(True), old, new)["b"]) == 1.0
    np.testing.assert_array_equal(freeze(jnp.array(False), old, new)["a"], np.ones(3))


def test_guard_norm_is_scale_free_floored_and_reads_the_moved_coordinates():
    """max(1, √(mean ε_j·ĝ_j²)) for every kernel: unchanged when θ is rescaled by c (ĝ by 1/c,
    ε by c²), 1 below the level where drift and noise match (an empty block included), the
    masked-out coordinates ignored, NaN for a non-finite gradient."""
    eps, grad = jnp.array([1e-6, 1e-2]), jnp.array([3e3, 30.0])
    np.testing.assert_allclose(guard_norm(grad, eps), 3.0, rtol=1e-5)  # √ε·ĝ = (3, 3)
    np.testing.assert_allclose(guard_norm(grad / 10, 100 * eps), 3.0, rtol=1e-5)  # units of θ × 10
    assert float(guard_norm(jnp.zeros(2), eps)) == 1.0 and float(guard_norm(grad, 1e-12)) == 1.0
    g, mask = jnp.asarray([3.0, -4.0, 100.0]), jnp.asarray([1.0, 1.0, 0.0])
    assert float(guard_norm(g, 0.5, mask)) == pytest.approx(np.sqrt(0.5 * 12.5))
    assert float(guard_norm(g, 0.5, jnp.zeros(3))) == 1.0
    assert np.isnan(float(guard_norm(g.at[0].set(jnp.nan), 0.5, mask)))
    assert np.isnan(float(guard_norm(jnp.array([jnp.nan, 0.0]), eps)))


# -- MALA ----------------------------------------------------------------------------------------
def test_mala_samples_its_target_exactly_and_accepts_at_the_theoretical_rate():
    """MALA on N(μ, diag(s²)) with ε = 0.3, i.e. 1.2 variances of the narrow coordinate (the
    unadjusted Langevin chain's variance would be 43% too large there): 4 × 20,000 steps give
    the exact moments (tolerances ≈ 4 se at the thinned draws' size) and a KS test cannot tell
    the draws (thinned by 20) from the target; dropping the backward proposal density from the
    acceptance ratio makes it fail (checked)."""
    mu, s = jnp.array([1.0, -2.0]), jnp.array([1.0, 0.5])

    def logp_grad(x):
        return -0.5 * jnp.sum(((x - mu) / s) ** 2), -(x - mu) / s**2

    def chain(key):
        def body(carry, k):
            x, lp, g = carry
            res = mala_step(k, x, lp, g, logp_grad, 0.3)
            return (res.x, res.log_density, res.grad), (res.x, res.accept_prob)

        x0 = mu
        _, (xs, acc) = jax.lax.scan(body, (x0, *logp_grad(x0)), jax.random.split(key, 20_000))
        return xs, acc

    xs, acc = jax.vmap(chain)(jax.random.split(jax.random.PRNGKey(0), 4))
    draws = np.asarray(xs[:, 1000::20]).reshape(-1, 2)
    z = (draws - np.asarray(mu)) / np.asarray(s)
    assert stats.kstest(z[:, 0], "norm").pvalue > 0.01 and stats.kstest(z[:, 1], "norm").pvalue > 0.01
    np.testing.assert_allclose(z.mean(0), 0.0, atol=0.1)
    np.testing.assert_allclose(z.std(0), 1.0, atol=0.06)
    assert 0.3 < float(acc.mean()) < 0.95


def test_mala_mask_freezes_coordinates():
    def logp_grad(x):
        return -0.5 * jnp.sum(x**2), -x

    x = jnp.array([1.0, 2.0, 3.0])
    res = mala_step(jax.random.PRNGKey(1), x, *logp_grad(x), logp_grad, 0.1, mask=jnp.array([1.0, 0.0, 1.0]))
    assert float(res.x[1]) == 2.0


# -- step sizes ---------------------------------------------------------------------------------
def test_resolve_step_size_forms():
    assert float(resolve_step_size(None, 0.7, 3)) == pytest.approx(0.7)
    np.testing.assert_allclose(resolve_step_size([0.1, 0.2, 0.3], 0.7, 3), [0.1, 0.2, 0.3])
    sched = PolynomialSchedule(1.0, 1.0, 0.5)
    assert resolve_step_size(sched, 0.7, 3) is sched
    wrapped = resolve_step_size(lambda t: 0.5 / (1 + t), 0.7, 3)
    assert isinstance(wrapped, CallableSchedule)
    assert float(step_size_at(wrapped, 1)) == pytest.approx(0.25)
    wrapped.scale = 2.0  # a tuner scales a user's schedule through its data leaf
    assert float(step_size_at(wrapped, 1)) == pytest.approx(0.5)
    leaves, treedef = jax.tree.flatten(wrapped)
    assert float(jax.tree.unflatten(treedef, leaves)(1)) == pytest.approx(0.5)


def test_resolve_step_size_names_the_shape_at_fault():
    with pytest.raises(ValueError, match=r"step_size has shape \(2,\) but the model has 3"):
        resolve_step_size([0.1, 0.2], 0.7, 3)
    with pytest.raises(ValueError, match=r"shape \(3, 3\)"):
        resolve_step_size(np.ones((3, 3)), 0.7, 3)
