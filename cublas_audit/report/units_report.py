"""units.md and units.json of a replicated run: each unit's speed against the first and the
unit-mismatch findings (judged by cublas_audit.judge.units)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cublas_audit.files import write_text_atomic
from cublas_audit.judge.finding import Finding
from cublas_audit.report.markdown import md_code, md_number, md_table, md_text, shorten
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.inputs import Dataset
from cublas_audit.table.rundir import UNITS_JSON, UNITS_REPORT

SHOWN = 40


def write_units_report(
    run_dir: Path, units: Sequence[Dataset], found: Sequence[Finding], spread: pd.DataFrame
) -> Path:
    """units.md and units.json of a replicated run, as judge.units compared its units."""
    records = {"findings": [f.to_json() for f in found], "spread": spread.to_dict("records")}
    write_text_atomic(run_dir / UNITS_JSON, json.dumps(json_ready(records), indent=1) + "\n")
    return write_text_atomic(run_dir / UNITS_REPORT, render(units, found, spread))


def render(units: Sequence[Dataset], found: Sequence[Finding], spread: pd.DataFrame) -> str:
    title = units[0].title.split(":", 1)[-1].strip() if units else ""
    kernels = [f for f in found if f.severity == "high"]
    slower = [f for f in found if f.severity == "medium"]
    parts = [
        f"# Units of one node: {md_text(title)}",
        f"{len(units)} units ran the same {len(units[0].frame)} cases; each is compared with "
        f"{md_text(units[0].gpu_label)} through the diff's noise model (the kernels' time where "
        "both traced them).",
        "## Unit speed",
        _speed_table(spread),
        f"## Kernel mismatches ({len(kernels)})",
        _findings(kernels) if kernels else "Every unit dispatched the same kernel for every case.",
        f"## Slower units ({len(slower)})",
        _findings(slower) if slower else "No unit slower than the first beyond the noise model.",
    ]
    return "\n\n".join(parts) + "\n"


def _speed_table(spread: pd.DataFrame) -> str:
    headers = ["unit", "UUID", "cases ok", "time vs first (median)", "fastest", "slowest",
               "SM clock MHz (median)", "power W (median)"]  # fmt: skip
    rows = [
        (md_text(r["unit"]), md_code(r["gpu_uuid"]), r["cases"], md_number(r["median_ratio"], 4),
         md_number(r["min_ratio"], 4), md_number(r["max_ratio"], 4),
         md_number(r["sm_clock_mhz"], 0), md_number(r["power_w"], 0))
        for r in spread.to_dict("records")
    ]  # fmt: skip
    return md_table(headers, rows)


def _findings(found: Sequence[Finding]) -> str:
    rows = [
        (md_text(f"{f.api} {f.routine} {f.mode} b{f.batch}"), md_code(shorten(f.kernel)),
         md_text(f.message))
        for f in found[:SHOWN]
    ]  # fmt: skip
    more = f"\n\n{len(found) - SHOWN} more in units.json." if len(found) > SHOWN else ""
    return md_table(["call", "kernel", "finding"], rows) + more
