"""The cuBLASLt heuristic audit: is the algorithm cuBLASLt picks the fastest one it offers?

For each problem, every candidate the heuristic returns (up to a limit) is run once and its output
compared with the default's, then the candidates that ran correctly are timed together (CUDA
events, interleaved rounds, median). `left_on_table = t_default / t_best` says how much the
default leaves behind; a second, independent timing round of the default and the best confirms
or refutes a gap before it becomes a `better-candidate` finding.

The measuring half (`run_candidates`) needs a GPU, cupy and nvmath-python, imported on use; the
rest (schema, ranking, findings, Markdown) works on a recorded candidates.csv anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pandas as pd
from tabulate import tabulate

from cublas_audit import lt, timing
from cublas_audit.cases import Case
from cublas_audit.errors import AuditError
from cublas_audit.table import MODES
from cublas_audit.thresholds import Thresholds

SCHEMA_VERSION = 1
CANDIDATES_FILE = "candidates.csv"
LOG_FILE = "candidates.log"
RULE = "better-candidate"
DEFAULT_LIMIT = 32
DEFAULT_THRESHOLD = Thresholds().candidate_gap_pct / 100
# A first, short interleaved round (this many timed calls each, at least) ranks the candidates;
# only those within SCREEN_MARGIN of its best, and the default, get the full >= min_reps round.
# Calls long enough to need screening (>= ~5 ms) vary by ~1% call to call: a candidate 10%
# behind after two calls is not the best one.
SCREEN_REPS = 2
SCREEN_MARGIN = 1.10
# Each timed round runs at least ~0.1 s per candidate (timing.repetitions: up to 200 calls of a
# short one), and at least this many calls: the floor matters only for calls over 20 ms, which vary
# by ~1% call to call, so a median of five interleaved calls sits far inside the 10% bar, and a gap
# is timed twice (the confirmation round) before it counts. Twenty, the sweep's floor, would make
# the audit of the default grid take minutes at 8192 x 8192 x 8192 batch 16 alone.
DEFAULT_MIN_REPS = 5
# Two correct algorithms differ from each other by at most the sum of their errors.
CROSS_CHECK_FACTOR = 2.0

# Column -> kind: the candidates.csv contract (docs/schema.md). Case-level values
# (left_on_table, confirm_left_on_table) repeat on every row of the case so that any row
# filter keeps them.
COLUMNS: dict[str, str] = {
    "schema_version": "int",
    "gpu_label": "str",
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


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.NA
    frame = frame[list(COLUMNS)]
    for column, kind in COLUMNS.items():
        if kind == "str":  # "" and missing are one thing, as they are after a CSV round trip
            text = frame[column].astype("string")
            frame[column] = text.where(text != "")
        else:
            frame[column] = pd.to_numeric(frame[column]).astype(_KINDS[kind])
    return add_ranks(frame)


def validate(raw: pd.DataFrame, source: Path) -> pd.DataFrame:
    """A raw (all-string) candidates table checked and typed, or a one-line AuditError."""
    missing = [c for c in REQUIRED if c not in raw.columns]
    if missing:
        raise AuditError(f"{source}: missing required column(s) {', '.join(missing)}")
    for column in raw.columns:
        kind = COLUMNS.get(column)
        if kind in ("int", "float"):
            _check_numeric(raw, column, kind, source)
    _check_values(raw, "mode", MODES, source)
    _check_values(raw, "status", STATUSES, source)
    return _typed(raw)


def _check_numeric(raw: pd.DataFrame, column: str, kind: str, source: Path) -> None:
    parsed = pd.to_numeric(raw[column], errors="coerce")
    bad = raw[column].notna() & parsed.isna()
    if kind == "int":
        bad |= parsed.notna() & (parsed % 1 != 0)
    if bad.any():
        row = int(bad.to_numpy().argmax()) + 1
        raise AuditError(
            f"{source}, row {row}, column {column!r}: expected "
            f"{'an integer' if kind == 'int' else 'a number'}, got {raw[column][bad].iloc[0]!r}"
        )


def _check_values(raw: pd.DataFrame, column: str, allowed: Sequence[str], source: Path) -> None:
    bad = ~raw[column].isin(allowed)
    if bad.any():
        row = int(bad.to_numpy().argmax()) + 1
        raise AuditError(
            f"{source}, row {row}, column {column!r}: unknown value "
            f"{raw[column][bad].iloc[0]!r} (known: {', '.join(allowed)})"
        )


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
    """Writes atomically: a crash never leaves half a file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    frame.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(path)
    return path


