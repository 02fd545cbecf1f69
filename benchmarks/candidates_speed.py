"""The candidate audit's figures (issue 5): wall time and run-to-run spread of left_on_table.

    python3 benchmarks/candidates_speed.py --json FILE [--keep DIR] [--runs 3]

Runs the cuBLASLt candidate audit of the default batched FP32 grid (sizes 256..8192, batches
4, 8, 16) `--runs` times in one process and prints each run's wall time (target 60 s), then per
case the left_on_table of every run and its spread (max - min). The largest spread is the noise
floor a `better-candidate` threshold must stay above. `--keep DIR` keeps the first run's
candidates.csv and candidates.log (in a sweep's run directory, its report renders them). A failing
run is recorded with its error and the others still run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.device.candidate_audit import run_candidates
from cublas_audit.judge import candidates
from cublas_audit.judge.candidates import ScreenJudge
from cublas_audit.observe import environment
from cublas_audit.planning.grid import (
    DEFAULT_BATCHES,
    DEFAULT_SIZES,
    build_plan,
    label_from_gpu_name,
)
from cublas_audit.table import candidates_table

TARGET_S = 60.0


def one_run(
    number: int, out_dir: Path, limit: int, threshold: float, gpu_label: str
) -> dict[str, Any]:
    cases = build_plan(
        sizes=DEFAULT_SIZES,
        batches=DEFAULT_BATCHES,
        modes=["fp32"],
        apis=["cublasLt"],
        single=False,
        batched=True,
    )
    start = time.perf_counter()
    try:
        frame = run_candidates(
            cases,
            out_dir,
            limit,
            screen=ScreenJudge(threshold),
            gpu_label=gpu_label,
            progress=lambda line: print(line, flush=True),
        )
    except Exception as exc:
        traceback.print_exc()
        return {"run": number, "error": f"{type(exc).__name__}: {exc}"}
    wall = time.perf_counter() - start
    summary = candidates.case_summary(frame)
    print(f"run {number}: {wall:.1f} s for {len(summary)} cases")
    return {
        "run": number,
        "wall_s": round(wall, 2),
        "cases": len(summary),
        "skipped": int((summary["status"] == "skipped").sum()),
        "findings": [
            f.evidence[0]["case_id"] for f in candidates.find_better_candidates(frame, threshold)
        ],
        "left_on_table": _by_case(summary, "left_on_table"),
        "default_rank": _by_case(summary, "default_rank"),
    }


def _by_case(summary: pd.DataFrame, column: str) -> dict[str, Any]:
    return {
        str(row["case_id"]): None if pd.isna(row[column]) else float(row[column])
        for row in summary.to_dict("records")
    }


def spread(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: left_on_table of each run, max - min, and max / min - 1."""
    measured = [r["left_on_table"] for r in runs if "left_on_table" in r]
    out: dict[str, dict[str, Any]] = {}
    for case_id in measured[0] if measured else {}:
        values = [m.get(case_id) for m in measured]
        finite = [v for v in values if v is not None]
        out[case_id] = {
            "left_on_table": values,
            "spread": round(max(finite) - min(finite), 4) if finite else None,
            "relative_spread": round(max(finite) / min(finite) - 1, 4) if finite else None,
        }
    return out


def versions() -> dict[str, Any]:
    import cupy
    import nvmath

    env = environment.collect()
    return {
        "device": env.gpu_name,
        "cc": env.cc,
        "driver": env.driver_version,
        "cuda_runtime": env.cuda_runtime,
        "cublas": env.cublas_version,
        "cupy": cupy.__version__,
        "nvmath": nvmath.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def report(runs: list[dict[str, Any]], spreads: dict[str, dict[str, Any]]) -> None:
    for run in runs:
        print(f"run {run['run']}: {run.get('wall_s', run.get('error'))} s")
    print(f"{'case':<36} {'left_on_table per run':<28} spread")
    for case_id, item in spreads.items():
        values = " ".join("-" if v is None else f"{v:.3f}" for v in item["left_on_table"])
        print(f"{case_id:<36} {values:<28} {item['spread']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="write the figures here")
    parser.add_argument("--keep", type=Path, help="keep the first run's candidates.csv here")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--limit", type=int, default=candidates_table.DEFAULT_LIMIT)
    parser.add_argument("--threshold", type=float, default=candidates.DEFAULT_THRESHOLD)
    args = parser.parse_args()
    device = versions()
    label = label_from_gpu_name(str(device["device"] or ""))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(1, args.runs + 1):
            keep = args.keep if number == 1 and args.keep else Path(tmp) / f"run{number}"
            runs.append(one_run(number, keep, args.limit, args.threshold, label))
    spreads = spread(runs)
    report(runs, spreads)
    finite = [s["spread"] for s in spreads.values() if s["spread"] is not None]
    walls = [r["wall_s"] for r in runs if "wall_s" in r]
    figures = {
        "benchmark": "candidates_speed",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        **device,
        "grid": {"sizes": list(DEFAULT_SIZES), "batches": list(DEFAULT_BATCHES), "mode": "fp32"},
        "limit": args.limit,
        "min_reps": candidates_table.DEFAULT_MIN_REPS,
        "threshold": args.threshold,
        "target_s": TARGET_S,
        "wall_s": walls,
        "within_target": bool(walls) and max(walls) <= TARGET_S,
        "max_spread": max(finite) if finite else None,
        "runs": runs,
        "spread": spreads,
    }
    print(f"max spread of left_on_table: {figures['max_spread']}; wall {walls} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if walls else 1


if __name__ == "__main__":
    sys.exit(main())
