"""Time and peak memory of `report` and `diff` on 1,000,000-row dispatch tables (issue 38: under
~2 GB peak RSS each).

    python benchmarks/large_table.py [--rows N] [--json FILE] [--keep DIR [--reuse]]

The tables are real rows tiled: the two back-to-back runs of one 10,000-problem FP32 map on the
H100 (tests/fixtures/h100-map-reruns/fp32-s0, every column of their dispatch.csv). Tile i of each
is its run with m increased by i % 64 and n by i // 64 (the map's sizes are multiples of 64, so
no shape repeats), its case ids renamed to match; nothing else changes. Table A tiles the first
run, table B the second with the same offsets: every case is matched, with the real run-to-run
differences of its map problem.

Each command runs as the CLI does, in a process of its own (`python -m cublas_audit`), output to
a file: `report A --format json`, `report A --format md` and `diff A B`. Its wall and CPU time
and peak resident memory (getrusage of that process) are printed and written to
benchmarks/results/large_table.json with the outputs' sizes (large_table_before.json: the same
before issue 38). This is a measurement, not a test: it takes minutes, 1 GB of disk for the two
tables, and the memory it measures.
"""

from __future__ import annotations

import argparse
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

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
RERUNS = REPO / "tests" / "fixtures" / "h100-map-reruns" / "fp32-s0"
ROWS = 1_000_000
LIMIT_GIB = 2.0


def tile(run: pd.DataFrame, i: int) -> pd.DataFrame:
    """Tile `i` of a recorded run: its sizes offset (m by i % 64, n by i // 64), case ids too."""
    dm, dn = i % 64, i // 64
    if dn >= 64:
        raise SystemExit("at most 4,096 tiles keep every shape distinct")
    out = run.copy()
    old = run["m"].astype(str) + "x" + run["n"].astype(str) + "x" + run["k"].astype(str)
    out["m"] = run["m"] + dm
    out["n"] = run["n"] + dn
    new = out["m"].astype(str) + "x" + out["n"].astype(str) + "x" + run["k"].astype(str)
    out["case_id"] = [
        case.replace(f".{before}.", f".{after}.", 1)
        for case, before, after in zip(run["case_id"], old, new, strict=True)
    ]
    return out


def write_tiled(run: pd.DataFrame, rows: int, path: Path) -> Path:
    """`rows` rows of tiles of `run`, appended tile by tile (the whole table is never in memory)."""
    tiles = -(-rows // len(run))
    with path.open("w", newline="") as sink:
        for i in range(tiles):
            part = tile(run, i).head(rows - i * len(run))
            part.to_csv(sink, index=False, header=i == 0, lineterminator="\n")
    return path


def measure(args: list[str], out: Path) -> dict[str, Any]:
    """One CLI command in its own process, stdout to `out`: wall seconds, peak RSS, exit code."""
    command = [sys.executable, "-m", "cublas_audit", *args]
    with out.open("wb") as sink, tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=sink, stderr=errors, cwd=out.parent)
        _, status, usage = os.wait4(process.pid, 0)  # the rusage of this one child
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        tail = errors.read().decode(errors="replace").strip().splitlines()[-3:]
    return {
        "command": "cublas-audit " + " ".join(args),
        "exit_code": process.returncode,
        "seconds": round(seconds, 1),
        # the CPU time too: on a machine shared with other work it varies less than wall time
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3),  # ru_maxrss: KiB on Linux
        "output_mib": round(out.stat().st_size / 2**20, 2),
        "stderr_tail": tail,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="rows of each table")
    parser.add_argument(
        "--json", type=Path, default=REPO / "benchmarks" / "results" / "large_table.json"
    )
    parser.add_argument("--keep", type=Path, help="write the tables and outputs here; keep them")
    parser.add_argument(
        "--reuse", action="store_true", help="take the tables --keep holds from an earlier run"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        a, b = work / "a.csv", work / "b.csv"
        if not (args.reuse and a.is_file() and b.is_file()):
            write_tiled(pd.read_parquet(RERUNS / "a.parquet"), args.rows, a)
            write_tiled(pd.read_parquet(RERUNS / "b.parquet"), args.rows, b)
        built = time.perf_counter() - start
        table_mib = a.stat().st_size / 2**20
        print(f"two {args.rows:,}-row tables ({table_mib:.0f} MiB of CSV each) in {built:.0f} s")
        commands = {
            "report_json": (["report", a.name, "--format", "json"], "report.json"),
            "report_md": (["report", a.name, "--format", "md"], "report.md"),
            "diff_md": (["diff", a.name, b.name], "diff.md"),
        }
        results = {}
        for name, (command, output) in commands.items():
            results[name] = measure(command, work / output)
            got = results[name]
            print(
                f"{got['command']:<40} {got['seconds']:6.1f} s (CPU {got['cpu_seconds']:6.1f} s)  "
                f"{got['peak_rss_gib']:5.2f} GiB  "
                f"output {got['output_mib']:8.2f} MiB  exit {got['exit_code']}"
            )
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "rows": args.rows,
        "table_mib": round(table_mib, 1),
        "source": str(RERUNS.relative_to(REPO)),
        "limit_gib": LIMIT_GIB,
        **results,
        "ok": all(r["exit_code"] == 0 and r["peak_rss_gib"] <= LIMIT_GIB for r in results.values()),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
