r"""SparseAsync — the asynchronous spike-and-slab sampler of Atchadé & Wang (2023), "A fast
asynchronous MCMC sampler for sparse Bayesian inference" (Alg. 1–3).

The model (see :mod:`numpyro_sg.spike_slab`) has an indicator δ ∈ {0,1}^p, a coefficient
θ ∈ ℝ^p whose prior factorises over coordinates given δ (paper: π(δ) ∝ p^(−u·size(δ)),
θ_j | δ_j ~ N(0, 1/ρ_{δ_j})), and a likelihood ℓ that depends on θ only through β = θ·δ.
The conditional inclusion probability of coordinate j is read from the model's own
per-coordinate prior terms:

.. math::

   q_j = \operatorname{sigmoid}\big(\operatorname{logit}\pi(\delta_j{=}1)
        + \log p(\theta_j\mid 1) - \log p(\theta_j\mid 0) + \ell_1 - \ell_0\big),

ℓ₁ = ℓ(θ·δ^{(j,1)}), ℓ₀ = ℓ(θ·δ^{(j,0)}) (for the paper's prior this is its eq. (4) with
a = u·log p + ½·log(ρ0/ρ1)).  One iteration:

* **STEP 1.** Excluded coordinates θ_j (δ_j = 0) are draws from the spike p(θ_j | δ_j = 0);
  the active block [θ]_δ is moved by a kernel invariant for its conditional
  exp(log p([θ]_δ | δ) + ℓ((θ, 0)_δ)): an exact Gaussian draw (``inner="gaussian"``, Gaussian
  likelihood with known scale, linear predictor X·β; :func:`gaussian_block_draw`), one MALA
  step (``inner="mala"``; :func:`~.updates.mala_step`), or, for ``variant="sgld"``, one SGLD
  step on a mini-batch (on the shared Langevin move of :mod:`numpyro_sg.kernels.moves`; both
  :func:`block_move`).
* **STEP 2.** A uniformly random subset J of J = ``update_size`` coordinates is chosen
  (:func:`draw_subset`) and their indicators are redrawn: ``variant="exact"`` (Alg. 1)
  sequentially from q_j (:func:`sequential_sweep`); ``variant="async"`` (Alg. 2) all in
  parallel (:func:`async_update`) from
  q̃_j = sigmoid(logit π(δ_j=1) + log p(θ_j|1) − log p(θ_j|0) + θ_j·G_j + Q_j) with one gradient
  G = ∇_β ℓ(β) (:func:`glm_async_gradient`, :func:`dense_async_gradient`) at
  β = θ·(δ ∨ 1_J) (``async_point="current"``) or β = θ·ϑ (ϑ = δ with the chosen coordinates
  off, the paper's eq. (7): ``"excluded"``); ``variant="sgld"`` (Alg. 3) likewise with Ĝ
  from STEP 1's mini-batch scaled by N/B.

Step size: absolute, θ' = θ + (ε/2)·ĝ(θ) + N(0, ε·I) for both the MALA proposal and the SGLD
step, in the model's unconstrained coordinates (no preconditioner); the paper writes γ with
noise √(2γ), so ε = 2γ.  The MALA ε is adapted during warmup only (:func:`robbins_monro`).

Lazy spike draws: an excluded θ_j is used by the algorithm only when j is chosen in STEP 2,
where it is drawn afresh from the spike; at other times its value has no effect on the chain.
The kernel therefore draws the J chosen ones only and, for the output, redraws every excluded
coordinate from the spike at each kept draw (in ``postprocess_fn``, from a key stored with the
draw).  The returned θ therefore has the law of the paper's θ̄ at every draw.

**Fast path** (GLM likelihood η = offset + X·β of family Gaussian / Bernoulli / Poisson, Normal
spike and slab, θ the only continuous site; :mod:`.glm`): the active set is a padded index
list of static size ``max_active`` (kept by :func:`compact_active`); an iteration costs
O(N·(size(δ) + J)) (plus O(N·size(δ)²) for the exact Gaussian draw), independent of p.  The
chosen subset is drawn in O(J) (first J distinct values of 2J uniform integers; an exact
uniform draw of a J-subset).  Otherwise a dense path (:mod:`.dense`) evaluates the model on the
full data (mini-batch for ``"sgld"``) for any model of the spike-and-slab form.

Layout: :mod:`.step` (the state and the pure step with the divergence guard) runs one
iteration on either path, :mod:`.glm` (the fast path, with its asynchronous gradient) or
:mod:`.dense` (the generic path, likewise), both built on :mod:`.updates` (the shared STEP 1
moves, STEP 2 indicator updates and evaluation point); :mod:`.options` and :mod:`.setup`
(options, plan, constants, start), :mod:`.sharded` (the fast path on data split over a mesh),
:mod:`.kernel` (the NumPyro shell :class:`SparseAsync`, hyperparameter ε in ``state.hyper``:
:class:`SparseAsyncHyper`).
"""

from numpyro_sg.kernels.sparse_async.dense import dense_async_gradient  # noqa: F401
from numpyro_sg.kernels.sparse_async.glm import glm_async_gradient  # noqa: F401
from numpyro_sg.kernels.sparse_async.kernel import SparseAsync
from numpyro_sg.kernels.sparse_async.options import SparseAsyncOptions
from numpyro_sg.kernels.sparse_async.step import SparseAsyncHyper, SparseAsyncState  # noqa: F401
from numpyro_sg.kernels.sparse_async.updates import (  # noqa: F401
    BlockMove,
    async_inclusion_logits,
    async_update,
    block_move,
    compact_active,
    draw_subset,
    gaussian_block_draw,
    robbins_monro,
    sequential_sweep,
)

__all__ = ["SparseAsync", "SparseAsyncOptions"]
