"""Stochastic-gradient MCMC kernels (one module per family) and their building blocks.

Each gradient kernel's module also has its functional ``init`` and ``step`` (BlackJAX's shape,
for a loop of your own: ``from numpyro_sg.kernels import sgld``), built on
:mod:`numpyro_sg.kernels.core`."""

from numpyro_sg.kernels.baoab import BAOAB
from numpyro_sg.kernels.cyclical import CyclicalSGLD
from numpyro_sg.diagnostics.convergence import DivergenceWarning
from numpyro_sg.kernels.base import SGKernel
from numpyro_sg.kernels.gradient import GradientKernel
from numpyro_sg.kernels.esgld import ESGLD, ESGLDOptions
from numpyro_sg.kernels.step_size import polynomial_schedule
from numpyro_sg.kernels.options import MinibatchOptions
from numpyro_sg.kernels.psgld import PSGLD, RMSpropOptions
from numpyro_sg.kernels.sgbd import SGBD
from numpyro_sg.kernels.sghmc import SGHMC
from numpyro_sg.kernels.sgnht import SGNHT
from numpyro_sg.kernels.sgld import SGLD
from numpyro_sg.kernels.sparse_async import SparseAsync, SparseAsyncOptions

__all__ = ["SGKernel", "GradientKernel", "DivergenceWarning", "SGLD", "SGBD", "ESGLD", "SparseAsync",
           "polynomial_schedule"]
__all__ += ["PSGLD", "BAOAB", "SGHMC", "SGNHT", "CyclicalSGLD"]
__all__ += ["MinibatchOptions", "RMSpropOptions", "ESGLDOptions", "SparseAsyncOptions"]
