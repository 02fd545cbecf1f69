"""table/validation.py pinned at its limits (issue 39 item 6): each range's value at, just inside
and just outside its bound (int32 sizes, percentages, times, registers), the words of each fault,
which rows count as a repeated case, where a CSV is cut off, the plan check, and read_once's
cache keys and size. Tiny frames and files; the one recorded table is the H100 smoke run's."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table import validation
from cublas_audit.table.dispatch import TableSource
from tests.conftest import FIXTURES

SMOKE_TABLE = FIXTURES / "h100-smoke" / "dispatch.csv"
SOURCE = TableSource(Path("t.csv"))


def bad(column: str, *values: float) -> list[bool]:
    return list(validation.RANGES[column].bad(pd.Series(values, dtype=float)))


def test_sizes_are_int32_from_one() -> None:
    assert validation.MAX_DIMENSION == 2_147_483_647
    assert bad("m", 1, 2_147_483_647, 0, 2_147_483_648, 0.5) == [False, False, True, True, True]


def test_percentages_from_zero_to_a_hundred() -> None:
    assert bad("fma_pct", 0.0, 0.5, 100.0, -0.01, 100.5, math.inf) == [
        False, False, False, True, True, True,
    ]  # fmt: skip


def test_times_are_above_zero_and_finite() -> None:
    assert bad("time_ms", 0.5, 1e-9, 0.0, -1.0, math.inf) == [False, False, True, True, True]
    assert bad("time_n", 1, 0.5) == [False, True]  # a sample count: at least 1


def test_non_negative_counts_from_zero_and_finite() -> None:
    assert bad("ipc", 0.0, 0.5, -0.001, math.inf) == [False, False, True, True]
    assert bad("registers", 0, 255, 256, -1) == [False, False, True, True]


def test_an_error_may_be_infinite_not_negative() -> None:
    assert bad("max_rel_err", 0.0, 0.5, math.inf, -0.1) == [False, False, False, True]


def test_missing_values_are_not_judged_here() -> None:
    assert list(validation.TIME.bad(pd.Series([None, "x", 1.0], dtype=object))) == [
        False,
        True,
        False,
    ]


def test_range_words() -> None:
    assert validation.TIME.describe(0.0) == "0.0 is out of range: expected a finite number above 0"
    assert validation.PERCENT.describe(101.0) == (
        "101.0 is out of range: expected a finite number at least 0 and at most 100"
    )
    assert (
        validation.DIMENSION.describe(0)
        == "size must be a positive integer, at most 2147483647 (int32)"
    )


def test_check_ranges_names_the_first_bad_row_and_column() -> None:
    frame = pd.DataFrame({"time_ms": [0.5, 0.0, -1.0], "m": [8, 8, 8]}, index=[10, 11, 12])
    with pytest.raises(AuditError) as caught:
        validation.check_ranges(frame, validation.RANGES, SOURCE)
    assert str(caught.value) == (
        "t.csv, row 2, column 'time_ms': 0.0 is out of range: expected a finite number above 0"
    )
    one = pd.DataFrame({"fma_pct": [50.0, 100.5]})
    with pytest.raises(AuditError, match=r"^t\.csv, row 2, column 'fma_pct': 100\.5 is out"):
        validation.check_ranges(one, validation.RANGES, SOURCE)
    validation.check_ranges(pd.DataFrame({"time_ms": [0.5]}), validation.RANGES, SOURCE)


def test_schema_versions_one_to_latest() -> None:
    validation.check_schema_version(
        pd.DataFrame({"x": [1]}), SOURCE, 3
    )  # no column: nothing to check
    validation.check_schema_version(pd.DataFrame({"schema_version": [1, 3, None]}), SOURCE, 3)
    for version, row in ((4, 2), (0, 2)):
        frame = pd.DataFrame({"schema_version": [1, version]})
        with pytest.raises(AuditError) as caught:
            validation.check_schema_version(frame, SOURCE, 3)
        assert str(caught.value) == (
            f"t.csv, row {row}, column 'schema_version': schema version {version} is not one "
            "this cublas-audit reads (1..3; written by a newer cublas-audit?)"
        )


def key_rows(**extra: list[object]) -> pd.DataFrame:
    base: dict[str, list[object]] = {
        "api": ["cublas", "cublas"], "routine": ["gemm", "gemm"], "mode": ["fp32", "fp32"],
        "m": [8, 8], "n": [8, 8], "k": [8, 8], "batch": [1, 1],
    }  # fmt: skip
    return pd.DataFrame({**base, **extra})


def test_a_case_twice_is_refused_its_aux_rows_are_not() -> None:
    with pytest.raises(AuditError) as caught:
        validation.check_unique(key_rows(), SOURCE)
    assert str(caught.value) == (
        "t.csv, row 2: the case of row 1 appears again "
        "(api=cublas, routine=gemm, mode=fp32, m=8, n=8, k=8, batch=1)"
    )
    validation.check_unique(key_rows(m=[8, 16]), SOURCE)
    # a main row and its aux kernel's row (no launch column): one case
    validation.check_unique(key_rows(role=["main", "aux"]), SOURCE)
    validation.check_unique(key_rows(role=[None, "aux"]), SOURCE)  # a missing role is main
    with pytest.raises(AuditError, match="appears again"):
        validation.check_unique(key_rows(role=[None, "main"]), SOURCE)
    # with a launch column each launch is its own row: aux rows are judged too
    validation.check_unique(key_rows(role=["main", "aux"], launch=[0, 1]), SOURCE)
    with pytest.raises(AuditError, match=r"row 2: the case of row 1 .*launch=0\)$"):
        validation.check_unique(key_rows(role=["main", "aux"], launch=[0, 0]), SOURCE)
    # NA equal to NA: a missing mode twice is the same case
    with pytest.raises(AuditError, match="mode=None"):
        validation.check_unique(key_rows(mode=[None, None]), SOURCE)


def test_a_csv_must_end_with_a_line_break(tmp_path: Path) -> None:
    cut = tmp_path / "cut.csv"
    for text in ("x", "a,b\n1,2"):  # one byte; a row without its line break
        cut.write_text(text)
        with pytest.raises(AuditError, match="ends mid-row"):
            validation.check_complete_file(cut)
    for text in ("\n", "a\n", ""):
        cut.write_text(text)
        validation.check_complete_file(cut)
    (tmp_path / "t.parquet").write_bytes(b"PAR1")  # a columnar file has no line breaks
    validation.check_complete_file(tmp_path / "t.parquet")
    validation.check_complete_file(tmp_path / "missing.csv")


def test_a_run_table_holds_exactly_its_plan() -> None:
    frame = pd.DataFrame({"case_id": ["a", "b", None]})
    validation.check_against_plan(frame.iloc[:2], ["a", "b"], SOURCE)
    with pytest.raises(AuditError) as caught:
        validation.check_against_plan(frame.iloc[:2], ["a", "b", "c", "d"], SOURCE)
    assert str(caught.value) == (
        "t.csv: 2 case(s) of plan.json have no row (first: c); the table is incomplete: "
        "rebuild it with cublas-audit sweep --resume"
    )
    with pytest.raises(AuditError) as caught:
        validation.check_against_plan(pd.DataFrame({"case_id": ["a", "x", "y"]}), ["a"], SOURCE)
    assert str(caught.value) == "t.csv, row 2, column 'case_id': case 'x' is not in plan.json"
    with pytest.raises(AuditError, match="needs the case_id column"):
        validation.check_against_plan(pd.DataFrame({"m": [1]}), [], SOURCE)


def test_a_run_table_of_its_plan_is_not_looked_up_row_by_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every planned case has a row and the table has no other case (as many distinct ones, no
    row without one): nothing to name, so no row is looked up in the plan (a merged full map's
    262,144 were, after its shards ended)."""
    frame = pd.DataFrame({"case_id": ["b", "a", "b"]})  # (a case of two rows: a sweep's loop)

    def looked_up(*args: object) -> None:
        raise AssertionError("looked up")

    monkeypatch.setattr(pd.Series, "isin", looked_up)
    validation.check_against_plan(frame, ["a", "b", "a"], SOURCE)
    with pytest.raises(AssertionError, match="looked up"):  # (a row of no case: named)
        validation.check_against_plan(pd.concat([frame, pd.DataFrame({"case_id": [None]})]),
                                      ["a", "b"], SOURCE)  # fmt: skip


