"""Variants of the reference SGEMM against cuBLAS on this GPU: the search behind issue 4's tiles.

    PYTHONPATH=$PWD python3 benchmarks/reference_variants.py \\
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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reference_vs_cublas import unit_device  # noqa: E402

from cublas_audit import reference  # noqa: E402
from cublas_audit.timing import time_interleaved  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=["8192,8", "4096,8"], help="SIZE,BATCH")
    parser.add_argument("--variants", nargs="+", default=["order=0", "order=1", "order=2"])
    parser.add_argument("--min-reps", type=int, default=10)
    parser.add_argument("--json", help="write the rows here")
    return parser.parse_args(argv)


def overrides(text: str) -> dict[str, Any]:
    """'order=1,acc_layout=blocks' -> {'order': 1, 'acc_layout': 'blocks'}"""
    pairs = (item.split("=", 1) for item in text.split(",") if item)
    return {key: int(value) if value.lstrip("-").isdigit() else value for key, value in pairs}


def variants(size: int, batch: int, texts: list[str]) -> dict[str, reference.Config]:
    base = reference.strategy_for(reference.device_cc(), size, size, size, batch)
    found = {text: replace(base, **overrides(text)) for text in texts}
    for text, config in list(found.items()):
        if config.problems():
            print(f"  {text}: skipped, {'; '.join(config.problems())}", flush=True)
            del found[text]
    return found


def launchers(
    size: int, batch: int, configs: dict[str, reference.Config], a: Any, b: Any, c: Any
) -> dict[str, Callable[[], None]]:
    """cuBLAS ("cublas") and every variant on the same operands, the variants compiled in
    parallel first."""
    reference.build_all((config, size, size, size) for config in configs.values())
    found = {"cublas": reference.cublas_launcher(size, size, size, batch, a, b, c)}
    for text, config in configs.items():
        found[text] = reference.prepare(size, size, size, batch, a, b, c, config)
    return found


def measure(
    size: int, batch: int, configs: dict[str, reference.Config], min_reps: int
) -> list[dict[str, Any]]:
    a, b, c = reference.random_operands(size, size, size, batch)
    contenders = launchers(size, batch, configs, a, b, c)
    labels = {"cublas": "cuBLAS"} | {text: config.label() for text, config in configs.items()}
    errors = {}
    for name, launch in list(contenders.items()):
        errors[name] = reference.checked(launch, a, b, c)
        if not errors[name] <= reference.TOLERANCE:
            print(f"  {name}: WRONG, relative error {errors[name]:.3g}", flush=True)
            del contenders[name]
    times = time_interleaved(contenders, min_reps, warm=True)  # each ran in its check
    blas_ms = times["cublas"].median_ms
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
    results: dict[str, Any] = {"command": sys.argv, "device": unit_device(args), "rows": []}
    for problem in args.problems:
        size, batch = (int(x) for x in problem.split(","))
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
