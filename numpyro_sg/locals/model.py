"""The model with its local latent variables integrated out, which every gradient kernel samples.

:class:`MarginalModel` wraps a NumPyro model whose subsample plate holds per-group latents b_g
(random effects).  Run on a mini-batch S of groups, it samples the globals θ as the model does
and replaces the batch's locals and observations by one factor site inside the same plate,
log p(y_g | θ) per group (or an estimator whose θ-gradient is unbiased for its gradient up to the
importance bias); the plate scales it by N/n as any likelihood term.  The kernels' state thus
holds θ only (nothing of size G), and every piece of the package that reads the model's log
density — mode search, Laplace preconditioner, control variates, KSD — works unchanged.

Following Song, Sun, Ye & Liang (2020), 'Extended stochastic gradient MCMC for large-scale
Bayesian variable selection' (supplement, Algorithm S1), the locals of the batch are drawn afresh
from their conditional at each iteration; here they are integrated out per group
(:mod:`numpyro_sg.locals.marginal`):

* ``"gaussian"``: exact marginal by one vectorised Newton step (locals conditionally Gaussian:
  the per-group Hessian does not depend on b, checked at init at two points);
* ``"importance"``: Fisher's identity with ``num_draws`` self-normalised importance draws from a
  per-group Laplace Student-t proposal;
* ``"imputation"``: Algorithm S1 as written (``num_draws`` Gaussian draws from the conditional,
  equal weights) in the sampling steps; its value is not a log marginal, so the warmup's mode
  search and the full-data scores (KSD, log-likelihood) use :meth:`MarginalModel.with_log_marginal`;
* ``"auto"`` (default): ``"gaussian"`` when detected, else ``"importance"``.

The random numbers of a mini-batch are a function of its indices (a hash), so the two
evaluations of a control-variate estimate (at θ and at the anchor θ̂, same indices) use common
random numbers, and the mode search sees a deterministic objective.
"""

from __future__ import annotations

import copy
import warnings

import jax.numpy as jnp
import numpy as np
import numpyro
from jax import random
from numpyro.primitives import Messenger

from numpyro_sg.infer.jit_data import jit_with_data
from numpyro_sg.infer.model_info import ModelInfo, plates_of, structure_only_active, trace_model
from numpyro_sg.locals.marginal import (
    LocalEstimate,
    gaussian_marginal,
    group_hessians,
    importance_marginal,
    imputation_surrogate,
    resampled_draw,
)
from numpyro_sg.locals.sites import (
    check_locals_stay_in_plate,
    group_log_joint,
    local_sites,
    plate_frame_dim,
    traced,
)

#: importance (or imputation) draws per group of the control-variate anchor's full-data gradient.
#: Its Monte Carlo error is a fixed gradient offset that shifts every draw of the chain (by how
#: much: docs/local_latents.md, "What the kernels do"), so the anchor is computed once with many
#: more draws than a step.
ANCHOR_DRAWS = 4096
#: proposals per group and draw of the sampling-importance-resampling draws of non-Gaussian locals
RESAMPLING_DRAWS = 256

#: importance draws per group by default, and at least in the log-marginal copy of an imputation
IMPORTANCE_DRAWS = 16
#: accepted values of ``method``
METHODS = ("auto", "gaussian", "importance", "imputation")


class LocalLatentWarning(UserWarning):
    """The importance sampler of the local latents has collapsed (low effective sample size)."""


class _split(Messenger):
    """Pass 1: globals and plates go through the outer handlers; every sample or deterministic
    site of ``plate`` is hidden from them (locals set to zeros)."""

    def __init__(self, fn, plate, local_names):
        self.plate, self.local_names = plate, set(local_names)
        self.fixed, self.indices, self.sizes, self.dim = {}, {}, {}, None
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] in ("sample", "deterministic") and self.plate in plates_of(msg):
            if msg["name"] in self.local_names:
                msg["value"] = jnp.zeros(msg["fn"].shape())
                self.dim = plate_frame_dim(msg, self.plate)
            msg["stop"] = True

    def postprocess_message(self, msg):
        if msg["type"] == "plate" and msg["args"][1] is not None:
            self.indices[msg["name"]], self.sizes[msg["name"]] = msg["value"], msg["args"][0]
        elif (msg["type"] == "sample" and not msg["is_observed"]
              and self.plate not in plates_of(msg)):
            self.fixed[msg["name"]] = msg["value"]


class _fix_plate(Messenger):
    def __init__(self, fn, name, value):
        self.name, self.value = name, value
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] == self.name:
            msg["value"] = self.value


