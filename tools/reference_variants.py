"""Variants of the reference SGEMM against cuBLAS on this GPU: the search behind issue 4's tiles.

    python -m tools.reference_variants \\
        --problems 8192,8 4096,8 --variants order=0 order=1 order=2 bk=16,stages=4 --json FILE

Each variant is the strategy table's pick for the problem with some Config fields overridden
(`order=1`, `acc_layout=blocks`, `acc_layout=8x4/cc`, `bm=256,bn=128`, ...). Per problem, every
variant is compiled (in parallel), checked against float64 on fresh random inputs (a wrong one is
dropped and reported), then all of them and cuBLAS are timed interleaved (CUDA events, median of
at least --min-reps), so drift hits every contender alike. Prints a table per problem, best
first; --json writes the rows with the device, date and versions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cublas_audit.device import operands
from cublas_audit.device.reference.config import Config
from cublas_audit.device.timing import time_interleaved
from tools._common import CUBLAS, checked, contenders, device_info, problem, variants


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=["8192,8", "4096,8"], help="SIZE,BATCH")
    parser.add_argument("--variants", nargs="+", default=["order=0", "order=1", "order=2"])
    parser.add_argument("--min-reps", type=int, default=10)
    parser.add_argument("--json", help="write the rows here")
    return parser.parse_args(argv)


def measure(
    size: int, batch: int, configs: dict[str, Config], min_reps: int
) -> list[dict[str, Any]]:
    ops = operands.make("fp32", size, size, size, batch)
    found = contenders(size, batch, configs, ops)
    labels = {CUBLAS: "cuBLAS"} | {text: config.label() for text, config in configs.items()}
    errors = checked(found, ops)
    times = time_interleaved(found, min_reps, warmed_up=True)  # each ran in its check
    blas_ms = times[CUBLAS].median_ms
    flop = 2 * size**3 * batch
    return [
        {
            "size": size,
            "batch": batch,
            "variant": name,
            "config": labels[name],
            "median_ms": t.median_ms,
            "min_ms": t.min_ms,
            "reps": t.reps,
            "tflops": flop / t.median_ms / 1e9,
            "efficiency": blas_ms / t.median_ms,
            "error": errors[name],
        }
        for name, t in sorted(times.items(), key=lambda item: item[1].median_ms)
    ]


def main(argv: list[str]) -> int:
    from tabulate import tabulate

    args = parse_args(argv)
    results: dict[str, Any] = {"command": sys.argv, "device": device_info(), "rows": []}
    for text in args.problems:
        size, batch = problem(text)
        rows = measure(size, batch, variants(size, batch, args.variants), args.min_reps)
        results["rows"].extend(rows)
        body = [
            [r["variant"], r["config"], r["median_ms"], r["tflops"], r["efficiency"]] for r in rows
        ]
        headers = ["variant", "config", "ms", "TFLOP/s", "cuBLAS ms / ms"]
        table = tabulate(body, headers=headers, floatfmt=("", "", ".3f", ".2f", ".4f"))
        print(f"\n{size}^3 batch {batch}\n{table}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
