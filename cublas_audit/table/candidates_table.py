"""candidates.csv, the cuBLASLt candidate audit's table: its schema, reading (checked and typed)
and writing, the problem each row was timed on, the timing basis, rank and left_on_table columns
derived from each case's times, and the journal an interrupted audit resumes from. Its verdicts
are judge.candidates'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.files import write_csv_atomic
from cublas_audit.planning.cases import BROADCASTS, TRANSPOSES, Case
from cublas_audit.planning.lt_enums import (
    NO_SPLIT_K,
    NUMBER_LIMITS,
    SPECS,
    enum_number,
    split_k_fault,
)
from cublas_audit.planning.modes import MODE_NAMES
from cublas_audit.table.dispatch import (
    TableSource,
    blank_as_missing,
    check_numeric_columns,
    check_values,
    layout_columns,
    plain,
    row_number,
)
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.rundir import CANDIDATES_FILE, records
from cublas_audit.table.validation import (
    DIMENSION,
    NON_NEGATIVE,
    TIME,
    Range,
    check_ranges,
    check_schema_version,
    read_once,
)

# 2: the problem's layout columns (transa .. workspace_limit_bytes), the kernel-only times and
# names, and timing_basis. A version-1 table lacks them: its layout is unknown (every problem was
# timed as packed nn, whatever the sweep's case was) and its times are the calls'.
SCHEMA_VERSION = 2

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
    "transa": "str",
    "transb": "str",
    "lda": "int",
    "ldb": "int",
    "broadcast": "str",
    "beta": "float",
    "strided": "int",
    "bias": "int",
    "workspace_limit_bytes": "int",
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
    # "cold" (L2 flushed before every timed call, the default) or "warm" (--warm); missing in
    # tables made before cold timing, which were all warm
    "operands": "str",
    "kernel_ms": "float",
    "kernels": "str",
    "tflops": "float",
    "rank": "int",
    "timing_basis": "str",
    "left_on_table": "float",
    "confirm_time_ms": "float",
    "kernel_confirm_ms": "float",
    "confirm_left_on_table": "float",
}
REQUIRED = ("case_id", "mode", "m", "n", "k", "batch", "candidate", "is_default", "status")
STATUSES = ("ok", "wrong", "failed", "unsupported", "skipped")
# The times a case's rank and left_on_table are judged on -> their column: the kernels' (CUPTI)
# where every timed candidate of the case has one, else the calls' (CUDA events).
BASES = {"kernel": "kernel_ms", "call": "time_ms"}
# ... and the confirmation round's column of each basis.
# The audit's measuring defaults: candidates per problem, and timed calls per round at least.
DEFAULT_LIMIT = 32
# Each timed round runs at least ~0.1 s per candidate (timing.repetitions: up to 200 calls of a
# short one), and at least this many calls: the floor matters only for calls over 20 ms, which vary
# by ~1% call to call, so a median of five interleaved calls sits far inside the 10% bar, and a gap
# is timed twice (the confirmation round) before it counts. Twenty, the sweep's floor, would make
# the audit of the default grid take minutes at 8192 x 8192 x 8192 batch 16 alone.
DEFAULT_MIN_REPS = 5


CONFIRM_COLUMNS = {"kernel": "kernel_confirm_ms", "call": "confirm_time_ms"}
# Text columns with a closed set of values (an empty broadcast is missing once read).
_CHOICES = {
    "transa": TRANSPOSES,
    "transb": TRANSPOSES,
    "broadcast": tuple(b for b in BROADCASTS if b),
    "timing_basis": tuple(BASES),
    "operands": ("cold", "warm"),
}
_KINDS: dict[str, Any] = {"int": pd.Int64Dtype(), "float": pd.Float64Dtype(), "str": "string"}
# Each number's range, as dispatch.csv's are checked (table.validation): a time that is no time
# would be judged and rendered ("default ms -1"), a split-K cuBLASLt cannot take pinned. rank and
# left_on_table are not read: add_ranks derives them again.
_FLAG = Range(0, 1)
RANGES: dict[str, Range] = {
    **dict.fromkeys(("m", "n", "k", "batch"), DIMENSION),
    **dict.fromkeys(("device_index", "lda", "ldb", "workspace_limit_bytes"), NON_NEGATIVE),
    **dict.fromkeys(("candidate", "waves_count"), NON_NEGATIVE),
    **dict.fromkeys(("strided", "bias", "is_default"), _FLAG),
    "beta": Range(-math.inf),
    **{name: Range(0, high) for name, high in NUMBER_LIMITS.items()},
    "split_k": Range(min(NO_SPLIT_K), 2**31 - 1),  # and at most k: _check_split_k
    "rel_err": Range(0.0, infinite_ok=True),  # an output that is not finite
    "reps": Range(1),
    **dict.fromkeys(
        ("time_ms", "min_ms", "kernel_ms", "tflops", "confirm_time_ms", "kernel_confirm_ms"), TIME
    ),
    "confirm_left_on_table": TIME,
}


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
    for column, allowed in _CHOICES.items():
        if column in raw.columns:
            check_values(raw, column, allowed, source, missing_ok=True)
    frame = _typed(raw, parsed)
    check_schema_version(frame, source, SCHEMA_VERSION)
    check_ranges(frame, RANGES, source)
    _check_split_k(frame, source)
    _check_enum_names(frame, source)
    _check_problems(frame, source)
    return frame


def _check_enum_names(frame: pd.DataFrame, source: TableSource) -> None:
    """Each tile, stages, reduction scheme and cluster shape one cuBLASLt's enums have (or the
    bare number the binding had no name for): `fix` would pin a name `verify` refuses."""
    for column in SPECS:
        present = frame[column].dropna()
        for name in present.unique():
            try:
                enum_number(column, str(name))
            except AuditError as exc:
                first = present.index[(present == name).to_numpy(dtype=bool)][0]
                raise source.error(str(exc), row_number(frame, first), column) from None


def _check_split_k(frame: pd.DataFrame, source: TableSource) -> None:
    """Each split-K one cuBLASLt takes on its row's problem (planning.lt_enums.split_k_fault)."""
    present = frame[frame["split_k"].notna()]
    bad = present.index[(present["split_k"] > present["k"]).to_numpy(dtype=bool)]
    if len(bad):
        row = present.loc[bad[0]]
        fault = split_k_fault(int(row["split_k"]), int(row["k"]))
        raise source.error(fault, row_number(frame, bad[0]), "split_k")


