import jax; jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
from numpyro.infer.util import potential_energy, initialize_model
from numpyro_sg.infer.model_info import trace_model
from numpyro_sg.locals import integrate_locals, pad_groups
from numpyro_sg.infer.handlers import with_indices

rng = np.random.default_rng(0)
G = 30
sizes = rng.integers(1, 8, G)
grp = np.repeat(np.arange(G), sizes)
x = rng.normal(size=grp.size)
b = rng.normal(size=(G, 2)) * [0.7, 0.3]
y = 1.0 + b[grp, 0] + (0.5 + b[grp, 1]) * x + 0.4 * rng.normal(size=grp.size)
_, X, Y, M = pad_groups(grp, x, y)

def model(X, Y, M, n=None):
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0).expand([2]).to_event(1))
    with numpyro.plate("groups", X.shape[0], subsample_size=n or X.shape[0]):
        b = numpyro.sample("b", dist.Normal(0, tau).to_event(1))
        xb, yb, mb = (numpyro.subsample(a, event_dim=1) for a in (X, Y, M))
        mu = beta[0] + b[:, :1] + (beta[1] + b[:, 1:]) * xb
        numpyro.sample("y", dist.Normal(mu, sigma).mask(mb).to_event(1), obs=yb)

def exact(X, Y, M, n=None):
    beta = numpyro.sample("beta", dist.Normal(0, 10).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0).expand([2]).to_event(1))
    tot = 0.0
    for g in range(X.shape[0]):
        m = np.asarray(M[g]); xg = X[g][m]; yg = Y[g][m]
        Z = jnp.stack([jnp.ones_like(xg), xg], 1)
        cov = Z @ jnp.diag(tau**2) @ Z.T + sigma**2 * jnp.eye(len(xg))
        tot = tot + dist.MultivariateNormal(beta[0] + beta[1] * xg, cov).log_prob(yg)
    numpyro.factor("lik", tot)

args = (jnp.asarray(X), jnp.asarray(Y), jnp.asarray(M))
info = trace_model(model, args)
mm = integrate_locals(model, info, args)
print(mm, mm.sites)
params = {"beta": jnp.array([0.8, 0.3]), "sigma": jnp.log(0.5), "tau": jnp.log(jnp.array([0.6, 0.4]))}
f1 = lambda p: -potential_energy(with_indices(mm, {"groups": jnp.arange(G)}), args, {}, p)
f2 = lambda p: -potential_energy(exact, args, {}, p)
v1, g1 = jax.value_and_grad(f1)(params); v2, g2 = jax.value_and_grad(f2)(params)
print(v1, v2)
print(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), g1, g2))
