"""The NumPyro ``MCMCKernel`` shell shared by every stochastic-gradient kernel.

A subclass supplies the update maths through two hooks:

* ``_init_extra(flat, noise_sd)`` — kernel-specific state fields at the initial point;
* ``_update(state, flat, key)`` — one move of the flat unconstrained vector using the
  stochastic gradient ``state.z_grad`` and noise estimate ``state.grad_noise_sd`` at it,
  returning ``(new_flat, fields)``.

The shell evaluates the log density, ĝ and (optionally) τ̂ at the *new* point on the next
mini-batch within the same iteration and keeps them in the state for the next move, so a
point whose state, log density or gradient is non-finite is never emitted as an unflagged draw.

The shell does everything else the same way for all kernels: plate discovery and validation,
initial values through NumPyro's ``init_strategy``, index drawing, the iteration counter (it
keeps counting across ``MCMC.warmup()`` then ``MCMC.run()``), vectorised chains, divergence
detection (non-finite state or gradient: the chain is frozen at its last finite state, the
``diverging`` field is ``True`` from then on and a :class:`DivergenceWarning` names the first
diverging iteration), and ``postprocess_fn`` through the full-data model.
"""

from __future__ import annotations

import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.flatten_util import ravel_pytree
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.infer.util import constrain_fn, initialize_model
from numpyro.util import is_prng_key

from numpyro_sg.minibatch import (
    Minibatcher,
    deterministic_in_plates,
    discover_plates,
    full_data,
    with_indices,
)

__all__ = ["SGKernel", "DivergenceWarning", "jit_with_data", "split_init_key", "ema"]


class DivergenceWarning(UserWarning):
    """A chain produced a non-finite state or gradient."""


def _all_finite(x):
    return jnp.all(jnp.isfinite(x))


