"""KSD paths: the KSD of the first k draws for several k, in one blocked pass."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from numpyro_sg.diagnostics.ksd_blocks import (
    check_block,
    default_block,
    normalise,
    pair_block_sums,
    to_device,
)
from numpyro_sg.diagnostics.scales import precondition, resolve_scales
from numpyro_sg.diagnostics.stein_kernels import signed_sqrt
from numpyro_sg.diagnostics.validation import (
    as_draws,
    check_kernel_args,
    check_thin,
    draws_and_scores,
    reject_run,
)

# what to call instead with an InferenceData or MCMC run
_RUN_ENTRY = "numpyro_sg.ksd"


def default_path_steps(T: int, num_steps: int = 20) -> np.ndarray:
    """About ``num_steps`` evenly spaced draw counts T/num_steps, 2T/num_steps, …, T.

    :param int T: number of draws.
    :param int num_steps: number of counts wanted (fewer when T < num_steps: duplicates are
        dropped).
    :return: sorted, unique int64 array of counts in [1, T], ending with T.

    **Example:**

    >>> from numpyro_sg.diagnostics.ksd import default_path_steps
    >>> default_path_steps(100, 4).tolist()
    [25, 50, 75, 100]
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}.")
    steps = np.round(np.linspace(T / num_steps, T, num_steps)).astype(np.int64)
    return np.unique(np.clip(steps, 1, T))


def _segments(boundaries, T, B):
    """Cut [0, T) at ``boundaries`` and into pieces of at most B; return the piece ends."""
    cuts = sorted({int(b) for b in boundaries} | {T})
    ends, start = [], 0
    for cut in cuts:
        while cut - start > B:
            start += B
            ends.append(start)
        if cut > start:
            ends.append(cut)
            start = cut
    return np.asarray(ends)


def _path_steps(steps, num_steps, T_full):
    """The validated steps (int64), or the default ones (:func:`default_path_steps`)."""
    if steps is None:
        return default_path_steps(T_full, num_steps)
    steps = np.asarray(steps)
    if steps.ndim != 1 or steps.size == 0 or not np.issubdtype(steps.dtype, np.integer):
        raise ValueError(f"steps must be a non-empty 1-D array of integers; got {steps!r}.")
    if steps.min() < 1 or steps.max() > T_full:
        raise ValueError(f"steps must lie in [1, T] = [1, {T_full}]; got range [{steps.min()}, {steps.max()}].")
    return steps.astype(np.int64)


def _segment_size(shape, num_counts, per_coordinate, block_size):
    """The most draws per segment of a path over draws of ``shape`` (T, d)."""
    T, d = shape
    B = block_size or (default_block(T, T) if not per_coordinate else None)
    if B is None:  # per coordinate: the einsum output (B, G, 6d+2) also counts
        n_guess = -(-T // default_block(T, T)) + num_counts
        B = default_block(T, max(T, n_guess * (6 * d + 2)))
    # the (segments × segments [× d]) float64 output is kept below ~256 MB: at most
    # √(3.2e7/d) segments, so pieces grow past B for very long chains
    max_seg = int(np.sqrt(3.2e7 / (d if per_coordinate else 1)))
    return max(min(B, T), -(-T // max(max_seg - num_counts, 1)))


def _segment_pair_sums(x, s, ends, *, c, beta, per_coordinate, exclude_diagonal):
    """The (segments × segments [× d]) float64 matrix of Σ k_π (or each k_j) over the pairs of
    draws of two segments, the segments ending at ``ends``."""
    starts = np.concatenate([[0], ends[:-1]])
    Bseg = int(np.max(ends - starts))
    idx = starts[:, None] + np.arange(Bseg)[None, :]
    valid = idx < ends[:, None]
    idx = np.where(valid, idx, 0)
    xj, sj = to_device(x, s)
    gx, gs = xj[idx], sj[idx]
    gw = jnp.asarray(valid, xj.dtype)
    gi = jnp.asarray(np.where(valid, idx, -1))
    out = pair_block_sums(
        gx, gs, gw, gi, gx, gs, gw, gi, c=float(c), beta=float(beta),
        per_coordinate=bool(per_coordinate), exclude_diagonal=exclude_diagonal,
    )
    return np.asarray(out, dtype=np.float64)


def ksd_path(x, score=None, *, scores=None, steps=None, num_steps=20, c=1.0, beta=-0.5,
             preconditioner="sd", per_coordinate=False, statistic="v", thin=None, block_size=None):
    """KSD of the first k draws, for several k, in one blocked pass (a KSD-versus-time path).

    The draws are cut into segments at the requested steps (and into pieces of at most
    ``block_size``); one pass computes the (segments × segments) matrix of block-pair sums
    of k_π (or of each k_j), and a 2-D cumulative sum gives Σ_{t,t'<k} at every step k.
    Cost: one KSD of all T draws; memory O(T·block + segments²·d).

    **One scale for the whole path**: with ``preconditioner="sd"`` the scales are the sd of
    *all* (thinned) draws, not of the first k, so every point of the path is on the same
    scale; ``"laplace"`` and arrays are likewise fixed.  The value at k = T therefore equals
    ``ksd`` of all draws.

    The other parameters (``x``, ``score``, ``scores``, ``c``, ``beta``, ``preconditioner``,
    ``per_coordinate``, ``statistic``, ``thin``, ``block_size``) are those of
    :func:`~numpyro_sg.diagnostics.ksd.ksd`,
    applied at each step.

    :param steps: draw counts k (1 ≤ k ≤ T, counted in ``x`` before thinning; the value at k
        uses the thinned draws among the first k).  Default: ``num_steps`` evenly spaced
        counts up to T (:func:`default_path_steps`).
    :param int num_steps: number of default steps.
    :return: (steps, ksd): int64 array of the steps and float64 array of the KSD values
        (NaN for the U-statistic where fewer than 2 draws are used).

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.diagnostics.ksd import ksd, ksd_path
    >>> x = np.random.default_rng(0).normal(size=(1000, 2))
    >>> steps, values = ksd_path(x, scores=-x, num_steps=4)
    >>> steps.tolist()
    [250, 500, 750, 1000]
    >>> bool(np.isclose(values[-1], ksd(x, scores=-x)))
    True
    """
    reject_run(x, "ksd_path", _RUN_ENTRY)
    check_kernel_args(c, beta, statistic)
    block_size = check_block(block_size)
    thin_ = check_thin(thin)
    steps = _path_steps(steps, num_steps, as_draws(x, "x").shape[0])
    x, s = draws_and_scores(x, score, scores, thin_, batch_size=block_size or 256)
    scales = resolve_scales(preconditioner, x, score)
    x, s = precondition(x, s, scales)
    counts = -(-steps // thin_)  # thinned draws among the first k: ceil(k / thin)
    size = _segment_size(x.shape, len(counts), per_coordinate, block_size)
    ends = _segments(counts[counts > 0], x.shape[0], size)
    out = _segment_pair_sums(x, s, ends, c=c, beta=beta, per_coordinate=per_coordinate,
                             exclude_diagonal=(statistic == "u"))
    cum = np.cumsum(np.cumsum(out, axis=0), axis=1)
    seg_of = {int(e): i for i, e in enumerate(ends)}
    vals = np.empty(len(steps))
    for m, k in enumerate(counts):
        sq = normalise(cum[seg_of[int(k)], seg_of[int(k)]], int(k), statistic)
        vals[m] = np.sum(signed_sqrt(sq)) if per_coordinate else float(signed_sqrt(sq))
    return steps, vals
