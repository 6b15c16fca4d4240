"""What a user does with a finished run.

* :mod:`~numpyro_sg.results.inference_data`: ArviZ ``InferenceData`` with the KSD attached;
* :mod:`~numpyro_sg.results.reference`: a NUTS reference run and the comparison against it;
* :mod:`~numpyro_sg.results.selection`: variable-selection summaries of spike-and-slab runs.
"""
