r"""Extended SGLD (ESGLD) for Bayesian variable selection: Song, Sun, Ye & Liang (2020),
"Extended stochastic gradient MCMC for large-scale Bayesian variable selection" (Biometrika),
their Algorithm 1 and supplement §3, and a default for GLM likelihoods with informed,
variance-reduced model moves.

The model (see :mod:`numpyro_sg.spike_slab`) has an indicator γ ∈ {0,1}^p, a latent vector
θ ∈ ℝ^p whose prior may depend on γ, and a likelihood that depends on θ only through
β = θ·γ.  Iteration t, with mini-batch S_t of size n out of N:

1. draw S_t;
2. run m = ``num_models`` Metropolis–Hastings moves on γ with θ fixed (up to sign flips),
   targeting

   .. math::

      \pi(\gamma \mid \theta, X_{n,N}) \propto \pi(\gamma)\,\pi(\theta\mid\gamma)\,
      \exp\Big(\tfrac{N}{n}\sum_{i\in S_t}\log f(x_i \mid \theta\cdot\gamma)\Big),
      \qquad |\gamma| \le q,

   started from the last model of the previous iteration: the paper's reversible-jump chain
   (:mod:`~numpyro_sg.kernels.esgld.paper`) or, the default for a GLM likelihood, informed
   single flips accepted on a control-variate estimate of the log-likelihood
   (:mod:`~numpyro_sg.kernels.esgld.informed`, :mod:`~numpyro_sg.kernels.esgld.targets`);
3. one Langevin step on θ, :func:`~numpyro_sg.kernels.moves.langevin_move`: the paper's
   averages the gradient over the m models,

   .. math::

      \theta^{(t+1)} = \theta^{(t)} + \frac{\varepsilon_t}{2m}\sum_{k=1}^m
      \nabla_\theta \log \pi(\theta^{(t)}\mid\gamma_k, X_{n,N}) + \mathcal N(0, \varepsilon_t\tau I),

   the default uses the control-variate gradient at the last model and ε_j = h·v_j, v_j the
   conditional posterior variance (:mod:`~numpyro_sg.kernels.esgld.step`; without the
   anchor — an intercept, a non-GLM likelihood — v_j from the model's own curvature and a
   start at the mode, :mod:`~numpyro_sg.kernels.esgld.warmup`);
4. the divergence guard :func:`~numpyro_sg.kernels.guard.guarded_update`.

Layout: :mod:`~numpyro_sg.kernels.esgld.options` (options, hyperparameters, static set-up),
:mod:`~numpyro_sg.kernels.esgld.paper` (the reversible-jump proposal and chain),
:mod:`~numpyro_sg.kernels.esgld.weights` (its proposal weights),
:mod:`~numpyro_sg.kernels.esgld.targets` (how both chains and the Langevin step evaluate
the target: indicator targets, coordinate tables, acceptance and penalty, the model-averaged
gradient and the control variates), :mod:`~numpyro_sg.kernels.esgld.informed` (the default's
moves),
:mod:`~numpyro_sg.kernels.esgld.warmup` (the start and Laplace step without the anchor),
:mod:`~numpyro_sg.kernels.esgld.step` (the pure step) and
:mod:`~numpyro_sg.kernels.esgld.kernel` (the :class:`ESGLD` shell).

Cost: for GLM likelihoods (linear predictor η = X·β) a paper proposal updates η for its one
or two changed coordinates, O(n) (plus O(p) to pick the coordinates); otherwise each proposal
evaluates the model on the mini-batch.  The paper's Langevin step costs m model gradients on
the mini-batch.  Nothing is O(N) per iteration (but the default's anchors, O(N·p²) each).
"""

from numpyro_sg.kernels.esgld.kernel import ESGLD
from numpyro_sg.kernels.esgld.options import ESGLDOptions
from numpyro_sg.kernels.esgld.paper import move_probabilities, propose_move, rjmh_indicator_chain  # noqa: F401
from numpyro_sg.kernels.esgld.targets import (  # noqa: F401
    IndicatorTarget,
    acceptance_probability,
    coordinate_table,
    indicator_target,
)
from numpyro_sg.kernels.esgld.weights import (  # noqa: F401
    proposal_weights,
    resolve_proposal_weights,
)

__all__ = ["ESGLD", "ESGLDOptions"]
