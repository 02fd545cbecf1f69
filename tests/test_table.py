"""The dispatch-table contract: what is accepted, what is refused and how the refusal reads."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table import candidates_table, dispatch, validation
from cublas_audit.table.candidates_table import read_candidates
from cublas_audit.table.rundir import TABLE_FILE
from cublas_audit.table.validation import read_table

from .conftest import FIXTURES, REPORTS

RUN = FIXTURES / "h100-batched-cublas"


def write(tmp_path: Path, frame: pd.DataFrame) -> Path:
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    return path


def required_only() -> pd.DataFrame:
    """The recorded run in the required columns alone, less its loop rows: without `routine` a
    loop row is the same case as the batched call beside it."""
    recorded = pd.read_csv(RUN / TABLE_FILE)
    calls = recorded[recorded["routine"] != "sgemm-loop"].reset_index(drop=True)
    return calls[list(dispatch.REQUIRED_COLUMNS)]


def test_a_table_with_only_the_required_columns_is_accepted(tmp_path: Path) -> None:
    frame = read_table(write(tmp_path, required_only()))
    assert list(frame.columns) == list(dispatch.REQUIRED_COLUMNS)
    assert frame["m"].dtype == "Int64"
    assert dispatch.main_launches(frame).equals(frame)


def test_a_case_twice_is_refused_naming_both_rows(tmp_path: Path) -> None:
    # With the loop rows, row 3 (the 256 batch-4 loop) is row 1's case again once routine is gone.
    recorded = pd.read_csv(RUN / TABLE_FILE)[list(dispatch.REQUIRED_COLUMNS)]
    with pytest.raises(AuditError, match=r"t\.csv, row 3: the case of row 1 appears again"):
        read_table(write(tmp_path, recorded))


def test_missing_column_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, required_only().drop(columns=["kernel"]))
    with pytest.raises(AuditError, match=r"t\.csv: missing required column\(s\) kernel"):
        read_table(path)


def test_non_numeric_size_names_row_and_column(tmp_path: Path) -> None:
    frame = required_only().astype({"m": object})
    frame.loc[3, "m"] = "big"
    with pytest.raises(
        AuditError, match=r"t\.csv, row 4, column 'm': expected an integer, got 'big'"
    ):
        read_table(write(tmp_path, frame))


def test_unknown_mode_and_zero_size_are_refused(tmp_path: Path) -> None:
    frame = required_only()
    frame.loc[0, "mode"] = "fp64"
    with pytest.raises(AuditError, match="row 1, column 'mode': unknown mode 'fp64'"):
        read_table(write(tmp_path, frame))
    frame = required_only()
    frame.loc[2, "batch"] = 0
    with pytest.raises(AuditError, match="row 3, column 'batch': size must be a positive integer"):
        read_table(write(tmp_path, frame))


def test_garbage_file_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    path.write_text("not parquet")
    with pytest.raises(AuditError, match="cannot be read as a table"):
        read_table(path)


def test_csv_and_parquet_round_trip(tmp_path: Path) -> None:
    frame = read_table(RUN)
    for name in ("copy.csv", "copy.parquet"):
        dispatch.write_table(frame, tmp_path / name)
        again = read_table(tmp_path / name)
        pd.testing.assert_frame_equal(again, frame, check_exact=False, rtol=1e-5)


def test_a_table_unchanged_since_it_was_read_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dispatch.csv and candidates.csv are parsed once per process while unchanged (a multi-GPU
    candidates run read each shard's candidates.csv three times); each caller gets its own copy,
    and a changed file is parsed again."""
    recorded = REPORTS / "h100" / "20261123-145452-batched" / "candidates.csv"
    path = tmp_path / "candidates.csv"
    path.write_bytes(recorded.read_bytes())
    first = read_candidates(path)
    first.loc[first.index[0], "time_ms"] = 1e9  # the caller's copy, not what was read
    with monkeypatch.context() as patch:
        patch.setattr(candidates_table, "validate", lambda *_: pytest.fail("parsed again"))
        again = read_candidates(path)
        assert again.loc[again.index[0], "time_ms"] != 1e9
    with pytest.raises(AuditError, match="missing required column"):
        read_table(path)  # the same file read as a dispatch table: parsed as one, and refused
    path.write_bytes(recorded.read_bytes() + recorded.read_bytes().splitlines(True)[1])
    assert len(read_candidates(path)) == len(again) + 1


def test_a_copy_is_the_same_table_and_a_same_sized_edit_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small table is known by its bytes: a run directory copied elsewhere (a gathered shard, a
    test's copy) is not parsed again, and an edit that keeps the file's size and modification
    time (a digit changed, the time restored) is."""
    recorded = REPORTS / "h100" / "20261123-094558-batched" / "dispatch.csv"
    first, second = tmp_path / "a" / "dispatch.csv", tmp_path / "b" / "dispatch.csv"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(recorded.read_bytes())
    read_table(first)
    with monkeypatch.context() as patch:
        patch.setattr(validation, "validate", lambda *_: pytest.fail("parsed again"))
        read_table(second)
    text = second.read_text()
    stat = second.stat()
    second.write_text(text.replace(",337.98,", ",337.99,", 1))
    os.utime(second, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert second.stat().st_size == stat.st_size
    (edited,) = read_table(second).query(
        "routine == 'cublasSgemmStridedBatched' and m == 8192 and batch == 16"
    )["time_ms"]
    assert edited == pytest.approx(337.99)
