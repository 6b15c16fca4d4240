"""numpyro_sg: stochastic-gradient MCMC kernels for NumPyro, with ArviZ output."""

from numpyro_sg.kernels import SGBD, SGLD, DivergenceWarning, polynomial_schedule
from numpyro_sg.arviz import to_inference_data
from numpyro_sg.minibatch import find_subsample_plates

__version__ = "0.1.0"

__all__ = [
    "SGLD",
    "SGBD",
    "DivergenceWarning",
    "polynomial_schedule",
    "find_subsample_plates",
    "to_inference_data",
]