class SGKernel(MCMCKernel):
    """Base class of the stochastic-gradient kernels (not used directly).

    :param model: a NumPyro model whose likelihood sits in a subsample plate
        (``numpyro.plate(name, N, subsample_size=n)`` with ``numpyro.subsample`` inside).
    :param subsample_size: mini-batch size n to draw, overriding the plate's own (an int, or a
        dict ``{plate_name: n}`` when there are several plates). The N/n scale follows the size
        actually used. Must lie in [1, N].
    :param bool replace: draw indices with replacement (default; O(n) per iteration) or
        without replacement by walking a per-epoch random permutation.
    :param init_strategy: NumPyro per-site initialisation strategy (default
        ``init_to_uniform``, as for ``NUTS``).
    :param bool check_data: check at ``init`` that the data to be subsampled are finite.
    :param float noise_ema_weight: β of the EMA τ̂⁽ᵏ⁾ = (1−β)·τ̂⁽ᵏ⁻¹⁾ + β·τ̂_k of the
        gradient-noise sd (when it is estimated).
    """

    State: type = None  # the kernel's state NamedTuple
    _needs_single_plate = False

    def __init__(
        self,
        model: Callable,
        *,
        subsample_size=None,
        replace: bool = True,
        init_strategy=init_to_uniform,
        check_data: bool = True,
        noise_ema_weight: float = 0.1,
    ):
        if not 0.0 < noise_ema_weight <= 1.0:
            raise ValueError(f"noise_ema_weight must lie in (0, 1], got {noise_ema_weight}.")
        self.noise_ema_weight = float(noise_ema_weight)
        if not callable(model):
            raise TypeError(f"`model` must be a NumPyro model (a callable), got {model!r}.")
        self._model = model
        self._subsample_size = subsample_size
        self._replace = bool(replace)
        self._init_strategy = init_strategy
        self._check_data = check_data
        self._mb = None
        self._unravel = None
        self._num_warmup = 0
        self._sample_fn = None
        self.estimate_noise = False

    # -- NumPyro's MCMCKernel contract -----------------------------------------------------
    @property
    def model(self):
        return self._model

    @property
    def sample_field(self):
        return "z"

    @property
    def default_fields(self):
        return ("z", "diverging")

    @property
    def minibatcher(self) -> Minibatcher:
        """The :class:`~numpyro_sg.minibatch.Minibatcher` built at ``init``."""
        return self._mb

    @property
    def plates(self):
        """The subsample plates (with the sizes actually drawn), known after ``init``."""
        return None if self._mb is None else self._mb.plates

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        self._num_warmup = int(num_warmup)
        plates = discover_plates(
            self._model,
            model_args,
            model_kwargs,
            subsample_size=self._subsample_size,
            check_data=self._check_data,
        )
        if self._needs_single_plate and len(plates) > 1:
            raise ValueError(
                f"{type(self).__name__} with these settings estimates the gradient noise from "
                f"per-datum gradients, which needs exactly one subsample plate; the model has "
                f"{[p.name for p in plates]}."
            )
        self._mb = Minibatcher(self._model, plates, replace=self._replace)
        self._deterministic_in_plate = deterministic_in_plates(
            self._model, plates, model_args, model_kwargs
        )

        batched, rng_key, key_init = split_init_key(rng_key)
        if init_params is None:
            first_batch = {p.name: jnp.arange(p.subsample_size) for p in plates}
            info = initialize_model(
                key_init,
                with_indices(self._model, first_batch),
                init_strategy=self._init_strategy,
                model_args=model_args,
                model_kwargs=model_kwargs,
            )
            init_params = info.param_info.z
        one_chain = jax.tree.map(lambda x: x[0], init_params) if batched else init_params
        _, self._unravel = ravel_pytree(one_chain)

        def init_one(params, key, model_args, model_kwargs):
            flat = ravel_pytree(params)[0]
            key, key_batch, key_idx = random.split(key, 3)
            batch_state = self._mb.init_batch_state(key_batch)
            indices, batch_state = self._mb.draw(key_idx, batch_state)
            _, grad, tau = self._evaluate(flat, indices, model_args, model_kwargs)
            return self.State(
                i=jnp.int32(0),
                z=params,
                z_grad=grad,
                grad_noise_sd=tau,
                diverging=jnp.array(False),
                batch_state=batch_state,
                rng_key=key,
                **self._init_extra(flat, tau),
            )

        if batched:
            init_one = jax.vmap(init_one, in_axes=(0, 0, None, None))
        state = jit_with_data(init_one, model_args, model_kwargs)(init_params, rng_key)
        self._sample_fn = self.sample
        return state

    def sample(self, state, model_args, model_kwargs):
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if is_prng_key(state.rng_key):
            new = self._step(state, model_args, model_kwargs)
        else:  # chain_method="vectorized": the kernel vmaps itself
            new = jax.vmap(self._step, in_axes=(0, None, None))(state, model_args, model_kwargs)
        newly = jnp.logical_and(new.diverging, jnp.logical_not(state.diverging))
        jax.lax.cond(
            jnp.any(newly),
            lambda: jax.debug.callback(self._warn_divergence, state.i, newly),
            lambda: None,
        )
        return new

    def postprocess_fn(self, model_args, model_kwargs):
        """Constrained values (deterministic sites included) of an unconstrained state.

        Deterministic sites inside a subsample plate are computed over the full data; when
        there are none, the plates run on a single datum, so post-processing a draw costs
        O(d) rather than O(N·d).
        """
        model_kwargs = {} if model_kwargs is None else model_kwargs
        if self._mb is None:
            model = self._model
        elif getattr(self, "_deterministic_in_plate", True):
            model = full_data(self._model, self._mb.plates)
        else:
            model = with_indices(self._model, {p.name: jnp.arange(1) for p in self._mb.plates})

        def postprocess(params):
            return constrain_fn(model, model_args, model_kwargs, params, return_deterministic=True)

        return postprocess

    def get_diagnostics_str(self, state):
        eps = jnp.mean(state.step_size)
        msg = f"step size {float(eps):.2e}"
        if bool(state.diverging):
            msg += ", DIVERGED"
        return msg

    # -- shared machinery -----------------------------------------------------------------
    def _evaluate(self, flat, indices, model_args, model_kwargs):
        """(log density, ĝ, τ̂) at the flat point on a mini-batch; τ̂ is NaN if not estimated."""
        log_density = self._mb.log_density_fn(model_args, model_kwargs)
        unravel = self._unravel

        def flat_log_density(x, idx):
            return log_density(unravel(x), idx)

        if self.estimate_noise:
            return self._mb.value_grad_noise(flat_log_density, flat, indices)
        value, grad = jax.value_and_grad(flat_log_density)(flat, indices)
        return value, grad, jnp.full_like(flat, jnp.nan)

    def _step(self, state, model_args, model_kwargs):
        key, key_batch, key_update = random.split(state.rng_key, 3)
        flat = ravel_pytree(state.z)[0]
        new_flat, fields = self._update(state, flat, key_update)
        indices, batch_state = self._mb.draw(key_batch, state.batch_state)
        value, grad, tau_k = self._evaluate(new_flat, indices, model_args, model_kwargs)
        tau = ema(state.grad_noise_sd, tau_k, self.noise_ema_weight)
        ok = _all_finite(new_flat) & jnp.isfinite(value) & _all_finite(grad)
        diverging = state.diverging | ~ok
        keep = lambda old, new: jnp.where(diverging, old, new)  # noqa: E731
        return state._replace(
            i=state.i + 1,
            z=self._unravel(keep(flat, new_flat)),
            z_grad=keep(state.z_grad, grad),
            grad_noise_sd=keep(state.grad_noise_sd, tau),
            diverging=diverging,
            batch_state=batch_state,
            rng_key=key,
            **fields,
        )

    def _warn_divergence(self, iteration, newly):
        k = int(jnp.max(iteration)) + 1  # 1-based iteration number, warmup included
        if k <= self._num_warmup:
            where = f"warmup iteration {k} of {self._num_warmup}"
        else:
            where = f"iteration {k}, i.e. sampling draw index {k - self._num_warmup - 1}"
        chains = ""
        if jnp.ndim(newly) > 0:
            chains = f" in vectorized chain(s) {[int(c) for c in jnp.nonzero(newly)[0]]}"
        warnings.warn(
            f"{type(self).__name__}: the chain diverged at {where}{chains}: the parameters, the "
            "log density or the stochastic gradient became non-finite. The chain is frozen at "
            "its last finite state from there on and its 'diverging' field is True; reduce "
            "step_size.",
            DivergenceWarning,
            stacklevel=2,
        )

    # -- hooks for subclasses ---------------------------------------------------------------
    def _init_extra(self, flat, noise_sd):  # pragma: no cover - abstract
        """Kernel-specific state fields at the initial point."""
        raise NotImplementedError

    def _update(self, state, flat, key):  # pragma: no cover - abstract
        """One move from ``flat`` using ``state.z_grad``/``state.grad_noise_sd``."""
        raise NotImplementedError


