"""The warmup's settings (:class:`WarmupOptions`) and result (:class:`ModeFit`); the mode search
itself is :func:`numpyro_sg.infer.warmup.find_mode`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from numpyro_sg.infer.curvature import local_modes_below
from numpyro_sg.infer.options import Options
from numpyro_sg.infer.progress import interactive
from numpyro_sg.infer.preconditioner import Preconditioner


#: :meth:`WarmupOptions.newton_first`: the Adam phases' cost in passes, in units of the Newton budget's,
#: from which a model with local latents tries Newton first
NEWTON_FIRST_RATIO = 3.0


@dataclass(frozen=True)
class WarmupOptions(Options):
    """Settings of the warmup's mode search (see :mod:`numpyro_sg.infer.warmup`): the kernels'
    ``warmup_options`` (``None``, a dict of these fields or an instance: :meth:`~numpyro_sg.infer.options.Options.of`).

    :param int optimizer_steps: Adam steps on mini-batches (0 skips the phase); default 500,
        or 2,000 above ``dense_max`` coordinates (where the diagonal Newton refinement cannot
        repair a poor optimum).
    :param float learning_rate: Adam's initial learning rate (cosine-decayed to 1% of it).
    :param batch_size: mini-batch size of the optimizer (default: the plate's n, at least
        1,000, at most N; above ``dense_max`` coordinates also at least enough for
        ``large_d_epochs`` passes over the data, as each parameter of a model with many
        parameters — a row of a factor matrix — is informed by few rows of each batch — but
        at most 16 times the small-d default).
    :param int large_d_epochs: see ``batch_size`` (default 100).
    :param int newton_steps: at most this many full-data Newton steps; default 30 up to
        ``dense_max`` coordinates, 8 above (:meth:`resolved`).  The loop stops when it has
        converged; the default leaves room for slowly converging starts such as a mixture's
        (step counts measured in ``docs/warmup.md``, "What the warmup does").
    :param float tolerance: Newton has converged when every step component is below this
        many Laplace sds.
    :param int chunk_size: rows per chunk of the full-data passes.
    :param int hessian_rows: rows of the random subsample the Hessian is computed on.
    :param int dense_max: largest dimension with a dense (Cholesky) preconditioner.
    :param float jitter: chains start at θ̂ + jitter·L·ξ.
    :param int seed: seed of the warmup's own random draws (mini-batches, Hessian rows), so
        that every chain of a run — whatever the chain method — starts from the same mode.
    :param float symmetry_jitter: coordinates whose gradient is exactly 0 at the zero start
        (a symmetric saddle, e.g. the factors of a matrix factorisation) start at
        ``symmetry_jitter``·ξ instead (:func:`~numpyro_sg.infer.multistart.break_symmetry`); 0 disables it.
    :param float diagonal_tolerance: above ``dense_max`` coordinates Newton uses the Hessian's
        diagonal only, a preconditioned gradient step that converges slowly on coupled
        coordinates (matrix factorisation); it has converged when every step component is
        below this many Laplace sds (default 0.25: a start well inside the posterior).  The
        steps are skipped when the optimizer's end is within this many sds in root mean square
        over coordinates by the preconditioner's diagonal
        (:func:`~numpyro_sg.infer.refinement.diagonal_refinement`).
    :param int hutchinson_probes: Rademacher probes of the Hutchinson diagonal of the
        preconditioner (above ``dense_max``; the Newton steps use 16); its relative error per
        coordinate is about √(Σ_{l≠j} H_jl² / probes)/|H_jj|.
    :param int fisher_group_size: rows per group of the Fisher diagonal.
    :param str diagonal: the preconditioner's curvature diagonal above ``dense_max`` coordinates:
        ``"fisher"`` (default with one subsample plate: the likelihood's Fisher diagonal
        from group gradients, :meth:`~numpyro_sg.infer.minibatch.Minibatcher.fisher_diagonal`, plus
        a Hutchinson estimate of the prior's alone) or ``"hutchinson"`` (Hutchinson on the
        whole Hessian: noisy for coordinates coupled to many others, which then get too wide
        a scale and can make the kernels diverge, as SGLD did on BPMF: ``docs/reproductions.md``).
        The Newton steps use a 16-probe Hutchinson diagonal either way.
    :param max_noise_heat: above ``dense_max`` coordinates, the diagonal scales are further
        divided by √(h/``max_noise_heat``) when the gradient-noise heat h (see
        :attr:`ModeFit.noise_heat`; τ̂ of the control-variate gradient at ``noise_points``
        draws from the diagonal Laplace approximation, in the working frame) exceeds it.  On
        a sparse model (matrix factorisation: a user's gradient rests on a fraction of a
        rating per batch, scaled by N/n) the mini-batch noise in the working frame is large;
        Langevin-type kernels then run hot, drift away from the anchor, where the
        control-variate noise grows further, and diverge.  ``None`` disables it.
    :param int noise_points: see ``max_noise_heat`` and ``max_noise_inflation``.
    :param max_noise_inflation: up to ``dense_max`` coordinates (one subsample plate, no local
        latents) the warmup measures the control-variate gradient noise of one row over the
        Hessian's rows at ``noise_points`` draws of the Laplace approximation
        (:attr:`ModeFit.row_noise`), and the kernels with a default step choose their mini-batch
        size n so that the variance this noise adds to the chain's stationary variance is at
        most this fraction in every coordinate (default 0.05: sds at most 2.5 % wide); see
        :mod:`numpyro_sg.kernels.noise_plan`.  ``None`` disables the measurement and the choice.
    :param max_minibatch_stiffness: above ``dense_max`` coordinates, when λ_B — the top
        eigenvalue of the whitened Hessian of the kernels' *mini-batch* log density (N/n-scaled;
        largest over two mini-batches, in the frame of the scales after the shrinks above) —
        exceeds it, the diagonal scales are further divided by √λ_B (λ_B becomes 1).  On sparse
        data (a film rated once gets N/n times its rating's curvature on the steps that draw it)
        λ_B is far above the full data's λ, which the other shrinks see, and every kernel's
        default step diverged on MovieLens BPMF; with this shrink none does.  Dense data stay
        near 1: no change below the threshold (measured: ``docs/reproductions.md``).  ``None``
        disables it.
    :param bool stabilise_diagonal: divide the diagonal Laplace scales by √(2λ − 1), λ the
        top eigenvalue of the whitened −H (power iteration on Hessian-vector products), so
        that a step size in preconditioner units is about as stable along the stiffest
        direction as with a dense preconditioner (λ = 1 for uncoupled coordinates: no change;
        the factor 2λ − 1 rather than λ is a margin for power iteration's underestimate and
        for curvature growing away from the mode — BAOAB's default diverged on BPMF with √λ).
    :param int num_starts: starts of the multi-start phase (:mod:`~numpyro_sg.infer.multistart`:
        the usual start, the init strategy's draw, uniform and prior draws), each followed by
        ``start_steps`` Adam steps on mini-batches; the search goes on from the end points with
        the highest full-data log density.  1 disables the phase (one start, as before).
        Default 32 up to ``dense_max`` coordinates, 8 above (:meth:`resolved`): on a
        three-component Gaussian mixture with components at −10, 0 and 10 each start reaches
        the highest mode's basin with a probability of only a few percent (the others merge
        two components or empty one), and 8 starts missed it where 32 found it.  With local
        latents one round (``starts_per_round``): every start's ascent there is a pass of
        per-group fits, and the first round's curvature check never settles a hierarchical
        posterior (indefinite at its dispersed starts), so all 32 used to run; none where
        Newton goes first (:meth:`newton_first`).
    :param int starts_per_round: starts run at a time, by one compiled program of this width
        (default 8); the main Adam phase continues this many best end points in the same
        program and keeps the best.
    :param bool settle_early: stop after the first round when it shows a log-concave
        posterior — every end finite and −H positive definite at every start
        (:func:`~numpyro_sg.infer.multistart.first_round_concave`, up to 64 coordinates) — as
        a GLM's does (default ``True``): its starts all climb to its one mode.  A mixture's
        dispersed starts meet indefinite curvature and every round runs.  Not checked when
        ``num_starts`` ≤ ``starts_per_round`` (one round).
    :param int start_steps: Adam steps per start (default 200).
    :param int start_batch_size: their mini-batch size (at most the plate's n); default: the
        main phase's up to ``dense_max`` coordinates (then both phases share one compiled
        program), 256 above.
    :param float start_learning_rate: their initial learning rate (cosine-decayed to 1% of
        it); larger than ``learning_rate`` so that a start can cross the data's scale (Adam
        moves each coordinate by about the learning rate per step).
    :param float multimodal_gap: the kernels warn (``ConvergenceWarning``) when some start
        ended at a log density more than this many nats below the mode found
        (:meth:`ModeFit.multimodality`): the posterior has several modes, and the chains
        explore one.
    :param str centre: ``"mode"`` (default: the steps above) or ``"variational"``: a
        mean-field Gaussian fit N(m, diag s²) on mini-batches replaces them
        (:mod:`~numpyro_sg.infer.variational`), m becomes the chains' centre and control-variate
        anchor (:attr:`ModeFit.mode`) and s the diagonal preconditioner's scales.  For
        hierarchical models whose group effects are parameters with a learnt scale (``b_j ~
        Normal(0, τ)``): their joint mode sits where τ → 0 and every b_j → 0, and chains
        started there with its Laplace scales stay there.  (Effects inside a subsample plate
        are local latents, integrated out, and need no such option.)
    :param int variational_steps: Adam steps of the variational fit (default 5,000; the
        mini-batch sizes are the optimizer phase's).
    :param float variational_learning_rate: their initial learning rate (cosine-decayed to 1%).
    :param progress_bar: show the mode search's phases with ``tqdm`` (on ``stderr``); default
        ``None``: when ``stderr`` is a terminal.  (NumPyro's ``MCMC(progress_bar=…)`` does not
        reach a kernel's ``init``, where the search runs.)
    """

    optimizer_steps: int | None = None
    learning_rate: float = 0.05
    batch_size: int | None = None
    newton_steps: int | None = None
    tolerance: float = 1e-3
    chunk_size: int = 65536
    hessian_rows: int = 65536
    dense_max: int = 256
    jitter: float = 1.0
    seed: int = 0
    symmetry_jitter: float = 0.1
    diagonal_tolerance: float = 0.25
    stabilise_diagonal: bool = True
    hutchinson_probes: int = 64
    diagonal: str = "fisher"
    fisher_group_size: int = 32
    large_d_epochs: int = 100
    max_noise_heat: float | None = 0.1
    max_minibatch_stiffness: float | None = 2.0
    noise_points: int = 4
    max_noise_inflation: float | None = 0.05
    num_starts: int | None = None
    starts_per_round: int = 8
    settle_early: bool = True
    start_steps: int = 200
    start_batch_size: int | None = None
    start_learning_rate: float = 0.2
    multimodal_gap: float = 20.0
    centre: str = "mode"
    variational_steps: int = 5000
    variational_learning_rate: float = 0.02
    progress_bar: bool | None = None

    ARGUMENT = "warmup_options"
    LABEL = "warmup option"

    def __post_init__(self):
        if self.centre not in ("mode", "variational"):
            raise ValueError(f"warmup option centre={self.centre!r}: choose 'mode' or 'variational'.")

    def show_progress(self) -> bool:
        """Whether the warmup shows a progress bar (``progress_bar``; default: when ``stderr``
        is a terminal or in a Jupyter kernel)."""
        if self.progress_bar is None:
            return interactive()
        return bool(self.progress_bar)

    def resolved(self, d: int, local_latents: bool = False) -> "WarmupOptions":
        """These options with the defaults that depend on the model filled in: ``num_starts``
        and ``newton_steps`` (more where d ≤ ``dense_max``, where they are cheap); with
        ``local_latents`` (a plate of groups whose locals are integrated out) one round of
        ``starts_per_round`` starts."""
        small = d <= self.dense_max
        default_starts = self.starts_per_round if local_latents else (32 if small else 8)
        return dataclasses.replace(
            self, num_starts=self.num_starts if self.num_starts is not None else default_starts,
            newton_steps=self.newton_steps if self.newton_steps is not None else (30 if small else 8))

    def optimizer_plan(self, d: int, sizes, min_batch: int = 1000) -> tuple:
        """``(steps, {plate size N: batch size})`` of the Adam phase for a model with d
        coordinates and plates of sizes N with the kernel's subsample sizes n (``sizes``: pairs
        (N, n)): by default max(n, ``min_batch``) rows (:mod:`numpyro_sg.infer.warmup`; defaults
        depend on d)."""
        large = d > self.dense_max
        steps = self.optimizer_steps if self.optimizer_steps is not None else (2000 if large else 500)
        batches = {}
        for N, n in sizes:
            b = self.batch_size or max(n, min_batch)
            if large and self.batch_size is None and steps > 0:  # at most 16 × the default
                b = max(b, min(-(-self.large_d_epochs * N // steps), 16 * b))
            batches[N] = int(min(b, N))
        return steps, batches

    def newton_first(self, d: int, batches: dict) -> bool:
        """Whether a model with local latents goes from the usual start to Newton directly,
        without the Adam phases (resolved options; ``batches``: :meth:`optimizer_plan`'s).

        A pass over the data there is a nested fit per group, so the warmup counts in passes:
        the multi-start and main Adam phases take Σ steps · width · b/N of them (5,600 on 1,000
        groups, whose batch is every group: Adam is full-data gradient ascent there), a Newton
        step one pass plus d Hessian-vector products over the Hessian's rows.  When the Adam
        phases cost :data:`NEWTON_FIRST_RATIO` times the whole Newton budget or more, Newton goes
        first; should it fall short of the mode, the Adam phases and Newton run as usual after
        it, at most 1/:data:`NEWTON_FIRST_RATIO` more work than before (it reached the mode on
        every model measured: ``docs/warmup.md``).  Not with a user's
        ``optimizer_steps``, nor above ``dense_max`` coordinates."""
        if self.optimizer_steps is not None or d > self.dense_max or not batches:
            return False
        steps, width = self.optimizer_plan(d, [])[0], max(1, min(self.starts_per_round, self.num_starts))
        starts = self.start_batches(d, batches)
        explore = self.num_starts * self.start_steps if self.num_starts > 1 else 0
        adam = max((explore * starts[N] + width * steps * b) / N for N, b in batches.items())
        newton = self.newton_steps * (1 + d * max(min(1.0, self.hessian_rows / N) for N in batches))
        return adam >= NEWTON_FIRST_RATIO * newton

    def start_batches(self, d: int, batches: dict) -> dict:
        """The multi-start ascents' batch sizes per plate size, given the main phase's
        ``batches`` (:meth:`optimizer_plan`): ``start_batch_size`` (default: the main phase's up
        to ``dense_max`` coordinates, 256 above), at most the main phase's."""
        size = self.start_batch_size if self.start_batch_size is not None else (None if d <= self.dense_max else 256)
        return {N: b if size is None else min(b, size) for N, b in batches.items()}


@dataclass(frozen=True)
class ModeFit:
    """The warmup's result.

    :ivar mode: θ̂, the flat unconstrained mode (d,).
    :ivar grad: the full-data gradient ∇ log π(θ̂) (d,): the control-variate anchor's.
    :ivar log_density: log π(θ̂) (full data, up to a constant).
    :ivar preconditioner: the Laplace :class:`~numpyro_sg.infer.preconditioner.Preconditioner`.
    :ivar converged: whether Newton met its tolerance.
    :ivar newton_steps: Newton steps taken.
    :ivar seconds: wall time of the search.
    :ivar stiffness: λ, the top eigenvalue of the whitened −H for a diagonal preconditioner
        (:func:`~numpyro_sg.infer.curvature.whitened_top_eigenvalue`; 1 for a dense one); the diagonal scales were divided
        by √(2λ − 1) (``WarmupOptions.stabilise_diagonal``).
    :ivar noise_heat: h, the 90% quantile over coordinates of τ̂_w²/4 — the extra variance a
        unit Langevin step gets from the control-variate gradient noise, relative to its
        injected noise — with that preconditioner (before ``max_noise_heat`` shrank it).
    :ivar row_noise: r_j, the variance the control-variate gradient of a single row adds per
        unit of drift, per coordinate, in units of the Laplace variance
        (:meth:`~numpyro_sg.infer.warmup._WarmupPrograms.row_noise`; a mini-batch of n rows has
        r_j/n); ``None`` where it was not measured (``WarmupOptions.max_noise_inflation``).
    :ivar row_kick: t_j, the largest single row's share of that gradient, in Laplace sds per
        unit of drift (a mini-batch of n rows that holds the row moves coordinate j by t_j/n
        per unit of drift): where a few extreme rows dominate, t_j²/n² exceeds r_j/n
        (:func:`~numpyro_sg.infer.noise.row_noise_covariance`); ``None`` where not measured.
    :ivar drift_ratio: λ̂, how much steeper than the Laplace approximation's the full-data
        gradient is at its draws (:func:`~numpyro_sg.infer.noise.drift_ratio`; 1 on a Gaussian
        posterior); the kernels' default steps shrink where it is well above 1
        (:mod:`~numpyro_sg.kernels.noise_plan`); ``None`` where not measured.
    :ivar data_passes: how many times the search read all the data (the full-data log density
        and gradient at a point, or at a batch of points at once); 0 for a fit found in the
        process's store.  The mini-batch steps and the Hessian's ``hessian_rows`` rows come on top.
    :ivar gradient_seconds: the wall time of the fastest full-data log density and gradient at a
        point (:func:`numpyro_sg.results.nuts_estimate.nuts_estimate` reads it: what one NUTS
        gradient costs); ``inf`` where the search made none.
    :ivar start_log_densities: log densities at the end points of the multi-start phase's short
        ascents, on the full-data scale (above ``hessian_rows`` rows, log π(θ̂) plus their
        difference from θ̂ on those rows) (:mod:`~numpyro_sg.infer.multistart`; empty when it did not run).
    :ivar start_ascents: for the end points more than ``multimodal_gap`` nats below θ̂, how
        much further they would climb, ½·Σ_j g_j²/|h_jj| there (gradient g, curvature −H;
        :func:`~numpyro_sg.infer.curvature.predicted_ascent`; 0 for the other end points).
    """

    mode: Any
    grad: Any
    log_density: float
    preconditioner: Preconditioner
    converged: bool
    newton_steps: int
    seconds: float
    stiffness: float = 1.0
    noise_heat: float = 0.0
    start_log_densities: tuple = ()
    start_ascents: tuple = ()
    row_noise: tuple | None = None
    row_kick: tuple | None = None
    drift_ratio: float | None = None
    data_passes: int = 0
    gradient_seconds: float = float("inf")

    def local_modes(self, gap: float = 20.0) -> np.ndarray:
        """Which starts ended in a local mode more than ``gap`` nats below the mode found.

        An end point x, Δ = log π(θ̂) − log π(x) below it, counts when its predicted further
        ascent a (:attr:`start_ascents`) is small, a ≤ ``gap`` (x has about stopped climbing),
        and Δ − a > ``gap`` (where it stops is still well below θ̂).  Up to 64 coordinates a is
        the Newton decrement with the full curvature, ``inf`` where −H is not positive definite
        (no local maximum there).  Starts that stopped far out on a slope or on a ridge are not
        counted; the values of a measured on mixtures and mixed models are in ``docs/warmup.md``,
        "What the warmup does".
        """
        values = np.asarray(self.start_log_densities, np.float64)
        if len(values) == 0 or len(self.start_ascents) != len(values):
            return np.zeros(len(values), bool)
        return local_modes_below(self.log_density, values, self.start_ascents, gap)

    def multimodality(self, gap: float = 20.0) -> str | None:
        """A warning's text when some starts of the multi-start phase ended more than ``gap``
        nats below the mode found (local modes of a multimodal posterior), else ``None``."""
        values = np.asarray(self.start_log_densities, np.float64)
        low = values[self.local_modes(gap)]
        if len(low) == 0:
            return None
        return (f"{len(low)} of {len(values)} starts of the warmup's mode search ended in modes "
                f"{self.log_density - np.max(low):.3g} to {self.log_density - np.min(low):.3g} nats "
                f"below the one found (log density {self.log_density:.6g}): the posterior is "
                "multimodal (e.g. a mixture's label switching or empty components). The chains "
                "start at the highest mode found and explore it only; raise warmup_options="
                "{'num_starts': …} to search more widely (the starts' end log densities are in "
                "kernel.mode_fit.start_log_densities). If the highest mode may be a narrow peak "
                "that holds little of the posterior's mass (an over-parameterised model, e.g. a "
                "network whose noise scale shrinks to fit the data), centre the warmup on a "
                "variational fit instead: warmup_options={'centre': 'variational'}.")

    def nonconvergence(self) -> str | None:
        """A warning's text when Newton did not meet its tolerance, else ``None``.  Above
        ``dense_max`` coordinates (a diagonal preconditioner) more steps do not help where the
        coordinates are coupled: on a regression network (898 weights, 43,152 rows) 8 and 30
        Newton steps, after 2,000 or 8,000 Adam steps, all ended unconverged, log π 2 nats above
        Adam's end, and the chains' predictions beat the optimum's."""
        if self.converged:
            return None
        head = (f"the warmup's mode search did not converge in {self.newton_steps} Newton steps (the log "
                "posterior may have no mode, or a flat or non-concave region near it; the curvature's "
                f"condition number there is {self.condition_number:.2g})")
        if self.preconditioner.kind == "diagonal":
            return (head + ". Above dense_max coordinates the steps use the Hessian's diagonal, which "
                    "crawls on strongly coupled coordinates (a neural network's weights): more Newton or "
                    "optimizer steps do not help there. The chains start from draws of the diagonal "
                    "Laplace approximation at the end point; judge the run by its held-out predictions: "
                    "numpyro_sg.predictive_metrics(mcmc, *held_out_data, per_chain=True).")
        return (head + "; the Laplace preconditioner and the chains' start may be poor. Check the model, "
                "raise warmup_options={'newton_steps': …, 'optimizer_steps': …}, or pass init_strategy "
                "and preconditioner='adapt'.")

    @property
    def scales(self) -> np.ndarray:
        """Laplace sds √diag(Σ̂) per coordinate."""
        P = self.preconditioner
        if P.chol is not None:
            return np.sqrt(np.sum(np.asarray(P.chol, np.float64) ** 2, axis=1))
        return np.asarray(P.scale, np.float64)

    @property
    def condition_number(self) -> float:
        """cond(−H) at the mode, from the preconditioner Σ̂ = L·Lᵀ (dense: σ_max(L)²/σ_min(L)²;
        diagonal: of its diagonal): how ill-conditioned (collinear, badly scaled) the posterior's
        curvature is.  Newton's steps are solved in float64, so a condition number up to about
        10¹⁰ costs the mode search nothing; the float32 gradient then limits how close to the mode
        it can get along the flattest direction."""
        P = self.preconditioner
        if P.chol is not None:
            s = np.linalg.svd(np.asarray(P.chol, np.float64), compute_uv=False)
        else:
            s = np.asarray(P.scale, np.float64)
        return float((s.max() / s.min()) ** 2)
