"""One process of a multi-process run (``tests/test_sharding.py``): ``python
tests/multiprocess_checks.py PROCESS_ID NUM_PROCESSES PORT OUT.npy``.

With NUM_PROCESSES = 2 each process owns one CPU device and half of the rows
(``jax.distributed.initialize`` + ``jax.make_array_from_process_local_data``); with 1 the
process has two forced devices and places the same rows with ``jax.device_put``.  Every
process calls ``to_inference_data``; process 0 saves SGLD's draws to OUT.npy and the KSD and
group names to OUT.npy.json.
"""

import json
import os
import sys

process_id, num_processes, port, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={1 if num_processes > 1 else 2}"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

if num_processes > 1:
    jax.distributed.initialize(f"localhost:{port}", num_processes=num_processes, process_id=process_id)

import numpyro_sg as nsg  # noqa: E402
from numpyro_sg.arviz_compat import group_names  # noqa: E402
from numpyro_sg.results import inference_data  # noqa: E402
from sharded_checks import data, logistic  # noqa: E402

X, y = data()
mesh = jax.make_mesh((2,), ("data",))
rows = NamedSharding(mesh, P("data"))
if num_processes > 1:
    mine = slice(process_id * len(X) // 2, (process_id + 1) * len(X) // 2)
    args = (jax.make_array_from_process_local_data(rows, X[mine]),
            jax.make_array_from_process_local_data(rows, y[mine]))
else:
    args = (jax.device_put(X, rows), jax.device_put(y, rows))
mcmc = MCMC(nsg.SGLD(logistic), num_warmup=200, num_samples=300, num_chains=2,
            chain_method="vectorized", progress_bar=False, jit_model_args=True)
mcmc.run(jax.random.PRNGKey(0), *args)
draws = np.asarray(mcmc.get_samples()["theta"])
idata = nsg.to_inference_data(mcmc, ksd_draws=100)   # on every process: the KSD's scores are collective
# the default ksd_draws' time budget, spent at once on process 1 only: process 0's decision to go on
# holds on both (else process 0 would wait forever for process 1's next block)
if process_id == 1:
    inference_data.MIN_KSD_SECONDS = 0.0
auto = nsg.to_inference_data(mcmc, sampling_time=0.0 if process_id == 1 else None)
if jax.process_index() == 0:
    np.save(out_path, draws)
    with open(out_path + ".json", "w") as f:
        json.dump({"ksd": float(idata.sample_stats.attrs["ksd"]), "groups": sorted(group_names(idata)),
                   "auto_draws": int(auto.sample_stats.attrs["ksd_draws_per_chain"])}, f)
