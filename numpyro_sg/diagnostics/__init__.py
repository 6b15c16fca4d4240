"""Stein diagnostics: kernel Stein discrepancy (KSD) and finite set Stein discrepancy (FSSD).

The modules are layered; each imports only from the layers below it (and from
:mod:`numpyro_sg.infer.laplace` and :mod:`numpyro_sg.infer.minibatch`):

1. :mod:`~numpyro_sg.diagnostics.validation` (input checks) and
   :mod:`~numpyro_sg.diagnostics.scales` (preconditioning);
2. :mod:`~numpyro_sg.diagnostics.stein_kernels` (the IMQ Stein kernel of a pair of points)
   and :mod:`~numpyro_sg.diagnostics.ksd_blocks` (its blocked double sum);
3. :mod:`~numpyro_sg.diagnostics.ksd` (with :mod:`~numpyro_sg.diagnostics.ksd_paths`) and
   :mod:`~numpyro_sg.diagnostics.fssd`: the discrepancies of arrays (draws and a score
   function or scores);
4. :mod:`~numpyro_sg.diagnostics.model_scores`: full-data scores of a NumPyro model
   (:mod:`~numpyro_sg.diagnostics.full_data_scores`), a run's scored draws
   (:mod:`~numpyro_sg.diagnostics.stein_runs`) and the discrepancies of a run (``MCMC`` or
   ``InferenceData``, :mod:`~numpyro_sg.diagnostics.run_discrepancies`);
5. :mod:`~numpyro_sg.diagnostics.stein` (:func:`numpyro_sg.ksd` and :func:`numpyro_sg.fssd`,
   which take arrays or a run) and :mod:`~numpyro_sg.diagnostics.plots` (KSD paths).

:mod:`~numpyro_sg.diagnostics.convergence` (effective sample size, convergence checks) stands
apart.
"""
