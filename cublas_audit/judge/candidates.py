"""The cuBLASLt heuristic audit's table and verdicts: is cuBLASLt's pick its fastest algorithm?

device.candidate_audit runs every candidate of the heuristic, checks and times it; this module is
the rest, and works on a recorded candidates.csv anywhere: its schema, reading and writing,
ranking, and the `better-candidate` findings. `left_on_table = t_default / t_best` says how much
the default leaves behind; a second, independent timing round of the default and the best confirms
or refutes a gap before it becomes a finding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.files import write_csv_atomic
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.judge.timed_rows import ratio_verdict
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.planning.cases import Case
from cublas_audit.planning.modes import MODE_NAMES
from cublas_audit.table.dispatch import (
    TableSource,
    blank_as_missing,
    check_numeric_columns,
    check_values,
    plain,
)
from cublas_audit.table.rundir import CANDIDATES_FILE, records

SCHEMA_VERSION = 1
RULE = "better-candidate"
DEFAULT_LIMIT = 32
DEFAULT_THRESHOLD = Thresholds().candidate_gap_pct / 100
# Each timed round runs at least ~0.1 s per candidate (timing.repetitions: up to 200 calls of a
# short one), and at least this many calls: the floor matters only for calls over 20 ms, which vary
# by ~1% call to call, so a median of five interleaved calls sits far inside the 10% bar, and a gap
# is timed twice (the confirmation round) before it counts. Twenty, the sweep's floor, would make
# the audit of the default grid take minutes at 8192 x 8192 x 8192 batch 16 alone.
DEFAULT_MIN_REPS = 5

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


# ===== the table ==================================================================================
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


def problems(cases: Iterable[Case]) -> list[Case]:
    """The distinct GEMM problems of a plan, as cuBLASLt cases (the sweep's loop rows and the
    classic-API twins name the same problem)."""
    seen: dict[tuple[str, int, int, int, int], Case] = {}
    for case in cases:
        key = (case.mode, case.m, case.n, case.k, case.batch)
        seen.setdefault(key, Case("cublasLt", *key))
    return list(seen.values())


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


# ===== ranking and findings (pure) ================================================================
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


# What a case's summary reads: the rest of a candidate's columns would only be copied around.
_SUMMARY_COLUMNS = [
    "case_id", "mode", "m", "n", "k", "batch", "candidate", "is_default", "status", "reason",
    "time_ms", "rank", "left_on_table", "confirm_left_on_table",
]  # fmt: skip


def case_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per case: counts, the default's rank, the best candidate, both gap measurements."""
    narrow = frame[_SUMMARY_COLUMNS]
    rows = [_summarize(case_id, group) for case_id, group in narrow.groupby("case_id", sort=False)]
    return pd.DataFrame(rows)


def _summarize(case_id: Any, rows: pd.DataFrame) -> dict[str, Any]:
    first = rows.iloc[0]
    listed = rows[rows["candidate"].notna()]
    default = listed[listed["is_default"] == 1]
    best = _best(rows)
    return {
        "case_id": case_id,
        **{key: first[key] for key in ("mode", "m", "n", "k", "batch")},
        "candidates": len(listed),
        "correct": int((listed["status"] == "ok").sum()),
        "default_candidate": _first_or_na(default["candidate"]),
        "default_rank": _first_or_na(default["rank"]),
        "default_ms": _first_or_na(default["time_ms"]),
        "best_candidate": best["candidate"] if best is not None else pd.NA,
        "best_ms": best["time_ms"] if best is not None else pd.NA,
        "left_on_table": first["left_on_table"],
        "confirm_left_on_table": first["confirm_left_on_table"],
        "status": "skipped" if listed.empty else "ok",
        "reason": first["reason"] if listed.empty else pd.NA,
    }


def _best(rows: pd.DataFrame) -> pd.Series | None:
    """The fastest correct candidate (ties: the heuristic's earlier one)."""
    timed = rows[(rows["status"] == "ok") & rows["time_ms"].notna()]
    if timed.empty:
        return None
    return timed.sort_values(["time_ms", "candidate"]).iloc[0]


def _first_or_na(values: pd.Series) -> Any:
    return values.iloc[0] if len(values) else pd.NA


# Run-to-run spread of left_on_table, the ratio of two interleaved timings in one process: at most
# 4.75 % over three audits of the default batched grid on the H100
# (benchmarks/results/candidates_speed_h100.json, max_spread), with a margin. Interleaving makes
# this far smaller than the spread of one call's time between runs (cublas_audit.judge.noise).
INTERLEAVED_FLOOR = 0.06


