"""judge/dominance.py pinned: each problem's fastest strictly dominating problem, on both paths,
against the definition computed row by row, on the first 300 problems of the H100's random FP32
map (reports/h100/maps/20261125-092546-fp32-random) with the 256 rows of its FP32 squares map
(20261123-235543-fp32-64-4096: 64..4096 cubed, each size's layouts), their dims and recorded
kernel times, and on a
hand-made set of ties; and which path a grid's size takes (DENSE_CELLS, at and one cell above)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cublas_audit.judge import dominance
from tests.conftest import REPORTS

MAPS = REPORTS / "h100" / "maps"
RANDOM_FP32 = MAPS / "20261125-092546-fp32-random" / "dispatch.csv"
SQUARES = MAPS / "20261123-235543-fp32-64-4096" / "dispatch.csv"


def by_definition(dims: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each row: among rows no smaller in any dimension and larger in one that are strictly
    faster, the fastest (the first in row order among equal times); -1 where none is."""
    found = np.full(len(times), -1)
    for i in range(len(times)):
        cone = (dims >= dims[i]).all(axis=1) & (dims > dims[i]).any(axis=1)
        faster = cone & (times < times[i])
        if faster.any():
            found[i] = int(np.argmin(np.where(faster, times, np.inf)))
    return found


@pytest.fixture(scope="module")
def recorded() -> tuple[np.ndarray, np.ndarray]:
    columns = ["m", "n", "k", "kernel_time_ms"]
    random = pd.read_csv(RANDOM_FP32, usecols=columns, nrows=300)
    table = pd.concat([random, pd.read_csv(SQUARES, usecols=columns)], ignore_index=True)
    return table[["m", "n", "k"]].to_numpy(dtype=np.int64), table["kernel_time_ms"].to_numpy(float)


# A hand-made set: (dims, time). Row 0 is dominated by rows 1-4; row 1 (equal m, n: larger k)
# by 3; row 2 ties row 0's time (no faster); rows 3 and 4 tie (the first wins); row 5 is
# dominated by nothing (largest m); row 6 equals row 0's dims (not strictly larger: no cone).
HAND_DIMS = np.array(
    [[64, 64, 64], [64, 64, 128], [128, 64, 64], [128, 128, 128], [128, 128, 192],
     [256, 64, 64], [64, 64, 64]]
)  # fmt: skip
HAND_TIMES = np.array([2.0, 1.5, 2.0, 1.0, 1.0, 0.5, 3.0])
# row 0: fastest of rows 1-5 (5: 256x64x64 >= 64^3): 5 at 0.5; row 1: rows 3, 4 at 1.0 -> 3;
# row 2 (128x64x64): rows 3, 4, 5 -> 5; row 3: row 4 dominates at 1.0, not faster -> -1; row 6:
# rows 1-5 (row 0, its equal, is not larger) -> 5
HAND_EXPECTED = [5, 3, 5, -1, -1, -1, 5]


def _paths(monkeypatch: pytest.MonkeyPatch, pairwise: bool, block: int = 2**22) -> None:
    if pairwise:
        monkeypatch.setattr(dominance, "DENSE_CELLS", 0)
    monkeypatch.setattr(dominance, "PAIRS_PER_BLOCK", block)


@pytest.mark.parametrize(
    ("pairwise", "block"),
    [(False, 2**22), (True, 2**22), (True, 556 * 7)],  # the last: blocks of 7 rows
)
def test_the_recorded_map_by_definition(
    recorded: tuple[np.ndarray, np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    pairwise: bool,
    block: int,
) -> None:
    dims, times = recorded
    expected = by_definition(dims, times)
    assert (expected >= 0).sum() == 138 and (expected < 0).sum() == 418  # both kinds
    _paths(monkeypatch, pairwise, block)
    assert dominance.fastest_dominating(dims, times).tolist() == expected.tolist()


@pytest.mark.parametrize("pairwise", [False, True])
def test_ties_and_equal_dims(monkeypatch: pytest.MonkeyPatch, pairwise: bool) -> None:
    assert by_definition(HAND_DIMS, HAND_TIMES).tolist() == HAND_EXPECTED
    _paths(monkeypatch, pairwise)
    assert dominance.fastest_dominating(HAND_DIMS, HAND_TIMES).tolist() == HAND_EXPECTED
    # one row at a time: the first row's answer too
    assert dominance.fastest_dominating(HAND_DIMS[:2], HAND_TIMES[:2]).tolist() == [1, -1]


def test_a_grid_of_dense_cells_is_built_one_more_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 Mi cells: 512 distinct m, 256 n, 256 k (512 rows) is built; 513 m is compared pairwise
    (the paths spied on, nothing computed)."""
    took: list[str] = []

    def spy(name: str):  # type: ignore[no-untyped-def]
        def path(dims: np.ndarray, rank: np.ndarray) -> np.ndarray:
            took.append(name)
            return np.full(len(rank), len(rank))

        return path

    monkeypatch.setattr(dominance, "_dense", spy("dense"))
    monkeypatch.setattr(dominance, "_pairwise", spy("pairwise"))
    assert dominance.DENSE_CELLS == 512 * 256 * 256
    for m_values in (512, 513):
        rows = np.arange(m_values)
        dims = np.stack([rows + 1, rows % 256 + 1, rows % 256 + 1], axis=1)
        found = dominance.fastest_dominating(dims, np.ones(m_values))
        assert (found == -1).all()
    assert took == ["dense", "pairwise"]
