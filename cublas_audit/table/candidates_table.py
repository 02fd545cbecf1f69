"""candidates.csv, the cuBLASLt candidate audit's table: its schema, reading (checked and typed)
and writing, the rank and left_on_table columns derived from each case's times, and the journal
an interrupted audit resumes from. Its verdicts are judge.candidates'.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.files import write_csv_atomic
from cublas_audit.planning.modes import MODE_NAMES
from cublas_audit.table.dispatch import (
    TableSource,
    blank_as_missing,
    check_numeric_columns,
    check_values,
)
from cublas_audit.table.rundir import CANDIDATES_FILE, records

SCHEMA_VERSION = 1

# Column -> kind: the candidates.csv contract (docs/schema.md). Case-level values
# (left_on_table, confirm_left_on_table) repeat on every row of the case so that any row
# filter keeps them.
COLUMNS: dict[str, str] = {
    "schema_version": "int",
    "gpu_label": "str",
    "device_index": "int",
    "gpu_uuid": "str",
    "case_id": "str",
    "mode": "str",
    "m": "int",
    "n": "int",
    "k": "int",
    "batch": "int",
    "candidate": "int",
    "is_default": "int",
    "algo_id": "int",
    "tile": "str",
    "stages": "str",
    "split_k": "int",
    "reduction_scheme": "str",
    "cta_swizzling": "int",
    "cluster_shape": "str",
    "custom_option": "int",
    "inner_shape": "int",
    "workspace_bytes": "int",
    "waves_count": "float",
    "status": "str",
    "reason": "str",
    "rel_err": "float",
    "time_ms": "float",
    "min_ms": "float",
    "reps": "int",
    "timing": "str",
    "tflops": "float",
    "rank": "int",
    "left_on_table": "float",
    "confirm_time_ms": "float",
    "confirm_left_on_table": "float",
}
REQUIRED = ("case_id", "mode", "m", "n", "k", "batch", "candidate", "is_default", "status")
STATUSES = ("ok", "wrong", "failed", "unsupported", "skipped")
_KINDS: dict[str, Any] = {"int": pd.Int64Dtype(), "float": pd.Float64Dtype(), "str": "string"}


def from_records(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Typed candidates table in schema column order, with rank and left_on_table filled in."""
    return _typed(pd.DataFrame(list(records)))


def _typed(frame: pd.DataFrame, parsed: Mapping[str, pd.Series] | None = None) -> pd.DataFrame:
    """The schema's columns in order, typed (`parsed`: numeric columns already parsed)."""
    frame = frame.copy()
    parsed = parsed or {}
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.NA
    frame = frame[list(COLUMNS)]
    for column, kind in COLUMNS.items():
        if kind == "str":  # "" and missing are one thing, as they are after a CSV round trip
            text = frame[column].astype("string")
            frame[column] = text.where(text != "")
        else:
            numbers = parsed[column] if column in parsed else pd.to_numeric(frame[column])
            frame[column] = numbers.astype(_KINDS[kind])
    return add_ranks(frame)


def validate(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    """A raw (all-string) candidates table checked and typed, or a one-line AuditError."""
    source = TableSource(path)
    missing = [c for c in REQUIRED if c not in raw.columns]
    if missing:
        raise source.error(f"missing required column(s) {', '.join(missing)}")
    raw = blank_as_missing(raw)
    parsed = check_numeric_columns(raw, COLUMNS, source)
    check_values(raw, "mode", MODE_NAMES, source)
    check_values(raw, "status", STATUSES, source)
    return _typed(raw, parsed)


def read_candidates(path: Path) -> pd.DataFrame:
    """candidates.csv from a file or a run directory."""
    path = Path(path)
    if path.is_dir():
        path = path / CANDIDATES_FILE
    if not path.exists():
        raise AuditError(f"{path}: no such file")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise AuditError(f"{path}: cannot be read as a table ({exc})") from exc
    if raw.empty:
        raise AuditError(f"{path}: the table has no rows")
    return validate(raw, path)


def write_candidates(frame: pd.DataFrame, path: Path) -> Path:
    return write_csv_atomic(frame, path)


def measured_on(frame: pd.DataFrame, env: Mapping[str, Any]) -> pd.DataFrame:
    """The table with the GPU its run's env.json names (nvidia-smi's index and UUID) on every
    row: a table merged from several GPUs says which measured each problem."""
    out = frame.copy()
    out["device_index"] = pd.array([env.get("device_index")] * len(out), dtype=pd.Int64Dtype())
    out["gpu_uuid"] = pd.array([env.get("gpu_uuid")] * len(out), dtype="string")
    return out


# ===== the journal: each audited problem's rows as it finishes ====================================
# One JSON line per finished problem ({"case_id": ..., "rows": [...]}), appended and flushed as
# the audit goes: an interrupted audit keeps its finished problems, and the next one takes them
# from here instead of measuring them again. candidates.csv is written from it at the end.


def journal_line(case_id: str, rows: Sequence[Mapping[str, Any]]) -> str:
    record = {"case_id": case_id, "rows": [dict(row) for row in rows]}
    return json.dumps(record, default=_json_scalar) + "\n"


def _json_scalar(value: Any) -> Any:
    """NumPy's scalars (a timing's median, a count) as the Python numbers they hold."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def read_journal(path: Path) -> dict[str, list[dict[str, Any]]]:
    """case_id -> its rows, for every problem the journal holds whole (a torn last line, a crash
    mid-write, is not a finished problem)."""
    finished = {}
    for record in records(path):
        rows = record.get("rows")
        if isinstance(record.get("case_id"), str) and isinstance(rows, list) and rows:
            finished[record["case_id"]] = rows
    return finished


# ===== derived columns ============================================================================
def add_ranks(frame: pd.DataFrame) -> pd.DataFrame:
    """rank (1 = fastest correct candidate of its case) and the case's left_on_table."""
    out = frame.copy()
    timed = (out["status"] == "ok") & out["time_ms"].notna()
    out["rank"] = pd.Series(pd.NA, index=out.index, dtype=pd.Int64Dtype())
    ranks = out.loc[timed].groupby("case_id")["time_ms"].rank(method="min")
    out.loc[timed, "rank"] = ranks.astype("int64")
    # left_on_table = t_default / t_best over the correct, timed candidates; NA without a default.
    correct = out.loc[timed & out["status"].notna()]
    best = correct.groupby("case_id")["time_ms"].min()
    default = correct[correct["is_default"] == 1].groupby("case_id")["time_ms"].first()
    out["left_on_table"] = out["case_id"].map(default / best).astype(pd.Float64Dtype())
    return out
