"""Stochastic-gradient MCMC kernels (one module per family)."""

from numpyro_sg.kernels.base import DivergenceWarning, SGKernel
from numpyro_sg.kernels.esgld import ESGLD
from numpyro_sg.kernels.sgbd import SGBD
from numpyro_sg.kernels.sgld import SGLD, polynomial_schedule
from numpyro_sg.kernels.sparse_async import SparseAsync

__all__ = ["SGKernel", "DivergenceWarning", "SGLD", "SGBD", "ESGLD", "SparseAsync", "polynomial_schedule"]
