"""The public Stein discrepancies :func:`numpyro_sg.ksd` and :func:`numpyro_sg.fssd`.

Both accept either arrays (draws and a score function or scores) or a run (an ArviZ
``InferenceData`` or a NumPyro ``MCMC`` object) and dispatch:

* arrays → the array-only :func:`numpyro_sg.diagnostics.ksd.ksd` and
  :func:`numpyro_sg.diagnostics.fssd.fssd`;
* a run → :func:`numpyro_sg.diagnostics.model_scores.ksd_of_run` and
  :func:`numpyro_sg.diagnostics.model_scores.fssd_of_run`, which read the run's stored scored
  draws or score them with the model's full-data density.

This module sits on top of the diagnostics layers (validation → scales → ksd/fssd →
model_scores) so that none of those needs to import upwards.
"""

from __future__ import annotations

from numpyro_sg.diagnostics.fssd import fssd as fssd_of_draws
from numpyro_sg.diagnostics.ksd import ksd as ksd_of_draws
from numpyro_sg.diagnostics.model_scores import fssd_of_run, ksd_of_run
from numpyro_sg.diagnostics.validation import is_run_like


def _dispatch(name, x, score, scores, options, *, of_run, of_draws, run_args, kwargs):
    """For a run: ``of_run(x, **run_args, **options, **kwargs)``; for arrays (``kwargs`` must
    then be empty): ``of_draws(x, score, scores=scores, **options)``."""
    if is_run_like(x):
        return of_run(x, **run_args, **options, **kwargs)
    if kwargs:
        raise TypeError(f"{name}() got unexpected keyword arguments {sorted(kwargs)} for array input.")
    return of_draws(x, score, scores=scores, **options)


def ksd(x, score=None, *, scores=None, c=1.0, beta=-0.5, preconditioner="sd", per_coordinate=False,
        statistic="v", thin=None, block_size=None, model=None, model_args=None, model_kwargs=None,
        var_names=None, **kwargs):
    """Kernel Stein discrepancy of draws, or of a run, from π: IMQ kernel (Gorham & Mackey 2017).

    KSD = √((1/T²)·Σ_{t,t'} k_π(θ_t, θ_t')) with k_π the IMQ Stein kernel of Gorham & Mackey
    (2017), "Measuring sample quality with kernels", after per-coordinate preconditioning
    (x → x/s, score → score·s); ``per_coordinate=True`` gives the Σ_j √V_j of Song, Sun, Ye &
    Liang (2020) and ``statistic="u"`` the signed root of the U-statistic.

    * For **arrays** (``x`` of shape (T, d) with ``score`` or ``scores``) this is
      :func:`numpyro_sg.diagnostics.ksd.ksd`, whose documentation describes ``score``,
      ``scores``, ``c``, ``beta``, ``preconditioner``, ``per_coordinate``, ``statistic``,
      ``thin`` and ``block_size``; any other keyword is an error.
    * For an ArviZ **InferenceData** or an **MCMC** object the scores are the model's
      full-data scores on the unconstrained space, read from the run's ``stein`` group or
      computed from ``model``: the call is
      :func:`~numpyro_sg.diagnostics.model_scores.ksd_of_run` with the same options, and
      ``score``/``scores`` are ignored.

    :param x: draws (T, d), or an ``InferenceData`` or ``MCMC`` run.
    :param model: (run input) the NumPyro model, when the run carries no ``stein`` group.
    :param model_args: (run input) the model's positional arguments (default: those the
        ``MCMC`` ran with).
    :param model_kwargs: (run input) the model's keyword arguments (likewise).
    :param var_names: (run input) the sites to diagnose, a name or a list (default: every
        continuous site).  The way to diagnose a model with tens of thousands of parameters:
        ``nsg.ksd(mcmc, var_names=["mu_u", "prec_u"], per_coordinate=True)`` scores each kept
        draw with the whole model but stores and compares only those sites' coordinates.
    :param kwargs: (run input) further options of
        :func:`~numpyro_sg.diagnostics.model_scores.ksd_of_run` (``max_draws``).
    :return: float (an array (d,) for a run with ``per_coordinate=True``).

    **Example:**

    >>> import numpy as np
    >>> import numpyro_sg as nsg
    >>> x = np.random.default_rng(0).normal(size=(1000, 2))  # draws from N(0, I)
    >>> bool(nsg.ksd(x, lambda z: -z) < nsg.ksd(x, lambda z: -(z - 1.0)))
    True

    With a run: ``nsg.ksd(nsg.to_inference_data(mcmc))`` uses the run's stored scored draws,
    and ``nsg.ksd(idata, model=model, model_args=(X, y))`` scores any ``InferenceData``.
    """
    run_args = dict(model=model, model_args=model_args, model_kwargs=model_kwargs)
    if var_names is not None:
        kwargs["var_names"] = var_names
    options = dict(c=c, beta=beta, preconditioner=preconditioner, per_coordinate=per_coordinate,
                   statistic=statistic, thin=thin, block_size=block_size)
    return _dispatch("ksd", x, score, scores, options, of_run=ksd_of_run, of_draws=ksd_of_draws,
                     run_args=run_args, kwargs=kwargs)


