"""A Bayesian neural-network classifier and the handwritten digits it is tried on.

:func:`mlp_classifier` is the network of Coullon, South & Nemeth (2023), "Efficient and
generalizable tuning strategies for stochastic gradient MCMC", Appendix B.3.1: one hidden
layer, p(y = k | θ, x) = softmax(φ(x·W₁ + b₁)·W₂ + b₂)_k with independent N(0, prior_sd²)
weights and biases.  The paper's φ is the softmax (``activation=jax.nn.softmax``); the default
is ``tanh``.  :func:`load_digits_split` is scikit-learn's bundled ``load_digits`` (1,797
handwritten 8×8 digits, installed with scikit-learn: no download), pixels scaled to [0, 1],
split into training, validation and test rows.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = ["mlp_classifier", "load_digits_split"]


def mlp_classifier(X, y=None, *, num_classes: int = 10, hidden: int = 50, activation=jnp.tanh,
                   prior_sd: float = 1.0, subsample_size: int = 100):
    """One-hidden-layer Bayesian network classifier with a subsample plate over the rows of ``X``.

    :param X: inputs (N, D).
    :param y: class labels (N,) in ``0 … num_classes − 1``, or ``None`` to predict.
    :param int hidden: hidden units.
    :param activation: the hidden layer's nonlinearity (``jax.nn.softmax`` for the paper's).
    :param float prior_sd: sd of every weight's and bias's N(0, prior_sd²) prior.
    :param int subsample_size: rows per mini-batch (at most N).
    """
    N, D = X.shape
    normal = dist.Normal(0.0, prior_sd)
    W1 = numpyro.sample("W1", normal.expand([D, hidden]).to_event(2))
    b1 = numpyro.sample("b1", normal.expand([hidden]).to_event(1))
    W2 = numpyro.sample("W2", normal.expand([hidden, num_classes]).to_event(2))
    b2 = numpyro.sample("b2", normal.expand([num_classes]).to_event(1))
    with numpyro.plate("data", N, subsample_size=min(subsample_size, N)):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Categorical(logits=activation(Xb @ W1 + b1) @ W2 + b2), obs=yb)


def load_digits_split(test: int = 360, validation: int = 0, seed: int = 0) -> dict:
    """scikit-learn's ``load_digits`` (pixels / 16, float32) split at random (``seed``):
    ``{"train": (X, y), "validation": (X, y), "test": (X, y)}`` with ``test`` and ``validation``
    rows (the default 1,437 / 0 / 360 is scikit-learn's ``test_size=0.2``)."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    X, y = (X[order] / 16.0).astype(np.float32), y[order].astype(np.int32)
    cut = [len(y) - test - validation, len(y) - test]
    parts = zip(np.split(X, cut), np.split(y, cut))
    return dict(zip(["train", "validation", "test"], parts))
