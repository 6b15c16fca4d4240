"""Conversion of ``numpyro_sg`` runs to ArviZ ``InferenceData``.

``az.from_numpyro`` on a subsample model stores a random mini-batch as ``observed_data`` and
cannot build the ``log_likelihood`` group.  :func:`to_inference_data` converts through a view of
the run whose model has every subsample plate switched to its full data.
"""

from __future__ import annotations

from types import SimpleNamespace

import arviz as az

from numpyro_sg.kernels.base import SGKernel
from numpyro_sg.minibatch import full_data

__all__ = ["to_inference_data"]


class _FullDataView:
    """Duck-typed stand-in for an ``MCMC`` object whose ``sampler.model`` uses the full data."""

    def __init__(self, mcmc, model):
        self._mcmc = mcmc
        self.sampler = SimpleNamespace(model=model)

    def __getattr__(self, name):
        return getattr(self._mcmc, name)


def to_inference_data(mcmc, log_likelihood: bool = False, **kwargs) -> az.InferenceData:
    """``arviz.InferenceData`` of a run of a ``numpyro_sg`` kernel.

    The posterior holds constrained values; ``sample_stats`` holds the collected extra fields
    (``diverging``, ``step_size``, ``grad_noise_sd``, …); ``observed_data`` (and, with
    ``log_likelihood=True``, the ``log_likelihood`` group) are over the full data, not a
    mini-batch.  Further keyword arguments go to :func:`arviz.from_numpyro`
    (``coords``, ``dims``, …).
    """
    sampler = mcmc.sampler
    if not isinstance(sampler, SGKernel) or sampler.plates is None:
        raise TypeError(
            "to_inference_data expects an MCMC object that has run a numpyro_sg kernel; "
            f"got a sampler of type {type(sampler).__name__}."
        )
    view = _FullDataView(mcmc, full_data(sampler.model, sampler.plates))
    return az.from_numpyro(view, log_likelihood=log_likelihood, **kwargs)