def _check_problems(frame: pd.DataFrame, source: TableSource) -> None:
    """Each row whose layout is known poses one cuBLAS call (Case's own checks: a leading
    dimension smaller than the stored rows, ...): one line naming the first that does not. Each
    distinct problem is built once (a case repeats it on every candidate's row)."""
    known = frame.loc[layout_known(frame), [*PROBLEM_COLUMNS, *PROBLEM_LAYOUT]]
    for index, record in known.drop_duplicates().iterrows():
        try:
            problem_case(record)
        except AuditError as exc:
            raise source.error(str(exc), row_number(frame, index)) from None


def read_candidates(path: Path) -> pd.DataFrame:
    """candidates.csv from a file or a run directory (once per process while the file is
    unchanged: validation.read_once)."""
    path = Path(path)
    if path.is_dir():
        path = path / CANDIDATES_FILE
    if not path.exists():
        raise AuditError(f"{path}: no such file")
    return read_once(path, _parsed)


def _parsed(path: Path) -> pd.DataFrame:
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise AuditError(f"{path}: cannot be read as a table ({exc})") from exc
    if raw.empty:
        raise AuditError(f"{path}: the table has no rows")
    return validate(raw, path)


def write_candidates(frame: pd.DataFrame, path: Path) -> Path:
    return write_csv_atomic(frame, path)


def measured_on(frame: pd.DataFrame, env: EnvRecord) -> pd.DataFrame:
    """The table with the GPU its run's env.json names (nvidia-smi's index and UUID) on every
    row: a table merged from several GPUs says which measured each problem."""
    out = frame.copy()
    out["device_index"] = pd.array([env.device_index] * len(out), dtype=pd.Int64Dtype())
    out["gpu_uuid"] = pd.array([env.gpu_uuid] * len(out), dtype="string")
    return out


