"""numpyro_sg: stochastic-gradient MCMC kernels for NumPyro, with ArviZ output and KSD."""

import os as _os

from numpyro_sg.infer.cpu_fusion_guard import guard_cpu_fusions as _guard_cpu_fusions

_guard_cpu_fusions()  # before JAX starts: jaxlib 0.10.2–0.11's CPU fusions compute wrong results
from numpyro_sg.kernels import ESGLD, SGBD, SGLD, DivergenceWarning, SparseAsync, polynomial_schedule
from numpyro_sg.kernels import BAOAB, PSGLD, CyclicalSGLD
from numpyro_sg.kernels import SGHMC, SGNHT
from numpyro_sg.kernels import ESGLDOptions, MinibatchOptions, RMSpropOptions, SparseAsyncOptions
from numpyro_sg.spike_slab import SpikeSlabSites
from numpyro_sg.results.inference_data import to_inference_data
from numpyro_sg.results.summary import posterior_summary
from numpyro_sg.diagnostics.convergence import ConvergenceWarning, check_convergence
from numpyro_sg.results.nuts_estimate import PreferNUTSWarning
from numpyro_sg.diagnostics.ksd import ksd_path, ksd_per_coordinate
from numpyro_sg.diagnostics.predictive import held_out_score, posterior_predictive, predictive_metrics
from numpyro_sg.diagnostics.plots import plot_ksd_path
from numpyro_sg.diagnostics.stein import fssd, ksd
from numpyro_sg.infer.minibatch import find_subsample_plates
from numpyro_sg.results.reference import compare_to_reference, nuts_reference, plot_reference_comparison
from numpyro_sg.results.selection import selection_summary
from numpyro_sg.tuning import grid_search, heuristic_step_size, mamba
from numpyro_sg.version import __version__  # noqa: F401
from numpyro_sg.infer.warmup import ModeFit, WarmupOptions
from numpyro_sg.infer.programs import CACHE_ENV as _CACHE_ENV, enable_compilation_cache

__all__ = [
    "SGLD",
    "SGBD",
    "ESGLD",
    "SparseAsync",
    "SGHMC",
    "SGNHT",
    "DivergenceWarning",
    "ConvergenceWarning",
    "PreferNUTSWarning",
    "check_convergence",
    "WarmupOptions",
    "ModeFit",
    "polynomial_schedule",
    "find_subsample_plates",
    "to_inference_data",
    "posterior_summary",
    "ksd",
    "ksd_path",
    "ksd_per_coordinate",
    "fssd",
    "predictive_metrics",
    "held_out_score",
    "posterior_predictive",
    "plot_ksd_path",
    "nuts_reference",
    "compare_to_reference",
    "plot_reference_comparison",
    "mamba",
    "grid_search",
    "heuristic_step_size",
    "selection_summary",
]
__all__ += ["PSGLD", "BAOAB", "CyclicalSGLD", "enable_compilation_cache"]
__all__ += ["MinibatchOptions", "RMSpropOptions", "SpikeSlabSites", "ESGLDOptions", "SparseAsyncOptions"]

if _os.environ.get(_CACHE_ENV):  # the persistent compilation cache, by environment variable
    enable_compilation_cache(_os.environ[_CACHE_ENV])
