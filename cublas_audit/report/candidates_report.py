"""The candidate audit in Markdown: the summary of every case, each flagged case's candidates, and a
standalone repro script (CuPy + nvmath-python) of the faster algorithm (report.lt_repro).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.files import write_text_atomic
from cublas_audit.judge.candidates import LAYOUT_UNKNOWN, RULE, CandidateVerdicts, problem_name
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.thresholds import LISTED_MAX
from cublas_audit.report.lt_repro import repro
from cublas_audit.report.markdown import cut_line, md_fence, md_table, md_text
from cublas_audit.table import rundir
from cublas_audit.table.dispatch import plain
from cublas_audit.table.env_record import EnvRecord

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
    label = EnvRecord.read(run_dir).gpu_label
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
        _summary_table(verdicts.summary.head(LISTED_MAX), known),
    ]
    cut = len(verdicts.summary) - LISTED_MAX
    lines += ["", cut_line(cut, "cases", "candidates.csv holds every case")] if cut > 0 else []
    for finding in verdicts.flagged[:LISTED_MAX]:
        rows = frame[frame["case_id"] == finding.evidence[0]["case_id"]]
        lines += ["", *_flagged_section(finding, rows, level + 1)]
    cut = len(verdicts.flagged) - LISTED_MAX
    said = "`report --format json` lists every one"
    lines += ["", cut_line(cut, "flagged cases", said)] if cut > 0 else []
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


def _flagged_section(finding: Finding, rows: pd.DataFrame, level: int) -> list[str]:
    best = rows.loc[finding.rows[1]]
    assert isinstance(best, pd.Series)  # the candidates table's index labels are unique
    columns = _table_columns(rows)
    return [
        f"{'#' * level} {RULE}: {md_text(problem_name(rows.iloc[0]))}",
        "",
        md_text(finding.message) + ".",
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