# ===== the problem a row was timed on ============================================================
PROBLEM_COLUMNS = ("mode", "m", "n", "k", "batch")
# The columns problem_columns writes: with PROBLEM_COLUMNS, the whole problem a row was timed on.
PROBLEM_LAYOUT = (
    "transa", "transb", "lda", "ldb", "broadcast", "beta", "strided", "bias",
    "workspace_limit_bytes",
)  # fmt: skip


def problem_columns(case: Case, workspace_limit_bytes: int) -> dict[str, Any]:
    """The columns that pose `case` (beyond mode and shape) and the workspace its candidates were
    allowed: what a row needs so that its times can be rebuilt on the same problem."""
    return {**layout_columns(case), "workspace_limit_bytes": workspace_limit_bytes}


def layout_known(frame: pd.DataFrame) -> pd.Series:
    """Rows that say which problem they were timed on (version 2). A version-1 row does not: it
    was timed as packed nn, which need not be the problem its sweep ran."""
    return (frame["transa"].notna() & frame["transb"].notna()).astype(bool)


def problem_case(row: Mapping[str, Any] | pd.Series) -> Case | None:
    """The cuBLASLt case a row's candidates were timed on, None where its layout is unknown.
    (Its workspace limit is the row's workspace_limit_bytes; the case keeps the default.)"""
    if plain(row.get("transa")) is None or plain(row.get("transb")) is None:
        return None
    return Case(
        "cublasLt",
        str(row["mode"]),
        int(row["m"]),
        int(row["n"]),
        int(row["k"]),
        int(row["batch"]),
        transa=str(row["transa"]),
        transb=str(row["transb"]),
        lda=int(plain(row.get("lda")) or 0),
        ldb=int(plain(row.get("ldb")) or 0),
        broadcast=str(plain(row.get("broadcast")) or ""),
        beta=float(plain(row.get("beta")) or 0.0),
        strided=bool(plain(row.get("strided"))),
        bias=bool(plain(row.get("bias"))),
    )


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
    """timing_basis, rank (1 = fastest correct candidate of its case) and the case's
    left_on_table, all on the basis time."""
    out = frame.copy()
    timed = ((out["status"] == "ok") & out["time_ms"].notna()).fillna(False).astype(bool)
    out["timing_basis"] = timing_basis(out, timed)
    judged = basis_ms(out)
    out["rank"] = pd.Series(pd.NA, index=out.index, dtype=pd.Int64Dtype())
    ranks = judged[timed].groupby(out.loc[timed, "case_id"]).rank(method="min")
    out.loc[timed, "rank"] = ranks.astype("int64")
    # left_on_table = t_default / t_best over the correct, timed candidates; NA without a default.
    cases = out.loc[timed, "case_id"]
    best = judged[timed].groupby(cases).min()
    defaults = timed & (out["is_default"] == 1).fillna(False).astype(bool)
    default = judged[defaults].groupby(out.loc[defaults, "case_id"]).first()
    out["left_on_table"] = out["case_id"].map(default / best).astype(pd.Float64Dtype())
    return out


def timing_basis(frame: pd.DataFrame, timed: pd.Series) -> pd.Series:
    """Per row, its case's basis: 'kernel' where every timed candidate of the case has a kernel
    time, 'call' where one lacks it (CUPTI unavailable, or a version-1 table), missing where the
    case timed nothing. One time judges a whole case: a ratio never mixes the two."""
    traced = (frame["kernel_ms"].notna() | ~timed).groupby(frame["case_id"]).transform("all")
    any_timed = timed.groupby(frame["case_id"]).transform("any").astype(bool)
    basis = pd.Series(["kernel" if t else "call" for t in traced], index=frame.index)
    return basis.where(any_timed).astype("string")


def basis_ms(frame: pd.DataFrame) -> pd.Series:
    """Each row's time on its case's basis (the kernels' or the call's)."""
    on_kernels = (frame["timing_basis"] == "kernel").fillna(False).astype(bool)
    return frame[BASES["kernel"]].where(on_kernels, frame[BASES["call"]])
