"""The map's chunks queued by a C thread (device.native_queue): same kernels, and how much faster.

    python benchmarks/native_queue.py JSON [--maps DIR] [--legs sample,grid,fp32,threads]
        [--keep DIR]

    sample  the recorded 10,000-problem BF16 map (seed 1: tests/fixtures/h100-map-reruns/bf16-s1)
            mapped twice on this GPU, back to back, both with cuBLAS's choices made ahead: its
            chunks queued by the C thread (`native`) and from Python (`python`,
            CUBLAS_AUDIT_NATIVE_QUEUE=0). Every problem's kernels against each other and against
            the recorded runs a and b, the diff gate both ways (map_speed.rerun_agreement), and
            each map's speed and engine record. --keep DIR writes the native map's table as
            DIR/native.parquet (+ env.json) for the CPU test that checks it on recorded data.
    grid    the BF16 full grid (M, N, K in 64..4096 step 64: 262,144 problems) on one GPU, the
            chunks queued by the C thread: map seconds (the target is 60 s on one H100).
    fp32    a uniform 20,000-problem sample of the FP32 grid (seed 0): its map phase, and the full
            grid's at that rate: the engine's seconds a problem times 262,144, plus the phase's
            seconds outside the engine (start-up, exit) once (the target is 560 s on one H100).
    threads a 20,000-problem BF16 sample (seed 3) with the C thread and 8, 4, 2 or 0 warm
            workers: the map's and the engine's seconds, the C thread's busy seconds and the
            GPU's seconds in the timed calls and between them (the engine record's `warm`).

The JSON is updated leg by leg.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import heuristic_warm  # noqa: E402


def sample_leg(maps: Path, keep: Path | None) -> dict[str, Any]:
    python = {"warm": True, "native": False}
    return heuristic_warm.compared(maps, keep, ("native", {"warm": True}), ("python", python))


def grid_leg(maps: Path) -> dict[str, Any]:
    found = heuristic_warm.mapped(maps / "grid-native", [], warm=True, native=True)
    found["target_map_s"] = heuristic_warm.TARGET_GRID_S
    return found


FP32_SAMPLE = 20_000
GRID_PROBLEMS = 64**3
TARGET_FP32_GRID_S = 560.0


def fp32_leg(maps: Path) -> dict[str, Any]:
    extra = ["--sample", str(FP32_SAMPLE), "--seed", "0"]
    found = heuristic_warm.mapped(maps / "fp32-sample", extra, warm=True, native=True, mode="fp32")
    timeline = (found.get("timeline") or [None])[0]
    phase = found.get("map_seconds")
    if timeline and phase:
        engine = timeline["engine_end_s"] - timeline["engine_start_s"]
        outside = phase - engine  # start-up and exit: once a map, however large
        found["engine_s"] = round(engine, 2)
        found["full_grid_estimate_s"] = round(outside + engine * GRID_PROBLEMS / FP32_SAMPLE, 1)
    found["target_full_grid_s"] = TARGET_FP32_GRID_S
    return found


def threads_leg(maps: Path) -> dict[str, Any]:
    extra = ["--sample", "20000", "--seed", "3"]
    runs: dict[str, Any] = {}
    for threads in (8, 4, 2, 0):
        found = heuristic_warm.mapped(maps / f"threads-{threads}", extra, True, True, threads)
        record = (found.get("warm") or [{}])[0]
        runs[str(threads)] = {
            "map_seconds": found.get("map_seconds"),
            "engine": found.get("engine_seconds"),
            **{key: record.get(key) for key in ("queue_busy_s", "gpu_calls_s", "gpu_between_s")},
        }
    return {"runs": runs}


def main(argv: list[str]) -> int:
    legs = {
        "sample": sample_leg,
        "grid": lambda maps, keep: grid_leg(maps),
        "threads": lambda maps, keep: threads_leg(maps),
        "fp32": lambda maps, keep: fp32_leg(maps),
    }
    return heuristic_warm.run_legs(argv, __doc__ or "", legs, Path("/tmp/native"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
