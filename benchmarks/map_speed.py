"""The dispatch map's speed, from finished maps' run directories (CPU; the maps ran on the GPU).

    python benchmarks/map_speed.py RUN_DIR [RUN_DIR...] [--rerun A B] [--json FILE]

Targets (issue 28, on the H100): at least 500 problems per second for problems whose 5 calls take
under 1 ms of GPU time, with every problem's kernel names, kernel-only times and quick float64
check kept; so the full 3-D grid of one mode (M, N, K in 64..4096 step 64: 262,144 problems) in
under 10 minutes. Every figure comes from the runs' own records: env.json (the map's wall time
and command) and timing.jsonl: per problem its timed calls and `case_s` (device.map_engine
queues a chunk of problems per synchronisation, so a problem's `case_s` is its share of its
chunk's wall time), and the engine's record of where its time went (queueing on the host,
waiting for the GPU, reading back, problems run alone). GPU-busy is the traced kernels' time over
the wall time. A map finished by `--resume` (several probe runs) is timed by its cases' shares,
which add up every part's measuring time (env.json times the last part alone). `--rerun A B`
compares two maps of the same plan: the same kernels everywhere and kernel times within the noise
model (`cublas-audit diff --fail-on regression` passes both ways).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cublas_audit.table import rundir  # noqa: E402

SMALL_MS = 1.0  # the 5 calls' GPU time under which a problem is "small"
# A case's case_s is its chunk's time over its cases, and the engine deals every chunk a like
# share of small and large problems: small problems have a rate of their own only in a map of
# (nearly) nothing else, as the grid 64..1024 or the BF16 grid
SMALL_ONLY = 0.99
TARGET_SMALL_RATE = 500.0
MIN_CALLS = 5
FULL_GRID = 64**3  # M, N, K in 64..4096 step 64
TARGET_FULL_GRID_S = 600.0


def records(run_dir: Path) -> list[dict[str, Any]]:
    """timing.jsonl's records, or timing.jsonl.gz's (committed maps keep them compressed)."""
    packed = run_dir / (rundir.TIME_RESULTS + ".gz")
    if not (run_dir / rundir.TIME_RESULTS).exists() and packed.exists():
        lines = gzip.decompress(packed.read_bytes()).decode().splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    return list(rundir.records(run_dir / rundir.TIME_RESULTS))


def gpu_ms(record: dict[str, Any]) -> float:
    """The GPU time of a problem's timed calls: traced kernel time, else event time."""
    median = record.get("kernel_time_ms") or record.get("time_ms") or 0.0
    calls = record.get("kernel_time_n") or record.get("time_n") or 0
    return float(median) * int(calls)