def batch_key(seed: int, idx):
    """A PRNG key that is a function of the mini-batch's indices (and ``seed``)."""
    idx = jnp.asarray(idx).astype(jnp.uint32)
    mult = (2 * jnp.arange(idx.shape[0], dtype=jnp.uint32) + 1) * jnp.uint32(0x9E3779B1)
    h = jnp.sum(idx * mult + jnp.uint32(0x7F4A7C15) * idx * idx, dtype=jnp.uint32)
    return random.fold_in(random.PRNGKey(seed), h)


class MarginalModel:
    """A NumPyro model with the local latents of its subsample plate integrated out.

    Built by :func:`marginalize_locals` (or automatically by the gradient kernels when they find a
    latent site inside a subsample plate); callable as the model itself.  ``model`` is the
    original, ``sites`` the :class:`~numpyro_sg.locals.sites.LocalSite` s, ``resolved`` the method
    in use once :meth:`prepare` has run.  Until prepared (the kernels prepare it at init, on their
    first trace of the data) calling it runs the original model.
    """

    def __init__(self, model, method="auto", num_draws=IMPORTANCE_DRAWS, df=4.0, newton_steps=25, seed=0,
                 min_ess=None, anchor_draws=ANCHOR_DRAWS):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
        if int(num_draws) < 1:
            raise ValueError(f"num_draws must be a positive int, got {num_draws!r}.")
        self.model, self.method, self.num_draws = model, method, int(num_draws)
        self.df, self.newton_steps, self.seed = float(df), int(newton_steps), int(seed)
        self.min_ess = 0.1 * self.num_draws if min_ess is None else float(min_ess)
        self.anchor_draws = max(int(anchor_draws), self.num_draws)
        self.sites, self.plate, self.resolved, self.plate_size = None, None, None, None
        self.batch_size = None   # groups per mini-batch, known once prepared
        self.gaussian_locals = None   # conditionally Gaussian, known once prepared (auto, imputation)

    def _identity(self) -> tuple:
        """What the marginal computes: the model, the settings and, once prepared, the sites,
        plate, sizes and method.  Equal marginals share their compiled programs (the warmup's,
        the kernels', the marginal's own): a second kernel on the same model and data of the
        same shapes, or a tuner's arm, compiles nothing the first did not."""
        return (self.model, self.method, self.num_draws, self.df, self.newton_steps, self.seed,
                self.min_ess, self.anchor_draws, None if self.sites is None else tuple(self.sites),
                self.plate, self.resolved, self.plate_size, self.batch_size, self.gaussian_locals)

    def __eq__(self, other):
        return type(other) is type(self) and other._identity() == self._identity()

    def __hash__(self):
        return hash(self._identity())

    def __repr__(self):
        return f"MarginalModel({getattr(self.model, '__name__', self.model)!r}, method={self.resolved or self.method!r})"

    @property
    def k(self) -> int:
        """Number of local scalars per group."""
        return sum(s.size for s in self.sites)

    @property
    def sampled(self) -> bool:
        """Whether the locals are integrated out by Monte Carlo (importance or imputation)."""
        return self.resolved in ("importance", "imputation")

    def with_num_draws(self, num_draws: int) -> "MarginalModel":
        """A copy (prepared as this one) that draws ``num_draws`` per group: the model of the
        control-variate anchor's full-data gradient (:func:`anchor_gradient`, ``anchor_draws``)
        and of the locals' posterior after the run."""
        precise = copy.copy(self)
        precise.num_draws = int(num_draws)
        return precise

    def with_log_marginal(self) -> "MarginalModel":
        """This model, or for ``"imputation"`` a copy whose value estimates log p(y_g | θ)
        (``"gaussian"`` for conditionally Gaussian locals, else ``"importance"``): Algorithm S1's
        surrogate has the right θ-gradient in expectation, but its value lacks the conditional's
        entropy, so a mode search on it, or full-data scores from a few draws, would be wrong."""
        if self.resolved != "imputation":
            return self
        exact = copy.copy(self)
        exact.resolved = "gaussian" if self.gaussian_locals else "importance"
        exact.num_draws = max(self.num_draws, IMPORTANCE_DRAWS)
        return exact

    def prepare(self, info: ModelInfo, model_args=(), model_kwargs=None):
        """Find and check the locals of the traced model, pick the method (``"auto"``: the per-group
        Hessian compared at two points of b) and warn if the importance ESS collapses at the
        traced point.  Returns ``self``."""
        tr = traced(self.model, model_args, model_kwargs)
        self.sites = local_sites(info, tr)
        if not self.sites:
            raise ValueError("marginalize_locals: the model has no latent site inside a subsample plate.")
        self.plate = self.sites[0].plate
        self.plate_size = int(info.subsample_plates[self.plate][0])
        check_locals_stay_in_plate(self.model, model_args, model_kwargs, info, self.sites, tr)
        fixed = {n: tr[n]["value"] for n in info.latent_sites if self.plate not in info.sites[n].plates}
        indices = {p: jnp.arange(n) for p, (_, n) in info.subsample_plates.items()}
        n = self.batch_size = int(info.subsample_plates[self.plate][1])
        dtype = jnp.result_type(float)

        def check(what, extra):   # compiled once per model and shapes, with data and θ as arguments
            def fn(fixed_, indices_, *rest):
                *extra_, args_, kwargs_ = rest

                def f(b):
                    return group_log_joint(self.model, args_, kwargs_, self.plate, indices_, fixed_, self.sites, b)

                if what == "hessians":
                    return group_hessians(f, *extra_)[2]
                return self.estimate(f, indices_[self.plate].shape[0], dtype, indices_[self.plate])

            key = ("marginal_check", what, self._identity(), str(dtype))
            program = jit_with_data(fn, model_args, model_kwargs, key=key, name=f"marginal_{what}")
            return program(fixed, indices, *extra)

        resolved = self.method
        if resolved in ("auto", "imputation"):
            H0 = np.asarray(check("hessians", (jnp.zeros((n, self.k), dtype),)))
            b1 = 0.5 + 0.3 * random.normal(random.PRNGKey(1), (n, self.k), dtype)
            H1 = np.asarray(check("hessians", (b1,)))
            tol = 1e-4 * max(float(np.max(np.abs(H0))), 1e-12)
            self.gaussian_locals = bool(np.allclose(H0, H1, rtol=1e-4, atol=tol))
            if resolved == "auto":
                resolved = "gaussian" if self.gaussian_locals else "importance"
        self.resolved = resolved
        if resolved == "importance":
            self.warn_ess(check("estimate", ()).ess)
        return self

    def warn_ess(self, ess):
        """Warn (:class:`LocalLatentWarning`) when a group's importance ESS is below ``min_ess``."""
        ess = np.asarray(ess)
        low = ~(ess >= self.min_ess)  # NaN counts as collapsed
        if low.any():
            warnings.warn(
                f"Local latents of plate '{self.plate}': the importance sampler collapsed for "
                f"{int(low.sum())} of {ess.size} groups (effective sample size below "
                f"{self.min_ess:g} of {self.num_draws} draws; smallest {ess.min():.2g}). Raise "
                "num_draws, lower df (heavier proposal tails) or use method='imputation'.",
                LocalLatentWarning, stacklevel=3)

    def estimate(self, f, n, dtype, idx) -> LocalEstimate:
        """The per-group :class:`~numpyro_sg.locals.marginal.LocalEstimate` of the batch ``idx``."""
        if self.resolved == "gaussian":
            return gaussian_marginal(f, n, self.k, dtype)
        key = batch_key(self.seed, idx)
        if self.resolved == "imputation":
            return imputation_surrogate(f, n, self.k, dtype, key, self.num_draws, self.newton_steps,
                                        self.gaussian_locals)
        return importance_marginal(f, n, self.k, dtype, key, self.num_draws, self.df, self.newton_steps)

    def draw(self, f, n, dtype, key):
        """One draw (n, k) of the batch's locals from their conditional given θ: exact for
        Gaussian locals, else by sampling importance resampling from :data:`RESAMPLING_DRAWS`
        proposals (:func:`~numpyro_sg.locals.marginal.resampled_draw`)."""
        if self.resolved == "gaussian":
            return resampled_draw(f, n, self.k, dtype, key, 1, float("inf"), self.newton_steps)
        return resampled_draw(f, n, self.k, dtype, key, max(RESAMPLING_DRAWS, self.num_draws),
                              self.df, self.newton_steps)

    def run(self, *args, **kwargs):
        """Run the model once (globals through the outer handlers) and return ``(the model's
        return value, LocalEstimate, the pass that ran it)``: the pass holds the plate's
        ``indices``, ``sizes`` (N, from the data) and ``dim``."""
        return self._per_group("estimate", (), args, kwargs)

    def conditional_draw(self, key, *args, **kwargs):
        """As :meth:`run`, with one draw (n, k) of the batch's locals from p(b_g | y_g, θ)
        (:meth:`draw`) in place of the estimate."""
        return self._per_group("draw", (key,), args, kwargs)

    def _per_group(self, kind, extra, args, kwargs):
        """Run the model once, globals through the outer handlers, and :meth:`estimate`
        (``kind="estimate"``) or :meth:`draw` (``"draw"``, ``extra = (key,)``) on the batch's
        conditional log joint f: ``(return value, its result, the pass that ran it)``."""
        if self.resolved is None:
            raise RuntimeError("MarginalModel.prepare must run before the model is used (the "
                               "kernels call it at init).")
        split = _split(self.model, self.plate, [s.name for s in self.sites])
        out = split(*args, **kwargs)
        model, plate, sites, dtype = self.model, self.plate, self.sites, jnp.result_type(float)

        def compute(fixed, indices, extra_, args_, kwargs_):
            # group_log_joint blocks the outer handlers: the program depends on its arguments
            # and on the settings in its key only
            def f(b):
                return group_log_joint(model, args_, kwargs_, plate, indices, fixed, sites, b)

            rows = indices[plate]
            if kind == "estimate":
                return self.estimate(f, rows.shape[0], dtype, rows)
            return self.draw(f, rows.shape[0], dtype, *extra_)

        # compiled once per model, settings and shapes (data as arguments): each eager trace of
        # the model (the kernels' init, the conversion's traces) reuses it
        key = ("marginal", kind, self._identity(), str(dtype))
        result = jit_with_data(compute, args, kwargs, key=key, name=f"marginal_{kind}")(
            split.fixed, split.indices, extra)
        return out, result, split

    def __call__(self, *args, **kwargs):
        if self.resolved is None:  # not prepared yet: the original model (the kernels' first trace)
            return self.model(*args, **kwargs)
        if structure_only_active():   # a trace of the structure: no integral computed
            split = _split(self.model, self.plate, [s.name for s in self.sites])
            out = split(*args, **kwargs)
            value = jnp.zeros(split.indices[self.plate].shape, jnp.result_type(float))
        else:
            out, est, split = self.run(*args, **kwargs)
            value = est.value
        idx, dim = split.indices[self.plate], split.dim
        with _fix_plate(None, self.plate, idx):   # (N from the data: the scale N/n stays right)
            with numpyro.plate(self.plate, split.sizes[self.plate], subsample_size=idx.shape[0], dim=dim):
                value = value.reshape((idx.shape[0],) + (1,) * (-dim - 1))
                numpyro.factor(f"{self.plate}_marginal", value)
        return out


