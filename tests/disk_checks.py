"""One run of ``tests/test_disk_rows.py`` in its own process: ``python tests/disk_checks.py
MODE DIR`` with MODE ``write`` (a logistic-regression data set as ``X.npy``, ``y.npy`` in DIR),
``disk`` (SGLD reading the rows from the files, :class:`numpyro_sg.infer.disk_rows.NpyRows`) or
``memory`` (the same arrays loaded in memory) or ``convert`` (the files written as Parquet and
streamed back by ``npy_from_parquet``); prints the peak anonymous memory (MB, the
process's own memory: file pages in the page cache are not counted) and saves the draws."""

import json
import sys
import threading
import time

import numpy as np

N, D, CHUNK = 2_000_000, 20, 100_000


def write(folder):
    rng = np.random.default_rng(0)
    X = np.lib.format.open_memmap(f"{folder}/X.npy", "w+", np.float32, (N, D))
    y = np.lib.format.open_memmap(f"{folder}/y.npy", "w+", np.float32, (N,))
    beta = rng.normal(size=D) / np.sqrt(D)
    for s in range(0, N, CHUNK):
        xb = rng.normal(size=(min(N, s + CHUNK) - s, D)).astype(np.float32)
        X[s:s + len(xb)] = xb
        y[s:s + len(xb)] = rng.random(len(xb)) < 1 / (1 + np.exp(-xb @ beta))
    X.flush()
    y.flush()


def anonymous_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Peak(threading.Thread):
    """Polls the process's anonymous memory every 5 ms."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.running = anonymous_mb(), True

    def run(self):
        while self.running:
            self.peak = max(self.peak, anonymous_mb())
            time.sleep(0.005)


def sample(mode, folder):
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
    start = time.perf_counter()
    if mode == "disk":
        model, args = on_disk, (NpyRows(f"{folder}/X.npy"), NpyRows(f"{folder}/y.npy"))
    else:
        model, args = in_memory, (np.load(f"{folder}/X.npy"), np.load(f"{folder}/y.npy"))
    mcmc = MCMC(nsg.SGLD(model), num_warmup=500, num_samples=1000, progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.PRNGKey(0), *args)
    draws = np.asarray(mcmc.get_samples()["theta"])
    seconds = time.perf_counter() - start
    peak.running = False
    np.save(f"{folder}/{mode}.npy", draws)
    return {"peak_mb": peak.peak, "seconds": seconds, "file_mb": (N * D + N) * 4 / 2**20}


def convert(folder):
    """``X.npy`` and ``y.npy`` written as one Parquet file (row groups of 100,000 rows), then
    streamed back with ``npy_from_parquet`` in a fresh measurement: its peak anonymous memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from numpyro_sg.infer.disk_rows import npy_from_parquet

    X, y = np.load(f"{folder}/X.npy", mmap_mode="r"), np.load(f"{folder}/y.npy", mmap_mode="r")
    names = [f"x{j}" for j in range(D)]
    schema = pa.schema([(n, pa.float32()) for n in names + ["y"]])
    with pq.ParquetWriter(f"{folder}/data.parquet", schema) as writer:
        for s in range(0, N, 100_000):
            cols = [np.ascontiguousarray(X[s:s + 100_000, j]) for j in range(D)]
            writer.write_table(pa.table(cols + [np.asarray(y[s:s + 100_000])], schema=schema))
    del writer
    before = anonymous_mb()
    peak = Peak()
    peak.start()
    npy_from_parquet(f"{folder}/data.parquet", names, f"{folder}/Xp.npy")
    peak.running = False
    same = bool(np.array_equal(np.load(f"{folder}/Xp.npy", mmap_mode="r"), X))
    return {"before_mb": before, "peak_mb": peak.peak, "file_mb": N * D * 4 / 2**20, "same": same}


if __name__ == "__main__":
    mode, folder = sys.argv[1], sys.argv[2]
    fn = {"write": write, "convert": convert}.get(mode)
    print(json.dumps(fn(folder) if fn else sample(mode, folder)))