def summarize(run_dir: Path) -> dict[str, Any]:
    env = rundir.read_env(run_dir)
    found = records(run_dir)
    done = list({r["case_id"]: r for r in found if r.get("event") == "done"}.values())
    ok = [r for r in done if r.get("status") == "ok"]
    small = [r for r in ok if gpu_ms(r) < SMALL_MS]
    small_s = sum(float(r["case_s"]) for r in small)
    map_s = float((env.get("phase_seconds") or {}).get("time") or env.get("sweep_seconds") or 0)
    engine: dict[str, float] = {}
    for record in (r for r in found if r.get("event") == "engine"):
        for name, seconds in (record.get("seconds") or {}).items():
            engine[name] = engine.get(name, 0.0) + float(seconds)
    spent = sum(engine.values())
    busy_s = sum(gpu_ms(r) for r in ok) / 1e3
    # A resumed map's env.json times its last part alone; its cases' shares (case_s) add up to
    # every part's measuring time, also a part stopped before it could record anything else.
    # A map stopped before its end (no table, no phase time) is timed the same way: its chunks
    # are dealt to like work (planning.chunks.dealt), so its rate is the whole map's.
    parts = sum(r.get("event") == "probe" for r in found)
    if parts > 1 or not map_s:
        map_s = sum(float(r.get("case_s") or 0) for r in done)
    rate = len(done) / map_s if map_s else None
    return {
        "run_dir": str(run_dir),
        "gpu": env.get("gpu_name"),
        "cublas": env.get("cublas_version"),
        "command": env.get("command"),
        "cases": len(done),
        "ok": len(ok),
        "map_seconds": map_s,
        "probe_runs": parts,
        "cases_per_second": round(rate, 2) if rate else None,
        "small_cases": len(small),
        "small_cases_per_second": round(len(small) / small_s, 2)
        if small_s and len(small) >= SMALL_ONLY * len(ok)
        else None,
        "median_case_ms": round(1e3 * statistics.median(float(r["case_s"]) for r in done), 3)
        if done
        else None,
        "gpu_busy_share": round(busy_s / map_s, 3) if map_s else None,
        "engine_seconds": {k: round(v, 2) for k, v in engine.items()},
        "engine_shares": {k: round(v / spent, 3) for k, v in engine.items()} if spent else {},
        "min_timed_calls": min((int(r["time_n"]) for r in ok), default=0),
        "traced": sum(r.get("kernel_time_status") == "ok" for r in ok),
        "checked": sum(r.get("check") == "quick" for r in done),
        "full_grid_seconds_at_this_rate": round(FULL_GRID / rate, 1) if rate else None,
        "targets": {
            "small_cases_per_second": TARGET_SMALL_RATE,
            "min_timed_calls": MIN_CALLS,
            "full_grid_seconds": TARGET_FULL_GRID_S,
        },
    }


def rerun_agreement(first: Path, second: Path) -> dict[str, Any]:
    """Two maps of one plan: kernels equal per problem, kernel-time ratios, and the diff gate."""
    a = {r["case_id"]: r for r in records(first) if r.get("event") == "done"}
    b = {r["case_id"]: r for r in records(second) if r.get("event") == "done"}
    both = [c for c in a if c in b and a[c].get("kernel_time_ms") and b[c].get("kernel_time_ms")]
    same = sum(a[c].get("traced_kernels") == b[c].get("traced_kernels") for c in both)
    ratios = sorted(float(b[c]["kernel_time_ms"]) / float(a[c]["kernel_time_ms"]) for c in both)
    gates = {}
    for name, (x, y) in {"a_to_b": (first, second), "b_to_a": (second, first)}.items():
        command = [sys.executable, "-m", "cublas_audit", "diff", str(x), str(y)]
        command += ["--format", "json", "--fail-on", "regression"]
        gates[name] = subprocess.run(command, capture_output=True, text=True).returncode
    return {
        "problems": len(both),
        "same_kernels": same,
        "kernel_time_ratio_p1_p50_p99": [
            round(ratios[int(q * (len(ratios) - 1))], 4) for q in (0.01, 0.5, 0.99)
        ]
        if ratios
        else [],
        "diff_fail_on_regression_exit": gates,
    }


def verdicts(found: dict[str, Any]) -> list[str]:
    rate = found["small_cases_per_second"]
    small = f"{rate:.0f}/s" if rate else "mixed with large ones in every chunk"
    lines = [f"{found['run_dir']}: small problems {small} (target >= {TARGET_SMALL_RATE:g})"]
    lines.append(f"  timed calls per case: {found['min_timed_calls']} (target >= {MIN_CALLS})")
    lines.append(
        f"  {found['cases']} problems in {found['map_seconds']:.0f} s; the full grid at this "
        f"rate: {found['full_grid_seconds_at_this_rate']} s (target < {TARGET_FULL_GRID_S:.0f})"
    )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="*")
    parser.add_argument("--rerun", type=Path, nargs=2, metavar=("A", "B"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    found: dict[str, Any] = {"maps": [summarize(path) for path in args.run_dirs]}
    if args.rerun:
        found["rerun"] = rerun_agreement(*args.rerun)
    print(json.dumps(found, indent=2))
    for summary in found["maps"]:
        print("\n".join(verdicts(summary)))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
