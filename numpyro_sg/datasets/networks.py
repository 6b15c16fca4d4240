"""A Bayesian neural-network classifier and the handwritten digits it is tried on.

:func:`mlp_classifier` is the network of Coullon, South & Nemeth (2023), "Efficient and
generalizable tuning strategies for stochastic gradient MCMC", Appendix B.3.1: one hidden
layer, p(y = k | θ, x) = softmax(φ(x·W₁ + b₁)·W₂ + b₂)_k with independent N(0, prior_sd²)
weights and biases.  The paper's φ is the softmax (``activation=jax.nn.softmax``); the default
is ``tanh``.  :func:`load_digits_split` is scikit-learn's bundled ``load_digits`` (1,797
handwritten 8×8 digits, installed with scikit-learn: no download), pixels scaled to [0, 1],
split into training, validation and test rows.

:func:`lenet_spike_slab` is the sparse network of Atchadé & Wang (2023), "A fast asynchronous
MCMC sampler for sparse Bayesian inference", §4.3 — LeNet-5 with ReLU units whose fully
connected layers carry a spike-and-slab prior — sized for the 8×8 digits, and
:func:`lenet_full_start` the paper's start: every weight in, at Glorot-uniform values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

__all__ = ["mlp_classifier", "load_digits_split", "lenet_spike_slab", "lenet_logits", "lenet_full_start",
           "LENET_LAYERS"]

#: the fully connected layers (inputs, outputs) of :func:`lenet_spike_slab`: the two pooled
#: 3×3 convolutions leave 2×2×16 = 64 features of an 8×8 image.
LENET_LAYERS = ((64, 120), (120, 84), (84, 10))
_CONVOLUTIONS = {"conv1": (3, 3, 1, 6), "conv2": (3, 3, 6, 16)}


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


def _convolve_pool(x, kernel, bias):
    """3×3 'same' convolution (NHWC), ReLU and 2×2 max-pooling."""
    x = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    x = jax.nn.relu(x + bias)
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def _num_coefficients():
    return sum(a * b + b for a, b in LENET_LAYERS)


def lenet_spike_slab(X, y=None, *, u: float = 1.5, rho0: float | None = None, rho1: float = 1.0,
                     conv_sd: float = 1.0, subsample_size: int = 100):
    r"""LeNet-style classifier of 8×8 images whose fully connected layers are sparsified.

    Two 3×3 convolutions (6 and 16 channels, ReLU, 2×2 max-pooling; N(0, ``conv_sd``²) weights
    and biases, never excluded, as in the paper), then fully connected layers 64–120–84–10 with
    ReLU (:data:`LENET_LAYERS`).  Their weights and biases form θ ∈ ℝ^p (p = 18,814) with
    indicators δ: π(δ) ∝ p^(−u·|δ|), θ_j | δ_j ~ N(0, 1/ρ_{δ_j}), ρ0 = N (``rho0=None``),
    ρ1 = 1, and the network uses β = θ·δ — the form :class:`~numpyro_sg.SparseAsync` samples.

    :param X: images (N, 64) or (N, 8, 8), e.g. :func:`load_digits_split`'s.
    :param y: class labels (N,), or ``None`` to predict.
    :param float u: the size penalty.  The paper's u = 50 on 60,000 images and 298,650
        weights is u·log p / N ≈ 0.01 nats per image per weight; u = 1.5 is that rate here.
    :param int subsample_size: rows per mini-batch (at most N).
    """
    N, p = X.shape[0], _num_coefficients()
    conv = {}
    for name, shape in _CONVOLUTIONS.items():
        conv[name] = numpyro.sample(name, dist.Normal(0.0, conv_sd).expand(list(shape)).to_event(4))
        conv[name + "_bias"] = numpyro.sample(name + "_bias", dist.Normal(0.0, conv_sd).expand([shape[-1]]).to_event(1))
    delta = numpyro.sample("delta", dist.Bernoulli(logits=-u * np.log(p)).expand([p]).to_event(1))
    rho0 = float(N) if rho0 is None else rho0
    theta = numpyro.sample("theta", dist.Normal(0.0, jnp.where(delta == 1, rho1 ** -0.5, rho0 ** -0.5)).to_event(1))
    beta = theta * delta
    with numpyro.plate("data", N, subsample_size=min(subsample_size, N)):
        Xb = numpyro.subsample(jnp.reshape(X, (N, 64)), event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        h = lenet_logits(conv, beta, Xb)
        numpyro.sample("y", dist.Categorical(logits=h), obs=yb)


def lenet_logits(conv: dict, beta, X, dropout_key=None, rate: float = 0.5):
    """The class logits (n, 10) of :func:`lenet_spike_slab`'s network: convolution weights
    ``conv`` (``conv1``, ``conv1_bias``, ``conv2``, ``conv2_bias``), fully connected weights and
    biases ``beta`` (p,) in :data:`LENET_LAYERS` order, images ``X`` (n, 64).  With
    ``dropout_key``, inverted dropout at ``rate`` before each fully connected layer."""
    h = _convolve_pool(jnp.reshape(X, (-1, 8, 8, 1)), conv["conv1"], conv["conv1_bias"])
    h = _convolve_pool(h, conv["conv2"], conv["conv2_bias"]).reshape(h.shape[0], -1)
    start = 0
    for k, (a, b) in enumerate(LENET_LAYERS):
        if dropout_key is not None:
            dropout_key, sub = jax.random.split(dropout_key)
            h = h * jax.random.bernoulli(sub, 1.0 - rate, h.shape) / (1.0 - rate)
        W, bias = beta[start:start + a * b].reshape(a, b), beta[start + a * b:start + a * b + b]
        start += a * b + b
        h = h @ W + bias
        h = jax.nn.relu(h) if k < len(LENET_LAYERS) - 1 else h
    return h


def lenet_full_start(seed: int = 0) -> dict:
    """The start of Atchadé & Wang's network run: every indicator 1, weights Glorot-uniform
    (U(±√(6 / (fan in + fan out))), the default of most frameworks), biases 0 — the values
    for ``init_strategy=init_to_value(values=lenet_full_start())``."""
    rng = np.random.default_rng(seed)

    def glorot(shape, fan_in, fan_out):
        return (rng.uniform(-1.0, 1.0, shape) * np.sqrt(6.0 / (fan_in + fan_out))).astype(np.float32)

    values = {}
    for name, (kh, kw, cin, cout) in _CONVOLUTIONS.items():
        values[name] = glorot((kh, kw, cin, cout), kh * kw * cin, kh * kw * cout)
        values[name + "_bias"] = np.zeros(cout, np.float32)
    theta = [part for a, b in LENET_LAYERS for part in (glorot(a * b, a, b), np.zeros(b, np.float32))]
    values["theta"] = np.concatenate(theta)
    values["delta"] = np.ones(_num_coefficients(), np.int32)
    return values