def split_init_key(rng_key):
    """``(batched, chain_key, init_key)``: a key, or a batch of keys (``chain_method=
    "vectorized"``), split into the chain's key and the key for the initial values."""
    batched = not is_prng_key(rng_key)
    if batched:
        keys = jax.vmap(lambda k: random.split(k, 2))(rng_key)
        return True, keys[:, 0], keys[:, 1]
    rng_key, key_init = random.split(rng_key)
    return False, rng_key, key_init


def jit_with_data(fn, model_args, model_kwargs):
    """``jax.jit`` of ``fn(*args, model_args, model_kwargs)`` with the data as arguments.

    Array leaves of the model arguments (the data) are passed to the compiled program as
    arguments rather than baked into it as constants (which is slow to compile for large
    data, SPEC §11); other leaves stay static.  Returns ``g(*args) = fn(*args, model_args,
    model_kwargs)``.
    """
    leaves, treedef = jax.tree.flatten((model_args, model_kwargs))
    dynamic = [isinstance(x, (np.ndarray, jax.Array)) and np.ndim(x) > 0 for x in leaves]
    arrays = [x for x, d in zip(leaves, dynamic) if d]

    @jax.jit
    def compiled(args, arrays):
        it = iter(arrays)
        args_, kwargs_ = jax.tree.unflatten(treedef, [next(it) if d else x for x, d in zip(leaves, dynamic)])
        return fn(*args, args_, kwargs_)

    return lambda *args: compiled(args, arrays)


def ema(previous, current, weight):
    """Exponential moving average (1 − β)·previous + β·current, β = ``weight``."""
    return (1.0 - weight) * previous + weight * current
