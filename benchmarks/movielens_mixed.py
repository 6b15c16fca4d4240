"""The MovieLens linear mixed model of Song, Sun, Ye & Liang (2020) at its scale: a simulator of
ratings of the shape of MovieLens 10M, the model in NumPyro, and two data-augmentation Gibbs
samplers.  Used by ``bench_movielens_gibbs.py`` and by the validation tests.

Model (their supplement; after Srivastava et al. 2018), per user i with s_i ratings y_i:

    y_i = W_i β + W_i b_i + e_i,  b_i ~ N_q(0, σ² D),  e_i ~ N(0, σ² I),
    β | σ² ~ N_p(0, σ² I),  σ² ~ 1/χ²₂,  D ~ inverse-Wishart(p + 2, I_q),   p = q = 6,

W_i's columns: an intercept, the film's genre (3 effect-coded columns), its popularity and the
"previous rating" indicator.

**Simulation** (:func:`simulate`; the ratings are on MovieLens's 0.5–5 grid, modelled as Gaussian
as the paper does).  Users, films and ratings in MovieLens 10M's proportions (71,567 users,
10,681 films per 10⁷ ratings); ratings per user 20 + a log-normal tail (median about 70, mean
N/users, at most 7,000); films drawn with Zipf-like popularity (a user may rate a film twice);
1–3 genres per film out of the 18 that the paper groups into four categories; each user's
ratings at increasing times within a personal period.  A rating is
clip(round₀.₅(3.5 + user + film + user's genre taste · genre + noise), 0.5, 5); the predictors
are then computed from the data as the paper defines them: the genre predictor is the mean of
the film's categories' effect codes (Children (1,0,0), Comedy (0,1,0), Drama (0,0,1), Action
(−1,−1,−1)); popularity is logit((l + 0.5)/(L + 1)) over the film's L ≤ 30 most recent earlier
ratings, l of them above 3; "previous" is 1 when the user's previous rating was above 3.

**The model's data** are per-user sufficient statistics (:func:`user_statistics`: WᵢᵀWᵢ, Wᵢᵀyᵢ,
yᵢᵀyᵢ, s_i): the Gaussian likelihood of a user's ratings is a function of them, so a mini-batch
of users costs O(n q²) however many ratings they have.  :func:`model` samples L, the Cholesky
factor of D⁻¹ (site ``prec_chol``, Wishart(p + 2, I)), and the random effects ``b`` centred, as
Algorithm S1 imputes them (decentred effects would give its one-draw gradient of σ² and D a
variance that grows with a user's number of ratings).

**Gibbs samplers** (b | θ per user; (β, σ²) | b, D normal–inverse-gamma; D⁻¹ | b, σ² Wishart by
Bartlett's decomposition), started as the paper does (least squares for β and σ², D = 0.2 I):

* :func:`gibbs_rows`: as the paper describes it, each iteration passes over all N ratings
  (the residuals given b and β); only the per-user Gram matrices WᵢᵀWᵢ are computed once;
* :func:`gibbs_statistics`: the best we could write, from the per-user sufficient statistics,
  O(users · q³) per iteration whatever N.

With the same key both give the same draws (up to rounding): they are one algorithm.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import random

from numpyro_sg.locals.marginal import _cholesky, _solve_lower

#: MovieLens 10M's size
RATINGS, USERS, FILMS = 10_000_054, 71_567, 10_681
P = 6   # fixed effects = random effects per user
#: the paper's four categories' effect codes, and the 18 genres grouped into them (with rough
#: MovieLens frequencies)
CODES = np.array([[-1, -1, -1], [1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float32)  # Action, Children, Comedy, Drama
GENRE_CATEGORY = np.array([0] * 6 + [1] * 2 + [2] + [3] * 9)
GENRE_WEIGHT = np.array([15, 10, 5, 8, 7, 15, 3, 5, 30, 12, 4, 45, 1, 3, 5, 17, 4, 2], float)


def _ratings_per_user(rng, users, ratings, films):
    tail = rng.lognormal(np.log(50.0), 1.3, users)
    extra = ratings - 20 * users
    for _ in range(5):                                   # scale to the total, cap the tail
        tail = np.minimum(tail * extra / tail.sum(), min(7000, films) - 20)
    counts = 20 + np.floor(tail).astype(np.int64)
    short = ratings - counts.sum()
    np.add.at(counts, rng.choice(users, size=abs(short)), np.sign(short))
    return counts


def simulate(num_ratings: int = RATINGS, seed: int = 0, with_film_and_time: bool = False):
    """``(user, W, y)``: the user of each rating (int32, sorted), the predictors (N, 6) float32
    and the ratings (N,) float32 of a MovieLens-10M-shaped data set (module docstring); with
    ``with_film_and_time``, also each rating's film and time."""
    rng = np.random.default_rng(seed)
    scale = num_ratings / RATINGS
    users, films = max(10, round(USERS * scale)), max(100, round(FILMS * scale))
    counts = _ratings_per_user(rng, users, num_ratings, films)
    user = np.repeat(np.arange(users, dtype=np.int32), counts)
    n, ends = user.size, np.cumsum(counts)
    first = ends - counts                                # each user's first row
    cdf = np.cumsum((np.arange(films) + 50.0) ** -1.1)
    film = np.searchsorted(cdf / cdf[-1], rng.random(n, np.float32)).astype(np.int32)
    # times: increasing within each user's own period (a cumulative sum of gaps)
    time = np.cumsum(rng.standard_exponential(n, np.float32), dtype=np.float64)
    time -= np.repeat(np.concatenate([[0.0], time[ends[:-1] - 1]]), counts)
    time *= np.repeat(rng.uniform(0.01, 0.3, users) / time[ends - 1], counts)
    time += np.repeat(rng.uniform(0.0, 0.69, users), counts)           # times in [0, 1)
    # films' genres and the ratings
    k = rng.choice([1, 2, 3], films, p=[0.4, 0.35, 0.25])
    picks = rng.choice(18, (films, 3), p=GENRE_WEIGHT / GENRE_WEIGHT.sum())
    use = np.arange(3)[None] < k[:, None]
    genre = ((CODES[GENRE_CATEGORY[picks]] * use[..., None]).sum(1) / k[:, None]).astype(np.float32)
    taste = rng.normal(0, 0.25, (users, 3)).astype(np.float32)
    latent = rng.standard_normal(n, np.float32)
    latent *= 0.75
    latent += (3.5 + rng.normal(0, 0.45, users)).astype(np.float32)[user]
    latent += rng.normal(0, 0.45, films).astype(np.float32)[film]
    for j in range(3):
        latent += taste[user, j] * genre[film, j]
    y = np.clip(np.round(2 * latent) / 2, 0.5, 5.0).astype(np.float32)
    del latent
    liked = (y > 3).astype(np.int32)
    W = np.empty((n, P), np.float32)
    W[:, 0] = 1.0
    W[:, 1:4] = genre[film]
    extra = (film, time.copy()) if with_film_and_time else ()
    # popularity: the film's ≤ 30 most recent earlier ratings
    time += film                                         # sorts by film, then time
    order = np.argsort(time)
    del time
    f_sorted = film[order]
    recent = np.arange(n) - np.searchsorted(f_sorted, f_sorted, side="left")
    del f_sorted
    np.minimum(recent, 30, out=recent)
    before = np.concatenate([[0], np.cumsum(liked[order])[:-1]])
    likes = before - before[np.arange(n) - recent]
    del before
    W[order, 4] = np.log((likes + 0.5) / (recent - likes + 0.5))
    del order, recent, likes
    W[1:, 5] = liked[:-1]
    W[first, 5] = 0.0
    return (user, W, y) + extra