# ===== ranking and findings (pure) ================================================================
def add_ranks(frame: pd.DataFrame) -> pd.DataFrame:
    """rank (1 = fastest correct candidate of its case) and the case's left_on_table."""
    out = frame.copy()
    timed = (out["status"] == "ok") & out["time_ms"].notna()
    out["rank"] = pd.Series(pd.NA, index=out.index, dtype=pd.Int64Dtype())
    ranks = out.loc[timed].groupby("case_id")["time_ms"].rank(method="min")
    out.loc[timed, "rank"] = ranks.astype("int64")
    left = {case_id: _left_on_table(rows) for case_id, rows in out.groupby("case_id")}
    out["left_on_table"] = out["case_id"].map(left).astype(pd.Float64Dtype())
    return out


def _left_on_table(rows: pd.DataFrame) -> float:
    """t_default / t_best over the correct, timed candidates; NaN if the default has no time."""
    default = rows[(rows["is_default"] == 1) & (rows["status"] == "ok")]["time_ms"].dropna()
    timed = rows[rows["status"] == "ok"]["time_ms"].dropna()
    if default.empty or timed.empty:
        return math.nan
    return float(default.iloc[0] / timed.min())


def case_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per case: counts, the default's rank, the best candidate, both gap measurements."""
    rows = [_summarize(case_id, group) for case_id, group in frame.groupby("case_id", sort=False)]
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


def is_better(left_on_table: Any, confirm_left_on_table: Any, threshold: float) -> bool:
    """Both the audit round and the independent confirmation round show the gap."""
    bar = 1.0 + threshold
    return bool(
        pd.notna(left_on_table)
        and pd.notna(confirm_left_on_table)
        and left_on_table >= bar
        and confirm_left_on_table >= bar
    )


