"""Out-of-core SGLD: a logistic regression read from ``.npy`` files on disk
(:class:`numpyro_sg.infer.disk_rows.NpyRows`) against the same arrays in memory.

Problem: N rows × d = 20 features (float32, simulated with a fixed seed, written in chunks of
10⁵ rows so the writer never holds the array), mini-batch n = 1,000, SGLD with its defaults
(warmup: mode search with full-data passes in chunks of 65,536 rows, Laplace preconditioner,
control variates).  Each setup runs in its own process and reports:

* ``seconds`` of ``MCMC.run`` (warmup and compilation included);
* ``it/s`` of sampling alone: a second ``run`` of ``num_samples`` iterations from the first
  run's last state, compiled already, so that only the iterations are timed;
* ``peak_mb``: the process's peak anonymous memory (RssAnon, polled every 5 ms; the page cache's
  file pages are shared and reclaimable, not the process's memory);
* the posterior means and sds, compared between the two setups.

Usage::

    python benchmarks/bench_big_data.py --rows 2000000          # 168 MB of files
    python benchmarks/bench_big_data.py --rows 10000000         # 840 MB, both setups
    python benchmarks/bench_big_data.py --rows 50000000 --disk-only --dir /data   # 4.2 GB
    python benchmarks/bench_big_data.py --rows 50000000 --parquet --dir /data     # + Parquet, in memory

``--parquet`` also writes the rows as a Parquet file (row groups of 10⁶ rows), converts it
back with :func:`~numpyro_sg.infer.disk_rows.npy_from_parquet` in its own process (``convert``:
seconds, peak memory) and samples from the converted files.

Measured (2-core machine): ``--rows 50000000 --parquet``: Parquet 4.4 GB, converted in 20 s at a
peak of 317 MB; from disk 117 s, 981 it/s, peak 655 MB; in memory 399 s, 963 it/s, peak
12.6 GB; identical draws (throughput ratio 1.02).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from disk_checks import Peak, write  # noqa: E402


def run(mode: str, folder: str, num_samples: int) -> dict:
    """One setup, in this process."""
    import jax
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC

    import numpyro_sg as nsg
    from numpyro_sg.infer.disk_rows import NpyRows

    def on_disk(X, y):
        theta = numpyro.sample("theta", dist.Normal(0, 3).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.num_rows, subsample_size=1000) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X(idx) @ theta), obs=y(idx))

    def in_memory(X, y):
        theta = numpyro.sample("theta", dist.Normal(0, 3).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=1000):
            logits = numpyro.subsample(X, event_dim=1) @ theta
            numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))

    peak = Peak()
    peak.start()
    if mode == "disk":
        model, args = on_disk, (NpyRows(f"{folder}/X.npy"), NpyRows(f"{folder}/y.npy"))
    else:
        model, args = in_memory, (np.load(f"{folder}/X.npy"), np.load(f"{folder}/y.npy"))
    mcmc = MCMC(nsg.SGLD(model), num_warmup=1000, num_samples=num_samples, progress_bar=False,
                jit_model_args=True)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), *args)
    seconds = time.perf_counter() - start
    draws = np.asarray(mcmc.get_samples()["theta"], np.float64)
    mcmc.post_warmup_state = mcmc.last_state
    start = time.perf_counter()
    mcmc.run(mcmc.post_warmup_state.rng_key, *args)
    rate = num_samples / (time.perf_counter() - start)
    peak.running = False
    return {"seconds": seconds, "it/s": rate, "peak_mb": peak.peak,
            "mean": draws.mean(0).tolist(), "sd": draws.std(0).tolist()}


def write_parquet(folder: str, rows_per_group: int = 1_000_000):
    """``folder/data.parquet`` (columns x0 … x19, y) from the ``.npy`` files, one row group at a
    time (pyarrow; memory O(rows_per_group))."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    X, y = np.load(f"{folder}/X.npy", mmap_mode="r"), np.load(f"{folder}/y.npy", mmap_mode="r")
    names = [f"x{j}" for j in range(X.shape[1])] + ["y"]
    schema = pa.schema([(n, pa.float32()) for n in names])
    with pq.ParquetWriter(f"{folder}/data.parquet", schema) as writer:
        for s in range(0, len(y), rows_per_group):
            cols = [np.ascontiguousarray(X[s:s + rows_per_group, j]) for j in range(X.shape[1])]
            writer.write_table(pa.table(cols + [np.asarray(y[s:s + rows_per_group])], schema=schema))


def convert(folder: str) -> dict:
    """``npy_from_parquet`` of ``folder/data.parquet`` into ``folder/pq/{X,y}.npy``, with its peak
    anonymous memory (in this process)."""
    import pyarrow.parquet as pq

    from numpyro_sg.infer.disk_rows import npy_from_parquet

    Path(f"{folder}/pq").mkdir(exist_ok=True)
    names = [n for n in pq.ParquetFile(f"{folder}/data.parquet").schema_arrow.names if n != "y"]
    peak = Peak()
    peak.start()
    start = time.perf_counter()
    npy_from_parquet(f"{folder}/data.parquet", names, f"{folder}/pq/X.npy")
    npy_from_parquet(f"{folder}/data.parquet", "y", f"{folder}/pq/y.npy")
    peak.running = False
    return {"seconds": time.perf_counter() - start, "peak_mb": peak.peak}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--dir", default=None, help="folder for the files (default: a temporary one)")
    parser.add_argument("--disk-only", action="store_true",
                        help="skip the in-memory run (when the data do not fit in memory)")
    parser.add_argument("--parquet", action="store_true",
                        help="also write the data as Parquet, convert it back with npy_from_parquet "
                             "(its peak memory reported) and sample from the converted files")
    parser.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp()
    if args.mode:
        out = convert(folder) if args.mode == "convert" else run(args.mode, folder, args.samples)
        print(json.dumps(out))
        return
    import disk_checks

    disk_checks.N = args.rows
    start = time.perf_counter()
    write(folder)
    results = {"rows": args.rows, "file_mb": args.rows * 21 * 4 / 2**20,
               "write_seconds": time.perf_counter() - start}

    def in_subprocess(mode, where=folder):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--dir", where, "--rows",
                              str(args.rows), "--samples", str(args.samples)],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    disk_folder = folder
    if args.parquet:
        start = time.perf_counter()
        write_parquet(folder)
        results["parquet_write_seconds"] = time.perf_counter() - start
        results["parquet_mb"] = Path(f"{folder}/data.parquet").stat().st_size / 2**20
        results["convert"] = in_subprocess("convert")
        disk_folder = f"{folder}/pq"   # the disk run reads the files converted from Parquet
    results["disk"] = in_subprocess("disk", disk_folder)
    if not args.disk_only:
        results["memory"] = in_subprocess("memory")
    if args.disk_only:
        print(json.dumps(results, indent=1))
        return
    d, m = results["disk"], results["memory"]
    sd = np.array(m["sd"])
    results["mean_diff_sd"] = float(np.max(np.abs(np.array(d["mean"]) - m["mean"]) / sd))
    results["sd_ratio_range"] = [float(np.min(np.array(d["sd"]) / sd)), float(np.max(np.array(d["sd"]) / sd))]
    results["throughput_ratio"] = d["it/s"] / m["it/s"]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
