r"""Full-data scores of a NumPyro model, and KSD / FSSD of a run.

The Stein diagnostics need, for each scored draw, the point in NumPyro's unconstrained space
(where the kernels move) and the score there,

.. math:: s(z) = \nabla_z \log \pi(z) = -\nabla_z U(z),

with :math:`U` NumPyro's potential energy of the model run over *all* of its data (every
subsample plate switched to ``arange(N)``, so the score is exact, not a mini-batch estimate).
Discrete latent sites (model indicators) are held at each draw's value: the score is that of
the continuous sites given the indicators.

:class:`ModelScores` does this for one model and data set; :func:`stein_dataset` picks evenly
thinned draws per chain and scores them.  The result is stored in the ``stein`` group of the
``InferenceData`` made by :func:`numpyro_sg.to_inference_data` and
:func:`numpyro_sg.nuts_reference`, so KSD with another preconditioner, per-coordinate KSD and
comparisons on a common scale are recomputed later without the model.

This is the run-aware layer of the diagnostics: it reads runs (``MCMC`` objects and
``InferenceData``) and hands arrays to the array-only :mod:`numpyro_sg.diagnostics.ksd` and
:mod:`numpyro_sg.diagnostics.fssd`.  :func:`numpyro_sg.ksd` and :func:`numpyro_sg.fssd`
(:mod:`numpyro_sg.diagnostics.stein`) dispatch a run to :func:`ksd_of_run` and
:func:`fssd_of_run`.

The pieces: :mod:`~numpyro_sg.diagnostics.full_data_scores` (:class:`ModelScores`,
:func:`full_data_model`), :mod:`~numpyro_sg.diagnostics.stein_runs` (a run's draws and its
``stein`` group) and :mod:`~numpyro_sg.diagnostics.run_discrepancies` (KSD and FSSD of a
run); every public name is importable from here.
"""

from __future__ import annotations

from numpyro_sg.diagnostics.full_data_scores import ModelScores, full_data_model  # noqa: F401
from numpyro_sg.diagnostics.run_discrepancies import (  # noqa: F401
    fssd_of_run,
    ksd_of_run,
    ksd_of_stein,
    resolve_run_scales,
)
from numpyro_sg.diagnostics.stein_runs import (  # noqa: F401
    STEIN_GROUP,
    run_model,
    run_samples,
    stein_arrays,
    stein_dataset,
    stein_of,
    thin_indices,
)
