"""cuBLAS's kernel choice made ahead (device.heuristic_warm): same kernels, and how much faster.

    python benchmarks/heuristic_warm.py JSON [--maps DIR] [--legs sample,grid] [--keep DIR]

    sample  the recorded 10,000-problem BF16 map (seed 1: tests/fixtures/h100-map-reruns/bf16-s1)
            mapped twice on this GPU, with the workers (`warm`) and without (`cold`,
            CUBLAS_AUDIT_WARM_THREADS=0): every problem's kernels against each other and against
            the recorded runs a and b, the diff gate both ways between warm and cold
            (benchmarks/map_speed.rerun_agreement), and each map's speed and engine record.
            --keep DIR writes the warm map's table as DIR/warm.parquet (+ env.json) for the CPU
            test that checks the agreement on recorded data.
    grid    the BF16 full grid (M, N, K in 64..4096 step 64: 262,144 problems) on one GPU,
            with the workers: map seconds (the target is 60 s on one H100) and where they went.

The JSON is updated leg by leg.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import map_speed  # noqa: E402

from cublas_audit.table import rundir  # noqa: E402

AXIS = "64:4096:64"
RECORDED = REPO / "tests" / "fixtures" / "h100-map-reruns" / "bf16-s1"
TARGET_GRID_S = 60.0


def mapped(
    out: Path,
    extra: list[str],
    warm: bool,
    native: bool = True,
    threads: int | None = None,
    mode: str = "bf16",
) -> dict[str, Any]:
    """One `cublas-audit map` over the axis cube, timed; its summary (map_speed) and warm record
    (`warm`: kernel choices made ahead, by `threads` workers where given; `native`: chunks queued
    by the C thread)."""
    env = dict(os.environ)
    if not warm:
        env["CUBLAS_AUDIT_WARM_THREADS"] = "0"
    elif threads is not None:
        env["CUBLAS_AUDIT_WARM_THREADS"] = str(threads)
    if not native:
        env["CUBLAS_AUDIT_NATIVE_QUEUE"] = "0"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "cublas_audit", "map", "--m", AXIS, "--n", AXIS, "--k", AXIS]
    command += [*extra, "--modes", mode, "--gpu-label", "h100", "--out", str(out)]
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = round(time.perf_counter() - began, 1)
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        return {"exit": done.returncode, "wall_s": wall, "tail": done.stderr[-2000:]}
    records = map_speed.records(out)
    engine = [r for r in records if r.get("event") == "engine"]
    warm_records = [r.get("warm") for r in engine]
    # when the engine began and ended in its probe's life: the phase's time outside the engine
    timelines = [r.get("timeline") for r in engine]
    found = map_speed.summarize(out)
    return {"exit": 0, "wall_s": wall, "warm": warm_records, "timeline": timelines, **found}


def kernels(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {r["case_id"]: r.get("traced_kernels") for r in records if r.get("event") == "done"}


def against_recorded(run: Path) -> dict[str, int]:
    """Problems whose traced kernels equal the recorded run a's and b's."""
    import pandas as pd

    mine = kernels(map_speed.records(run))
    found: dict[str, int] = {"problems": len(mine)}
    for side in ("a", "b"):
        table = pd.read_parquet(RECORDED / f"{side}.parquet", columns=["case_id", "traced_kernels"])
        theirs = dict(zip(table["case_id"], table["traced_kernels"], strict=True))
        found[f"same_as_{side}"] = sum(str(theirs.get(c)) == str(k) for c, k in mine.items())
    return found


def sample_leg(maps: Path, keep: Path | None) -> dict[str, Any]:
    return compared(maps, keep, ("warm", {"warm": True}), ("cold", {"warm": False}))


def compared(
    maps: Path,
    keep: Path | None,
    new: tuple[str, dict[str, Any]],
    old: tuple[str, dict[str, Any]],
) -> dict[str, Any]:
    """The recorded 10,000-problem sample mapped the `new` way and the `old` way (mapped's
    settings), back to back: each against the recorded runs and against each other; --keep
    writes the new way's table for the CPU tests."""
    extra = ["--sample", "10000", "--seed", "1"]
    (first, first_way), (second, second_way) = new, old
    runs = {name: maps / f"sample-{name}" for name in (first, second)}
    found = {
        first: mapped(runs[first], extra, **first_way),
        second: mapped(runs[second], extra, **second_way),
    }
    if found[first]["exit"] == 0 and found[second]["exit"] == 0:
        for name in (first, second):
            found[f"{name}_vs_recorded"] = against_recorded(runs[name])
        found[f"{first}_vs_{second}"] = map_speed.rerun_agreement(runs[second], runs[first])
        if keep is not None:
            from cublas_audit.table.validation import read_table

            keep.mkdir(parents=True, exist_ok=True)
            table = read_table(runs[first])
            table.to_parquet(keep / f"{first}.parquet", compression="zstd")
            shutil.copy(runs[first] / rundir.ENV_FILE, keep / f"{first}.env.json")
    return found


def grid_leg(maps: Path) -> dict[str, Any]:
    found = mapped(maps / "grid-warm", [], True)
    found["target_map_s"] = TARGET_GRID_S
    return found


def run_legs(
    argv: list[str],
    doc: str,
    legs: dict[str, Callable[[Path, Path | None], dict[str, Any]]],
    maps: Path,
) -> int:
    """The command line of this script and of native_queue.py: JSON [--maps] [--legs] [--keep],
    each leg's findings written into JSON as it ends."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--maps", type=Path, default=maps)
    parser.add_argument("--legs", default=",".join(legs))
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args(argv)
    found: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    args.maps.mkdir(parents=True, exist_ok=True)
    for leg in [name.strip() for name in args.legs.split(",") if name.strip()]:
        found[leg] = legs[leg](args.maps, args.keep)
        args.json.write_text(json.dumps(found, indent=2, default=str) + "\n")
        print(leg, json.dumps(found[leg], default=str)[:3000], flush=True)
    return 0


def main(argv: list[str]) -> int:
    legs = {"sample": sample_leg, "grid": lambda maps, keep: grid_leg(maps)}
    return run_legs(argv, __doc__ or "", legs, Path("/tmp/warm"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
