"""Bayesian logistic regression on 100,000 data points with SGLD and SGBD, as they come.

    python examples/logistic_regression.py                 # writes logistic_regression.png
    python examples/logistic_regression.py --num-data 20000 --out /tmp/trace.png

Both kernels run with their defaults — no step size to choose: the warmup finds the mode,
the Laplace preconditioner and the control-variate anchor, and four chains start from draws
of the Laplace approximation — on 1% mini-batches.  The script prints an ArviZ summary per
kernel beside the true coefficients, what the warmup found and how long it took, and saves
a trace plot of both runs (marginal histograms and the first chain's trace) to ``--out``.
"""

import argparse

import arviz as az
import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import numpyro_sg as nsg  # noqa: E402
from numpyro_sg.datasets import logistic_regression_model, simulate_logistic_regression  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--num-samples", type=int, default=2000)
    parser.add_argument("--out", default="logistic_regression.png")
    args = parser.parse_args(argv)

    N = args.num_data
    X, y, theta_true = simulate_logistic_regression(N, dim=5, seed=1)
    n = max(N // 100, 1)
    kernels = {"SGLD": nsg.SGLD(logistic_regression_model), "SGBD": nsg.SGBD(logistic_regression_model)}
    runs = {}
    for i, (name, kernel) in enumerate(kernels.items()):
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=args.num_samples, num_chains=4,
                    chain_method="vectorized")
        mcmc.run(jax.random.PRNGKey(i), X, y, subsample_size=n, extra_fields=("step_size",))
        idata = nsg.to_inference_data(mcmc)
        runs[name] = idata
        fit = kernel.mode_fit
        print(f"\n{name}: the warmup's mode search took {fit.seconds:.1f} s ({fit.newton_steps} "
              f"Newton steps, converged: {fit.converged}); Laplace sds {np.round(fit.scales, 4)}")
        table = az.summary(idata, var_names=["theta"])
        table.insert(0, "true", theta_true)
        print(table.to_string())

    fig, axes = plt.subplots(2, 2, figsize=(10, 6), squeeze=False)
    for row, (name, idata) in enumerate(runs.items()):
        theta = idata.posterior["theta"].values  # (chain, draw, coordinate), any ArviZ version
        for j in range(theta.shape[-1]):
            axes[row, 0].hist(theta[..., j].ravel(), bins=60, density=True, histtype="step")
            axes[row, 1].plot(theta[0, :, j], lw=0.5)
        axes[row, 0].set_title(f"{name} (defaults): theta")
        axes[row, 1].set_title(f"{name}: trace")
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"\nTrace plot written to {args.out}")


if __name__ == "__main__":
    main()