def fssd(x, score=None, *, scores=None, num_locations=10, bandwidth=None, locations=None,
         optimize=False, num_opt_steps=100, learning_rate=0.05, optimize_bandwidth=False,
         rng_key=None, preconditioner="sd", thin=None, model=None, model_args=None,
         model_kwargs=None, **kwargs):
    """Squared finite set Stein discrepancy FSSD² of draws, or of a run, from π.

    The FSSD of Jitkrittum et al. (2017), "A linear-time kernel goodness-of-fit test".

    FSSD² = (1/(dJ))·Σ_i Σ_j g_i(v_j)², g_i(v) = E_θ[s_i(θ)·k(θ, v) + ∂_{θ_i}k(θ, v)], k the
    Gaussian kernel exp(−‖θ − v‖²/(2σ²)) and v_1 … v_J test locations, after per-coordinate
    preconditioning; ``optimize=True`` is FSSD-opt (locations moved by Adam ascent).

    * For **arrays** (``x`` of shape (T, d) with ``score`` or ``scores``) this is
      :func:`numpyro_sg.diagnostics.fssd.fssd`, whose documentation describes ``score``,
      ``scores``, ``num_locations``, ``bandwidth``, ``locations``, ``optimize``,
      ``num_opt_steps``, ``learning_rate``, ``optimize_bandwidth``, ``rng_key``,
      ``preconditioner`` and ``thin``; any other keyword is an error.
    * For an ArviZ **InferenceData** or an **MCMC** object the call is
      :func:`~numpyro_sg.diagnostics.model_scores.fssd_of_run` with the same options (full-data
      scores on the unconstrained space, chains pooled); ``score``/``scores`` are ignored.

    The run parameters ``model``, ``model_args``, ``model_kwargs`` and ``kwargs`` are those of
    :func:`numpyro_sg.ksd`.

    :param x: draws (T, d), or an ``InferenceData`` or ``MCMC`` run.
    :return: float FSSD².

    **Example:**

    >>> import numpy as np
    >>> import numpyro_sg as nsg
    >>> x = np.random.default_rng(0).normal(size=(1000, 2))  # draws from N(0, I)
    >>> bool(nsg.fssd(x, lambda z: -z) < nsg.fssd(x, lambda z: -(z - 1.0)))
    True
    """
    run_args = dict(model=model, model_args=model_args, model_kwargs=model_kwargs)
    options = dict(num_locations=num_locations, bandwidth=bandwidth, locations=locations,
                   optimize=optimize, num_opt_steps=num_opt_steps, learning_rate=learning_rate,
                   optimize_bandwidth=optimize_bandwidth, rng_key=rng_key,
                   preconditioner=preconditioner, thin=thin)
    return _dispatch("fssd", x, score, scores, options, of_run=fssd_of_run, of_draws=fssd_of_draws,
                     run_args=run_args, kwargs=kwargs)
