"""The guard against jaxlib 0.10.2–0.11's miscompiled CPU fusions (numpyro_sg.infer.cpu_fusion_guard).

Each check runs in a fresh interpreter: XLA reads its flags once, when JAX starts.  On an
affected jaxlib the first check fails without the guard (checked by removing the call from
``numpyro_sg/__init__.py``: a beta-regression log density vectorised over 8 points was off by
up to 8.6 nats per row); on another jaxlib it holds trivially."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from numpyro_sg.infer.cpu_fusion_guard import FLAG, affected

ROOT = Path(__file__).resolve().parents[1]

# a Beta log density (as numpyro's, written out) on 100,000 rows, at 8 points one at a time and vectorised
VECTORISED = """
import numpy as np, jax, jax.numpy as jnp
from jax.scipy.special import gammaln
rng = np.random.default_rng(0)
X = jnp.asarray(rng.standard_normal((100_000, 6)), jnp.float32)
y = jnp.asarray(rng.uniform(0.01, 0.9, 100_000), jnp.float32)
E = jnp.asarray(np.concatenate([rng.normal(0, 0.05, (8, 7)), rng.normal(2.3, 0.02, (8, 1))], 1), jnp.float32)
def f(x):
    mu = jax.nn.sigmoid(x[0] + X @ x[1:7]); phi = jnp.exp(x[7])
    c = jnp.stack([mu * phi, (1 - mu) * phi], -1); v = jnp.stack([y, 1 - y], -1)
    return jnp.sum(jnp.log(v) * (c - 1.0), -1) - (jnp.sum(gammaln(c), -1) - gammaln(jnp.sum(c, -1)))
one = np.stack([np.asarray(jax.jit(f)(E[i])) for i in range(8)])
print(float(np.abs(np.asarray(jax.jit(jax.vmap(f))(E)) - one).max()))
"""


def _python(code: str):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-W", "always::RuntimeWarning", "-c", code], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("user", ["", "import os\nos.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=2')\n",
                                  "import os\nos.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2'\n"])
def test_a_vectorised_log_density_equals_the_one_point_ones_after_import(user):
    """Whatever the user does to XLA_FLAGS after ``import numpyro_sg`` (nothing, ``setdefault``
    or replace, as multi-device recipes do): their devices, the right numbers, and their
    XLA_FLAGS as they set it."""
    code = ("import numpyro_sg\n" + user + VECTORISED
            + "import jax, os\nprint(jax.local_device_count(), repr(os.environ.get('XLA_FLAGS')))")
    out = _python(code)
    assert out.returncode == 0, out.stderr[-2000:]
    error, devices, flags = out.stdout.split("\n")[0], *out.stdout.split("\n")[1].split(" ", 1)
    assert float(error) < 1e-3   # float32 rounding of one row: 1e-5
    assert int(devices) == (2 if user else 1)
    assert flags == (repr("--xla_force_host_platform_device_count=2") if user else "None")


@pytest.mark.skipif(not affected(), reason="only an affected jaxlib is guarded")
def test_a_guard_that_comes_too_late_says_so_and_its_remedy_works():
    before = "import jax; jax.numpy.zeros(1).block_until_ready()\nimport numpyro_sg\n"
    out = _python(before)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "jax-ml/jax/issues/39103" in out.stderr and FLAG in out.stderr
    remedy = _python("import os\nos.environ['XLA_FLAGS'] = " + repr(FLAG) + "\n" + before + VECTORISED)
    assert "jax-ml/jax/issues/39103" not in remedy.stderr, remedy.stderr[-2000:]
    assert float(remedy.stdout.split()[-1]) < 1e-3


def test_which_jaxlib_versions_are_guarded():
    assert [affected(v) for v in ("0.10.1", "0.10.2", "0.11.2", "0.12.0", "0.12.0.1")] == [
        False, True, True, False, False]
