"""Excursions: a chain whose draws jump tens of posterior sds away, which R̂ and ESS miss."""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_sg.infer.preconditioner import Preconditioner, init_moments, update_moments
from numpyro_sg.infer.warmup_options import ModeFit
from numpyro_sg.kernels.report import EXCURSION_SDS, excursion_report


def _moments(draws):
    """Each chain's running moments over its draws (chains, T, d)."""
    one = lambda x: jax.lax.scan(lambda m, xi: (update_moments(m, xi), None), init_moments(x.shape[1], False), x)[0]
    return jax.vmap(one)(jnp.asarray(draws, jnp.float32))


def test_a_chain_that_jumps_30_sds_once_is_reported_and_gaussian_chains_are_not():
    """Four chains of 2,000 standard-normal draws (Laplace sds 0.1 around 1): the largest of
    24,000 normal coordinates is about 4.4 sds, far inside the limit (seed fixed); one chain
    that jumps 30 sds for 5 draws — 0.25 % of its draws, which move its mean by 0.075 sd and
    leave R̂ near 1 — is reported, the others not; a diverged chain is left to the divergence
    report."""
    rng = np.random.default_rng(0)
    fit = ModeFit(mode=jnp.ones(3), grad=jnp.zeros(3), log_density=0.0,
                  preconditioner=Preconditioner(scale=jnp.full(3, 0.1)), converged=True, newton_steps=1, seconds=0.0)
    draws = 1.0 + 0.1 * rng.normal(size=(4, 2000, 3))
    assert excursion_report(fit, _moments(draws), np.zeros(4, bool)) == []
    draws[2, 1000:1005, 1] += 0.1 * 30
    found = excursion_report(fit, _moments(draws), np.zeros(4, bool))
    assert len(found) == 1 and "chain(s) [2]" in found[0][0] and "flat coordinate 1" in found[0][0], found
    assert "numpyro_sg.SGBD" in found[0][1]
    bounded = excursion_report(fit, _moments(draws), np.zeros(4, bool), bounded=True)
    assert "subsample_size" in bounded[0][1] and "SGBD" not in bounded[0][1]
    assert excursion_report(fit, _moments(draws), np.array([False, False, True, False])) == []
    assert EXCURSION_SDS < 30


def test_moments_reset_to_zeros_start_their_range_afresh():
    """The kernels reset the moments to zeros at the end of warmup: the range of the kept draws
    must not include 0 (or a warmup draw) unless a kept draw is there."""
    m = init_moments(2, False)
    for x in ([5.0, 6.0], [7.0, 4.0]):
        m = update_moments(m, jnp.asarray(x))
    assert np.asarray(m.low).tolist() == [5.0, 4.0] and np.asarray(m.high).tolist() == [7.0, 6.0]
    m = jax.tree.map(jnp.zeros_like, m)
    m = update_moments(m, jnp.asarray([9.0, 9.0]))
    assert np.asarray(m.low).tolist() == [9.0, 9.0]
    assert np.asarray(update_moments(m, jnp.asarray([1.0, 1.0]), active=False).low).tolist() == [9.0, 9.0]
