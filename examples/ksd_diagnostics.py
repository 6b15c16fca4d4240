"""Check stochastic-gradient chains with the kernel Stein discrepancy and against NUTS.

    python examples/ksd_diagnostics.py                        # writes ksd_vs_time.png
    python examples/ksd_diagnostics.py --out docs/images/ksd_vs_time.png

A logistic regression (N = 20,000, d = 5, prior N(0, 10²); posterior sd ≈ 0.02) is sampled
by NUTS on the full data (the ground truth, :func:`numpyro_sg.nuts_reference`) and by four
stochastic-gradient chains on 10% mini-batches: the papers' SGLD with a small step, with a
step 20× too large, the papers' corrected SGBD with its adaptive step, and SGLD with the
package's defaults (warmup mode search, Laplace preconditioner, control variates).  For each chain the script prints
the KSD that :func:`numpyro_sg.to_inference_data` stores, the comparison table with NUTS
(:func:`numpyro_sg.compare_to_reference`: mean error in NUTS sds, relative sd error, ξ(σ̂), KSD of both
on NUTS's scale) and the KSD of the papers' raw form, then plots KSD against sampling time
for every run on one common scale (:func:`numpyro_sg.plot_ksd_path`).
"""

import argparse
import time

import jax
import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
from numpyro.infer import MCMC, init_to_uniform  # noqa: E402

import numpyro_sg as nsg  # noqa: E402
from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=20_000)
    parser.add_argument("--num-samples", type=int, default=4000)
    parser.add_argument("--out", default="ksd_vs_time.png")
    parser.add_argument("--cache-dir", default=None, help="cache the NUTS reference here")
    args = parser.parse_args(argv)

    N = args.num_data
    X, y, theta_true = simulate_logistic_regression(N, dim=5, seed=0)
    n = N // 10
    ref = nsg.nuts_reference(logistic_regression_model, X, y, num_warmup=500, num_samples=1000,
                             cache_dir=args.cache_dir, progress_bar=False)
    print(f"NUTS (full data): {ref.posterior.attrs['sampling_time']:.1f} s, "
          f"KSD {ref.sample_stats.attrs['ksd']:.3f}")
    # the papers' kernels (absolute step sizes, plain gradients, NumPyro's random start) ...
    classic = dict(preconditioner=None, gradient="plain", init_strategy=init_to_uniform)
    kernels = {
        "SGLD ε = 0.2/N": nsg.SGLD(logistic_regression_model, step_size=0.2 / N, **classic),
        "SGLD ε = 4/N (too large)": nsg.SGLD(logistic_regression_model, step_size=4.0 / N, **classic),
        "c-SGBD adaptive": nsg.SGBD(logistic_regression_model, step_size=1 / np.sqrt(N),
                                    variant="corrected", adapt_step_size="always", **classic),
        # ... and the package's defaults (warmup mode search, Laplace preconditioner, CV)
        "SGLD (defaults)": nsg.SGLD(logistic_regression_model),
    }
    # untimed warm-up: JAX's one-time start-up costs would otherwise be charged to the first run
    MCMC(nsg.SGLD(logistic_regression_model, step_size=0.2 / N, **classic), num_warmup=10,
         num_samples=10, progress_bar=False).run(jax.random.PRNGKey(0), X, y, subsample_size=n)
    runs = {}
    for i, (name, kernel) in enumerate(kernels.items()):
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=args.num_samples, progress_bar=False)
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(i + 1), X, y, subsample_size=n)
        jax.block_until_ready(mcmc.get_samples())
        idata = nsg.to_inference_data(mcmc, sampling_time=time.perf_counter() - start)
        runs[name] = idata
        table = nsg.compare_to_reference(idata, ref)
        stats = idata.sample_stats.attrs
        print(f"\n{name}: {idata.posterior.attrs['sampling_time']:.1f} s; KSD {stats['ksd']:.3f} "
              f"(own sd), {table.attrs['ksd']:.3f} on NUTS's scale (NUTS {table.attrs['ksd_reference']:.3f}), "
              f"raw form {nsg.ksd(idata, preconditioner=None):.1f}; ξ(σ̂) = {table.attrs['xi_sd']:.2f}")
        print(table[["mean", "ref_mean", "mean_err", "sd_rel_err", "ess_per_s", "ref_ess_per_s"]]
              .round(3).to_string())
    ax = nsg.plot_ksd_path(runs, x="time", reference=ref)
    ax.set_title(f"Logistic regression, N = {N:,}, 10% mini-batches")
    ax.axhline(ref.sample_stats.attrs["ksd"], color="k", ls=":", lw=1)
    ax.text(ax.get_xlim()[0], ref.sample_stats.attrs["ksd"], " NUTS, 1,000 draws", va="bottom", fontsize=8)
    ax.figure.tight_layout()
    ax.figure.savefig(args.out, dpi=110)
    print(f"\nKSD-versus-time plot written to {args.out}")


if __name__ == "__main__":
    main()
