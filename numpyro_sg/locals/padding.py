"""Ragged groups as rectangular arrays: :func:`pad_groups`."""

from __future__ import annotations

import numpy as np


def pad_groups(group, *columns, max_rows=None, fill=0.0):
    """Pad a long table (one row per observation) into (G, R) arrays by group, and a mask.

    :param group: (N_obs,) group label of each row (any sortable labels).
    :param columns: arrays with N_obs rows each (extra trailing dims are kept: (G, R, ...)).
    :param max_rows: R, the rows kept per group (default: the largest group); a larger group
        raises ValueError.
    :param fill: value of the padding entries.
    :return: ``(labels (G,), padded columns..., mask (G, R) bool)``, groups in sorted label order
        and rows in their original order within a group.

    >>> labels, x, mask = pad_groups([7, 3, 7, 7], [1.0, 2.0, 3.0, 4.0])
    >>> labels.tolist(), x.tolist(), mask.tolist()
    ([3, 7], [[2.0, 0.0, 0.0], [1.0, 3.0, 4.0]], [[True, False, False], [True, True, True]])
    """
    group = np.asarray(group)
    labels, gid, counts = np.unique(group, return_inverse=True, return_counts=True)
    R = int(counts.max()) if max_rows is None else int(max_rows)
    if counts.max() > R:
        raise ValueError(f"A group has {int(counts.max())} rows, more than max_rows={R}.")
    order = np.argsort(gid, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.empty(len(group), np.int64)
    pos[order] = np.arange(len(group)) - np.repeat(starts, counts)
    mask = np.zeros((len(labels), R), bool)
    mask[gid, pos] = True
    out = []
    for col in columns:
        col = np.asarray(col)
        if col.shape[0] != len(group):
            raise ValueError(f"A column has {col.shape[0]} rows, the group labels {len(group)}.")
        dtype = np.result_type(col.dtype, np.asarray(fill).dtype)
        padded = np.full((len(labels), R) + col.shape[1:], fill, dtype)
        padded[gid, pos] = col
        out.append(padded)
    return (labels, *out, mask)
