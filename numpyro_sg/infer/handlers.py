"""NumPyro handlers that choose which data a model sees: chosen indices in its subsample plates
(:class:`with_indices`, :func:`full_data`), the prior alone (:class:`without_plate_sites`), the
likelihood alone (:class:`likelihood_only`) or some rows masked out (:class:`mask_plate_rows`)."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.primitives import Messenger

from numpyro_sg.infer.model_info import plates_of


class with_indices(Messenger):
    """Handler: run ``fn`` with the given data indices in its plates.

    ``indices`` maps plate names to integer index arrays.  The plate's ``subsample_size`` is
    set to the length of the array, so NumPyro scales every site in the plate by
    N/len(indices) without a size-mismatch warning.

    **Example:**

    .. code-block:: python

        with_indices(model, {"data": jnp.arange(10)})(X, y)   # the first 10 rows, scale N/10
    """

    def __init__(self, fn: Callable | None = None, indices: dict | None = None):
        self.indices = dict(indices or {})
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] in self.indices:
            idx = self.indices[msg["name"]]
            msg["value"] = idx
            msg["args"] = (msg["args"][0], int(jnp.shape(idx)[0]))


class without_plate_sites(Messenger):
    """Handler giving weight 0 to every sample site inside the named plates (the prior alone)."""

    def __init__(self, fn=None, plate_names=()):
        self.plate_names = set(plate_names)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and self.plate_names.intersection(plates_of(msg)):
            msg["scale"] = 0.0


class likelihood_only(Messenger):
    """Handler scoring only the sites inside the named plates (the likelihood).

    Every latent sample site outside them keeps its value and support (so the constraining
    transforms, and the log-Jacobian factors NumPyro adds for them, are unchanged) but scores 0:
    its log density is neither computed nor differentiated.  Observed sites and factors are
    kept.  The gradient of such a density differs from the full one by the gradient of the
    prior alone, a term the same for every mini-batch (the gradient-noise estimate of
    :meth:`~numpyro_sg.infer.minibatch.Minibatcher.value_grad_noise` relies on this).
    """

    def __init__(self, fn=None, plate_names=()):
        self.plate_names = set(plate_names)
        super().__init__(fn)

    def process_message(self, msg):
        if (msg["type"] == "sample" and not msg["is_observed"]
                and not self.plate_names.intersection(plates_of(msg))):
            fn = msg["fn"]
            msg["fn"] = dist.ImproperUniform(fn.support, fn.batch_shape, fn.event_shape)


class mask_plate_rows(Messenger):
    """Handler masking rows of a plate: ``mask`` (n,) multiplies the log-likelihood of every
    sample site inside plate ``plate_name`` row by row (False drops the row)."""

    def __init__(self, fn=None, plate_name=None, mask=None):
        self.plate_name = plate_name
        self.mask = mask
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "sample":
            return
        for frame in msg.get("cond_indep_stack", []):
            if frame.name == self.plate_name:
                mask = jnp.reshape(self.mask, jnp.shape(self.mask) + (1,) * (-frame.dim - 1))
                msg["fn"] = msg["fn"].mask(mask)


def full_data(model: Callable, plates) -> Callable:
    """``model`` with every subsample plate in ``plates`` run over all of its data."""
    return with_indices(model, {p.name: jnp.arange(p.size) for p in plates})
