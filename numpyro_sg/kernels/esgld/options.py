"""ESGLD's options, hyperparameters and static set-up.

* :class:`ESGLDOptions`: the constructor's ``options``, and :class:`ESGLDSettings`: all its
  static settings, validated together;
* :func:`resolve_algorithm`: ``"auto"`` → the informed / control-variate / Laplace algorithm
  for a GLM likelihood, the paper's otherwise;
* :class:`ESGLDHyper` / :func:`esgld_hyperparameters`: the step size and temperature held in
  the state;
* :class:`ESGLDSetup`: the static configuration one iteration reads;
* :func:`anchor_iterations`: when the control-variate anchor is (re)computed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax, random

from numpyro_sg.infer.minibatch import Minibatcher
from numpyro_sg.infer.options import Options
from numpyro_sg.kernels.options import check_choice, check_positive
from numpyro_sg.kernels.step_size import resolve_step_size
from numpyro_sg.spike_slab import SpikeSlab, SpikeSlabSites

WEIGHT_KINDS = ("auto", "correlation", "deviance", "uniform")
_CORRECTIONS = (None, "penalty")
_FAST_PATHS = ("auto", "glm", "generic")
_PROPOSALS = ("auto", "informed", "paper")
_GRADIENTS = ("auto", "cv", "plain")
_PRECONDITIONERS = ("auto", "laplace", None)
#: default step size h with the Laplace preconditioner (ε_j = h·v_j, v_j the conditional
#: posterior variance of θ_j under the control-variate surrogate)
DEFAULT_STEP_SIZE = 0.25
#: default h with the Laplace preconditioner where the control-variate anchor does not apply
#: (a model with an intercept or another continuous site, a non-GLM likelihood): the plain
#: mini-batch gradient's noise inflates the spread at h = 0.25 (measured: docs/esgld.md,
#: "Without the anchor")
PLAIN_LAPLACE_STEP_SIZE = 0.1
#: default absolute step ε without a preconditioner (the paper's linear example)
PAPER_STEP_SIZE = 1e-6
#: rows of the data read for data-based proposal weights when ``weight_rows`` is not given
DEFAULT_WEIGHT_ROWS = 20_000


def _is_int_at_least(value, minimum) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= minimum


@dataclass(frozen=True)
class ESGLDOptions(Options):
    """The options of :class:`~numpyro_sg.ESGLD` beyond its direct arguments: its ``options``
    (``None``, a dict of these fields or an instance), validated on construction; an array of
    proposal weights is held as a tuple.

    :param proposal_weights: weights of the paper's moves: ``"auto"`` (``"correlation"`` for a
        Gaussian GLM likelihood, ``"deviance"`` for other GLMs, ``"uniform"`` otherwise),
        ``"correlation"`` (w_j = exp(abs(corr(y, x_j)) − 1)), ``"deviance"`` (w_j = exp(−(d_j −
        min d)/(5·sd d) − 0.1), d_j the one-variable GLM deviance), both on the first
        ``weight_rows`` rows, ``"uniform"`` (w_j = ½) or an array of p weights in (0, 1).
    :param bool flip_sign: flip θ_j's sign with probability ½ when j enters or leaves (default,
        as in the paper).
    :param mh_correction: ``None`` (plain mini-batch acceptance, as in the paper) or
        ``"penalty"`` (subtract half the estimated variance of the mini-batch log-likelihood
        difference — of the control-variate remainder with the anchor — from the log acceptance
        ratio).  Automatic rule: no penalty during the warmup (the search), the full penalty
        after it.  An error with a full batch (n = N), where there is no noise to correct.
    :param fast_path: ``"auto"`` (GLM fast path when the likelihood is a GLM), ``"glm"``
        (require it) or ``"generic"`` (evaluate the model for every proposal).
    :param weight_rows: rows used to compute data-based proposal weights (default
        :data:`DEFAULT_WEIGHT_ROWS` = 20,000); an error with weights that read no data.
    :param float temperature: τ (default 1), held in the state (hyperparameter ``temperature``).

    >>> ESGLDOptions.of({"flip_sign": False}).flip_sign
    False
    """

    proposal_weights: Any = "auto"
    flip_sign: bool = True
    mh_correction: str | None = None
    fast_path: str = "auto"
    weight_rows: int | None = None
    temperature: float = 1.0

    LABEL = "ESGLD option"

    def __post_init__(self):
        check_choice("mh_correction", self.mh_correction, _CORRECTIONS)
        check_choice("fast_path", self.fast_path, _FAST_PATHS)
        check_positive("temperature", self.temperature)
        object.__setattr__(self, "temperature", float(self.temperature))
        self._check_weights()

    def _check_weights(self):
        weights = self.proposal_weights
        if isinstance(weights, str):
            check_choice("proposal_weights", weights, WEIGHT_KINDS + ("an array",))
        else:
            w = np.asarray(weights, dtype=float)
            if w.ndim != 1 or not np.all((w > 0) & (w < 1)):
                raise ValueError("proposal_weights as an array must be a vector of values in (0, 1).")
            object.__setattr__(self, "proposal_weights", tuple(float(v) for v in w))
        if self.weight_rows is not None:
            if not _is_int_at_least(self.weight_rows, 1):
                raise ValueError(f"weight_rows must be an int ≥ 1, got {self.weight_rows!r}.")
            if not isinstance(weights, str) or weights == "uniform":
                raise ValueError(
                    "weight_rows applies only to data-based proposal weights ('correlation', "
                    f"'deviance' or 'auto'); it has no effect with proposal_weights={weights!r}."
                )


@dataclass(frozen=True)
class ESGLDSettings:
    """Everything :class:`~numpyro_sg.ESGLD`'s constructor was given but the step size, the
    subsample size and the init strategy, validated together (see the kernel for the meaning):
    its direct arguments, ``options`` (:class:`ESGLDOptions`) and ``sites``
    (:class:`~numpyro_sg.spike_slab.SpikeSlabSites`).  A ``proposal`` given as an array of
    weights becomes ``"paper"`` with these ``proposal_weights``.

    >>> ESGLDSettings(num_models=10, max_model_size=50).max_model_size
    50
    """

    num_models: int = 10
    max_model_size: int | None = None
    proposal: Any = "auto"
    gradient: str = "auto"
    preconditioner: str | None = "auto"
    options: ESGLDOptions = ESGLDOptions()
    sites: SpikeSlabSites = SpikeSlabSites()

    def __post_init__(self):
        if not _is_int_at_least(self.num_models, 1):
            raise ValueError(f"num_models must be an int ≥ 1, got {self.num_models!r}.")
        check_choice("gradient", self.gradient, _GRADIENTS)
        check_choice("preconditioner", self.preconditioner, _PRECONDITIONERS)
        if isinstance(self.proposal, str):
            check_choice("proposal", self.proposal, _PROPOSALS + ("an array",))
        else:  # an array: the paper's moves with these weights
            if not (isinstance(self.options.proposal_weights, str) and self.options.proposal_weights == "auto"):
                raise ValueError("Give proposal weights either as proposal=array or as "
                                 "options={'proposal_weights': …}, not both.")
            object.__setattr__(self, "options", replace(self.options, proposal_weights=self.proposal))
            object.__setattr__(self, "proposal", "paper")
        if self.max_model_size is not None and not _is_int_at_least(self.max_model_size, 1):
            raise ValueError(f"max_model_size must be an int ≥ 1 (and ≤ p), got {self.max_model_size!r}.")


def anchor_applies(ss: SpikeSlab) -> bool:
    """True when the control-variate anchor applies: a detected GLM likelihood and θ the only
    continuous site."""
    return ss.glm is not None and tuple(ss.continuous_sites) == (ss.coefficient,)


def resolve_algorithm(settings: ESGLDSettings, ss: SpikeSlab) -> tuple:
    """(proposal, gradient, preconditioner) resolved for the model: ``"auto"`` becomes
    ``"informed"`` / ``"cv"`` / ``"laplace"`` when the likelihood is a detected GLM and θ is
    the only continuous site (what the control-variate anchor needs), else ``"paper"`` /
    ``"plain"`` / ``"laplace"`` (the Laplace scales then come from the warmup's fit of the
    full model, :mod:`~numpyro_sg.kernels.esgld.warmup`; the proposal also becomes
    ``"paper"`` when proposal weights or ``weight_rows`` are given); asking for ``"informed"``
    or ``"cv"`` on another model raises ``ValueError``.
    """
    o, weights = settings, settings.options
    ok = anchor_applies(ss)
    why = ("needs a GLM likelihood (linear predictor X·β, fast_path 'auto' or 'glm') and the "
           f"coefficient {ss.coefficient!r} as the only continuous site; this model has "
           f"glm={'yes' if ss.glm is not None else 'no'}, continuous sites {list(ss.continuous_sites)}.")
    resolved = []
    for name, value, good, bad in (("proposal", o.proposal, "informed", "paper"),
                                   ("gradient", o.gradient, "cv", "plain"),
                                   ("preconditioner", o.preconditioner, "laplace", "laplace")):
        if value == "auto":
            value = good if ok else bad
            if name == "proposal" and (weights.proposal_weights != "auto" or weights.weight_rows is not None):
                value = "paper"  # weights were asked for: the paper's weighted moves
        elif value == good and not ok and good != bad:
            raise ValueError(f"{name}={good!r} {why}")
        resolved.append(value)
    return tuple(resolved)


class ESGLDHyper(NamedTuple):
    """Hyperparameters of :class:`~numpyro_sg.ESGLD` held in its state: ``step_size`` (a scalar,
    one entry per unconstrained continuous coordinate, or a schedule pytree evaluated at the
    iteration counter with :func:`~numpyro_sg.kernels.step_size.step_size_at`) and
    ``temperature`` τ."""

    step_size: Any
    temperature: Any


def esgld_hyperparameters(step_size, temperature, dim: int, preconditioner=None, noisy_gradient=False) -> ESGLDHyper:
    """The :class:`ESGLDHyper` of the options, the step size resolved by
    :func:`~numpyro_sg.kernels.step_size.resolve_step_size` (default :data:`DEFAULT_STEP_SIZE`
    with ``preconditioner="laplace"`` — :data:`PLAIN_LAPLACE_STEP_SIZE` when the Laplace step
    comes with the plain mini-batch gradient, ``noisy_gradient`` —, else
    :data:`PAPER_STEP_SIZE`; a plain callable is wrapped in a schedule; an array must have
    ``dim`` entries).

    >>> float(esgld_hyperparameters(None, 1.0, dim=3, preconditioner="laplace").step_size)
    0.25
    """
    if preconditioner == "laplace":
        default = PLAIN_LAPLACE_STEP_SIZE if noisy_gradient else DEFAULT_STEP_SIZE
    else:
        default = PAPER_STEP_SIZE
    eps = resolve_step_size(step_size, default, dim)
    return ESGLDHyper(eps, jnp.asarray(temperature, jnp.result_type(float)))


def anchor_iterations(family_name: str, num_warmup: int) -> tuple:
    """Iterations at which the control-variate anchor is (re)computed at the current β: 0, and
    for a non-Gaussian likelihood also 100, 400 and 1,000 when they fall in the warmup (the
    informed moves find the strong effects within the first iterations, but θ needs a few
    hundred Langevin steps to reach its posterior scale, and a stale anchor leaves a noisy
    estimate that inflates null inclusions, as measured on the logistic example of Song, Sun, Ye
    & Liang (2020) in ``docs/esgld.md``, "Song et al. (2020), Table 1 / Table S1"; a Gaussian
    likelihood's expansion is exact whatever the anchor, so once is enough).  Each anchor costs
    one full-data product Xᵀ·diag(ℓ'')·X, O(N·p²).

    >>> anchor_iterations("bernoulli", 2000)
    (0, 100, 400, 1000)
    """
    if family_name == "gaussian":
        return (0,)
    return (0,) + tuple(k for k in (100, 400, 1000) if k < num_warmup)


@dataclass(frozen=True)
class ESGLDSetup:
    """Static configuration of an ESGLD chain, built by ``ESGLD.init`` from one model trace.

    ``spike_slab`` the model's :class:`~numpyro_sg.spike_slab.SpikeSlab`; ``minibatcher`` its
    index drawing; ``unravel`` flat → dict of the unconstrained continuous sites; ``dim`` their
    number of coordinates; ``max_model_size`` q; ``num_models`` m; ``flip_sign``;
    ``penalty_fpc`` the finite-population correction of the penalty (``None``: no penalty);
    ``inclusion_name`` / ``effective_name`` the names of the inclusion frequency and of
    β = θ·γ in the output; ``weight_kind`` the resolved proposal weights and ``weight_rows``
    the data rows they read (``None`` for weights that read no data); ``proposal``
    ``"informed"`` or ``"paper"``, ``gradient`` ``"cv"`` or ``"plain"``, ``preconditioner``
    ``"laplace"`` or ``None`` (resolved); ``anchor_steps`` the iterations at which the
    control-variate anchor is (re)computed at the current β; ``num_warmup`` (the penalty
    applies from then on); ``rb_name`` the name of the Rao-Blackwellised inclusion output
    (``None`` without informed proposals); ``laplace_index`` where θ sits in the flat
    continuous vector when the Laplace step's curvatures come from the model's Hessian
    (:mod:`~numpyro_sg.kernels.esgld.warmup`, where the anchor does not apply; ``None``
    otherwise); ``row_axes`` the mesh axes the data rows are split over (``None`` on one
    device): the step then runs on every shard's rows (``spike_slab`` and ``minibatcher`` see
    the local plate of N/D rows and n/D mini-batch rows) and :meth:`total` sums over shards.
    """

    spike_slab: SpikeSlab
    minibatcher: Minibatcher
    unravel: Callable
    dim: int
    max_model_size: int
    num_models: int = 10
    flip_sign: bool = True
    penalty_fpc: float | None = None
    inclusion_name: str = "inclusion"
    effective_name: str = "beta"
    weight_kind: Any = "uniform"
    weight_rows: int | None = None
    proposal: str = "paper"
    gradient: str = "plain"
    preconditioner: str | None = None
    anchor_steps: tuple = ()
    num_warmup: int = 0
    rb_name: str | None = None
    laplace_index: Any = None
    row_axes: tuple | None = None

    def total(self, x):
        """``x`` (a sum over this device's data rows) summed over the data shards: a ``psum``
        over ``row_axes`` on a mesh, ``x`` itself on one device."""
        return x if self.row_axes is None else lax.psum(x, self.row_axes)

    @property
    def anchored(self) -> bool:
        """True when the chain carries a control-variate anchor (``Anchor``)."""
        laplace_from_anchor = self.preconditioner == "laplace" and self.laplace_index is None
        return self.proposal == "informed" or self.gradient == "cv" or laplace_from_anchor

    @property
    def full_batch(self) -> bool:
        """True when every iteration uses all N data (subsample size n = N)."""
        plate = self.spike_slab.plate
        return plate.subsample_size == plate.size

    def draw(self, key, batch_state):
        """``(indices, new batch state)`` of the next mini-batch (all N data when full-batch)."""
        if self.full_batch:
            return self.spike_slab.full_indices(), batch_state
        if self.row_axes is not None:  # a stratified mini-batch: each shard its own rows
            key = random.fold_in(key, lax.axis_index(self.row_axes))
        return self.minibatcher.draw(key, batch_state)

    def pack(self, flat, gammas, rao_blackwell=None) -> dict:
        """The state's ``z``: continuous sites, the last model γ_m, the inclusion frequency and
        (informed proposals) the Rao-Blackwellised inclusion (γ_m's frequency when not given)."""
        z = dict(self.unravel(flat))
        z[self.spike_slab.indicator] = gammas[-1].astype(jnp.int32)
        z[self.inclusion_name] = jnp.mean(gammas.astype(flat.dtype), 0)
        if self.rb_name is not None:
            z[self.rb_name] = z[self.inclusion_name] if rao_blackwell is None else rao_blackwell.astype(flat.dtype)
        return z

    def unpack(self, z):
        """``(continuous params, γ)`` of the state's ``z``."""
        z = dict(z)
        gamma = z.pop(self.spike_slab.indicator)
        z.pop(self.inclusion_name)
        if self.rb_name is not None:
            z.pop(self.rb_name)
        return z, gamma
