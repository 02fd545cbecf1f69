"""Speed of `report` and `diff` on 10,000-row tables (issue 3: at most 3 s each on the CPU machine).

    python benchmarks/report_speed.py [--json FILE]

The tables are real rows repeated: tile i of the recorded H100 batched run (54 rows) is the run
with m increased by i and n by 2i (never the same shape twice), so the tiles are distinct cases
with the recorded kernels, metrics and times. Side B of the diff tiles the recorded smoke run the
same way; the two share the batch-8 cases at 256 and 1024 of each tile, so the diff has matches
(with the real +14 % regression at 256), identical cases and cases on one side only.
Both are timed in-process from the CSV file to the written Markdown (the report with its plot).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import matplotlib
import pandas as pd

from cublas_audit.judge import diff
from cublas_audit.judge.audited import audit_all
from cublas_audit.report import diff_report, render
from cublas_audit.table import dispatch
from cublas_audit.table.inputs import load_inputs, load_one_gpu
from cublas_audit.table.validation import read_table

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
NOISE_RUNS = REPO / "reports" / "h100" / "noise" / "start-a"
ROWS = 10_000
LIMIT_S = 3.0


def tiled(run: Path, rows: int, path: Path) -> Path:
    """Writes `rows` rows made of the recorded run's rows, sizes offset per tile."""
    recorded = read_table(run)
    tiles = -(-rows // len(recorded))
    frames = [recorded.assign(m=recorded["m"] + i, n=recorded["n"] + 2 * i) for i in range(tiles)]
    return dispatch.write_table(pd.concat(frames, ignore_index=True).head(rows), path)


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json", type=Path, default=REPO / "benchmarks" / "results" / "report_speed.json"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        a = tiled(FIXTURES / "h100-batched-cublas", ROWS, work / "a.csv")
        b = tiled(FIXTURES / "h100-smoke", ROWS, work / "b.csv")
        out = work / "out" / "report.md"
        report_s = timed(lambda: render.write_report(audit_all(load_inputs([a])), out))
        diff_s = timed(
            lambda: diff_report.to_markdown(diff.compare(load_one_gpu(a), load_one_gpu(b)))
        )
        # Schema 2 tables, with the distributions every timing verdict reads: two back-to-back
        # reruns of the default batched grid on the H100, tiled the same way.
        c = tiled(NOISE_RUNS / "run-00", ROWS, work / "c.csv")
        d = tiled(NOISE_RUNS / "run-01", ROWS, work / "d.csv")
        verdicts_s = timed(
            lambda: diff_report.to_markdown(diff.compare(load_one_gpu(c), load_one_gpu(d)))
        )
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "matplotlib": matplotlib.__version__,
        "jinja2": jinja2.__version__,
        "rows": ROWS,
        "report_s": round(report_s, 3),
        "diff_s": round(diff_s, 3),
        "diff_with_distributions_s": round(verdicts_s, 3),
        "limit_s": LIMIT_S,
        "ok": max(report_s, diff_s, verdicts_s) <= LIMIT_S,
    }
    print(f"report of {ROWS} rows (with plot): {report_s:.2f} s (limit {LIMIT_S:.0f} s)")
    print(f"diff of two {ROWS}-row tables:      {diff_s:.2f} s (limit {LIMIT_S:.0f} s)")
    print(f"  the same with distributions:     {verdicts_s:.2f} s (limit {LIMIT_S:.0f} s)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