def find_better_candidates(
    frame: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD
) -> list[dict[str, Any]]:
    """`better-candidate` findings: cases whose best candidate beats the default by >= threshold
    in the audit round and again in the confirmation round.

    Each is a dict with exactly the fields of `cublas_audit.findings.Finding` (`Finding(**d)`):
    `rows` are the index labels of the default's and the best's rows in `frame`, `evidence` their
    records (role, case, configuration, times, both left_on_table measurements).
    """
    findings = []
    for _, rows in frame.groupby("case_id", sort=False):
        first = rows.iloc[0]
        if not is_better(first["left_on_table"], first["confirm_left_on_table"], threshold):
            continue
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
        "gpu_label": _plain(first["gpu_label"]) or "",
        "api": "cublasLt",
        "routine": "cublasLtMatmul",
        "mode": str(first["mode"]),
        "batch": int(first["batch"]),
        "sizes": [f"{first['m']}x{first['n']}x{first['k']}"],
        "kernel": describe(default),
        "message": (
            f"{_problem(first)}: cuBLASLt's default algorithm ({describe(default)}) takes "
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
        "rows": [_plain(default.name), _plain(best.name)],
        "evidence": [_evidence(default, "default"), _evidence(best, "best")],
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
    return {"role": role, **{key: _plain(row[key]) for key in _EVIDENCE_COLUMNS}}


def _plain(value: Any) -> Any:
    """JSON-friendly scalars: pandas NA -> None, numpy numbers -> Python numbers."""
    if pd.isna(value):
        return None
    return value.item() if hasattr(value, "item") else value


def describe(row: pd.Series) -> str:
    """'algo 55, tile 64x64, stages 8x3, split-K 1' (what a reader compares at a glance)."""
    parts = [f"algo {_plain(row['algo_id'])}", f"tile {_plain(row['tile'])}"]
    parts.append(f"stages {_plain(row['stages'])}")
    parts.append(f"split-K {_plain(row['split_k'])}")
    return ", ".join(parts)


def _problem(row: pd.Series) -> str:
    return f"{row['mode']} {row['m']}x{row['n']}x{row['k']} batch {row['batch']}"


# ===== Markdown ===================================================================================
TABLE_COLUMNS = {
    "candidate": "#",
    "is_default": "default",
    "algo_id": "algo",
    "tile": "tile",
    "stages": "stages",
    "split_k": "split-K",
    "reduction_scheme": "reduction",
    "cta_swizzling": "swizzle",
    "cluster_shape": "cluster",
    "workspace_bytes": "workspace B",
    "status": "status",
    "time_ms": "time ms",
    "tflops": "TFLOP/s",
    "rank": "rank",
}


def render_markdown(
    frame: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD, level: int = 2
) -> str:
    """The report section, its heading at `level`: a summary of every case, then each flagged
    case's table and repro one level below."""
    lines = [
        f"{'#' * level} cuBLASLt heuristic candidates",
        "",
        f"`left on table` = default time / best candidate time; a case is flagged when both the "
        f"audit round and a second, independent round show at least {1 + threshold:.2f}x.",
        "",
        _summary_table(frame, threshold),
    ]
    for finding in find_better_candidates(frame, threshold):
        rows = frame[frame["case_id"] == finding["evidence"][0]["case_id"]]
        lines += ["", *_flagged_section(finding, rows, level + 1)]
    return "\n".join(lines) + "\n"


def _summary_table(frame: pd.DataFrame, threshold: float) -> str:
    body = []
    for row in case_summary(frame).to_dict("records"):
        flagged = is_better(row["left_on_table"], row["confirm_left_on_table"], threshold)
        body.append(
            [
                f"{row['mode']} {row['m']}x{row['n']}x{row['k']} b{row['batch']}",
                row["candidates"],
                row["correct"],
                _plain(row["default_rank"]),
                _fmt(row["default_ms"], ".4g"),
                _fmt(row["best_ms"], ".4g"),
                _fmt(row["left_on_table"], ".2f"),
                _fmt(row["confirm_left_on_table"], ".2f"),
                RULE if flagged else (row["reason"] if row["status"] == "skipped" else ""),
            ]
        )
    headers = ["case", "candidates", "correct", "default rank", "default ms", "best ms"]
    headers += ["left on table", "confirmed", "finding"]
    return tabulate(body, headers=headers, tablefmt="github")


def _fmt(value: Any, spec: str) -> str:
    return "" if pd.isna(value) else format(float(value), spec)


def _flagged_section(finding: Mapping[str, Any], rows: pd.DataFrame, level: int) -> list[str]:
    table = rows[list(TABLE_COLUMNS)].rename(columns=TABLE_COLUMNS).copy()
    table["default"] = table["default"].map({1: "yes", 0: ""})
    table = table.astype(object).where(table.notna(), "")
    best = rows.loc[finding["rows"][1]]
    return [
        f"{'#' * level} {RULE}: {_problem(rows.iloc[0])}",
        "",
        str(finding["message"]) + ".",
        "",
        tabulate(table.to_numpy().tolist(), headers=list(table.columns), tablefmt="github"),
        "",
        "Standalone repro (cupy + nvmath-python): the default algorithm against this candidate,",
        "its attributes set through the cuBLASLt API.",
        "",
        "```python",
        repro(best),
        "```",
    ]


# The repro's algorithm attributes: (config attribute, candidates.csv column, enum, prefix).
_REPRO_ATTRIBUTES = (
    ("TILE_ID", "tile", "MatmulTile", "TILE_"),
    ("STAGES_ID", "stages", "MatmulStages", "STAGES_"),
    ("SPLITK_NUM", "split_k", "", ""),
    ("REDUCTION_SCHEME", "reduction_scheme", "ReductionScheme", ""),
    ("CTA_SWIZZLING", "cta_swizzling", "", ""),
    ("CUSTOM_OPTION", "custom_option", "", ""),
    ("INNER_SHAPE_ID", "inner_shape", "", ""),
    ("CLUSTER_SHAPE_ID", "cluster_shape", "ClusterShape", "SHAPE_"),
)
_REPRO = """\
import cupy as cp, numpy as np, nvmath
from nvmath.bindings import cublas, cublasLt as lt

m, n, k, batch = {m}, {n}, {k}, {batch}  # column-major, no transposes, strided batch
dtype, compute = nvmath.CudaDataType.{data_type}, cublas.ComputeType.{compute_type}
def rand(shape):  # {storage} storage
    x = cp.random.standard_normal(shape, dtype=cp.float32)
    return {convert}
a, b = rand((batch, k, m)), rand((batch, n, k))
c = cp.empty((batch, n, m), dtype=a.dtype)
h, desc = lt.create(), lt.matmul_desc_create(compute, nvmath.CudaDataType.CUDA_R_32F)
def setter(set_fn, dtype_fn, obj):
    def set_(attr, value):
        v = np.array([value], dtype_fn(attr))
        set_fn(obj, attr, v.ctypes.data, v.nbytes)
    return set_
def layout(rows, cols):
    lay = lt.matrix_layout_create(dtype, rows, cols, rows)
    set_ = setter(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, lay)
    if batch > 1:
        set_(lt.MatrixLayoutAttribute.BATCH_COUNT, batch)
        set_(lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, rows * cols)
    return lay
la, lb, lc = layout(m, k), layout(k, n), layout(m, n)
algo = np.zeros(1, lt.matmul_algo_dtype)
lt.matmul_algo_init(h, compute, nvmath.CudaDataType.CUDA_R_32F, dtype, dtype, dtype, dtype,
                    {algo_id}, algo.ctypes.data)
set_ = setter(lt.matmul_algo_config_set_attribute, lt.get_matmul_algo_config_attribute_dtype,
              algo.ctypes.data)
C = lt.MatmulAlgoConfigAttribute
{settings}
ws = cp.empty({workspace}, cp.uint8)  # the workspace the audit allowed every algorithm
pref = lt.matmul_preference_create()
setter(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref)(
    lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, ws.nbytes)
found, count = np.zeros(1, lt.matmul_heuristic_result_dtype), np.zeros(1, np.int32)
lt.matmul_algo_get_heuristic(h, desc, la, lb, lc, lc, pref, 1, found.ctypes.data,
                             count.ctypes.data)
default = np.ascontiguousarray(found["algo"])  # the heuristic's pick: cuBLASLt's default
alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)
def run(algo_ptr):
    lt.matmul(h, desc, alpha.ctypes.data, a.data.ptr, la, b.data.ptr, lb, beta.ctypes.data,
              c.data.ptr, lc, c.data.ptr, lc, algo_ptr, ws.data.ptr, ws.nbytes, 0)
for name, ptr in (("default", default.ctypes.data), ("candidate", algo.ctypes.data)) * 2:
    run(ptr)  # warm-up
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(20):
        run(ptr)
    stop.record()
    stop.synchronize()
    print(name, cp.cuda.get_elapsed_time(start, stop) / 20, "ms")
"""


def repro(row: pd.Series) -> str:
    """A standalone script timing the default against this candidate's configuration."""
    mode = str(row["mode"])
    data_type, compute_type = lt.MODE_TYPES[mode]
    storage = lt.STORAGE[mode]
    convert = (
        "(x.view(cp.uint32) >> 16).astype(cp.uint16)  # bf16 bits"
        if storage == "uint16"
        else f"x.astype(cp.{storage})"
    )
    return _REPRO.format(
        m=int(row["m"]),
        n=int(row["n"]),
        k=int(row["k"]),
        batch=int(row["batch"]),
        data_type=data_type,
        compute_type=compute_type,
        storage=storage,
        convert=convert,
        algo_id=int(row["algo_id"]),
        settings="\n".join(_repro_settings(row)),
        workspace=lt.DEFAULT_WORKSPACE_BYTES,
    ).rstrip()


def _repro_settings(row: pd.Series) -> list[str]:
    lines = []
    for attribute, column, enum, prefix in _REPRO_ATTRIBUTES:
        value = row[column]
        if pd.isna(value):
            continue  # this cuBLASLt did not report it: leave the algo's initial value
        text = str(value)
        if enum and not text.isdigit():
            text = f"lt.{enum}.{prefix}{text}"
        lines.append(f"set_(C.{attribute}, {text})")
    return lines


# ===== measuring (GPU) ============================================================================
@dataclass
class Settings:
    limit: int = DEFAULT_LIMIT
    threshold: float = DEFAULT_THRESHOLD
    min_reps: int = DEFAULT_MIN_REPS
    workspace_bytes: int = lt.DEFAULT_WORKSPACE_BYTES
    gpu_label: str = ""
    log: IO[str] = field(default_factory=lambda: sys.stderr)


def problems(cases: Iterable[Case]) -> list[Case]:
    """The distinct GEMM problems of a plan, as cuBLASLt cases (the sweep's loop rows and the
    classic-API twins name the same problem)."""
    seen: dict[tuple[str, int, int, int, int], Case] = {}
    for case in cases:
        key = (case.mode, case.m, case.n, case.k, case.batch)
        seen.setdefault(key, Case("cublasLt", *key))
    return list(seen.values())


def run_candidates(
    cases: Iterable[Case],
    out_dir: Path | None,
    limit: int = DEFAULT_LIMIT,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    min_reps: int = DEFAULT_MIN_REPS,
    workspace_bytes: int = lt.DEFAULT_WORKSPACE_BYTES,
    gpu_label: str = "",
    progress: Callable[[str], None] = lambda line: None,
) -> pd.DataFrame:
    """Audits every problem of `cases`; writes candidates.csv (and candidates.log, the
    tracebacks of failed cases and candidates) to out_dir when given. One failing case never
    stops the rest: it becomes a `skipped` row with its reason."""
    lt.bindings()  # a missing nvmath-python is one clear error before any work
    todo = problems(cases)
    log_path = out_dir / LOG_FILE if out_dir is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") if log_path else contextlib.nullcontext(sys.stderr) as log:
        settings = Settings(limit, threshold, min_reps, workspace_bytes, gpu_label, log)
        records: list[dict[str, Any]] = []
        for number, case in enumerate(todo, 1):
            rows = audit_case(case, settings)
            records += rows
            progress(f"[{number}/{len(todo)}] {_progress_line(case, rows)}")
    frame = from_records(records)
    if out_dir is not None:
        write_candidates(frame, out_dir / CANDIDATES_FILE)
    return frame


def _progress_line(case: Case, rows: Sequence[Mapping[str, Any]]) -> str:
    summary = case_summary(from_records(rows)).iloc[0]
    if summary["status"] == "skipped":
        return f"{case.case_id}: skipped ({summary['reason']})"
    return (
        f"{case.case_id}: {summary['candidates']} candidates, {summary['correct']} correct, "
        f"default rank {_plain(summary['default_rank'])}, "
        f"left on table {_fmt(summary['left_on_table'], '.3f')}"
    )


def audit_case(case: Case, settings: Settings) -> list[dict[str, Any]]:
    """The rows of one problem: one per candidate, or one `skipped` row with the reason."""
    import cupy

    base = {
        "schema_version": SCHEMA_VERSION,
        "gpu_label": settings.gpu_label,
        "case_id": case.case_id,
        "mode": case.mode,
        "m": case.m,
        "n": case.n,
        "k": case.k,
        "batch": case.batch,
    }
    try:
        rows = _audit(case, settings)
    except Exception as exc:  # out of memory, no algorithm, a failing default: record, go on
        _log_exception(settings.log, case.case_id, exc)
        rows = [{"status": "skipped", "reason": _reason(exc)}]
    finally:
        cupy.get_default_memory_pool().free_all_blocks()
    return [{**base, **row} for row in rows]


def _audit(case: Case, settings: Settings) -> list[dict[str, Any]]:
    a, b, c = lt.operands(case.mode, case.m, case.n, case.k, case.batch)
    ptrs = (a.data.ptr, b.data.ptr, c.data.ptr)
    shape = (case.m, case.n, case.k, case.batch)
    with lt.LtGemm(case.mode, *shape, *ptrs, workspace_bytes=settings.workspace_bytes) as gemm:
        listed = _with_default(gemm.heuristics(settings.limit), gemm.default())
        default = next(cand for cand, is_default in listed if is_default)
        expected, default_error = _run_default(gemm, default, a, b, c, case.mode)
        rows = [
            _check(gemm, cand, is_default, c, expected, default_error, case, settings)
            for cand, is_default in listed
        ]
        _time_rows(gemm, listed, rows, case, settings)
    return rows


def _with_default(
    listed: list[lt.LtCandidate], default: lt.LtCandidate
) -> list[tuple[lt.LtCandidate, bool]]:
    """Marks the default in the heuristic's list; appends it when the list (limit) lacks it."""
    key = default.algo.tobytes()
    marked = [(cand, cand.algo.tobytes() == key) for cand in listed]
    if not any(is_default for _, is_default in marked):
        default.index = len(listed)
        marked.append((default, True))
    return marked


def _run_default(
    gemm: lt.LtGemm, default: lt.LtCandidate, a: Any, b: Any, c: Any, mode: str
) -> tuple[Any, float]:
    """The default's output (what candidates are checked against) and its own error against a
    float64 product on the first batch entry (enough to catch a wrong default, cheaply)."""
    import cupy

    lt.poison(c, mode)
    gemm.run(default)
    cupy.cuda.get_current_stream().synchronize()
    error = lt.normwise_error(c[:1], lt.reference(a[:1], b[:1]))
    return c.copy(), error


def _check(
    gemm: lt.LtGemm,
    cand: lt.LtCandidate,
    is_default: bool,
    c: Any,
    expected: Any,
    default_error: float,
    case: Case,
    settings: Settings,
) -> dict[str, Any]:
    """Runs one candidate once and compares its output with the default's."""
    row: dict[str, Any] = {**cand.attributes(), "is_default": int(is_default)}
    row["candidate"] = row.pop("index")
    tolerance = lt.NORMWISE_TOLERANCE[case.mode]
    if is_default:
        wrong = default_error > tolerance
        reason = f"differs from a float64 product: error {default_error:.3g}" if wrong else ""
        status = "wrong" if wrong else "ok"
        return {**row, "status": status, "reason": reason, "rel_err": default_error}
    if cand.workspace_bytes > gemm.workspace_bytes:
        reason = f"needs {cand.workspace_bytes} B of workspace, {gemm.workspace_bytes} B allowed"
        return {**row, "status": "unsupported", "reason": reason}
    status, reason, error = _run_and_compare(gemm, cand, c, expected, case, settings)
    return {**row, "status": status, "reason": reason, "rel_err": error}


def _run_and_compare(
    gemm: lt.LtGemm, cand: lt.LtCandidate, c: Any, expected: Any, case: Case, settings: Settings
) -> tuple[str, str, float]:
    import cupy

    lt.poison(c, case.mode)
    try:
        gemm.run(cand)
        cupy.cuda.get_current_stream().synchronize()
    except Exception as exc:
        _log_exception(settings.log, f"{case.case_id} candidate {cand.index}", exc)
        status = "unsupported" if "NOT_SUPPORTED" in str(exc) else "failed"
        return status, _reason(exc), math.nan
    error = lt.normwise_error(c, expected)
    limit = CROSS_CHECK_FACTOR * lt.NORMWISE_TOLERANCE[case.mode]
    if error > limit:
        return "wrong", f"differs from the default's output: error {error:.3g} > {limit:g}", error
    return "ok", "", error


def _time_rows(
    gemm: lt.LtGemm,
    listed: Sequence[tuple[lt.LtCandidate, bool]],
    rows: list[dict[str, Any]],
    case: Case,
    settings: Settings,
) -> None:
    """Fills time_ms, min_ms, reps, timing, tflops, and the confirmation round's times."""
    launchers = {
        str(cand.index): functools.partial(gemm.run, cand)
        for (cand, _), row in zip(listed, rows, strict=True)
        if row["status"] == "ok"
    }
    if not launchers:
        return
    default_key = str(next(cand.index for cand, is_default in listed if is_default))
    times = time_candidates(launchers, default_key, settings.min_reps)
    for row in rows:
        measured = times.get(str(row["candidate"]))
        if measured is not None:
            took, how = measured
            row.update(time_ms=took.median_ms, min_ms=took.min_ms, reps=took.reps)
            row.update(timing=how, tflops=case.flops / (took.median_ms * 1e9))
    _confirm(launchers, default_key, rows, settings)


def time_candidates(
    launchers: Mapping[str, Callable[[], None]], default_key: str, min_reps: int
) -> dict[str, tuple[timing.Timing, str]]:
    """key -> (Timing, "full" | "screen"): a screening round over all candidates, then a full
    round (>= min_reps each) over the default and those near the screening's best."""
    # Every candidate has just run for its correctness check, and the finalists in the screen.
    screen = timing.time_interleaved(launchers, min(SCREEN_REPS, min_reps), warm=True)
    if all(t.reps >= min_reps for t in screen.values()):
        return {key: (t, "full") for key, t in screen.items()}  # short calls: screen was full
    finalists = finalist_keys({key: t.median_ms for key, t in screen.items()}, default_key)
    full = timing.time_interleaved({key: launchers[key] for key in finalists}, min_reps, warm=True)
    return {
        key: (full[key], "full") if key in full else (screen[key], "screen") for key in launchers
    }


def finalist_keys(medians: Mapping[str, float], default_key: str) -> list[str]:
    """The default and every candidate within SCREEN_MARGIN of the fastest, in input order."""
    best = min(medians.values())
    return [k for k, t in medians.items() if k == default_key or t <= SCREEN_MARGIN * best]


def _confirm(
    launchers: Mapping[str, Callable[[], None]],
    default_key: str,
    rows: list[dict[str, Any]],
    settings: Settings,
) -> None:
    """A second, independent round (fresh warm-up and repetitions) of the default against the
    best, run only where the first round shows a gap at or above the threshold."""
    timed = [r for r in rows if pd.notna(r.get("time_ms"))]
    default = next((r for r in timed if str(r["candidate"]) == default_key), None)
    if default is None:
        return
    best = min(timed, key=lambda r: (r["time_ms"], r["candidate"]))
    if best is default or default["time_ms"] / best["time_ms"] < 1.0 + settings.threshold:
        return
    keys = (default_key, str(best["candidate"]))
    again = timing.time_interleaved({key: launchers[key] for key in keys}, settings.min_reps)
    default["confirm_time_ms"] = again[keys[0]].median_ms
    best["confirm_time_ms"] = again[keys[1]].median_ms
    ratio = again[keys[0]].median_ms / again[keys[1]].median_ms
    for row in rows:
        row["confirm_left_on_table"] = ratio


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _log_exception(log: IO[str], what: str, exc: BaseException) -> None:
    log.write(f"--- {what}\n")
    log.write("".join(traceback.format_exception(exc)))
    log.flush()
