"""Four GPUs of one host against one: the BF16 full grid end to end (issue 40 items 4 and 5).

    python benchmarks/fleet_scaling.py JSON [--legs quarter,all,ray,one] [--maps DIR]
        [--axis 64:4096:64] [--modes bf16] [--gpu-label h100]

Each leg is one `cublas-audit map` process over the grid (M, N, K on --axis), timed from its
start to its exit (plan, shards, merge, judging, report), into --maps/<leg>:

    quarter  `--shard 1/4` on one GPU (CUDA_VISIBLE_DEVICES=0): what a fleet of four should take
    all      `--devices all`: a shard a GPU, each in a process of its own (run.shard_processes)
    ray      `--ray auto`: a local Ray instance, one num_gpus=1 task a GPU
    one      the whole grid on one GPU

Targets: `--devices all` and `--ray auto` within 1.25x the quarter shard's wall time. The JSON
(updated leg by leg, so that legs run in several device calls add up) holds quarter_shard_wall_s,
devices_all_wall_s, ray_wall_s, bf16_full_grid_one_gpu_s, after_gpu_s (the devices-all run's wall
time outside its shards: start-up, merge, judging, report), run_dir_mb (the devices-all run
directory), each leg's shards' map seconds, setup seconds (before each probe: checks, the
machine's survey, plan.json, env.json, the roofline) and engine seconds (device.map_engine:
queueing, waiting, CUPTI flush, reading), the quarter's and devices-all leg's
`after_gpu_seconds` (env.json's: merge, judge, fold_wait, report_load, report), the
devices-all leg's `shard_timeline_s` (env.json's: from the shards' start, when each shard's
process began and said it was done, when all had exited and every table was read), the ray leg's
`ray_timings` (env.json's: each phase of the Ray run timed apart, run.ray_fleet), and `bounds`:
where a target is missed, what the measurements say bounds it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cublas_audit.table import rundir  # noqa: E402

TARGET_RATIO = 1.25
LEGS = {
    "quarter": (["--shard", "1/4"], {"CUDA_VISIBLE_DEVICES": "0"}),
    "all": (["--devices", "all"], {}),
    "ray": (["--ray", "auto"], {}),
    "one": ([], {"CUDA_VISIBLE_DEVICES": "0"}),
}
KEYS = {
    "quarter": "quarter_shard_wall_s",
    "all": "devices_all_wall_s",
    "ray": "ray_wall_s",
    "one": "bf16_full_grid_one_gpu_s",
}


def shard_dirs(run_dir: Path) -> list[Path]:
    """A run's shard run directories (--devices: shards/gpuN, --ray: shards/shard-I), or the run."""
    found = sorted(p for p in (run_dir / "shards").glob("*") if (p / rundir.PLAN_FILE).exists())
    return found or [run_dir]


def engine_seconds(run_dir: Path) -> dict[str, float]:
    """The map engine's record of where a shard's time went (timing.jsonl's engine events)."""
    spent: dict[str, float] = {}
    for record in rundir.records(run_dir / rundir.TIME_RESULTS):
        if record.get("event") == "engine":
            for name, seconds in (record.get("seconds") or {}).items():
                spent[name] = round(spent.get(name, 0.0) + float(seconds), 2)
    return spent


def run_leg(leg: str, maps: Path, axis: str, modes: str, label: str) -> dict[str, Any]:
    extra, env = LEGS[leg]
    out = maps / leg
    command = [sys.executable, "-m", "cublas_audit", "map", "--m", axis, "--n", axis, "--k", axis]
    command += ["--modes", modes, "--gpu-label", label, "--out", str(out), *extra]
    began = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
    wall = time.perf_counter() - began
    (maps / f"{leg}.log").write_text(done.stdout + done.stderr)
    env_json = rundir.read_env(out) if (out / rundir.ENV_FILE).exists() else {}
    shards = shard_dirs(out)
    found: dict[str, Any] = {
        "command": command[2:],
        "exit": done.returncode,
        "wall_s": round(wall, 1),
        "sweep_seconds": env_json.get("sweep_seconds"),
        "shard_seconds": {p.name: rundir.read_env(p).get("sweep_seconds") for p in shards},
        # each shard's time before its probe (checks, the machine's survey, plan.json, env.json,
        # the roofline's measurement), which its sweep_seconds leaves out
        "setup_seconds": {p.name: rundir.read_env(p).get("setup_seconds") for p in shards},
        "engine_seconds": {p.name: engine_seconds(p) for p in shards},
        "run_dir_mb": round(sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6, 1),
    }
    if env_json.get("ray_timings"):  # (a --ray run's phases, timed apart: run.ray_fleet)
        found["ray_timings"] = env_json["ray_timings"]
    if env_json.get("after_gpu_seconds"):  # (merge, judging, folds, report: jobs.measure)
        found["after_gpu_seconds"] = env_json["after_gpu_seconds"]
    if env_json.get("shard_timeline_s"):  # (--devices: each shard process's first and last
        # word, all exited, every table read; seconds from the shards' start: run.multi_gpu)
        found["shard_timeline_s"] = env_json["shard_timeline_s"]
    return found


def engine_total(seconds: dict[str, float]) -> float:
    return round(sum(v for k, v in seconds.items() if k != "alone"), 1)


