"""The map's chunks queued by a C thread (device.native_queue): same kernels, and how much faster.

    python benchmarks/native_queue.py JSON [--maps DIR] [--legs sample,grid] [--keep DIR]

    sample  the recorded 10,000-problem BF16 map (seed 1: tests/fixtures/h100-map-reruns/bf16-s1)
            mapped twice on this GPU, back to back, both with cuBLAS's choices made ahead: its
            chunks queued by the C thread (`native`) and from Python (`python`,
            CUBLAS_AUDIT_NATIVE_QUEUE=0). Every problem's kernels against each other and against
            the recorded runs a and b, the diff gate both ways (map_speed.rerun_agreement), and
            each map's speed and engine record. --keep DIR writes the native map's table as
            DIR/native.parquet (+ env.json) for the CPU test that checks it on recorded data.
    grid    the BF16 full grid (M, N, K in 64..4096 step 64: 262,144 problems) on one GPU, the
            chunks queued by the C thread: map seconds (the target is 60 s on one H100).

The JSON is updated leg by leg.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import heuristic_warm  # noqa: E402
import map_speed  # noqa: E402

from cublas_audit.table import rundir  # noqa: E402


def sample_leg(maps: Path, keep: Path | None) -> dict[str, Any]:
    extra = ["--sample", "10000", "--seed", "1"]
    native, python = maps / "sample-native", maps / "sample-python"
    found = {
        "native": heuristic_warm.mapped(native, extra, warm=True, native=True),
        "python": heuristic_warm.mapped(python, extra, warm=True, native=False),
    }
    if found["native"]["exit"] == 0 and found["python"]["exit"] == 0:
        found["native_vs_recorded"] = heuristic_warm.against_recorded(native)
        found["python_vs_recorded"] = heuristic_warm.against_recorded(python)
        found["native_vs_python"] = map_speed.rerun_agreement(python, native)
        if keep is not None:
            from cublas_audit.table.validation import read_table

            keep.mkdir(parents=True, exist_ok=True)
            read_table(native).to_parquet(keep / "native.parquet", compression="zstd")
            shutil.copy(native / rundir.ENV_FILE, keep / "native.env.json")
    return found


def grid_leg(maps: Path) -> dict[str, Any]:
    found = heuristic_warm.mapped(maps / "grid-native", [], warm=True, native=True)
    found["target_map_s"] = heuristic_warm.TARGET_GRID_S
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--maps", type=Path, default=Path("/tmp/native"))
    parser.add_argument("--legs", default="sample,grid")
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args(argv)
    found: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    args.maps.mkdir(parents=True, exist_ok=True)
    for leg in [name.strip() for name in args.legs.split(",") if name.strip()]:
        found[leg] = sample_leg(args.maps, args.keep) if leg == "sample" else grid_leg(args.maps)
        args.json.write_text(json.dumps(found, indent=2, default=str) + "\n")
        print(leg, json.dumps(found[leg], default=str)[:3000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
