"""The sweep's speed figures (issue 2).

    python benchmarks/sweep_speed.py parse [--json FILE]   # CPU: 10,000-row ncu export -> table
    python benchmarks/sweep_speed.py sweep [--json FILE] [--keep DIR] [--cold-cache]   # GPU

`parse` tiles the real H100 ncu export under tests/fixtures/ to 10,000 launches (the rows repeat,
their ids and case ids are renumbered) and times parsing it and writing the dispatch table; target
2 s. `sweep` runs `cublas-audit sweep --batched` (6 sizes x 3 batches, both APIs) and reports the
wall time (target 120 s), the share spent under ncu, and the per-case overhead.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cublas_audit.observe import ncu_export as ncu_parse
from cublas_audit.planning.cases import Case
from cublas_audit.table import assemble, rundir
from cublas_audit.table import dispatch as table

REPO = Path(__file__).resolve().parent.parent

FIXTURE = REPO / "tests" / "fixtures" / "h100-batched-cublas" / "ncu" / "chunk-000.csv"
ROWS = 10_000


def tiled_export(path: Path, rows: int) -> list[Case]:
    """Writes an ncu raw CSV of `rows` launches made of the recorded ones; returns their cases."""
    with FIXTURE.open(newline="") as handle:
        header, units, *recorded = list(csv.reader(handle))
    nvtx = next(i for i, name in enumerate(header) if name.startswith("thread Domain:Push/Pop"))
    cases: list[Case] = []
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_ALL)
        writer.writerow(header)
        writer.writerow(units)
        for i in range(rows):
            row = list(recorded[i % len(recorded)])
            case = Case("cublas", "fp32", 256 + i, 256, 256, 8)
            row[0] = str(i)
            row[nvtx] = f'1  "<default domain>:{ncu_parse.CALL_RANGE_PREFIX}{case.case_id}:none" '
            writer.writerow(row)
            cases.append(case)
    return cases


def parse_benchmark() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "export.csv"
        cases = tiled_export(export, ROWS)
        start = time.perf_counter()
        launches = ncu_parse.parse_csv_file(export)
        parsed = time.perf_counter()
        frame = assemble.build_table(cases, launches, {}, {}, {"gpu_label": "h100"})
        table.write_table(frame, Path(tmp) / rundir.TABLE_FILE)
        done = time.perf_counter()
    return {
        "rows": len(frame),
        "parse_s": round(parsed - start, 3),
        "table_s": round(done - parsed, 3),
        "total_s": round(done - start, 3),
        "target_s": 2.0,
    }


def sweep_benchmark(keep: Path | None, cold_cache: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = keep or Path(tmp) / "run"
        env = dict(os.environ)
        if cold_cache:  # a first sweep on a machine compiles every reference specialization
            env["CUPY_CACHE_DIR"] = str(Path(tmp) / "kernel-cache")
        cache = Path(env.get("CUPY_CACHE_DIR", Path.home() / ".cupy" / "kernel_cache"))
        cached = sum(1 for _ in cache.iterdir()) if cache.is_dir() else 0
        argv = [
            sys.executable,
            "-m",
            "cublas_audit",
            "sweep",
            "--batched",
            "--out",
            str(run_dir),
        ]
        start = time.perf_counter()
        done = subprocess.run(argv, check=False, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        if done.returncode:  # the sweep said why on stderr
            sys.exit(done.returncode)
        env = json.loads((run_dir / rundir.ENV_FILE).read_text())
        plan = json.loads((run_dir / rundir.PLAN_FILE).read_text())
    phases = env.get("phase_seconds", {})
    profiled = sum(1 for case in plan if not case.get("loop"))
    return {
        "cases": len(plan),
        "profiled_cases": profiled,
        "wall_s": round(wall, 2),
        "ncu_s": phases.get("profile"),
        "ncu_share": round(phases.get("profile", 0.0) / wall, 3),
        "timing_s": phases.get("time"),
        "ncu_s_per_profiled_case": round(phases.get("profile", 0.0) / max(profiled, 1), 3),
        "overhead_s": round(wall - sum(phases.values()), 2),
        "target_s": 120.0,
        # A first sweep on a machine compiles every reference specialization (CuPy's cache).
        "kernel_cache": f"{cache}: {cached} entries at the start",
        "device": env.get("gpu_name"),
        "driver": env.get("driver_version"),
        "cublas": env.get("cublas_version"),
        "ncu": env.get("ncu_version"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("parse", "sweep"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="sweep: keep the run directory here")
    parser.add_argument(
        "--cold-cache",
        action="store_true",
        help="sweep: an empty CuPy kernel cache, as on a machine's first sweep",
    )
    args = parser.parse_args()
    figures = (
        parse_benchmark() if args.what == "parse" else sweep_benchmark(args.keep, args.cold_cache)
    )
    figures.update(
        benchmark=f"sweep_speed {args.what}",
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        host=platform.node(),
        python=platform.python_version(),
    )
    for key, value in figures.items():
        print(f"{key:>24}: {value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
