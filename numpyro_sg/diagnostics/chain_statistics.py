"""ArviZ's convergence statistics, vectorised over coordinates.

The rank-normalised split-R̂, the bulk and tail effective sample sizes and the Monte Carlo
standard errors of Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), 'Rank-normalization,
folding, and localization: an improved R̂ for assessing convergence of MCMC', computed as
ArviZ 0.x computes them (``arviz.summary``'s diagnostics columns, ``arviz.ess``,
``arviz.rhat``), to float64 rounding, but for every coordinate of a site at once.  ArviZ 0.x
runs a Python loop per coordinate (Geyer's initial monotone sequence is a ``while`` loop):
the diagnostics of 3,760 coordinates × 4 chains × 2,000 draws take it about 70 s on 2 cores,
these functions 10 s (``benchmarks/bench_summary.py``).  Geyer's sequences become cumulative
operations over the lag pairs; blocks of coordinates run on one thread per core.

Every public function takes draws ``x`` of shape (chains, draws, d) and returns (d,) arrays; a
coordinate with a NaN gives NaN, fewer than 4 draws per chain give NaN, one chain gives a NaN R̂.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy import fft, special

__all__ = ["ess_bulk", "rank_rhat_and_ess_bulk", "summary_diagnostics"]

#: coordinates per block (the autocovariances' FFT holds chains × 2·draws × block complex numbers)
BLOCK = 256


def _split(x):
    """(d, m, n) → (d, 2m, n // 2): each chain's first and last halves as two chains."""
    half = x.shape[2] // 2
    return np.concatenate([x[:, :, :half], x[:, :, x.shape[2] - half:]], axis=1)


def _average_ranks(a):
    """Ranks 1..n of each row of a (d, n), ties given their average rank (``method="average"``)."""
    order = np.argsort(a, axis=1)   # ties get their average rank whatever their order
    ordered = np.take_along_axis(a, order, axis=1)
    n = a.shape[1]
    pos = np.broadcast_to(np.arange(1.0, n + 1.0), a.shape)
    new_run = np.ones(a.shape, bool)
    new_run[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    run_end = np.ones(a.shape, bool)
    run_end[:, :-1] = new_run[:, 1:]
    first = np.maximum.accumulate(np.where(new_run, pos, 0.0), axis=1)
    last = np.minimum.accumulate(np.where(run_end, pos, np.inf)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty(a.shape)
    np.put_along_axis(ranks, order, 0.5 * (first + last), axis=1)
    return ranks


def _z_scale(x):
    """Normal scores of the ranks over all chains and draws, per coordinate (Blom's offset 3/8)."""
    d, m, n = x.shape
    rank = _average_ranks(x.reshape(d, m * n))
    return special.ndtri((rank - 0.375) / (m * n + 0.25)).reshape(x.shape)


def _rhat(x):
    """Split-free R̂ of chains x (d, m, n)."""
    n = x.shape[2]
    between = n * np.var(x.mean(axis=2), axis=1, ddof=1)
    within = np.mean(np.var(x, axis=2, ddof=1), axis=1)
    return np.sqrt((between / within + n - 1) / n)


def _autocov(x):
    """Autocovariances of each chain at every lag (last axis), by FFT, divided by n."""
    n = x.shape[2]
    size = fft.next_fast_len(2 * n)
    f = fft.rfft(x - x.mean(axis=2, keepdims=True), n=size, axis=2)
    return fft.irfft(f.real**2 + f.imag**2, n=size, axis=2)[:, :, :n] / n


def _ess(x):
    """ESS of chains x (d, m, n) with Geyer's initial positive and monotone sequences."""
    d, m, n = x.shape
    with np.errstate(invalid="ignore", divide="ignore"):
        acov = _autocov(x)
        mean_var = np.mean(acov[:, :, 0], axis=1) * n / (n - 1.0)
        var_plus = mean_var * (n - 1.0) / n
        if m > 1:
            var_plus = var_plus + np.var(x.mean(axis=2), axis=1, ddof=1)
        rho = (1.0 - (mean_var[:, None] - np.mean(acov, axis=1)) / var_plus[:, None]).T   # (n, d)
    rho[0] = 1.0
    kmax = max((n - 3) // 2, 0)                  # the last lag pair the sequence may reach
    pairs = rho[0:2 * kmax + 2:2] + rho[1:2 * kmax + 2:2]                 # (kmax + 1, d)
    k = np.arange(kmax + 1)[:, None]
    stop = np.where((pairs <= 0.0) & (k >= 1), k, kmax).min(axis=0) if kmax else np.zeros(d, int)
    stop = np.where(pairs[0] <= 0.0, 0, stop)     # K: the pair at which the sequence stops
    monotone = np.minimum.accumulate(pairs, axis=0)
    body = np.sum(np.where(k < stop, monotone, 0.0), axis=0)
    even = np.take_along_axis(rho, 2 * stop[None], axis=0)[0]
    last_pair = np.take_along_axis(pairs, stop[None], axis=0)[0]
    tail = np.where((stop == 0) | (last_pair >= 0.0) | (even > 0.0), even, 0.0)
    tau = np.maximum(-1.0 + 2.0 * body + tail, 1.0 / math.log10(m * n))
    ess = m * n / tau
    ess = np.where(np.isnan(rho).any(axis=0), np.nan, ess)
    constant = (np.max(x, axis=(1, 2)) - np.min(x, axis=(1, 2))) < np.finfo(float).resolution
    return np.where(constant, float(m * n), ess)


def _blocks(fn, x, outputs: int):
    """``fn`` over blocks of :data:`BLOCK` coordinates of x (m, n, d), each given as a contiguous
    (block, m, n) array (the FFTs and sorts run along draws), one thread per core (NumPy and
    SciPy release the GIL in them), NaN for coordinates with a NaN or fewer than 4 draws per
    chain; ``outputs`` arrays (d,)."""
    x = np.asarray(x)
    d = x.shape[2]
    out = np.full((outputs, d), np.nan)
    if x.shape[1] < 4:
        return out

    def block(lo):
        part = np.ascontiguousarray(np.moveaxis(x[:, :, lo:lo + BLOCK], 2, 0), dtype=np.float64)
        ok = ~np.isnan(part).any(axis=(1, 2))
        if ok.any():
            with np.errstate(invalid="ignore", divide="ignore"):
                out[:, lo:lo + BLOCK][:, ok] = fn(part[ok] if not ok.all() else part)

    starts = range(0, d, BLOCK)
    if len(starts) == 1:
        block(0)
    else:
        with ThreadPoolExecutor(min(len(starts), os.cpu_count() or 1)) as pool:
            list(pool.map(block, starts))
    return out


def _bulk(x):
    return _ess(_z_scale(_split(x)))


def _rank_rhat(x, fold_at_full_median: bool = False, z=None):
    """max of the bulk and folded split-R̂; the folded draws are |x − median| with the median
    of the split chains (``arviz.rhat``) or of all draws (``arviz.summary``: they differ when an
    odd number of draws drops the middle one).  ``z``: the split chains' normal scores, if known
    (the bulk ESS needs them too)."""
    if x.shape[1] < 2:
        return np.full(x.shape[0], np.nan)
    split = _split(x)
    folded = np.abs(split - np.median(x if fold_at_full_median else split, axis=(1, 2))[:, None, None])
    return np.maximum(_rhat(_z_scale(split) if z is None else z), _rhat(_z_scale(folded)))


def ess_bulk(x):
    """Bulk ESS (``arviz.ess(method="bulk")``) of every coordinate of x (chains, draws, d)."""
    return _blocks(lambda b: _bulk(b)[None], x, 1)[0]


def _rhat_and_bulk(x):
    z = _z_scale(_split(x))
    return np.stack([_rank_rhat(x, z=z), _ess(z)])


def rank_rhat_and_ess_bulk(x):
    """The rank-normalised split-R̂ (``arviz.rhat``) and the bulk ESS (:func:`ess_bulk`) of every
    coordinate of x (chains, draws, d), sharing the split chains' normal scores: ``(rhat, ess)``,
    (d,) arrays."""
    rhat, ess = _blocks(_rhat_and_bulk, x, 2)
    return rhat, ess


def _diagnostics(x):
    d, m, n = x.shape
    flat = x.reshape(d, m * n)
    low, high = np.quantile(flat, [0.05, 0.95], axis=1)[:, :, None, None]
    tail = np.minimum(_ess(_split((x <= low).astype(float))), _ess(_split((x <= high).astype(float))))
    centred2 = (x - flat.mean(axis=1)[:, None, None]) ** 2
    total = centred2.sum(axis=(1, 2))
    mcse_mean = np.sqrt(total / (m * n - 1) / _ess(_split(x)))
    evar = total / (m * n)
    varvar = ((centred2**2).mean(axis=(1, 2)) - evar**2) / _ess(_split(centred2))
    mcse_sd = np.sqrt(varvar / evar / 4)
    z = _z_scale(_split(x))
    return np.stack([mcse_mean, mcse_sd, _ess(z), tail, _rank_rhat(x, fold_at_full_median=True, z=z)])


#: the columns of :func:`summary_diagnostics`, in ``arviz.summary``'s order
DIAGNOSTICS = ("mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat")


def summary_diagnostics(x) -> dict:
    """``arviz.summary``'s diagnostics columns (:data:`DIAGNOSTICS`) of every coordinate of x
    (chains, draws, d): ``{column: (d,) array}``."""
    return dict(zip(DIAGNOSTICS, _blocks(_diagnostics, x, len(DIAGNOSTICS))))
