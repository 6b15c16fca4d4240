r"""ESGLD on data whose rows are split over the devices of a mesh.

The whole step runs on every shard (:meth:`~numpyro_sg.infer.sharding.DataShards.replicated`)
with the chain's state and keys replicated, so that every accept/reject decision is the same
everywhere; each shard draws n/D of its own N/D rows (a stratified mini-batch, as for the
gradient kernels, :mod:`~numpyro_sg.infer.sharding`) and every sum over data rows becomes a
``psum`` (:meth:`~numpyro_sg.kernels.esgld.options.ESGLDSetup.total`): the anchor's g and H
(p + p² floats, at the anchor iterations only), each informed move's Σ_i Δ(N/n)r_i (one float
per move; three with the penalty) and the control-variate gradient's Xᵀa (p floats).
"""

from __future__ import annotations

from dataclasses import replace

from numpyro_sg.infer.minibatch import Minibatcher
from numpyro_sg.infer.sharded_minibatch import ShardedMinibatcher
from numpyro_sg.kernels.esgld.options import ESGLDSetup, anchor_applies
from numpyro_sg.spike_slab import SpikeSlab


def sharded_minibatcher(model, plates, shards, ss: SpikeSlab, proposal, gradient,
                        replace_rows) -> ShardedMinibatcher:
    """The :class:`~numpyro_sg.infer.sharded_minibatch.ShardedMinibatcher` of data split over a
    mesh, after checking that this ESGLD splits its work there: the informed proposals and the
    control-variate gradient of a GLM likelihood, whose row sums (the anchor's g and H, each
    move's Σ r_i, the gradient's Xᵀa) are what the shards add up."""
    if proposal != "informed" or gradient != "cv" or not anchor_applies(ss):
        raise ValueError(
            "ESGLD on data split over a mesh runs the informed proposals with the control-variate "
            "gradient of a GLM likelihood (the defaults for a GLM with θ the only continuous "
            f"site); this model and these options resolve to proposal={proposal!r}, "
            f"gradient={gradient!r}. Pass the data unsharded (e.g. jax.device_get(X)).")
    if not replace_rows:
        raise ValueError("sharded data: each device draws its mini-batch rows with replacement; "
                         "replace=False is not supported (minibatch_options).")
    return ShardedMinibatcher(model, plates, shards)


def shard_setup(setup: ESGLDSetup, mb) -> ESGLDSetup:
    """The setup one shard's step reads: its local plate (N/D rows, n/D a mini-batch) and the
    mesh axes :meth:`ESGLDSetup.total` sums over (``setup`` itself on one device)."""
    if not isinstance(mb, ShardedMinibatcher):
        return setup
    (plate,) = mb.local_plates
    return replace(setup, spike_slab=replace(setup.spike_slab, plate=plate),
                   minibatcher=Minibatcher(mb.model, mb.local_plates, replace=True),
                   row_axes=mb.shards.axes)