def is_better(left_on_table: Any, confirm_left_on_table: Any, threshold: float) -> bool:
    """Both the audit round and the independent confirmation round call the default slower than
    the best candidate (verdicts.judge: a gap of at least `threshold` beyond the interleaved
    floor)."""
    rounds = (plain(left_on_table), plain(confirm_left_on_table))
    if any(ratio is None or not ratio > 0 for ratio in rounds):
        return False
    return all(
        ratio_verdict(float(ratio), INTERLEAVED_FLOOR, threshold) is Verdict.slower
        for ratio in rounds
    )


def find_better_candidates(
    frame: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD
) -> list[dict[str, Any]]:
    """`better-candidate` findings: cases whose best candidate beats the default by >= threshold
    in the audit round and again in the confirmation round.

    Each is a dict with exactly the fields of `judge.finding.Finding` (`Finding(**d)`):
    `rows` are the index labels of the default's and the best's rows in `frame`, `evidence` their
    records (role, case, configuration, times, both left_on_table measurements).
    """
    # The gaps repeat on every row of a case: judge each case on its first, slice only the flagged.
    firsts = frame.drop_duplicates("case_id")
    gaps = firsts[["case_id", "left_on_table", "confirm_left_on_table"]].itertuples(index=False)
    flagged = [case_id for case_id, left, confirm in gaps if is_better(left, confirm, threshold)]
    findings = []
    for case_id in flagged:
        rows = frame[frame["case_id"] == case_id]
        first = rows.iloc[0]
        default = rows[rows["is_default"] == 1].iloc[0]
        best = _best(rows)
        assert best is not None  # a finite left_on_table implies a timed best
        findings.append(_finding(first, default, best))
    return findings


def _finding(first: pd.Series, default: pd.Series, best: pd.Series) -> dict[str, Any]:
    left = float(first["left_on_table"])
    confirm = float(first["confirm_left_on_table"])
    return {
        "rule": RULE,
        "severity": "medium",
        "gpu_label": plain(first["gpu_label"]) or "",
        "api": "cublasLt",
        "routine": "cublasLtMatmul",
        "mode": str(first["mode"]),
        "batch": int(first["batch"]),
        "sizes": [f"{first['m']}x{first['n']}x{first['k']}"],
        "kernel": describe(default),
        "message": (
            f"{problem_name(first)}: cuBLASLt's default algorithm ({describe(default)}) takes "
            f"{left:.2f}x the time of its heuristic's candidate #{int(best['candidate'])} "
            f"({describe(best)}); a second timing round confirms {confirm:.2f}x"
        ),
        "workaround": (
            f"Run candidate #{int(best['candidate'])}: take it from "
            "cublasLtMatmulAlgoGetHeuristic's list, or build it with cublasLtMatmulAlgoInit and "
            "cublasLtMatmulAlgoConfigSetAttribute (the repro below); nvmath-python's "
            "Matmul.autotune() finds it too."
        ),
        "kernel_name": "",
        "rows": [plain(default.name), plain(best.name)],
        "evidence": [_evidence(default, "default"), _evidence(best, "best")],
        "compared": [],
        "effect": round(1 - 1 / left, 4),  # the share of the default's time the best saves
    }


_EVIDENCE_COLUMNS = (
    "case_id",
    "m",
    "n",
    "k",
    "batch",
    "candidate",
    "algo_id",
    "tile",
    "stages",
    "split_k",
    "reduction_scheme",
    "cta_swizzling",
    "cluster_shape",
    "custom_option",
    "inner_shape",
    "workspace_bytes",
    "time_ms",
    "confirm_time_ms",
    "left_on_table",
    "confirm_left_on_table",
)


def _evidence(row: pd.Series, role: str) -> dict[str, Any]:
    return {"role": role, **{key: plain(row[key]) for key in _EVIDENCE_COLUMNS}}


def describe(row: pd.Series) -> str:
    """'algo 55, tile 64x64, stages 8x3, split-K 1' (what a reader compares at a glance)."""
    parts = [f"algo {plain(row['algo_id'])}", f"tile {plain(row['tile'])}"]
    parts.append(f"stages {plain(row['stages'])}")
    parts.append(f"split-K {plain(row['split_k'])}")
    return ", ".join(parts)


def problem_name(row: pd.Series) -> str:
    return f"{row['mode']} {row['m']}x{row['n']}x{row['k']} batch {row['batch']}"
