"""SGLD's and SGHMC's tamed gradient in a dense Laplace frame (``kernels.moves.tamed_gradient``):
on a target whose log density falls steeply a few sds out (a wall, as a few rows tens of sds out
with a saturating link make), the untamed step overshoots by tens of sds, the tamed one samples
the target; where the gradient stays near the Laplace frame's, taming changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax, random

from numpyro_sg.infer.preconditioner import Preconditioner
from numpyro_sg.kernels import sghmc, sgld
from numpyro_sg.kernels.moves import tamed_gradient

#: log π(u) = Σ_j −u_j²/2 − (SLOPE/4)·softplus(4(u_j − WALL)): N(0, 1) with a wall at +3 sds whose
#: slope (200) is what a handful of rows 30–45 sds out give a multinomial logit's coefficient
WALL, SLOPE, DIM = 3.0, 200.0, 2


def wall_gradient(u, _minibatch):
    return -u - SLOPE * jax.nn.sigmoid(4.0 * (u - WALL))


def _target_sd() -> float:
    u = np.linspace(-8.0, 8.0, 200_001)
    log_p = -u**2 / 2 - SLOPE / 4 * np.logaddexp(0.0, 4.0 * (u - WALL))
    p = np.exp(log_p - log_p.max())
    mean = np.sum(u * p) / np.sum(p)
    return float(np.sqrt(np.sum((u - mean) ** 2 * p) / np.sum(p)))


def _draws(module, **init_options):
    precond = Preconditioner(chol=jnp.eye(DIM))
    state = module.init(jnp.zeros(DIM), wall_gradient, None, 0.7, precond=precond, **init_options)

    def one(state, key):
        state = module.step(key, state, wall_gradient, None, correct_discretisation=True)
        return state, state.z
    _, draws = lax.scan(one, state, random.split(random.PRNGKey(0), 40_000))
    return np.asarray(draws)[2_000:]


@pytest.mark.parametrize("module", [sgld, sghmc], ids=["sgld", "sghmc"])
def test_a_wall_three_sds_out_is_sampled_not_overshot(module):
    """ε = 0.7 (the defaults' step) in the target's Laplace frame.  Untamed, a chain that reaches
    the wall (0.13 % of a N(0, 1)'s mass, so tens of times in 38,000 steps) is thrown to about
    −(ε/2)·200 = −70 sds; tamed, it moves at most (ε/2)·(2√2 + 5) = 2.7 sds.  The draws' sd then
    matches the target's within 5 % (38,000 correlated draws per coordinate estimate it to about
    1 %; seed fixed), and none is below −6 (a N(0, 1) draw below −6 has probability 10⁻⁹)."""
    draws = _draws(module)
    assert draws.min() > -6.0, draws.min()
    assert np.all(np.abs(draws.std(0) / _target_sd() - 1) < 0.05), (draws.std(0), _target_sd())


def test_taming_leaves_gradients_of_a_posterior_near_its_laplace_frame_unchanged():
    dense, identity = Preconditioner(chol=jnp.eye(10)), Preconditioner()
    g = random.normal(random.PRNGKey(1), (1000, 10)) * 1.3   # ‖g‖ ≈ 1.3·√10 = 4.1, G = 2√10 + 5 = 11.3
    assert np.array_equal(jax.vmap(lambda x: tamed_gradient(x, dense))(g), g)
    big = jnp.full(10, 100.0)
    assert abs(float(jnp.linalg.norm(tamed_gradient(big, dense))) - (2 * np.sqrt(10) + 5)) < 1e-3
    assert np.array_equal(tamed_gradient(big, identity), big)   # a paper's absolute units: no frame to tame in
