r"""STEP 2 of SparseAsync: the chosen subset of indicators and their redraw.

The subset J of ``update_size`` coordinates (:func:`draw_subset`), the sequential Gibbs sweep
of the exact sampler (:func:`sequential_sweep`), the asynchronous inclusion logits and the
independent draws of Atchadé & Wang (2023), "A fast asynchronous MCMC sampler for sparse
Bayesian inference" (:func:`async_inclusion_logits`, :func:`async_update`), and the fast
path's padded list of active coordinates (:func:`compact_active`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax, random


def draw_subset(key, p: int, J: int):
    """A uniformly random subset of {0, …, p−1} of size J, as a (J,) int32 array (distinct).

    For p > 8·J: the first J distinct values (in order of appearance) of 2·J i.i.d. uniform
    integers, O(J log J); in the (rare) event of fewer than J distinct values, or for small p,
    an exact ``random.choice`` without replacement (O(p log p)).  Both are exactly uniform: the
    event "J distinct values among 2·J draws" is invariant under relabelling.

    >>> import jax
    >>> chosen = draw_subset(jax.random.PRNGKey(0), 10_000, 100)
    >>> chosen.shape, len(set(chosen.tolist()))
    ((100,), 100)
    """
    if J > p:
        raise ValueError(f"cannot draw {J} distinct coordinates out of p = {p}.")
    k1, k2 = random.split(key)
    if p <= 8 * J:
        return random.choice(k2, p, (J,), replace=False).astype(jnp.int32)
    M = 2 * J
    d = random.randint(k1, (M,), 0, p, dtype=jnp.int32)
    order = jnp.argsort(d, stable=True)
    s = d[order]
    first_sorted = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    is_first = jnp.zeros((M,), bool).at[order].set(first_sorted)
    pos = jnp.where(is_first, jnp.arange(M), M + jnp.arange(M))
    subset = d[jnp.argsort(pos)[:J]]
    return lax.cond(
        jnp.sum(is_first) >= J,
        lambda: subset,
        lambda: random.choice(k2, p, (J,), replace=False).astype(jnp.int32),
    )


def sequential_sweep(key, carry, conditional: Callable, num_updates: int):
    r"""The exact sampler's STEP 2: ``num_updates`` single-site Gibbs updates of binary
    indicators, in turn.

    For t = 0, …, T−1: ``logit, on, off = conditional(carry, t)`` gives the log-odds of the
    t-th chosen indicator being 1 given the current ``carry`` (which encodes the other
    indicators — δ itself, or a linear predictor updated in O(N)) and the carry with it set to
    1 (``on``) or to 0 (``off``); then v_t ~ Bernoulli(sigmoid(logit)) (key
    ``fold_in(key, t)``) and carry ← ``on`` if v_t else ``off``.  Each update conditions on
    the ones before it, so the sweep leaves the joint law of the indicators invariant.

    :param key: PRNG key.
    :param carry: a pytree: the state the conditionals read.
    :param conditional: ``(carry, t) -> (logit, carry_on, carry_off)``.
    :param int num_updates: T.
    :return: ``(carry, V)`` — the final carry and the T draws V (int32).

    **Example:**

    .. code-block:: python

        def conditional(delta, t):
            j = chosen[t]
            on, off = delta.at[j].set(1), delta.at[j].set(0)
            return log_target(on) - log_target(off), on, off

        delta, V = sequential_sweep(key, delta, conditional, chosen.shape[0])
    """

    def body(c, t):
        logit, on, off = conditional(c, t)
        v = random.bernoulli(random.fold_in(key, t), jax.nn.sigmoid(logit))
        return jax.tree.map(lambda a, b: jnp.where(v, a, b), on, off), v.astype(jnp.int32)

    return lax.scan(body, carry, jnp.arange(num_updates))


def async_inclusion_logits(prior_logodds, theta, grad, hess=None, taylor="first", point="current"):
    """logit q̃_j = prior log-odds + θ_j·G_j + Q_j for the chosen coordinates.

    ``taylor="first"``: Q = 0; ``"sensitive"``: Q = ½θ_j²G_j² (eq. (6) of Atchadé & Wang
    (2023)); ``"second"``: Q = ±½θ_j²·abs(∂²ℓ/∂β_j²) (``hess``), + at the point where j is on
    (``point="current"``) and − where it is off (``"excluded"``), so that it is exact for a
    Gaussian likelihood at either.

    >>> float(async_inclusion_logits(0.0, 0.5, 2.0, None, "sensitive"))
    1.5
    """
    out = prior_logodds + theta * grad
    if taylor == "sensitive":
        out = out + 0.5 * theta**2 * grad**2
    elif taylor == "second":
        sign = 1.0 if point == "current" else -1.0
        out = out + sign * 0.5 * theta**2 * jnp.abs(hess)
    return out


def async_update(key, prior_logodds, theta, grad, hess=None, taylor="first", point="current"):
    r"""The asynchronous samplers' STEP 2: the chosen indicators drawn independently, at once.

    V_j ~ Bernoulli(q̃_j) independently, logit q̃_j = :func:`async_inclusion_logits`
    (prior log-odds + θ_j·G_j + Q_j), with G (and H) from one gradient at the evaluation point
    (:func:`~numpyro_sg.kernels.sparse_async.glm_async_gradient` or
    :func:`~numpyro_sg.kernels.sparse_async.dense_async_gradient`).

    :return: V, (J,) int32.

    **Example:**

    .. code-block:: python

        G, H = glm_async_gradient(X_J, eta, theta_J, delta_J, family, y, params)
        V = async_update(key, prior_logodds, theta_J, G, H)   # new δ_J
    """
    logits = async_inclusion_logits(prior_logodds, theta, grad, hess, taylor, point)
    return random.bernoulli(key, jax.nn.sigmoid(logits)).astype(jnp.int32)


def compact_active(active, delta, chosen, added):
    """The padded active-set index list after STEP 2, in O(m + J).

    ``active`` (m,) lists the coordinates that were active (δ_j = 1) before STEP 2, padded with
    p = ``delta.shape[0]``; ``delta`` (p,) is the indicator after STEP 2; ``chosen`` (J,) the
    coordinates updated and ``added`` (J,) bool those of them switched on (0 → 1).  The new
    list holds the survivors (entries of ``active`` still active, in their order), then the
    newcomers (in the order of ``chosen``), padded with p.  ``count`` is their number; when it
    exceeds m the list is truncated (an overflow the caller must handle).

    :return: ``(new_active (m,) int32, count int32)``.

    **Example:**

    .. code-block:: python

        delta = delta.at[chosen].set(V)
        active, count = compact_active(active, delta, chosen, (old_delta_J == 0) & (V == 1))
    """
    m, p = active.shape[0], delta.shape[0]
    keep = (active < p) & (delta.at[active].get(mode="fill", fill_value=0) == 1)
    candidates = jnp.concatenate([active, chosen.astype(active.dtype)])
    mask = jnp.concatenate([keep, added])
    position = jnp.where(mask, jnp.cumsum(mask) - 1, m)
    new = jnp.full((m,), p, jnp.int32).at[position].set(candidates, mode="drop")
    return new, jnp.sum(mask).astype(jnp.int32)