def marginalize_locals(model, *, method="auto", num_draws=IMPORTANCE_DRAWS, df=4.0, newton_steps=25, seed=0,
                       min_ess=None, anchor_draws=ANCHOR_DRAWS) -> MarginalModel:
    """The model with the local latent variables of its subsample plate integrated out.

    The gradient kernels (SGLD, SGBD, SGHMC, SGNHT, pSGLD, BAOAB) do this themselves with the
    defaults when they find a latent site inside a subsample plate; call it to choose the options:

    :param model: a NumPyro model with per-group latents inside a subsample plate.
    :param method: ``"auto"`` (default), ``"gaussian"``, ``"importance"`` or ``"imputation"``
        (see :mod:`numpyro_sg.locals.model`).
    :param num_draws: m, the importance (or imputation) draws per group and iteration.
    :param df: degrees of freedom of the Student-t importance proposal.
    :param newton_steps: damped Newton steps to the conditional mode (non-Gaussian locals).
    :param seed: seed of the draws (mixed with a hash of each mini-batch's indices).
    :param min_ess: importance ESS below which a :class:`LocalLatentWarning` is raised at init
        (default m/10).
    :param anchor_draws: draws per group of the control-variate anchor's full-data gradient,
        computed once at the mode (at least ``num_draws``); its Monte Carlo error would shift the
        whole chain (by how much: ``docs/local_latents.md``, "What the kernels do").

    **Example:**

    .. code-block:: python

        from numpyro_sg.locals import marginalize_locals

        kernel = nsg.SGLD(marginalize_locals(model, method="importance", num_draws=32))
    """
    return MarginalModel(model, method, num_draws, df, newton_steps, seed, min_ess, anchor_draws)


def integrate_locals(model, info: ModelInfo, model_args=(), model_kwargs=None):
    """The kernels' hook: ``model`` unchanged when the traced model ``info`` has no latent site
    inside a subsample plate, else the prepared :class:`MarginalModel` (a :class:`MarginalModel`
    given by the user is prepared with its own options; one prepared for data of other sizes is
    prepared again as a copy)."""
    if not isinstance(model, MarginalModel):
        if not info.latent_in(info.subsample_plates):
            return model
        model = MarginalModel(model)
    if model.resolved is None:
        return model.prepare(info, model_args, model_kwargs)
    if info.subsample_plates.get(model.plate) == (model.plate_size, model.batch_size):
        return model
    fresh = copy.copy(model)   # prepared for data of other sizes: prepared again, as a copy
    fresh.resolved = fresh.gaussian_locals = None
    return fresh.prepare(trace_model(model.model, model_args, model_kwargs), model_args, model_kwargs)
