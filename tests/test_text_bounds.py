"""table/text.py at each dtype it meets (issue 39 item 6): shared_text's storage and identity, and
blank_cells on python-stored, pyarrow-stored and object text, numbers, NA, and cells that start
blank without being blank."""

from __future__ import annotations

import pandas as pd

from cublas_audit.table.text import blank_cells, shared_text

CELLS = ["a", " ", " a", "", "\t\n", None, "a "]
BLANK = [False, True, False, True, True, False, False]


def test_shared_text_is_python_stored_text_once() -> None:
    given = pd.Series(["x", None, "x"], index=[3, 4, 5], name="kernel", dtype=object)
    shared = shared_text(given)
    assert shared.dtype == pd.StringDtype("python")
    assert shared.tolist() == ["x", pd.NA, "x"] and list(shared.index) == [3, 4, 5]
    assert shared.name == "kernel" and shared.iloc[0] is shared.iloc[2]  # one string, shared
    assert shared_text(shared) is shared  # held so already: no copy


def test_blank_cells_of_each_text_storage() -> None:
    for dtype in (pd.StringDtype("python"), pd.StringDtype("pyarrow"), object):
        got = blank_cells(pd.Series(CELLS, dtype=dtype, index=range(10, 17)))
        assert got.tolist() == BLANK, dtype
        assert list(got.index) == list(range(10, 17))
    assert blank_cells(shared_text(pd.Series(CELLS, dtype=object))).tolist() == BLANK


def test_blank_cells_of_numbers_and_mixed_objects() -> None:
    assert blank_cells(pd.Series([1, 2])).tolist() == [False, False]
    assert blank_cells(pd.Series([1.5, None])).tolist() == [False, False]
    mixed = pd.Series([1, " ", "b", None, 2.5], dtype=object)  # not a string column to pandas
    assert blank_cells(mixed).tolist() == [False, True, False, False, False]


def test_blank_cells_test_each_distinct_text_once() -> None:
    """A column of one blank value in every row (a map table's `broadcast`: "") tests that value
    once, not each of its rows (a 262,144-row table's read tested every cell of such columns)."""
    tested: list[str] = []

    class Counted(str):
        def strip(self, chars: str | None = None) -> str:
            tested.append(str(self))
            return str.strip(self, chars)

    blank, word = Counted(""), Counted(" a")
    got = blank_cells(pd.Series([blank, word, blank, None, blank] * 200, dtype=object))
    assert got.tolist() == [True, False, True, False, True] * 200
    assert sorted(tested) == ["", " a"]
