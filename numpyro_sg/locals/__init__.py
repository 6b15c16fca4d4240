"""Local latent variables: hierarchical and mixed-effects models whose groups grow with the data.

A latent site inside a subsample plate is *local* (one value per group: a random effect).  The
gradient kernels integrate the locals of each mini-batch out and sample the globals' marginal
posterior p(θ | y) (:mod:`~numpyro_sg.locals.model`, maths in :mod:`~numpyro_sg.locals.marginal`,
detection and checks in :mod:`~numpyro_sg.locals.sites`); :func:`pad_groups` turns a long table
into the (G, R) arrays and mask such a model reads.
"""

from numpyro_sg.locals.model import (
    LocalLatentWarning,
    MarginalModel,
    integrate_locals,
    marginalize_locals,
)
from numpyro_sg.locals.padding import pad_groups
from numpyro_sg.locals.posterior import local_draws

__all__ = ["MarginalModel", "marginalize_locals", "integrate_locals", "pad_groups", "local_draws",
           "LocalLatentWarning"]
