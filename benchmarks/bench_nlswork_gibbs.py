"""The mixed model with the priors of Song, Sun, Ye & Liang (2020) on nlswork: SGLD on mini-batches
of women against a data-augmentation Gibbs sampler, KSD of the fixed effects against time.

    python benchmarks/bench_nlswork_gibbs.py                 # all 4,709 women
    python benchmarks/bench_nlswork_gibbs.py --women 1000    # the first 1,000 (quicker)

The analogue of Figures S1–S2 of Song, Sun, Ye & Liang (2020), 'Extended stochastic gradient MCMC
for large-scale Bayesian variable selection' (supplement, a linear mixed model on MovieLens),
on the ``nlswork`` panel of :mod:`bench_nlswork` (log wage; fixed effects: intercept,
experience, schooling, South; a random intercept and experience slope per woman), with that
paper's priors (after Srivastava et al. 2018):

    y_i = W_i β + Z_i b_i + e_i,  b_i ~ N(0, σ² D),  e_i ~ N(0, σ² I),
    β | σ² ~ N(0, σ² I),  σ² ~ 1/χ²₂,  D ~ inverse-Wishart(q + 2, I_q)   (q = 2)

written in NumPyro with Λ = D⁻¹ ~ Wishart(q + 2, I) (its Cholesky factor is the site
``prec_chol``).  The paper writes the inverse-Wishart's degrees of freedom as p + 2 with p = q
there (Z_i = W_i); here q = 2 random effects against p = 4 fixed ones, and q + 2 is used.

* **SGLD** (defaults): the women's effects integrated out exactly (Gaussian locals), mini-batches
  of 500 women; time = the whole ``MCMC.run`` (mode search, warmup and draws), the path over
  the kept draws placed at a constant cost per iteration after the initialisation.
* **Gibbs** (JAX, one compiled ``lax.scan``): b | β, σ², D (per woman, 2×2 Gaussian), then
  (β, σ²) | b, D (normal–inverse-gamma), then D⁻¹ | b, σ² (Wishart, Bartlett), on all the data
  at each iteration, started as the paper does (least squares for β and σ², D = 0.2 I); time =
  iterations × the measured cost of one (compilation excluded).
* **Reference**: a long Gibbs run (``--reference`` iterations after 1,000 burn-in).

Printed: the KSD path of β for both samplers against wall time (the paper's Σ_j over β's
coordinates of the per-coordinate KSD, one scale for both: the reference's sds), the time each
needs to reach KSD levels, both samplers' errors against the reference for the globals and the
women's effects, and their min-ESS/s over the globals.  Saved: ``docs/images/nlswork_gibbs_ksd.png``
with ``--plot``.

Measured on all 4,709 women (2-core machine loaded by the test suite; pinned stack): SGLD's
globals within 0.10 reference sd and sds within 3 %, the women's effects' median error 0.005 sd;
118 s in all, 84 s of it initialisation.  Gibbs: 1.4 ms per iteration, KSD(β) 0.19 after 2.8 s
(SGLD: 100 s); after 2,000 iterations its σ² and D⁻¹ sds are still 2.0–2.4× the reference's
(start-up transient).  On data this small, full-data Gibbs is the faster sampler; see
docs/local_latents.md for the arithmetic at the paper's 10⁷ ratings.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from bench_nlswork import load
from jax import random
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg.arviz_compat import ess
from numpyro_sg.diagnostics.full_data_scores import ModelScores
from numpyro_sg.diagnostics.ksd import ksd_path

Q = 2   # random effects per woman


def inv2(A):
    """Inverse of a batch of 2×2 matrices (elementwise)."""
    a, b, c, d = A[..., 0, 0], A[..., 0, 1], A[..., 1, 0], A[..., 1, 1]
    det = a * d - b * c
    return jnp.stack([jnp.stack([d, -b], -1), jnp.stack([-c, a], -1)], -2) / det[..., None, None]


def chol2(S):
    """Lower Cholesky factor of a batch of 2×2 SPD matrices (elementwise)."""
    l11 = jnp.sqrt(S[..., 0, 0])
    l21 = S[..., 1, 0] / l11
    l22 = jnp.sqrt(S[..., 1, 1] - l21**2)
    zero = jnp.zeros_like(l11)
    return jnp.stack([jnp.stack([l11, zero], -1), jnp.stack([l21, l22], -1)], -2)


def paper_model(X, experience, wage=None, mask=None, *, subsample_size=None):
    p = X.shape[-1]
    sigma2 = numpyro.sample("sigma2", dist.InverseGamma(1.0, 0.5))           # 1/χ²₂
    beta = numpyro.sample("beta", dist.Normal(0.0, jnp.sqrt(sigma2)).expand([p]).to_event(1))
    prec_chol = numpyro.sample("prec_chol", dist.WishartCholesky(Q + 2.0, scale_tril=jnp.eye(Q)))
    cov = sigma2 * inv2(prec_chol @ prec_chol.T)                              # σ² D
    with numpyro.plate("women", X.shape[0], subsample_size=subsample_size or min(500, X.shape[0] // 4)):
        b = numpyro.sample("b", dist.MultivariateNormal(0.0, scale_tril=chol2(cov)))
        x, e, m = (numpyro.subsample(a, event_dim=a.ndim - 1) for a in (X, experience, mask))
        w = numpyro.subsample(wage, event_dim=1) if wage is not None else None
        mean = x @ beta + b[:, :1] + b[:, 1:] * e
        numpyro.sample("wage", dist.Normal(mean, jnp.sqrt(sigma2)).mask(m).to_event(1), obs=w)


def gibbs_sampler(X, experience, wage, mask):
    """``(init, step)`` of the data-augmentation Gibbs sampler; state (β, σ², Λ = D⁻¹, b)."""
    m = mask.astype(X.dtype)
    Z = jnp.stack([m, experience * m], -1)                                  # (G, R, 2)
    Xm, y = X * m[..., None], wage * m
    G, p, n = X.shape[0], X.shape[-1], m.sum()
    XtX, Xty = jnp.einsum("grp,grq->pq", Xm, Xm), jnp.einsum("grp,gr->p", Xm, y)
    ZtZ, ZtX = jnp.einsum("grk,grl->gkl", Z, Z), jnp.einsum("grk,grp->gkp", Z, Xm)
    Zty = jnp.einsum("grk,gr->gk", Z, y)
    V = jnp.linalg.inv(XtX + jnp.eye(p))
    V_chol = jnp.linalg.cholesky(V)

    def init():
        beta = jnp.linalg.solve(XtX, Xty)
        sigma2 = jnp.sum((y - Xm @ beta) ** 2) / (n - p)
        return beta, sigma2, jnp.eye(Q) / 0.2, jnp.zeros((G, Q))

    def step(state, key):
        beta, sigma2, Lam, _ = state
        k1, k2, k3, k4, k5, k6 = random.split(key, 6)
        A_inv = inv2(ZtZ + Lam)                                             # (G, 2, 2)
        mean = jnp.einsum("gkl,gl->gk", A_inv, Zty - ZtX @ beta)
        b = mean + jnp.einsum("gkl,gl->gk", chol2(sigma2 * A_inv), random.normal(k1, (G, Q)))
        Xtr = Xty - jnp.einsum("gkp,gk->p", ZtX, b)
        resid = y - jnp.einsum("grk,gk->gr", Z, b)
        beta_hat = V @ Xtr
        sse = jnp.sum(resid**2) - Xtr @ beta_hat
        quad = jnp.einsum("gk,kl,gl->", b, Lam, b)
        shape = 1.0 + n / 2 + G * Q / 2
        sigma2 = (0.5 + sse / 2 + quad / 2) / random.gamma(k2, shape)
        beta = beta_hat + jnp.sqrt(sigma2) * V_chol @ random.normal(k3, (p,))
        S = jnp.einsum("gk,gl->kl", b, b)
        L = chol2(inv2(jnp.eye(Q) + S / sigma2))                            # Wishart scale's factor
        df = Q + 2.0 + G
        A = jnp.array([[jnp.sqrt(2 * random.gamma(k4, df / 2)), 0.0],
                       [random.normal(k5), jnp.sqrt(2 * random.gamma(k6, (df - 1) / 2))]])
        Lam = L @ A @ A.T @ L.T                                             # Bartlett
        return (beta, sigma2, Lam, b), (beta, sigma2, chol2(Lam), b)

    return init, step


def run_gibbs(data, iterations: int, seed: int, burn_in: int = 0):
    """Draws of the globals {beta, sigma2, prec_chol} (iterations, …), the women's effects'
    mean and sd over the kept draws, and the seconds per iteration (compilation excluded)."""
    init, step = gibbs_sampler(*(jnp.asarray(a) for a in data))

    @jax.jit
    def chain(state, keys):
        def body(carry, key):
            st, s1, s2 = carry
            st, (beta, sigma2, pc, b) = step(st, key)
            return (st, s1 + b, s2 + b**2), (beta, sigma2, pc)
        zeros = jnp.zeros_like(state[3])
        (st, s1, s2), draws = jax.lax.scan(body, (state, zeros, zeros), keys)
        return st, s1, s2, draws

    state = init()
    if burn_in:
        state = chain(state, random.split(random.PRNGKey(seed + 1), burn_in))[0]
    keys = random.split(random.PRNGKey(seed), iterations)
    compiled = chain.lower(state, keys).compile()
    start = time.perf_counter()
    _, s1, s2, (beta, sigma2, pc) = jax.block_until_ready(compiled(state, keys))
    per_iteration = (time.perf_counter() - start) / iterations
    mean = np.asarray(s1) / iterations
    sd = np.sqrt(np.maximum(np.asarray(s2) / iterations - mean**2, 0.0))
    draws = {"beta": np.asarray(beta), "sigma2": np.asarray(sigma2), "prec_chol": np.asarray(pc)}
    return draws, (mean, sd), per_iteration


def summary(draws: dict) -> dict:
    """Per coordinate: mean, sd, ESS of the globals (beta, sigma2, D⁻¹'s Cholesky factor), from
    draws of shape (chains, draws, …)."""
    cols = {f"beta[{j}]": draws["beta"][..., j] for j in range(draws["beta"].shape[-1])}
    cols["sigma2"] = draws["sigma2"]
    for i, j in [(0, 0), (1, 0), (1, 1)]:
        cols[f"prec_chol[{i},{j}]"] = draws["prec_chol"][..., i, j]
    return {k: (float(np.mean(v)), float(np.std(v)), ess(v)) for k, v in cols.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--women", type=int, default=None, help="use the first N women")
    parser.add_argument("--gibbs", type=int, default=2000, help="Gibbs iterations of the path")
    parser.add_argument("--reference", type=int, default=20000, help="reference Gibbs iterations")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--plot", action="store_true", help="save docs/images/nlswork_gibbs_ksd.png")
    args = parser.parse_args(argv)

    data = load(args.women)
    G = data[0].shape[0]
    print(f"{int(data[3].sum()):,} rows on {G:,} women")

    ref_draws, (ref_b_mean, ref_b_sd), _ = run_gibbs(data, args.reference, seed=1, burn_in=1000)
    ref = summary({k: v[None] for k, v in ref_draws.items()})

    mcmc = MCMC(nsg.SGLD(paper_model), num_warmup=args.warmup, num_samples=args.samples,
                num_chains=1, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(random.PRNGKey(0), *data)
    sgld_seconds = time.perf_counter() - start
    kernel = mcmc.sampler
    sgld_init = kernel.mode_fit.seconds
    sgld = mcmc.get_samples()
    gibbs, (gibbs_b_mean, _), gibbs_per_iter = run_gibbs(data, args.gibbs, seed=0)

    # KSD of β on one scale (the reference's unconstrained sds), scores of the globals' marginal
    scores = ModelScores(kernel.model, data)
    x_ref = scores.unconstrain({k: ref_draws[k][::10] for k in ("beta", "sigma2", "prec_chol")})
    p = data[0].shape[-1]
    scale = x_ref.std(0)[:p]

    def path(draws, times):
        x = scores.unconstrain(draws)
        s = scores.score(x)
        steps, values = ksd_path(x[:, :p], scores=s[:, :p], preconditioner=scale, per_coordinate=True,
                                 num_steps=25)
        return np.asarray(times)[steps - 1], values

    t_sgld = sgld_init + (np.arange(1, args.samples + 1) + args.warmup) * (
        (sgld_seconds - sgld_init) / (args.warmup + args.samples))
    sg_t, sg_k = path({k: np.asarray(sgld[k]) for k in ("beta", "sigma2", "prec_chol")}, t_sgld)
    gb_t, gb_k = path(gibbs, np.arange(1, args.gibbs + 1) * gibbs_per_iter)
    print("KSD path of beta (seconds: KSD)")
    print("  SGLD :", ", ".join(f"{t:.1f}: {k:.3g}" for t, k in zip(sg_t[::3], sg_k[::3])))
    print("  Gibbs:", ", ".join(f"{t:.1f}: {k:.3g}" for t, k in zip(gb_t[::3], gb_k[::3])))
    for level in np.geomspace(max(sg_k.min(), gb_k.min()), min(sg_k.max(), gb_k.max()), 4)[:3]:
        t1 = sg_t[np.argmax(sg_k <= level)] if (sg_k <= level).any() else np.nan
        t2 = gb_t[np.argmax(gb_k <= level)] if (gb_k <= level).any() else np.nan
        print(f"  KSD {level:.3g}: SGLD {t1:.1f} s, Gibbs {t2:.1f} s (ratio {t2 / t1:.2f})")

    sg_sum = summary({k: np.asarray(sgld[k])[None] for k in ("beta", "sigma2", "prec_chol")})
    gb_sum = summary({k: v[None] for k, v in gibbs.items()})
    print(f"{'coordinate':>16} {'reference':>22} {'SGLD err (sd), sd ratio':>26} {'Gibbs err, sd ratio':>22}")
    for name, (mu, sd, _) in ref.items():
        e1, e2 = (sg_sum[name][0] - mu) / sd, (gb_sum[name][0] - mu) / sd
        print(f"{name:>16} {mu:10.4g} ± {sd:9.3g} {e1:14.3f} {sg_sum[name][1] / sd:9.3f} "
              f"{e2:12.3f} {gb_sum[name][1] / sd:9.3f}")
    local = nsg.to_inference_data(mcmc, ksd=False).local_posterior
    sg_err = np.abs(local["b_mean"].values - ref_b_mean) / ref_b_sd
    gb_err = np.abs(gibbs_b_mean - ref_b_mean) / ref_b_sd
    sd_ratio = local["b_sd"].values / ref_b_sd
    print(f"women's effects: SGLD median |error| {np.median(sg_err):.3f} sd (99th percentile "
          f"{np.quantile(sg_err, 0.99):.3f}), sd ratio 5-95% {np.quantile(sd_ratio, 0.05):.3f}-"
          f"{np.quantile(sd_ratio, 0.95):.3f}; Gibbs ({args.gibbs} iterations) median {np.median(gb_err):.3f}")
    sg_ess = min(v[2] for v in sg_sum.values()) / sgld_seconds
    gb_ess = min(v[2] for v in gb_sum.values()) / (args.gibbs * gibbs_per_iter)
    print(f"time: SGLD {sgld_seconds:.1f} s ({sgld_init:.1f} s initialisation) for {args.warmup + args.samples} "
          f"iterations; Gibbs {gibbs_per_iter * 1e3:.2f} ms per iteration. min-ESS/s over the globals: "
          f"SGLD {sg_ess:.3g}, Gibbs {gb_ess:.3g} (compilation excluded)")
    if args.plot:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.loglog(sg_t, sg_k, "o-", ms=3, label="SGLD (mini-batches of 500 women)")
        ax.loglog(gb_t, gb_k, "s-", ms=3, label="Gibbs (data augmentation, all women)")
        ax.set(xlabel="wall time (s)", ylabel="KSD of β", title=f"nlswork, {G:,} women")
        ax.legend()
        fig.savefig(Path(__file__).resolve().parents[1] / "docs" / "images" / "nlswork_gibbs_ksd.png",
                    dpi=100, bbox_inches="tight")


if __name__ == "__main__":
    main()