def user_statistics(user, W, y, num_users=None):
    """Per-user sufficient statistics ``(WtW (U, 6, 6), Wty (U, 6), yty (U,), s (U,))``, float32
    (sums in float64)."""
    U = num_users or int(user.max()) + 1
    WtW = np.empty((U, P, P))
    for a in range(P):
        for b in range(a, P):
            WtW[:, a, b] = WtW[:, b, a] = np.bincount(user, W[:, a] * W[:, b].astype(np.float64), U)
    Wty = np.stack([np.bincount(user, W[:, a] * y.astype(np.float64), U) for a in range(P)], -1)
    yty = np.bincount(user, y.astype(np.float64) ** 2, U)
    s = np.bincount(user, minlength=U).astype(np.float64)
    return tuple(a.astype(np.float32) for a in (WtW, Wty, yty, s))


def model(WtW, Wty, yty, s, subsample_size=500):
    """The paper's linear mixed model on per-user sufficient statistics (module docstring); the
    random effects ``b`` are the local latents of the subsample plate ``users``."""
    U = WtW.shape[0]
    sigma2 = numpyro.sample("sigma2", dist.InverseGamma(1.0, 0.5))           # 1/χ²₂
    beta = numpyro.sample("beta", dist.Normal(0.0, jnp.sqrt(sigma2)).expand([P]).to_event(1))
    prec_chol = numpyro.sample("prec_chol", dist.WishartCholesky(P + 2.0, scale_tril=jnp.eye(P)))
    root = _solve_lower(prec_chol, jnp.eye(P)).T                   # L⁻ᵀ, root rootᵀ = D = (L Lᵀ)⁻¹
    scale_tril = jnp.sqrt(sigma2) * _cholesky(root @ root.T)
    with numpyro.plate("users", U, subsample_size=min(subsample_size, U)):
        b = numpyro.sample("b", dist.MultivariateNormal(jnp.zeros(P), scale_tril=scale_tril))
        A, c, q, n = (numpyro.subsample(a, event_dim=a.ndim - 1) for a in (WtW, Wty, yty, s))
        coef = beta + b
        sse = q - 2 * jnp.einsum("nk,nk->n", coef, c) + jnp.einsum("nk,nkl,nl->n", coef, A, coef)
        numpyro.factor("ratings", -0.5 * n * jnp.log(2 * jnp.pi * sigma2) - 0.5 * sse / sigma2)


