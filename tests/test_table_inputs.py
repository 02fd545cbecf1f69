"""Issue 38: candidates.csv and dispatch.csv read as strictly as each other, before anything is
judged or written: every value in its range (a split-K cuBLASLt cannot take, a time that is no
time) and a schema version this cublas-audit knows, each refused in one line naming the file, the
row and the column.

The tables are the H100 map follow-up's (reports/h100/maps/20261124-003639-fp32-64-8192/follow-up,
whose candidate #2 of fp32 1856^3 batch 8 `fix` pins) and the H100 smoke run's dispatch.csv
(tests/fixtures/h100-smoke), copied and broken the way a hand-edited table can be.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.table.candidates_table import read_candidates
from tests.conftest import FIXTURES, REPORTS

FOLLOW_UP = REPORTS / "h100" / "maps" / "20261124-003639-fp32-64-8192" / "follow-up"
SMOKE = FIXTURES / "h100-smoke"
CASE = "cublasLt.fp32.1856x1856x1856.b8.nn"
runner = CliRunner()


def edited_table(source: Path, target: Path, where: dict[str, str], column: str, value: str) -> int:
    """`source` copied to `target` with `column` set to `value` in the first row matching
    `where`; returns that row's number as the error names it (1 = the first data row)."""
    with source.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    number = next(i for i, row in enumerate(rows) if all(row[k] == v for k, v in where.items()))
    rows[number][column] = value
    with target.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return number + 1


def refused(result: Result, words: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    error = result.stderr.strip()
    assert error.startswith("error: ") and "\n" not in error, repr(result.stderr)
    assert re.search(words, error), error


@pytest.mark.parametrize(
    ("candidate", "column", "value"),
    [
        # `fix` copied it into fix.json and the C snippet's int32_t
        ("2", "split_k", "1000000000000"),
        ("2", "split_k", "1e12"),
        ("2", "split_k", "1857"),  # more parts than k has elements
        ("2", "split_k", "-2"),
        # rendered as "default ms -1 ... left on table 1.00"
        ("0", "time_ms", "-1"),
        ("0", "time_ms", "0"),
        ("0", "time_ms", "inf"),
        ("2", "confirm_time_ms", "0"),
        ("2", "min_ms", "-0.5"),
        ("2", "reps", "0"),
        ("2", "rel_err", "-1e-7"),
        ("2", "workspace_bytes", "-1"),
        ("2", "algo_id", "-3"),
        ("2", "is_default", "2"),
        # fix wrote it into fix.json, which verify then refused, and left the TunableOp file out
        ("2", "tile", "999x999"),
        ("2", "cluster_shape", "9x9x9"),
    ],
)
def test_fix_refuses_a_candidates_value_out_of_range(
    tmp_path: Path, candidate: str, column: str, value: str
) -> None:
    table = tmp_path / "candidates.csv"
    where = {"case_id": CASE, "candidate": candidate}
    row = edited_table(FOLLOW_UP / "candidates.csv", table, where, column, value)
    out = tmp_path / "fixes"
    result = runner.invoke(app, ["fix", str(table), "--torch-version", "2.14.1", "--out", str(out)])
    refused(result, rf"{re.escape(str(table))}, row {row}, column '{column}': ")
    assert not out.exists()


def test_cublaslts_own_split_k_values_read() -> None:
    """The Llama trace's candidate audit reads: cuBLASLt's own split-K values for its GEMV
    algorithms (-1 and 0) beside 1 and 8, and a time of every timed row above 0 (the quick
    suite's part of the test below)."""
    table = REPORTS / "h100" / "traces" / "20261125-093616-llama-v2" / "candidates.csv"
    assert {-1, 0, 1, 8} <= set(read_candidates(table)["split_k"].dropna().astype(int))


@pytest.mark.heavy
def test_the_recorded_candidates_tables_stay_readable() -> None:
    """Every candidates.csv recorded under reports/ reads: cuBLASLt's own split-K values for its
    GEMV algorithms (-1 and 0, the Llama traces) and a time of every timed row above 0. Heavy
    (20 tables, 2.5 s of CPU): the quick suite reads the Llama trace's table (the test above)
    and the bundled runs' through their reports."""
    tables = sorted(REPORTS.rglob("candidates.csv"))
    assert len(tables) > 10
    splits = set()
    for table in tables:
        splits |= set(read_candidates(table)["split_k"].dropna().astype(int))
    assert {-1, 0, 1, 8} <= splits


@pytest.mark.parametrize("version", ["99", "4", "0"])
def test_a_dispatch_table_of_an_unknown_schema_version_is_refused(
    tmp_path: Path, version: str
) -> None:
    """A dispatch.csv of schema_version 99 was read as if this cublas-audit knew its columns."""
    run = tmp_path / "run"
    shutil.copytree(SMOKE, run)
    row = edited_table(SMOKE / "dispatch.csv", run / "dispatch.csv", {}, "schema_version", version)
    result = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "report.md")])
    refused(result, rf"row {row}, column 'schema_version': schema version {version} is not")


def test_a_candidates_table_of_an_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "candidates.csv"
    edited_table(FOLLOW_UP / "candidates.csv", table, {}, "schema_version", "3")
    with pytest.raises(AuditError, match=r"row 1, column 'schema_version': schema version 3"):
        read_candidates(table)
