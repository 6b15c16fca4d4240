"""Stein diagnostics: kernel Stein discrepancy (KSD) and finite set Stein discrepancy (FSSD).

The modules are layered; each imports only from the layers below it (and from
:mod:`numpyro_sg.infer.laplace` and :mod:`numpyro_sg.infer.minibatch`):

1. :mod:`~numpyro_sg.diagnostics.validation` (input checks) and
   :mod:`~numpyro_sg.diagnostics.scales` (preconditioning);
2. :mod:`~numpyro_sg.diagnostics.ksd` and :mod:`~numpyro_sg.diagnostics.fssd`: the
   discrepancies of arrays (draws and a score function or scores);
3. :mod:`~numpyro_sg.diagnostics.model_scores`: full-data scores of a NumPyro model and the
   discrepancies of a run (``MCMC`` or ``InferenceData``);
4. :mod:`~numpyro_sg.diagnostics.stein` (:func:`numpyro_sg.ksd` and :func:`numpyro_sg.fssd`,
   which take arrays or a run) and :mod:`~numpyro_sg.diagnostics.plots` (KSD paths).
"""
