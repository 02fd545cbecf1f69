"""SM clock and board power while each contender runs back to back: a steady stream of one kernel.

    python -m tools.reference_power --problem 8192,8 \\
        --variants acc_layout=rows acc_layout=blocks --json FILE

The figures of benchmarks/reference_vs_cublas.py time the reference and cuBLAS interleaved, one
call each in turn. Under a power limit that is not what a stream of one kernel gets: here each
contender runs --calls times in a row while nvidia-smi samples the SM clock, power and temperature
every 100 ms, for --rounds rounds over all contenders. Variants are the table's pick with Config
fields overridden, as in tools/reference_variants.py; each contender is checked against float64
first (a wrong one is dropped and reported). Prints one line per contender and round; --json
writes them with the device, date and versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cublas_audit.device import operands
from tools._common import checked, contenders, device_info, problem, variants

SAMPLE = ["--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits"]
SKIPPED_SAMPLES = 3  # the sampler's first 300 ms overlap the warm-up call


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="8192,8", help="SIZE,BATCH")
    parser.add_argument("--variants", nargs="+", default=["acc_layout=rows", "acc_layout=blocks"])
    parser.add_argument("--calls", type=int, default=25, help="calls in a row per contender")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the rows here")
    return parser.parse_args(argv)


def run_sampled(launch: Callable[[], None], calls: int) -> dict[str, float]:
    """Mean ms per call of `calls` calls in a row, with the mean SM clock and power meanwhile."""
    import cupy

    launch()
    cupy.cuda.Device().synchronize()
    sampler = subprocess.Popen(
        ["nvidia-smi", *SAMPLE, "-lms", "100"], stdout=subprocess.PIPE, text=True
    )
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(calls):
        launch()
    stop.record()
    stop.synchronize()
    sampler.terminate()
    lines = sampler.communicate()[0].splitlines()
    samples = [[float(x) for x in line.split(",")] for line in lines if line.strip()]
    kept = samples[SKIPPED_SAMPLES:] or samples
    return {
        "ms": float(cupy.cuda.get_elapsed_time(start, stop)) / calls,
        "mhz": sum(s[0] for s in kept) / len(kept),
        "watts": sum(s[1] for s in kept) / len(kept),
        "temp_c": kept[-1][2],
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    size, batch = problem(args.problem)
    ops = operands.make("fp32", size, size, size, batch)
    found = contenders(size, batch, variants(size, batch, args.variants), ops)
    errors = checked(found, ops)
    results: dict[str, Any] = {"command": sys.argv, "device": device_info(), "rows": []}
    for round_ in range(args.rounds):
        for name, launch in found.items():
            row = {"size": size, "batch": batch, "round": round_, "contender": name}
            row |= {**run_sampled(launch, args.calls), "error": errors[name]}
            results["rows"].append(row)
            print(
                f"{round_} {name:24s} {row['ms']:9.3f} ms {row['mhz']:6.0f} MHz "
                f"{row['watts']:6.1f} W {row['temp_c']:3.0f} C",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
