"""The machinery every kernel stands on, one concern per module.

* :mod:`~numpyro_sg.infer.model_info`: one trace of the model (sites, plates, initial values);
* :mod:`~numpyro_sg.infer.minibatch`: subsample-plate discovery, index draws and the
  mini-batch gradient estimators (plain and control variates);
* :mod:`~numpyro_sg.infer.preconditioner`: the preconditioner and its working frame;
* :mod:`~numpyro_sg.infer.laplace`: Newton steps and the Laplace approximation;
* :mod:`~numpyro_sg.infer.warmup`: the mode search that sets the preconditioner, the
  control-variate anchor and the chains' starting points.
"""
