"""The convergence diagnostics of a network-sized posterior: vectorised against ArviZ 0.x's loop.

``numpyro_sg.diagnostics.chain_statistics.summary_diagnostics`` (the columns ``mcse_mean``,
``mcse_sd``, ``ess_bulk``, ``ess_tail``, ``r_hat`` of ``arviz.summary``, all coordinates at
once) on ``--coordinates`` autocorrelated coordinates × 4 chains × 2,000 draws, against
``arviz.summary(kind="diagnostics")`` on a twentieth of them, scaled by 20 (ArviZ 0.x's cost is
per coordinate).  Prints both times and their ratio, and the largest relative difference of
the twentieth both computed; then the whole table: ``numpyro_sg.posterior_summary`` against
``arviz.summary`` (its statistics columns measured, its diagnostics as above).

    python benchmarks/bench_summary.py --coordinates 3760
"""

from __future__ import annotations

import argparse
import time
import warnings

import arviz as az
import numpy as np

import numpyro_sg as nsg
from numpyro_sg.arviz_compat import from_dict
from numpyro_sg.diagnostics.chain_statistics import summary_diagnostics


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinates", type=int, default=3760)
    args = parser.parse_args()
    if int(az.__version__.split(".")[0]) >= 1:
        raise SystemExit("this benchmark compares with ArviZ 0.x's per-coordinate loop")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 2000, args.coordinates)).cumsum(axis=1) * 0.05 + rng.normal(size=(4, 2000, args.coordinates))
    start = time.perf_counter()
    ours = summary_diagnostics(x)
    vectorised = time.perf_counter() - start
    part = x[:, :, : max(args.coordinates // 20, 1)]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = az.summary({"x": part}, kind="diagnostics", round_to="none")
    loop = (time.perf_counter() - start) * x.shape[2] / part.shape[2]
    diff = max(float(np.max(np.abs(ours[c][: part.shape[2]] - ref[c].to_numpy()) / np.abs(ref[c].to_numpy())))
               for c in ours)
    print(f"{args.coordinates:,} coordinates: vectorised {vectorised:.1f} s, ArviZ loop {loop:.1f} s "
          f"(scaled from {part.shape[2]}), ratio {loop / vectorised:.1f}x; largest relative difference {diff:.1e}")
    idata = from_dict(posterior={"x": x})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        nsg.posterior_summary(idata)
        table = time.perf_counter() - start
        start = time.perf_counter()
        az.summary(idata, kind="stats")
        stats = time.perf_counter() - start
    print(f"whole table: posterior_summary {table:.1f} s, az.summary {stats + loop:.1f} s (its statistics "
          f"columns {stats:.1f} s, measured, + the diagnostics loop, scaled), ratio {(stats + loop) / table:.1f}x")


if __name__ == "__main__":
    main()