def test_read_table_of_a_recorded_file_and_of_none(tmp_path: Path) -> None:
    frame = validation.read_table(SMOKE_TABLE)
    assert len(frame) == 11
    assert validation.read_table(SMOKE_TABLE.parent).equals(frame)  # a run directory: its table
    with pytest.raises(AuditError, match=r"missing\.csv: no such file"):
        validation.read_table(tmp_path / "missing.csv")


def smoke_with(tmp_path: Path, **cells: str) -> Path:
    """The smoke table's first row with some cells replaced, as a file."""
    lines = SMOKE_TABLE.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    row = lines[1].rstrip("\n").split(",")
    for column, text in cells.items():
        row[header.index(column)] = text
    path = tmp_path / "dispatch.csv"
    path.write_text(lines[0] + ",".join(row) + "\n")
    return path


def test_text_that_looks_missing_stays_text(tmp_path: Path) -> None:
    # m written '256.0': no int to pyarrow's reading (None), a whole number to the text reading
    path = smoke_with(tmp_path, gpu_label="None", m="256.0")
    assert validation.typed_csv(path) is None
    frame = validation.read_table(path)
    assert frame["gpu_label"].tolist() == ["None"]  # only an empty cell is missing
    assert frame["m"].tolist() == [256]


def test_a_csv_is_parsed_by_pyarrow_into_the_frame_the_text_reading_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyarrow")
    path = smoke_with(tmp_path, case_id="")
    typed: list[object] = []
    real = validation.typed_csv

    def spied(given: Path) -> pd.DataFrame | None:
        typed.append(real(given))
        return real(given)

    monkeypatch.setattr(validation, "typed_csv", spied)
    fast = validation._parsed(path)
    assert len(typed) == 1 and typed[0] is not None  # 2 bytes of memory a byte, not 15
    monkeypatch.setattr(validation, "typed_csv", lambda p: None)
    pd.testing.assert_frame_equal(fast, validation._parsed(path))
    assert fast["case_id"].isna().tolist() == [True]


