"""The machinery every kernel stands on, one concern per module.

* :mod:`~numpyro_sg.infer.model_info`: one trace of the model (sites, plates, initial values);
* :mod:`~numpyro_sg.infer.plates`: subsample-plate discovery and the checks of the mini-batch
  sizes and of the data;
* :mod:`~numpyro_sg.infer.handlers`: the handlers that run a model on chosen rows of its data;
* :mod:`~numpyro_sg.infer.indices`: mini-batch index draws (with or without replacement);
* :mod:`~numpyro_sg.infer.jit_data`: compilation with the data as arguments;
* :mod:`~numpyro_sg.infer.minibatch`: the mini-batch gradient estimators (plain and control
  variates) and the gradient-noise sd;
* :mod:`~numpyro_sg.infer.full_density`: full-data, prior and per-datum densities;
* :mod:`~numpyro_sg.infer.preconditioner`: the preconditioner and its working frame;
* :mod:`~numpyro_sg.infer.curvature`: Hutchinson diagonals, power iteration and the Laplace
  preconditioner of a Hessian;
* :mod:`~numpyro_sg.infer.laplace`: damped Newton steps (one loop) and the Laplace approximation;
* :mod:`~numpyro_sg.infer.warmup_options` and :mod:`~numpyro_sg.infer.warmup`: the mode search
  that sets the preconditioner, the control-variate anchor and the chains' starting points;
* :mod:`~numpyro_sg.infer.multistart`: the mode search's multi-start phase (multimodal
  posteriors);
* :mod:`~numpyro_sg.infer.options`: the convention of the options objects (a frozen dataclass
  that an argument takes as ``None``, a dict of fields or an instance).
"""
