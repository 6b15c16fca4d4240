r"""The one gradient of the asynchronous update: G_j = ∂ℓ/∂β_j (and H_j = ∂²ℓ/∂β_j²) at the
evaluation point, for a GLM in O(n·J) (:func:`glm_async_gradient`) or for any likelihood by
automatic differentiation (:func:`dense_async_gradient`); the evaluation point is the current
β with the chosen coordinates switched on or off (:func:`evaluation_shift`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def evaluation_shift(theta_J, delta_J, point):
    """Change Δ of the chosen β_J from β = θ·δ to the asynchronous evaluation point:
    θ_J·(1 − δ_J) (``point="current"``: every chosen coordinate on at θ_j) or −θ_J·δ_J
    (``"excluded"``: every chosen coordinate off).

    >>> import jax.numpy as jnp
    >>> evaluation_shift(jnp.array([2.0, 3.0]), jnp.array([1, 0]), "current").tolist()
    [0.0, 3.0]
    >>> evaluation_shift(jnp.array([2.0, 3.0]), jnp.array([1, 0]), "excluded").tolist()
    [-2.0, -0.0]
    """
    if point == "current":
        return theta_J * (1 - delta_J)
    return -theta_J * delta_J


def glm_async_gradient(X_J, eta, theta_J, delta_J, family, y, params, scale=1.0, second=False,
                       point="current", total=None):
    r"""G_j = ∂ℓ/∂β_j (and H_j = ∂²ℓ/∂β_j²) for the chosen coordinates of a GLM, O(n·J).

    ℓ(β) = scale·Σ_i f(η_i), η = offset + X·β (``family.loglik`` f).  ``eta`` is η at the
    current β = θ·δ; the evaluation point sets the chosen coordinates of β to θ_J
    (``point="current"``: all on) or to 0 (``"excluded"``: all off), i.e. η_e = η + X_J·Δ with
    Δ = :func:`evaluation_shift`; then G = scale·X_Jᵀ f′(η_e) and H = scale·(X_J²)ᵀ f″(η_e).

    :param X_J: (n, J) columns of the chosen coordinates.
    :param eta: (n,) linear predictor at the current β.
    :param theta_J: (J,) coefficients θ_J (fresh spike draws for the excluded ones).
    :param delta_J: (J,) current indicators.
    :param family: a :class:`~numpyro_sg.spike_slab.GLMFamily` (``GLM_FAMILIES[name]``).
    :param y: (n,) observations.
    :param params: the family's other parameters (``{"scale": σ}`` for the Gaussian).
    :param scale: N/n for a mini-batch (1 for the full data).
    :param bool second: also return H (for ``taylor="second"``).
    :param str point: ``"current"`` or ``"excluded"``.
    :param total: optional function summing (G, H) over the data shards when the rows are this
        device's share (one ``psum``); ``None`` when they are all the rows.
    :return: ``(G, H)``, H ``None`` unless ``second``.

    **Example:**

    .. code-block:: python

        G, H = glm_async_gradient(X[:, chosen], X @ (theta * delta), theta[chosen],
                                  delta[chosen], GLM_FAMILIES["bernoulli"], y, {}, second=True)
    """
    eta_e = eta + X_J @ evaluation_shift(theta_J, delta_J, point)
    G = scale * (X_J.T @ family.dloglik(eta_e, y, params))
    H = scale * ((X_J * X_J).T @ family.d2loglik(eta_e, y, params)) if second else None
    return (G, H) if total is None else total((G, H))


def dense_async_gradient(loglik: Callable, theta, delta, chosen, second=False, point="current"):
    r"""G_j = ∂ℓ/∂β_j (and H_j = ∂²ℓ/∂β_j²) for the chosen coordinates, for any likelihood.

    ℓ = ``loglik`` (β ↦ ℓ(β), e.g. the model's log-likelihood in the effective coefficients)
    is differentiated at β = θ·(δ ∨ 1_J) (``point="current"``) or β = θ·δ·(1 − 1_J)
    (``"excluded"``); H by one Hessian-vector product per chosen coordinate.

    :param loglik: β (p,) ↦ ℓ(β), a scalar.
    :param theta: (p,) coefficients.
    :param delta: (p,) current indicators.
    :param chosen: (J,) chosen coordinates (distinct).
    :param bool second: also return H.
    :param str point: ``"current"`` or ``"excluded"``.
    :return: ``(G, H)`` of shape (J,), H ``None`` unless ``second``.

    >>> import jax.numpy as jnp
    >>> G, _ = dense_async_gradient(lambda b: -0.5 * jnp.sum(b**2), jnp.array([1.0, 2.0]),
    ...                             jnp.array([0, 0]), jnp.array([1]))
    >>> G.tolist()
    [-2.0]
    """
    shift = evaluation_shift(theta[chosen], delta[chosen], point)
    beta = (theta * delta).at[chosen].add(shift)
    grad_fn = jax.grad(loglik)
    G = grad_fn(beta)[chosen]
    H = None
    if second:
        def diagonal(j):
            e = jnp.zeros_like(beta).at[j].set(1.0)
            return jax.jvp(grad_fn, (beta,), (e,))[1][j]

        H = jax.vmap(diagonal)(chosen)
    return G, H