def test_a_column_twice_is_refused(tmp_path: Path) -> None:
    lines = SMOKE_TABLE.read_text().splitlines()
    path = tmp_path / "twice.csv"
    path.write_text("\n".join(f"{line},{line.split(',')[0]}" for line in lines[:2]) + "\n")
    with pytest.raises(AuditError, match=r"column\(s\) gpu_label appear more than once"):
        validation.read_table(path)
    (tmp_path / "t.parquet").write_bytes(b"PAR1")  # no table: and no CSV either
    with pytest.raises(AuditError, match="cannot be read as a table"):
        validation.read_table(tmp_path / "t.parquet")


def test_read_once_keys_a_small_file_by_its_bytes_a_large_one_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(validation, "_READ", {})
    parsed: list[Path] = []

    def parse(path: Path) -> pd.DataFrame:
        parsed.append(path)
        return pd.DataFrame({"n": [len(parsed)]})

    assert validation._HASHED_BYTES == 4 * 1024 * 1024
    for size, reads in ((validation._HASHED_BYTES, 1), (validation._HASHED_BYTES + 1, 2)):
        parsed.clear()
        for name in ("a.csv", "b.csv"):  # the same bytes under two names
            (tmp_path / name).write_bytes(b"x" * size)
            validation.read_once(tmp_path / name, parse)
        assert len(parsed) == reads, size
    got = validation.read_once(tmp_path / "b.csv", parse)
    got.loc[0, "n"] = 99  # the caller's copy: the cached frame stays as read
    assert validation.read_once(tmp_path / "b.csv", parse).loc[0, "n"] == 2


def test_read_once_keeps_the_last_32(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "_READ", {})
    parsed: list[str] = []

    def parse(path: Path) -> pd.DataFrame:
        parsed.append(path.name)
        return pd.DataFrame()

    files = [tmp_path / f"{i}.csv" for i in range(33)]
    for i, path in enumerate(files):
        path.write_text(f"{i}\n")
        validation.read_once(path, parse)
    assert len(validation._READ) == 32 == validation._READ_KEPT
    validation.read_once(files[1], parse)  # still kept
    assert len(parsed) == 33
    validation.read_once(files[0], parse)  # the oldest, dropped for the 33rd
    assert parsed[-1] == "0.csv" and len(parsed) == 34