def _wishart_cholesky(key, df, scale_chol):
    """Cholesky factor of a Wishart(df, S) draw, S = scale_chol scale_cholᵀ (Bartlett)."""
    k1, k2 = random.split(key)
    idx = jnp.arange(P)
    chi = jnp.sqrt(2 * random.gamma(k1, (df - idx) / 2))
    A = jnp.tril(random.normal(k2, (P, P)), -1) + jnp.diag(chi)
    return scale_chol @ A


def _theta_given_b(key, b, sums, Lam, num_ratings, num_users):
    """(β, σ²) | b, D and D⁻¹ | b, σ² from the sums Wᵀ(y − Wb), ‖y − Wb‖², WᵀW."""
    Wtr, rss, WtW_total = sums
    k1, k2, k3 = random.split(key, 3)
    V = jnp.linalg.inv(WtW_total + jnp.eye(P))
    beta_hat = V @ Wtr
    quad = jnp.einsum("gk,kl,gl->", b, Lam, b)
    shape = 1.0 + num_ratings / 2 + num_users * P / 2
    sigma2 = (0.5 + (rss - Wtr @ beta_hat) / 2 + quad / 2) / random.gamma(k1, shape)
    beta = beta_hat + jnp.sqrt(sigma2) * jnp.linalg.cholesky(V) @ random.normal(k2, (P,))
    S = jnp.eye(P) + b.T @ b / sigma2
    chol = _wishart_cholesky(k3, P + 2.0 + num_users, jnp.linalg.cholesky(jnp.linalg.inv(S)))
    return beta, sigma2, chol @ chol.T, chol


def _b_given_theta(key, WtW, Wtr_user, Lam, sigma2):
    """b_i | θ, y_i per user: N(A_i⁻¹ Wᵢᵀ(yᵢ − Wᵢβ), σ² A_i⁻¹), A_i = WᵢᵀWᵢ + D⁻¹ (elementwise
    6×6 algebra, no batched LAPACK call)."""
    C = _cholesky(WtW + Lam)
    mean = _solve_lower(C, _solve_lower(C, Wtr_user[..., None]), transpose=True)[..., 0]
    noise = _solve_lower(C, random.normal(key, mean.shape)[..., None], transpose=True)[..., 0]
    return mean + jnp.sqrt(sigma2) * noise


def _least_squares_start(WtW_total, Wty_total, yty_total, num_ratings):
    beta = jnp.linalg.solve(WtW_total, Wty_total)
    sigma2 = (yty_total - Wty_total @ beta) / (num_ratings - P)
    return beta, sigma2, jnp.eye(P) / 0.2


def gibbs_statistics(WtW, Wty, yty, s):
    """``(init, step)`` of the Gibbs sampler on per-user sufficient statistics; state (β, σ², D⁻¹),
    a step's output (β, σ², chol D⁻¹, b)."""
    WtW_total, Wty_total = WtW.sum(0), Wty.sum(0)
    N, U = s.sum(), WtW.shape[0]

    def init():
        return _least_squares_start(WtW_total, Wty_total, yty.sum(), N)

    def step(state, key):
        beta, sigma2, Lam = state
        k1, k2 = random.split(key)
        b = _b_given_theta(k1, WtW, Wty - WtW @ beta, Lam, sigma2)
        Wtr = Wty_total - jnp.einsum("gkl,gl->k", WtW, b)
        rss = jnp.sum(yty - 2 * jnp.einsum("gk,gk->g", b, Wty) + jnp.einsum("gk,gkl,gl->g", b, WtW, b))
        beta, sigma2, Lam, chol = _theta_given_b(k2, b, (Wtr, rss, WtW_total), Lam, N, U)
        return (beta, sigma2, Lam), (beta, sigma2, chol, b)

    return init, step


def gibbs_rows(user, W, y, WtW):
    """``(init, step)`` of the same Gibbs sampler written as the paper describes it: each
    iteration computes the residuals of all N ratings twice (given β, then given b)."""
    WtW_total = WtW.sum(0)
    N, U = y.shape[0], WtW.shape[0]

    def init():
        return _least_squares_start(W.T @ W, W.T @ y, y @ y, N)

    def step(state, key):
        beta, sigma2, Lam = state
        k1, k2 = random.split(key)
        resid = y - W @ beta
        Wtr_user = jax.ops.segment_sum(W * resid[:, None], user, U, indices_are_sorted=True)
        b = _b_given_theta(k1, WtW, Wtr_user, Lam, sigma2)
        resid = y - jnp.einsum("nk,nk->n", W, b[user])
        sums = (W.T @ resid, resid @ resid, WtW_total)
        beta, sigma2, Lam, chol = _theta_given_b(k2, b, sums, Lam, N, U)
        return (beta, sigma2, Lam), (beta, sigma2, chol, b)

    return init, step
