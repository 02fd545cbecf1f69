"""Run-to-run noise of un-profiled timing: the default batched grid rerun back to back.

    python benchmarks/noise.py collect --runs 10 --out reports/h100/noise/START   (on a GPU)

Each rerun is a complete `cublas-audit sweep --batched --no-profile --no-reference` into its own
run directory (OUT/run-NN), so every table the noise model is fitted and judged on is an ordinary
dispatch table with its distributions and clocks, and any pair of them can be diffed. Prints one
line per run (wall time, cases) and a JSON summary last; the run directories are the data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cublas_audit.cases import DEFAULT_BATCHES, DEFAULT_SIZES, build_plan
from cublas_audit.sweep_setup import SweepOptions, sweep


def collect(runs: int, out: Path, label: str) -> list[dict[str, object]]:
    cases = build_plan(
        sizes=DEFAULT_SIZES,
        batches=DEFAULT_BATCHES,
        modes=["fp32"],
        apis=["cublas", "cublasLt"],
        single=False,
        batched=True,
    )
    done = []
    for index in range(runs):
        run_dir = out / f"run-{index:02d}"
        command = ["cublas-audit", "sweep", "--batched", "--no-profile", "--no-reference"]
        options = SweepOptions(
            cases=cases,
            gpu_label=label,
            out=run_dir,
            profile=False,
            reference=False,
            command=[*command, "--gpu-label", label, "--out", str(run_dir)],
        )
        start = time.perf_counter()
        result = sweep(options)
        seconds = time.perf_counter() - start
        done.append({"run": str(run_dir), "seconds": round(seconds, 2), "cases": len(result.frame)})
        print(f"run {index}: {len(result.frame)} rows in {seconds:.1f} s", flush=True)
    return done


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gather = commands.add_parser("collect", help="rerun the default batched grid on this GPU")
    gather.add_argument("--runs", type=int, default=10)
    gather.add_argument("--out", type=Path, required=True)
    gather.add_argument("--gpu-label", default="h100")
    args = parser.parse_args(argv)
    done = collect(args.runs, args.out, args.gpu_label)
    print(json.dumps({"runs": done}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
