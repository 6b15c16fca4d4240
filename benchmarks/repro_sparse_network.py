"""Atchadé & Wang (2023), §4.3 (Figs. 15–16, Table 2), on scikit-learn's digits (one process).

    python benchmarks/repro_sparse_network.py                     # the table in docs/reproductions.md
    python benchmarks/repro_sparse_network.py --iterations 4000   # quick

The paper runs its sparse asynchronous SGLD (Algorithm 3) on a LeNet-5 with ReLU units on
Fashion-MNIST, the convolutions kept and the fully connected layers under the spike-and-slab
prior (u = 50, ρ0 = n, ρ1 = 1), step γ = 10⁻⁷, J = 1,000 indicators per iteration of p = 298,650,
mini-batches of 100, from the full model (every weight in, default initial values), 250,000
iterations of which the first 150,000 are burn-in; every 100 iterations it records the test
accuracy of a draw's sampled predictions, overall and per class, and the fraction of weights
kept.  It reports 1.00 % of the weights kept at 86.5 % accuracy, against 88.65 % for Monte
Carlo dropout.

Here: :func:`numpyro_sg.datasets.networks.lenet_spike_slab` (two 3×3 convolutions, fully connected
64–120–84–10, p = 18,814 sparsified weights) on the 8×8 digits (1,437 training and 360 test
images) with the paper's settings scaled to this data: u = 1.5 (the paper's size penalty per
image per weight, u·log p / n ≈ 0.01), J = 63 (the paper's share of p redrawn per iteration),
ε = 3·10⁻⁵ (``step_size`` is the absolute ε = 2γ of this kernel; the paper's γ on 42× fewer
images moves too little in the iterations run here, and ε = 10⁻⁴ is too large once the network
is sparse: its accuracy fell to 40 % at times), the same 60 % burn-in and a statistic every 100
iterations.  Beside it: Monte Carlo dropout (Gal & Ghahramani 2016) on the same network
without the spike-and-slab (dropout 0.5 before each fully connected layer, Adam, the N(0, 1)
prior as weight decay), its accuracy from sampled predictions under 100 dropout masks.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import MCMC, init_to_value

import numpyro_sg as nsg
from numpyro_sg.datasets.networks import lenet_full_start, lenet_logits, lenet_spike_slab, load_digits_split


def test_logits(samples, X):
    """(draws, rows, 10) logits of the test images under each draw (β = θ·δ)."""
    def one(draw):
        tr = trace(substitute(seed(lenet_spike_slab, 0), draw)).get_trace(X, None, subsample_size=X.shape[0])
        return tr["y"]["fn"].logits

    draws = {k: v for k, v in samples.items() if k in ("conv1", "conv1_bias", "conv2", "conv2_bias", "theta", "delta")}
    return jax.lax.map(one, draws)


def sampled_accuracy(logits, y, key):
    """Per draw: overall accuracy and accuracy within each class of predictions drawn from the
    predictive (the paper's ŷ ~ M(F(x))), shapes (draws,) and (draws, 10)."""
    yhat = jax.random.categorical(key, logits)
    hit = np.asarray(yhat == y)
    per_class = np.stack([hit[:, y == g].mean(axis=1) for g in range(10)], axis=1)
    return hit.mean(axis=1), per_class


def sparse_sgld(train, test, args):
    kernel = nsg.SparseAsync(lenet_spike_slab, args.step_size, variant="sgld", update_size=args.update_size,
                             options={"taylor": args.taylor}, init_strategy=init_to_value(values=lenet_full_start()))
    mcmc = MCMC(kernel, num_warmup=0, num_samples=args.iterations, thinning=100, progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(args.seed), *train, extra_fields=("model_size",))
    samples = jax.block_until_ready(mcmc.get_samples())
    seconds = time.perf_counter() - t0
    kept = np.asarray(mcmc.get_extra_fields()["model_size"]) / samples["theta"].shape[-1]
    accuracy, per_class = sampled_accuracy(test_logits(samples, test[0]), test[1], jax.random.PRNGKey(1))
    return seconds, kept, accuracy, per_class


def mc_dropout(train, test, steps=5000, rate=0.5, masks=100):
    """Monte Carlo dropout on the same network: (seconds, accuracy per mask, per class)."""
    (X, y), (Xt, yt) = (tuple(map(jnp.asarray, part)) for part in (train, test))
    values = lenet_full_start()
    params = {k: jnp.asarray(v) for k, v in values.items() if k != "delta"}
    N = X.shape[0]

    def logits(p, x, key):
        return lenet_logits(p, p["theta"], x, dropout_key=key, rate=rate)

    def loss(p, idx, key):
        lp = jax.nn.log_softmax(logits(p, X[idx], key))
        nll = -jnp.mean(jnp.take_along_axis(lp, y[idx, None], 1))
        return nll + sum(jnp.sum(v ** 2) for v in jax.tree_util.tree_leaves(p)) / (2 * N)

    opt = optax.adam(1e-3)

    @jax.jit
    def update(p, s, key):
        k1, k2 = jax.random.split(key)
        g = jax.grad(loss)(p, jax.random.choice(k1, N, (100,), replace=False), k2)
        u, s = opt.update(g, s)
        return optax.apply_updates(p, u), s

    t0 = time.perf_counter()
    state = opt.init(params)
    for key in jax.random.split(jax.random.PRNGKey(2), steps):
        params, state = update(params, state, key)
    out = jax.vmap(lambda k: logits(params, jnp.asarray(Xt), k))(jax.random.split(jax.random.PRNGKey(3), masks))
    seconds = time.perf_counter() - t0
    accuracy, per_class = sampled_accuracy(out, yt, jax.random.PRNGKey(4))
    return seconds, accuracy, per_class


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20_000)
    ap.add_argument("--step-size", type=float, default=3e-5)
    ap.add_argument("--update-size", type=int, default=63)
    ap.add_argument("--taylor", default="sensitive", help="the paper's eq. (6) is 'sensitive'")
    ap.add_argument("--burn-in", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data = load_digits_split()
    train, test = data["train"], data["test"]
    seconds, kept, accuracy, per_class = sparse_sgld(train, test, args)
    burn = int(round(args.burn_in * len(kept)))
    print(f"SA-SGLD: {args.iterations} iterations in {seconds:.1f} s (compile included)")
    print("along the run (every 10th statistic): iteration, accuracy %, weights kept %")
    for i in range(0, len(kept), max(1, len(kept) // 10)):
        print(f"  {(i + 1) * 100:>7}  {100 * accuracy[i]:5.1f}  {100 * kept[i]:6.2f}")
    print(f"after burn-in ({len(kept) - burn} statistics): weights kept {100 * kept[burn:].mean():.2f} % "
          f"({100 * kept[burn:].std():.2f}), accuracy {100 * accuracy[burn:].mean():.1f} % "
          f"({100 * accuracy[burn:].std():.2f})")
    d_seconds, d_accuracy, d_per_class = mc_dropout(train, test)
    print(f"MC dropout: {d_seconds:.1f} s, accuracy {100 * d_accuracy.mean():.2f} % ({100 * d_accuracy.std():.2f})")
    print("per class: median (quartiles) accuracy %, SA-SGLD after burn-in | MC dropout")
    for g in range(10):
        q = np.percentile(per_class[burn:, g], [25, 50, 75]) * 100
        r = np.percentile(d_per_class[:, g], [25, 50, 75]) * 100
        print(f"  {g}: {q[1]:5.1f} ({q[0]:.1f}–{q[2]:.1f}) | {r[1]:5.1f} ({r[0]:.1f}–{r[2]:.1f})")


if __name__ == "__main__":
    main()
