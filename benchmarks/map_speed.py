"""The dispatch map's speed, from a finished map's run directory (CPU; the map ran on the GPU).

    python benchmarks/map_speed.py RUN_DIR [--json FILE]

Targets (issue 18, on the H100): at least 25 cases per second for problems under 1 ms with at
least 5 timed calls each, and a 10,000-case FP32 map of M, N, K in 64..4096 in under 10 minutes.
Every figure comes from the run's own records: env.json (the map phase's wall time, the command)
and timing.jsonl (per case: the probe's wall seconds on it, `case_s`, and its timed calls). The
per-case rate of the small problems is their count over the sum of their `case_s`: everything
the probe did for them (operands, the quick check, the timed and traced calls, the record);
the map's overall rate also holds the probe's start and the table's assembly.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cublas_audit.table import rundir  # noqa: E402

SMALL_MS = 1.0
TARGET_SMALL_RATE = 25.0
MIN_CALLS = 5
TARGET_10K_S = 600.0


def results(run_dir: Path) -> list[dict[str, Any]]:
    """The `done` records of timing.jsonl, or of timing.jsonl.gz (the committed 10,000-case map
    keeps its records compressed)."""
    packed = run_dir / (rundir.TIME_RESULTS + ".gz")
    if not (run_dir / rundir.TIME_RESULTS).exists() and packed.exists():
        lines = gzip.decompress(packed.read_bytes()).decode().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        return [r for r in records if r.get("event") == "done"]
    return list(rundir.read_results(run_dir / rundir.TIME_RESULTS).values())


def summarize(run_dir: Path) -> dict[str, Any]:
    env = rundir.read_env(run_dir)
    done = results(run_dir)
    ok = [r for r in done if r.get("status") == "ok"]
    small = [r for r in ok if float(r["time_ms"]) < SMALL_MS]
    small_s = sum(float(r["case_s"]) for r in small)
    map_s = float((env.get("phase_seconds") or {}).get("time") or env.get("sweep_seconds") or 0)
    return {
        "run_dir": str(run_dir),
        "gpu": env.get("gpu_name"),
        "cublas": env.get("cublas_version"),
        "command": env.get("command"),
        "cases": len(done),
        "ok": len(ok),
        "map_seconds": map_s,
        "cases_per_second": round(len(done) / map_s, 2) if map_s else None,
        "small_cases": len(small),
        "small_cases_per_second": round(len(small) / small_s, 2) if small_s else None,
        "min_timed_calls": min((int(r["time_n"]) for r in ok), default=0),
        "traced": sum(r.get("kernel_time_status") == "ok" for r in ok),
        "targets": {
            "small_cases_per_second": TARGET_SMALL_RATE,
            "min_timed_calls": MIN_CALLS,
            "map_seconds_for_10000": TARGET_10K_S,
        },
    }


def verdicts(found: dict[str, Any]) -> list[str]:
    lines = []
    rate = found["small_cases_per_second"] or 0
    lines.append(f"small problems: {rate:.1f} cases/s (target >= {TARGET_SMALL_RATE:g})")
    lines.append(f"timed calls per case: {found['min_timed_calls']} (target >= {MIN_CALLS})")
    if found["cases"] >= 10_000:
        lines.append(
            f"{found['cases']} cases in {found['map_seconds']:.0f} s "
            f"(target < {TARGET_10K_S:.0f} s for 10,000)"
        )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    found = summarize(args.run_dir)
    print(json.dumps(found, indent=2))
    print("\n".join(verdicts(found)))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
