"""The candidate audit in Markdown: the summary of every case, each flagged case's candidates, and a
standalone repro script (CuPy + nvmath-python) of the faster algorithm.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.files import write_text_atomic
from cublas_audit.judge.candidates import LAYOUT_UNKNOWN, RULE, CandidateVerdicts, problem_name
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES
from cublas_audit.planning.modes import mode as mode_of
from cublas_audit.report.markdown import md_fence, md_table, md_text, visible
from cublas_audit.table import rundir
from cublas_audit.table.dispatch import plain

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
# Said of an audit whose every row predates layouts (candidates.csv version 1).
VERSION_1_NOTE = (
    f"This audit predates layouts (candidates.csv version 1): {LAYOUT_UNKNOWN}. Each problem was "
    "timed as packed nn, whatever its sweep's case was, on call time (CUDA events)."
)
BASIS_NOTE = (
    "Times are each case's basis: `kernel` (CUPTI kernel-only time, where every timed candidate "
    "has one) or `call` (CUDA events around the call, which include its launch overhead)."
)


def write_candidates_run_report(run_dir: Path, verdicts: CandidateVerdicts) -> Path:
    """report.md of a candidates run: its audit as judged (at the run's recorded threshold)."""
    label = rundir.read_env(run_dir).get("gpu_label")
    text = f"# cuBLASLt candidate audit: {label}\n\n" + render_markdown(verdicts)
    return write_text_atomic(run_dir / rundir.REPORT_FILE, text)


def render_markdown(verdicts: CandidateVerdicts, level: int = 2) -> str:
    """The report section, its heading at `level`: a summary of every case, then each flagged
    case's table and repro one level below."""
    frame = verdicts.frame
    known = bool((verdicts.summary["layout"] != LAYOUT_UNKNOWN).any())
    lines = [
        f"{'#' * level} cuBLASLt heuristic candidates",
        "",
        f"`left on table` = default time / best candidate time; a case is flagged when both the "
        f"audit round and a second, independent round show at least {1 + verdicts.threshold:.2f}x.",
        "",
        BASIS_NOTE if known else VERSION_1_NOTE,
        "",
        _summary_table(verdicts.summary, known),
    ]
    for finding in verdicts.flagged:
        rows = frame[frame["case_id"] == finding["evidence"][0]["case_id"]]
        lines += ["", *_flagged_section(finding, rows, level + 1)]
    return "\n".join(lines) + "\n"


def _summary_table(summary: pd.DataFrame, known: bool) -> str:
    """One row per case; where any case says its layout (version 2), each case's layout and
    timing basis too."""
    body = []
    for row in summary.to_dict("records"):
        flagged = row["flagged"]
        case = f"{row['mode']} {row['m']}x{row['n']}x{row['k']} b{row['batch']}"
        times = [_fmt(row["default_ms"], ".4g"), _fmt(row["best_ms"], ".4g")]
        if known:
            times.append(md_text(plain(row["timing_basis"]) or ""))
        body.append(
            [
                md_text(f"{case} {row['layout']}" if known else case),
                row["candidates"],
                row["correct"],
                plain(row["default_rank"]),
                *times,
                _fmt(row["left_on_table"], ".2f"),
                _fmt(row["confirm_left_on_table"], ".2f"),
                RULE if flagged else md_text(row["reason"] if row["status"] == "skipped" else ""),
            ]
        )
    headers = ["case", "candidates", "correct", "default rank", "default ms", "best ms"]
    headers += ["basis"] if known else []
    headers += ["left on table", "confirmed", "finding"]
    return md_table(headers, body)


def _fmt(value: Any, spec: str) -> str:
    return "" if plain(value) is None else format(float(value), spec)


def _flagged_section(finding: Mapping[str, Any], rows: pd.DataFrame, level: int) -> list[str]:
    best = rows.loc[finding["rows"][1]]
    columns = _table_columns(rows)
    return [
        f"{'#' * level} {RULE}: {md_text(problem_name(rows.iloc[0]))}",
        "",
        md_text(finding["message"]) + ".",
        "",
        md_table(
            list(columns.values()), [_candidate_cells(r, columns) for _, r in rows.iterrows()]
        ),
        "",
        "Standalone repro (cupy + nvmath-python): the default algorithm against this candidate,",
        "its attributes set through the cuBLASLt API.",
        "",
        md_fence(repro(best), "python"),
    ]


def _table_columns(rows: pd.DataFrame) -> dict[str, str]:
    """TABLE_COLUMNS, with the kernel-only time beside the call's where the case traced any."""
    if rows["kernel_ms"].isna().all():
        return TABLE_COLUMNS
    columns = {}
    for column, header in TABLE_COLUMNS.items():
        columns[column] = header
        if column == "time_ms":
            columns["kernel_ms"] = "kernel ms"
    return columns


# How each candidate column reads in the flagged case's table.
_CELL_FORMATS = {"time_ms": ".4g", "kernel_ms": ".4g", "tflops": ".1f"}


def _candidate_cells(row: pd.Series, columns: Mapping[str, str]) -> list[str]:
    cells = []
    for column in columns:
        value = plain(row[column])
        if column == "is_default":
            cells.append("yes" if value == 1 else "")
        elif column in _CELL_FORMATS:
            cells.append(_fmt(value, _CELL_FORMATS[column]))
        else:
            cells.append("" if value is None else md_text(value))
    return cells


# What a candidates.csv value may be to enter the repro as an enum name or a number.
_ENUM_NAME = re.compile(r"[A-Za-z0-9_]+")
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
    spec = mode_of(mode)
    data_type, compute_type, storage = spec.data_type_name, spec.compute_type_name, spec.storage
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
        workspace=DEFAULT_WORKSPACE_BYTES,
    ).rstrip()


def _repro_settings(row: pd.Series) -> list[str]:
    lines = []
    for attribute, column, enum, prefix in _REPRO_ATTRIBUTES:
        value = row[column]
        if pd.isna(value):
            continue  # this cuBLASLt did not report it: leave the algo's initial value
        text = str(value)
        if not _ENUM_NAME.fullmatch(text):
            lines.append(f"# {attribute}: not set, {visible(text)!r} is not a plain name or number")
            continue  # a table value never becomes code
        if enum and not text.isdigit():
            text = f"lt.{enum}.{prefix}{text}"
        lines.append(f"set_(C.{attribute}, {text})")
    return lines
