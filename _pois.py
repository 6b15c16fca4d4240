import time, sys, jax, jax.numpy as jnp, numpy as np
from numpyro.infer import MCMC
import numpyro_sg as nsg
from numpyro_sg.datasets.mixed import glmm_random_intercept_model, simulate_glmm_random_intercept
x, y, m = simulate_glmm_random_intercept(G=400, rows=5, tau=1.0, seed=1)
args = (x, y, m, 20)
t = time.time()
ref = nsg.nuts_reference(glmm_random_intercept_model, *args, num_warmup=500, num_samples=1000, progress_bar=False, ksd_draws=None, cache_dir="/tmp/i24/cache")
print("nuts", time.time() - t, flush=True)
for v in ("alpha", "beta", "tau"):
    print(v, float(ref.posterior[v].mean()), float(ref.posterior[v].std()))
kname = sys.argv[1] if len(sys.argv) > 1 else "SGLD"
t = time.time()
mc = MCMC(getattr(nsg, kname)(glmm_random_intercept_model), num_warmup=1000, num_samples=5000, progress_bar=False)
mc.run(jax.random.PRNGKey(0), *args)
s = mc.get_samples(); print(kname, time.time() - t, flush=True)
for v in ("alpha", "beta", "tau"):
    print(v, float(s[v].mean()), float(s[v].std()))
t = time.time()
idata = nsg.to_inference_data(mc, ksd=False)
print("idata", time.time() - t, idata.groups())
bm = idata.local_posterior["b_mean"].values; bs = idata.local_posterior["b_sd"].values
rm = ref.posterior["b"].mean(("chain", "draw")).values; rs = ref.posterior["b"].std(("chain", "draw")).values
err = np.abs(bm - rm) / rs
print("locals |mean err|/sd median, p99:", np.median(err), np.quantile(err, 0.99), "sd ratio median", np.median(bs / rs), np.quantile(np.abs(bs/rs-1), 0.9))
