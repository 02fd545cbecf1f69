"""The sweep's speed figures (issue 2).

    python benchmarks/sweep_speed.py parse [--json FILE]   # CPU: 10,000-row ncu export -> table
    python benchmarks/sweep_speed.py sweep [--json FILE] [--keep DIR]   # GPU

`parse` tiles the real H100 ncu export under tests/fixtures/ to 10,000 launches (the rows repeat,
their ids and case ids are renumbered) and times parsing it and writing the dispatch table; target
2 s. `sweep` runs `cublas-audit sweep --batched` (6 sizes x 3 batches, three APIs) twice, target
100 s on a fresh machine: first cold, with CUPY_CACHE_DIR pointing the sweep and its probes at a
fresh, empty directory (every CuPy kernel and reference specialization compiles, as on a
machine's first sweep; only CuPy's kernel cache is made cold), then warm, right after, on the
cache the first run filled. For each run: the wall time, env.json's phase_seconds and each phase's
share of the wall (profile, time, recheck, candidates, and other: the wall less the phases), and
how the kernel times were traced (timing.jsonl's kernel_trace). The JSON is written after each
run, so a run cut short still leaves the first one's figures.
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
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cublas_audit.observe import ncu_export
from cublas_audit.planning.cases import Case
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.table import assemble, dispatch, rundir

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
            row[nvtx] = f'1  "<default domain>:{ncu_export.CALL_RANGE_PREFIX}{case.case_id}:none" '
            writer.writerow(row)
            cases.append(case)
    return cases


def parse_benchmark() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "export.csv"
        cases = tiled_export(export, ROWS)
        start = time.perf_counter()
        launches = ncu_export.parse_csv_file(export)
        parsed = time.perf_counter()
        frame = assemble.build_table(cases, launches, {}, {}, {"gpu_label": "h100"})
        dispatch.write_table(frame, Path(tmp) / rundir.TABLE_FILE)
        done = time.perf_counter()
    return {
        "rows": len(frame),
        "parse_s": round(parsed - start, 3),
        "table_s": round(done - parsed, 3),
        "total_s": round(done - start, 3),
        "target_s": 2.0,
    }


PHASES = ("profile", "time", "recheck", "candidates")
TARGET_S = 100.0


def sweep_benchmark(keep: Path | None, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The cold run (kept in `keep` where given), then the warm one; `save` hears the figures
    after each run."""
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "kernel-cache"
        cache.mkdir()  # fresh and empty: the first sweep on a machine
        env = {**os.environ, "CUPY_CACHE_DIR": str(cache)}
        figures: dict[str, Any] = {
            "cold_wall_s": None,  # None: not run (yet)
            "warm_wall_s": None,
            "target_s": TARGET_S,  # on the cold run: a fresh machine's first sweep
            "target_met": None,
            "kernel_cache": f"CUPY_CACHE_DIR={cache}, empty at the start of the cold run",
        }
        for run, run_dir in (("cold", keep or Path(tmp) / "cold"), ("warm", Path(tmp) / "warm")):
            measured, run_env = one_sweep(run_dir, env, cache)
            figures[f"{run}_wall_s"] = measured["wall_s"]
            figures[run] = measured
            if run == "cold":
                figures.update(cold_summary(measured, run_env))
            figures["target_met"] = figures["cold_wall_s"] <= TARGET_S
            save(figures)
    return figures


def one_sweep(
    run_dir: Path, env: dict[str, str], cache: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One `sweep --batched` into run_dir: its wall time, phases and their shares; its env.json."""
    cached = sum(1 for _ in cache.iterdir())
    argv = [sys.executable, "-m", "cublas_audit", "sweep", "--batched", "--out", str(run_dir)]
    start = time.perf_counter()
    done = subprocess.run(argv, check=False, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    if done.returncode:  # the sweep said why on stderr
        sys.exit(done.returncode)
    run_env = json.loads((run_dir / rundir.ENV_FILE).read_text())
    plan = read_plan(run_dir / rundir.PLAN_FILE)
    phases = {name: float(took) for name, took in run_env.get("phase_seconds", {}).items()}
    shares = {name: round(phases.get(name, 0.0) / wall, 3) for name in PHASES}
    shares["other"] = round((wall - sum(phases.values())) / wall, 3)
    traced = Counter(
        record.get("kernel_trace", "none")
        for record in rundir.read_results(run_dir / rundir.TIME_RESULTS).values()
    )
    measured = {
        "wall_s": round(wall, 2),
        "phase_seconds": phases,
        "phase_shares": shares,
        "other_s": round(wall - sum(phases.values()), 2),
        "kernel_cache_entries_at_start": cached,
        "kernel_trace": dict(traced),
        "cases": len(plan),
        "profiled_cases": sum(1 for case in plan if not case.loop),
    }
    return measured, run_env


def cold_summary(cold: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """The figures this benchmark always reported, of the cold run: the target's run."""
    wall, phases = cold["wall_s"], cold["phase_seconds"]
    return {
        "cases": cold["cases"],
        "profiled_cases": cold["profiled_cases"],
        "wall_s": wall,
        "ncu_s": phases.get("profile"),
        "ncu_share": round(phases.get("profile", 0.0) / wall, 3),
        "timing_s": phases.get("time"),
        "ncu_s_per_profiled_case": round(
            phases.get("profile", 0.0) / max(cold["profiled_cases"], 1), 3
        ),
        "overhead_s": cold["other_s"],
        "device": env.get("gpu_name"),
        "driver": env.get("driver_version"),
        "cublas": env.get("cublas_version"),
        "ncu": env.get("ncu_version"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("parse", "sweep"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="sweep: keep the cold run's directory here")
    args = parser.parse_args()
    stamp = {
        "benchmark": f"sweep_speed {args.what}",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
    }

    def save(figures: dict[str, Any]) -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({**figures, **stamp}, indent=2) + "\n")

    figures = parse_benchmark() if args.what == "parse" else sweep_benchmark(args.keep, save)
    save(figures)
    for key, value in {**figures, **stamp}.items():
        print(f"{key:>24}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
