"""For each problem of a map series, the fastest problem of its dominance cone: no smaller in any
dimension, larger in at least one (what `size-inversion` pads to). Near-linear in the problems
where the grid is small enough to hold densely, memory-bounded pairwise otherwise.

Ties: the fastest, then the first in row order, encoded once as a rank (a row's position in the
stable order of the times): the smallest rank of a cone is its answer, and a minimum of ranks
needs no tie-breaking of its own. A NaN time ranks last and is never faster.

Dense: each axis compressed to its distinct values, the ranks laid on that grid (absent: `n`,
ranking after every row), a suffix minimum along each axis in turn gives at each cell the best of
every cell >= it; a point's strict cone is the union of the three suffixes one step further along
one axis, so its answer is their minimum.
"""

from __future__ import annotations

import numpy as np

# Above this many cells the dense grid is not built (int32 ranks: 128 MiB per array, two held):
# a shapes file of thousands of distinct sizes is judged pairwise instead.
DENSE_CELLS = 32 * 2**20
# Pairs compared at once by the pairwise fallback (its comparisons: a few bytes each).
PAIRS_PER_BLOCK = 2**22


def fastest_dominating(dims: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each row of `dims` (m, n, k), the position of the fastest row that dominates it,
    where that one is faster than it (strictly); -1 where none is."""
    n = len(times)
    order = np.argsort(times, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    cells = np.prod([len(np.unique(dims[:, axis])) for axis in range(3)], dtype=float)
    best = _dense(dims, rank) if cells <= DENSE_CELLS else _pairwise(dims, rank)
    found = np.full(n, -1, dtype=np.int64)
    some = best < n
    candidate = order[best[some]]
    faster = times[candidate] < times[some]
    found[np.flatnonzero(some)[faster]] = candidate[faster]
    return found


def _dense(dims: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The smallest rank of each row's strict cone (len(rank) where empty), on the grid."""
    n = len(rank)
    axes = [np.unique(dims[:, axis], return_inverse=True) for axis in range(3)]
    shape = tuple(len(values) for values, _ in axes)
    cell = np.ravel_multi_index(tuple(inverse.ravel() for _, inverse in axes), shape)
    grid = np.full(int(np.prod(shape)), n, dtype=np.int32)
    # several rows of one problem (layouts a series does not split): the cell keeps the best
    np.minimum.at(grid, cell, rank.astype(np.int32))
    cone = grid.reshape(shape)
    for axis in range(3):
        suffix = np.flip(cone, axis)  # a view: the running minimum from the far end, in place
        np.minimum.accumulate(suffix, axis=axis, out=suffix)
    beyond = np.full(shape, n, dtype=np.int32)
    beyond[:-1, :, :] = cone[1:, :, :]
    np.minimum(beyond[:, :-1, :], cone[:, 1:, :], out=beyond[:, :-1, :])
    np.minimum(beyond[:, :, :-1], cone[:, :, 1:], out=beyond[:, :, :-1])
    return beyond.ravel()[cell].astype(np.int64)


def _pairwise(dims: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The smallest rank of each row's strict cone (len(rank) where empty), by comparing every
    pair, a block of rows at a time."""
    n = len(rank)
    best = np.empty(n, dtype=np.int64)
    step = max(1, PAIRS_PER_BLOCK // max(n, 1))
    for start in range(0, n, step):
        block = dims[start : start + step, None, :]
        no_smaller = (dims[None, :, :] >= block).all(axis=2)
        larger = (dims[None, :, :] > block).any(axis=2)
        best[start : start + step] = np.where(no_smaller & larger, rank, n).min(axis=1)
    return best
