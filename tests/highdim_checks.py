"""One run of ``tests/test_ksd_var_names.py``'s large-d check in its own process:
``python tests/highdim_checks.py DRAWS [all]``.

BPMF on a simulated 2,000 × 3,000 rank-10 ratings matrix (d = 50,040 unconstrained
coordinates, 160,000 training ratings), 1,000 draws of plain SGLD (no warmup: the check is
about the diagnostics, not the chain), then ``to_inference_data`` with DRAWS scored draws and
per-coordinate KSD with ``var_names`` (the hyperparameters, 40 coordinates).  Prints a JSON
line: the growth of the process's peak anonymous memory over the diagnostics (MB), their
seconds, and what the groups hold.  With ``all``, ``to_inference_data`` without
``var_names`` (every coordinate), for comparison."""

import json
import sys
import time
import warnings
from functools import partial

import jax
import numpy as np
from numpyro.infer import MCMC

import numpyro_sg as nsg
from numpyro_sg import datasets as ds

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from disk_checks import Peak, anonymous_mb  # noqa: E402

VAR_NAMES = ["mu_u", "prec_u", "mu_v", "prec_v"]


def main(draws: int, every_site: bool):
    data = ds.simulate_ratings(2000, 3000, 10, 200_000, 0.5, seed=0)
    model = partial(ds.bpmf_model, **data.model_kwargs(rank=10, subsample_size=1000,
                                                       noise_precision=4.0))
    kernel = nsg.SGLD(model, step_size=1e-5, preconditioner=None, gradient="plain")
    mcmc = MCMC(kernel, num_warmup=0, num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *data.model_args())
    jax.block_until_ready(mcmc.get_samples())
    var_names = None if every_site else VAR_NAMES
    peak = Peak()
    before = anonymous_mb()
    peak.start()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a 1,000-step chain from the prior start is far off
        idata = nsg.to_inference_data(mcmc, var_names=var_names, ksd_draws=draws)
        per_coordinate = nsg.ksd(idata, var_names=["mu_u", "prec_u"], per_coordinate=True)
        fresh = nsg.ksd(mcmc, var_names="prec_v", max_draws=draws)
    seconds = time.perf_counter() - start
    peak.running = False
    print(json.dumps(dict(
        d=sum(int(np.size(v[0])) for v in mcmc.get_samples().values()),
        growth_mb=round(peak.peak - before, 1), seconds=round(seconds, 1),
        posterior=sorted(idata.posterior.data_vars), coordinates=int(idata.stein.sizes["coordinate"]),
        per_coordinate=int(np.size(per_coordinate)), ksd=float(idata.sample_stats.attrs["ksd"]),
        finite=bool(np.all(np.isfinite(per_coordinate)) and np.isfinite(fresh)),
        ksd_seconds=round(float(idata.sample_stats.attrs["ksd_seconds"]), 1))), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "all")
