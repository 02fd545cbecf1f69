"""table/dispatch.py pinned (issue 39 item 6): the schema version a reader takes, the layout a
table without those columns means, column order, typing, each numeric check at int64's edge,
allowed values, row numbers, the JSON-ready cell (`plain`, `json_ready`), `cell_records` and the
copy-on-write copy. Tiny frames; the recorded table is the H100 smoke run's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table import dispatch
from cublas_audit.table.validation import read_table
from tests.conftest import FIXTURES

SMOKE_TABLE = FIXTURES / "h100-smoke" / "dispatch.csv"
SOURCE = dispatch.TableSource(Path("t.csv"))


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    lines = SMOKE_TABLE.read_text().splitlines()
    assert read_table(SMOKE_TABLE)["schema_version"].tolist() == [1] * 11
    for version, readable in ((3, True), (4, False)):
        path = tmp_path / f"v{version}.csv"
        path.write_text(
            lines[0] + "\n" + lines[1].replace(",1,cublas.", f",{version},cublas.") + "\n"
        )
        if readable:
            assert read_table(path)["schema_version"].tolist() == [version]
        else:
            with pytest.raises(
                AuditError, match=r"schema version 4 is not one this cublas-audit reads \(1\.\.3"
            ):
                read_table(path)


def test_a_table_without_layout_columns_posed_packed_nn_problems() -> None:
    frame = pd.DataFrame({"m": [8, 8], "beta": [None, 1.0]})
    filled = dispatch.with_layout_defaults(frame)
    assert filled.iloc[0].to_dict() == {
        "m": 8, "beta": 0.0, "transa": "n", "transb": "n", "lda": 0, "ldb": 0,
        "broadcast": "", "strided": 0, "bias": 0, "workspace_mib": -1,
    }  # fmt: skip
    assert filled["beta"].tolist() == [0.0, 1.0]
    assert frame["beta"].isna().tolist() == [True, False]  # the caller's frame unchanged


def test_the_distribution_columns_of_each_timed_quantity() -> None:
    assert dispatch.distribution_columns("time") == [
        "time_n", "time_min_ms", "time_q1_ms", "time_q3_ms", "time_max_ms",
    ]  # fmt: skip
    assert (
        dispatch.ALL_COLUMNS["kernel_time_n"] == "int"
        and dispatch.ALL_COLUMNS["ref_time_q3_ms"] == "float"
    )


def test_schema_columns_first_then_the_others() -> None:
    assert dispatch.column_order(["zzz", "time_ms", "case_id", "gpu_label", "aaa"]) == [
        "gpu_label", "time_ms", "case_id", "zzz", "aaa",
    ]  # fmt: skip


def test_from_records_adds_the_required_columns_typed() -> None:
    frame = dispatch.from_records([{"m": 8, "case_id": "a", "extra": "x"}])
    assert list(frame.columns[:10]) == list(dispatch.REQUIRED_COLUMNS)
    assert list(frame.columns[10:]) == ["case_id", "extra"]
    assert frame["m"].dtype == pd.Int64Dtype() and frame["time_ms"].dtype == pd.Float64Dtype()
    assert frame["kernel"].isna().all() and str(frame["case_id"].dtype) == "string"
    assert frame["extra"].tolist() == ["x"]  # an unknown column left alone


def test_coerce_takes_parsed_numbers_as_they_are() -> None:
    frame = pd.DataFrame({"m": ["8"], "gpu_label": ["h100"]})
    assert dispatch.coerce(frame)["m"].tolist() == [8]
    parsed = {"m": pd.Series([16.0])}
    assert dispatch.coerce(frame, parsed)["m"].tolist() == [16]


def test_validate_names_a_missing_column_and_an_empty_identifying_cell() -> None:
    raw = pd.read_csv(SMOKE_TABLE, dtype=str, keep_default_na=False, na_values=[""]).head(3)
    with pytest.raises(AuditError, match=r"^t\.csv: missing required column\(s\) time_ms$"):
        dispatch.validate(raw.drop(columns=["time_ms"]), SOURCE)
    blank = raw.copy()
    blank.loc[2, "mode"] = " "
    with pytest.raises(AuditError, match=r"^t\.csv, row 3, column 'mode': must not be empty$"):
        dispatch.validate(blank, SOURCE)
    with pytest.raises(AuditError, match="the table has no rows"):
        dispatch.validate(raw.iloc[:0], SOURCE)
    assert len(dispatch.validate(raw, SOURCE)) == 3


def numbers(column: str, *texts: str | None) -> dict[str, pd.Series]:
    frame = pd.DataFrame({column: list(texts)}, dtype=object)
    return dispatch.check_numeric_columns(
        frame, {column: dispatch.ALL_COLUMNS[column], "time_ms": "float"}, SOURCE
    )


def test_ints_are_whole_and_within_int64() -> None:
    assert numbers("m", "3", "8", None)["m"].tolist()[:2] == [3, 8]  # odd and even
    assert numbers("m", str(2**63 - 1024))["m"].tolist() == [2**63 - 1024]  # the largest below
    for text in (str(2**63), "2.5", "x"):
        with pytest.raises(AuditError) as caught:
            numbers("m", "1", text)
        assert str(caught.value) == f"t.csv, row 2, column 'm': expected an integer, got '{text}'"


def test_floats_are_numbers() -> None:
    assert numbers("time_ms", "2.5", "1e300")["time_ms"].tolist() == [2.5, 1e300]
    with pytest.raises(
        AuditError, match=r"^t\.csv, row 2, column 'time_ms': expected a number, got 'x'$"
    ):
        numbers("time_ms", "1", "x")
    already = pd.DataFrame({"m": pd.array([4, None], dtype="Int64")})
    assert dispatch.check_numeric_columns(already, {"m": "int"}, SOURCE)["m"] is not None


def test_allowed_values_and_missing_ones() -> None:
    frame = pd.DataFrame({"role": pd.Series(["main", None, "aux"], dtype=object)})
    dispatch.check_values(frame, "role", ("main", "aux"), SOURCE, missing_ok=True)
    with pytest.raises(AuditError) as caught:
        dispatch.check_values(frame, "role", ("main", "aux"), SOURCE)
    assert str(caught.value) == "t.csv, row 2, column 'role': unknown role None (known: main, aux)"
    with pytest.raises(
        AuditError, match=r"row 3, column 'role': unknown role 'aux' \(known: main\)"
    ):
        dispatch.check_values(frame, "role", ("main",), SOURCE, missing_ok=True)


def test_row_numbers_count_from_one_after_the_header() -> None:
    frame = pd.DataFrame({"x": [1, 2, 3]}, index=[7, 5, 9])
    assert [dispatch.row_number(frame, i) for i in (7, 5, 9)] == [1, 2, 3]
    assert str(SOURCE.error("m")) == "t.csv: m"
    assert str(SOURCE.error("m", 0, "c")) == "t.csv, row 0, column 'c': m"


def test_plain_cells() -> None:
    for missing in (None, pd.NA, math.nan, np.float64("nan")):
        assert dispatch.plain(missing) is None
    assert dispatch.plain(1.5) == 1.5 and dispatch.plain(2.5) == 2.5  # not rounded without digits
    assert dispatch.plain(1.23456, 2) == 1.23 and dispatch.plain(3, 2) == 3
    got = dispatch.plain(np.int64(3))
    assert got == 3 and type(got) is int
    assert dispatch.plain(np.str_("a")) == "a" and dispatch.plain("x") == "x"


def test_json_ready_data() -> None:
    data = {
        "a": [np.float64("inf"), np.int64(2), pd.NA, {"k": np.float64(1.5)}],
        "b": (1, "x", True),
        3: float("nan"),
        "c": math.inf,
        "d": 0.5,
    }
    assert dispatch.json_ready(data) == {
        "a": [None, 2, None, {"k": 1.5}], "b": [1, "x", True], "3": None, "c": None, "d": 0.5,
    }  # fmt: skip
    assert dispatch.json_ready({"n": math.nan}) == {"n": None}
    assert dispatch.json_ready(np.float64("-inf")) is None and dispatch.json_ready(None) is None
    assert dispatch.frame_records(pd.DataFrame({"x": [1.5, math.nan]})) == [{"x": 1.5}, {"x": None}]


def test_main_launches() -> None:
    frame = pd.DataFrame({"role": ["main", None, "aux"], "x": [1, 2, 3]})
    assert dispatch.main_launches(frame)["x"].tolist() == [1, 2]
    without = pd.DataFrame({"x": [1]})
    assert dispatch.main_launches(without) is without


def test_cell_records() -> None:
    frame = pd.DataFrame({"a": [1, 2], "b": pd.Series(["x", None], dtype=object)})
    assert dispatch.cell_records(frame) == [{"a": 1, "b": "x"}, {"a": 2, "b": None}]
    assert dispatch.cell_records(pd.DataFrame(index=range(2))) == [{}, {}]


def test_an_unshared_copy_shares_memory_until_written() -> None:
    frame = pd.DataFrame({"a": np.arange(5)})
    copy = dispatch.unshared(frame)
    if int(pd.__version__.split(".")[0]) >= 3:  # copy-on-write: no memory of its own yet
        assert np.shares_memory(copy["a"].to_numpy(), frame["a"].to_numpy())
    copy.loc[0, "a"] = 99
    assert frame["a"].tolist() == [0, 1, 2, 3, 4]