def figures(found: dict[str, Any]) -> dict[str, Any]:
    """The issue's keys and the bounds of any target missed, from the legs measured so far."""
    legs = found["legs"]
    for leg, key in KEYS.items():
        if leg in legs and legs[leg]["exit"] == 0:
            found[key] = legs[leg]["wall_s"]
    bounds: dict[str, str] = {}
    quarter = legs.get("quarter")
    if "all" in legs and legs["all"]["exit"] == 0:
        every = legs["all"]
        found["after_gpu_s"] = round(every["wall_s"] - float(every["sweep_seconds"] or 0), 1)
        found["run_dir_mb"] = every["run_dir_mb"]
    for leg in ("all", "ray"):
        if leg not in legs or quarter is None or legs[leg]["exit"] or quarter["exit"]:
            continue
        ratio = legs[leg]["wall_s"] / quarter["wall_s"]
        found[f"{leg}_over_quarter"] = round(ratio, 3)
        if ratio > TARGET_RATIO:
            every = legs.get("all")
            done = every if every is not None and every["exit"] == 0 else None
            bounds[leg] = _bound(leg, ratio, legs[leg], quarter, done)
    found["bounds"] = bounds
    return found


def _bound(
    leg: str,
    ratio: float,
    fleet: dict[str, Any],
    quarter: dict[str, Any],
    devices: dict[str, Any] | None = None,
) -> str:
    """What the legs' records say a missed target is made of: the slowest shard against the
    quarter alone (its engine's share and the rest), and the time outside the shards."""
    shards = {name: s for name, s in fleet["shard_seconds"].items() if s}
    slowest = max(shards, key=lambda name: shards[name])
    engine = engine_total(fleet["engine_seconds"][slowest])
    alone = quarter["sweep_seconds"]
    alone_engine = engine_total(quarter["engine_seconds"]["quarter"])
    outside = fleet["wall_s"] - shards[slowest]
    text = (
        f"{ratio:.2f}x the quarter shard (target {TARGET_RATIO}x). The slowest shard took "
        f"{shards[slowest]} s against {alone} s alone; its map engine {engine} s against "
        f"{alone_engine} s alone, so {shards[slowest] - engine:.0f} s of the shard (against "
        f"{alone - alone_engine:.0f} s alone) were its start-up and its table. {outside:.0f} s "
        "of the wall time went outside the shards (start-up, "
        + ("gathering the shards, " if leg == "ray" else "")
        + "merge, judging, report)."
    )
    if shards[slowest] - engine > 1.5 * (alone - alone_engine):
        text += (
            " The shards' host work outside their probes took over 1.5x the quarter's: the "
            "shards slow each other on the host."
        )
    if leg == "ray" and devices is not None:
        # the same merge, judging and report follow both: what is more is Ray's own
        beside = devices["wall_s"] - max(s for s in devices["shard_seconds"].values() if s)
        text += (
            f" Against {beside:.0f} s outside the shards under --devices all (the same merge, "
            f"judging and report), {outside - beside:.0f} s more are Ray's own."
        )
    if leg == "ray" and fleet.get("ray_timings"):
        text += " " + ray_phases(fleet["ray_timings"], fleet["wall_s"])
    return text


def ray_phases(timings: dict[str, Any], wall: float) -> str:
    """Where a Ray run's wall time went, from its env.json's ray_timings (seconds from the start
    of joining Ray; the command's start-up before it and its exit after the report are the rest
    of the wall time)."""
    shards = timings.get("shards") or {}
    started = [t["started_at_s"] for t in shards.values() if t.get("started_at_s") is not None]
    returned = [t["returned_at_s"] for t in shards.values()]
    steps = {
        name: max((float(t.get(name) or 0) for t in shards.values()), default=0.0)
        for name in ("sweep_s", "fold_s", "pack_s", "unpack_s")
    }
    done = float(timings.get("reported_at_s") or 0)
    # a local head of the run's own (run.ray_head): its ready line, what bounds the join
    ready = timings.get("head_ready_s")
    head = f"the local head up at {ready} s, " if ready is not None else ""
    return (
        f"Timed apart (ray_timings, from the start of joining Ray): {head}joining Ray "
        f"{timings.get('connect_s')} s, of which the driver waited "
        f"{timings.get('connect_waited_s')} s; tasks submitted at "
        f"{timings.get('submitted_at_s')} s, started at "
        f"{min(started, default=0):.1f}-{max(started, default=0):.1f} s; the slowest shard's "
        f"sweep {steps['sweep_s']:.1f} s, fold {steps['fold_s']:.1f} s, pack "
        f"{steps['pack_s']:.1f} s, unpack {steps['unpack_s']:.1f} s; back at "
        f"{min(returned, default=0):.1f}-{max(returned, default=0):.1f} s; reading the shards "
        f"{timings.get('read_shards_s')} s, merge {timings.get('merge_s')} s, judging "
        f"{timings.get('judge_s')} s, report {timings.get('report_s')} s, done at {done:.1f} s; "
        f"{wall - done:.1f} s of the wall time before joining Ray began and after the report "
        "(the command's start-up and its exit, Ray's shutdown included)."
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--legs", default="quarter,all,ray", help="'' recomputes the figures")
    parser.add_argument("--maps", type=Path, default=Path("/tmp/fleet"))
    parser.add_argument("--axis", default="64:4096:64")
    parser.add_argument("--modes", default="bf16")
    parser.add_argument("--gpu-label", default="h100")
    args = parser.parse_args(argv)
    found: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    found.setdefault("legs", {})
    args.maps.mkdir(parents=True, exist_ok=True)
    for leg in [name.strip() for name in args.legs.split(",") if name.strip()]:
        found["legs"][leg] = run_leg(leg, args.maps, args.axis, args.modes, args.gpu_label)
        print(leg, json.dumps(found["legs"][leg]), flush=True)
        args.json.write_text(json.dumps(figures(found), indent=2) + "\n")
    if not args.legs.strip():  # the figures again from the legs recorded (no GPU)
        args.json.write_text(json.dumps(figures(found), indent=2) + "\n")
    print(json.dumps({k: v for k, v in found.items() if k != "legs"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
