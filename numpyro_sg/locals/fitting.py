"""What the warmup and the full-data scores read of a model whose locals are integrated out.

A :class:`~numpyro_sg.locals.model.MarginalModel` estimates each group's log p(y_g | θ) (or, for
Algorithm S1's imputation, a surrogate with the right θ-gradient) from a few draws per mini-batch
step.  Two things need more than a step does: the control-variate anchor's full-data gradient,
whose Monte Carlo error would shift every draw of the chain (:func:`anchor_gradient`, with
``anchor_draws`` per group), and a mode search or a full-data score, which need a log density
(:func:`log_marginal_of`, :func:`log_marginal_batcher`).
"""

from __future__ import annotations

import copy
import dataclasses

import jax.numpy as jnp

from numpyro_sg.infer.jit_data import jit_with_data
from numpyro_sg.infer.programs import placement_key, tree_signature
from numpyro_sg.locals.model import MarginalModel


def anchor_gradient(mb, fit, unravel, model_args=(), model_kwargs=None, chunk_size=65536):
    """The warmup's ``fit`` with its full-data gradient (the control-variate anchor's) recomputed
    at the mode with ``anchor_draws`` draws per group, when the kernel's model (``mb.model``)
    integrates its locals out by Monte Carlo; ``fit`` unchanged otherwise, and for an imputation
    of conditionally Gaussian locals, whose gradient's mean is the exact marginal's that the
    mode search (:func:`log_marginal_batcher`) computed.

    The control-variate estimate ∇̂ = ∇ log π(θ̂) + (N/n) Σ_batch [∇ℓ_g(θ) − ∇ℓ_g(θ̂)] is
    unbiased only if its anchor term is: a Monte Carlo error in ∇ log π(θ̂) is the same at every
    step and does not average out.  Rows are visited in chunks shrunk by num_draws/anchor_draws,
    so the pass needs the memory of an ordinary one.
    """
    model = mb.model
    if not (isinstance(model, MarginalModel) and model.sampled) or model.anchor_draws <= model.num_draws:
        return fit
    if model.resolved == "imputation" and model.gaussian_locals:
        return fit   # imputed from the exact conditional: the mode search's exact gradient is the mean
    precise = copy.copy(mb)
    precise.model = model.with_num_draws(model.anchor_draws)
    chunk = max(1, chunk_size * model.num_draws // model.anchor_draws)
    key = ("anchor_gradient", precise.model, mb.plates, mb.replace, placement_key(mb), chunk,
           tree_signature(unravel(fit.mode)))   # what the pass computes: shared by equal kernels
    _, grad = jit_with_data(lambda x, a, k: precise.full_value_and_grad_fn(unravel, a, k, chunk)(x),
                            model_args, model_kwargs or {}, key=key, name="anchor_gradient")(fit.mode)
    return dataclasses.replace(fit, grad=jnp.asarray(grad, fit.grad.dtype))


def log_marginal_of(model):
    """``model.with_log_marginal()`` for a :class:`MarginalModel`, else ``model``: the model whose
    full-data value and scores a mode search, a KSD or a log-likelihood should read."""
    return model.with_log_marginal() if isinstance(model, MarginalModel) else model


def log_marginal_batcher(mb):
    """The mini-batcher ``mb`` with its model replaced by :func:`log_marginal_of` (``mb`` itself
    when that is the same model): what the warmup's mode search runs on."""
    model = log_marginal_of(mb.model)
    if model is mb.model:
        return mb
    exact = copy.copy(mb)
    exact.model = model
    return exact
