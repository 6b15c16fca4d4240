r"""The warmup's variational centre: a mean-field Gaussian fit instead of the mode.

A hierarchical model whose group effects are parameters (not local latents integrated out),
``b_j ~ Normal(0, τ)`` for many j, has no useful joint mode: the density grows without bound as
τ → 0 with every b_j → 0 (a funnel's neck), so the mode search ends there and a Laplace
preconditioner of near-zero sds pins the chains to it.  The mean-field Gaussian variational
approximation q(x) = N(m, diag(s²)) on the unconstrained space does not collapse (its entropy
Σ log s_j pays for a vanishing τ) and sits in the posterior's bulk.
:func:`variational_adam` maximises the evidence lower bound

    L(m, ρ) = E_ε[log π̂(m + e^ρ ⊙ ε)] + Σ_j ρ_j,   ε ~ N(0, I),  s = e^ρ,

with Adam (optax, cosine-decayed learning rate) on one reparameterised draw and one
mini-batch estimate log π̂ (scaled by N/n) per step:
∇_m = g, ∇_ρ = g ⊙ ε ⊙ e^ρ + 1, g = ∇ log π̂(m + e^ρ ⊙ ε).  The warmup
(``WarmupOptions(centre="variational")``) then uses m as the chains' centre and control-variate
anchor and s as the diagonal preconditioner's scales (stabilised as the Laplace ones are).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import random

#: the variational sds at the start (on the unconstrained space), as NumPyro's ``AutoNormal``
INITIAL_SD = 0.1


def variational_adam(flat_ld, mb, start, learning_rate: float, key, steps: int):
    """``steps`` Adam steps on the mean-field evidence lower bound from mean ``start``:
    ``(mean m, sds s)`` (module docstring; a ``lax.scan``, call inside ``jit``).

    :param flat_ld: ``(x, indices) -> `` the mini-batch log density of a flat point x.
    :param mb: the :class:`~numpyro_sg.infer.minibatch.Minibatcher` whose ``draw`` gives the
        mini-batches.
    :param start: the initial mean (d,).
    :param learning_rate: Adam's initial learning rate (cosine-decayed to 1% of it).
    """
    schedule = optax.cosine_decay_schedule(learning_rate, max(steps, 1), alpha=0.01)
    opt = optax.adam(schedule)
    params = (start, jnp.full_like(start, jnp.log(INITIAL_SD)))

    def body(carry, k):
        (m, rho), state = carry
        k_batch, k_eps = random.split(k)
        idx, _ = mb.draw(k_batch, None)
        eps = random.normal(k_eps, m.shape, m.dtype)
        g = jax.grad(flat_ld)(m + jnp.exp(rho) * eps, idx)
        ok = jnp.all(jnp.isfinite(g))
        grads = (-jnp.where(ok, g, 0.0), -jnp.where(ok, g * eps * jnp.exp(rho) + 1.0, 0.0))
        updates, new_state = opt.update(grads, state, (m, rho))
        return (optax.apply_updates((m, rho), updates), new_state), None

    ((m, rho), _), _ = jax.lax.scan(body, (params, opt.init(params)), random.split(key, steps))
    return m, jnp.exp(rho)


def cosine_rate(learning_rate, step, steps, alpha: float = 0.01):
    """``learning_rate`` cosine-decayed over ``steps`` steps to ``alpha`` of it, at ``step``
    (optax's ``cosine_decay_schedule``, with ``steps`` and ``learning_rate`` allowed to be traced)."""
    progress = jnp.minimum(step, steps) / jnp.maximum(steps, 1)
    return learning_rate * (alpha + (1.0 - alpha) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress)))


def adam_ascent(flat_ld, mb, start, learning_rate, key, steps):
    """``steps`` Adam steps (optax's ``scale_by_adam``, cosine-decayed ``learning_rate``,
    :func:`cosine_rate`) maximising the mini-batch log density ``flat_ld(x, indices)`` from
    ``start``: the mode search's stochastic phase (call inside ``jit``; a non-finite gradient
    skips its step).  ``steps`` and ``learning_rate`` may be traced: one compiled program
    serves the multi-start ascents and the main phase (step t's mini-batch comes from
    ``fold_in(key, t)``)."""
    adam = optax.scale_by_adam()

    def body(t, carry):
        x, state = carry
        idx, _ = mb.draw(random.fold_in(key, t), None)
        g = jax.grad(flat_ld)(x, idx)
        ok = jnp.all(jnp.isfinite(g))
        direction, new_state = adam.update(-jnp.where(ok, g, 0.0), state, x)
        moved = x - cosine_rate(learning_rate, t, steps).astype(x.dtype) * direction
        return jnp.where(ok, moved, x), new_state

    x, _ = jax.lax.fori_loop(0, steps, body, (start, adam.init(start)))
    return x
