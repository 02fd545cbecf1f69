"""Joining a new local Ray beside the driver's planning, two ways (issue 40 item 4), no GPU:

    python benchmarks/ray_join.py [--rounds 3] [--work 2.0] [--json OUT]

Each leg runs in a fresh process: run.ray_connect.connect_soon("auto") at its start, then a
CPU-bound, allocating pure-Python load standing in for the command line's planning (a fixed
amount of work, measured alone first at about --work seconds), then connect (what the driver
waits for), then release and the wait for it (what the exit waits for):

    head    the local head in a process of its own (run.ray_head: `ray start --head --block`),
            joined by its address once it printed it: what `--ray auto` does now
    thread  ray.init(address=None, num_cpus=...) in the joining thread, beside the planning: what
            it did before (run.ray_connect with no head of its own)

Both legs use a Ray temp folder of their own (RAY_TMPDIR), so that a cluster address another
`ray start` left in /tmp/ray is not joined by the thread leg. Printed per round: the planning's
seconds beside the join, connect_s (joining Ray, from its start), connect_waited_s (the driver's
wait after its planning), head_ready_s (the head's ready line), ready_s (from the start until
both the planning and Ray were done), stop_s (release until Ray was left and the head stopped),
and whether any process of the head was left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def planning(units: int) -> float:
    """`units` rounds of building and dropping small records (what planning does in Python)."""
    began = time.perf_counter()
    for unit in range(units):
        rows: list[dict[str, Any]] = [
            {"m": i, "n": unit, "k": i * unit, "shape": (i, unit)} for i in range(2_000)
        ]
        sum(row["k"] for row in rows)
    return time.perf_counter() - began


def calibrate(seconds: float) -> int:
    probe = 20
    return max(1, round(probe * seconds / planning(probe)))


def leg(way: str, units: int) -> dict[str, Any]:
    """One join beside the planning, in this (fresh) process."""
    sys.path.insert(0, str(REPO))
    from cublas_audit.run import ray_connect

    if way == "thread":
        ray_connect._local_head = lambda address: None
    began = time.time()
    ray_connect.connect_soon("auto")
    joining = ray_connect._joining
    assert joining is not None
    head = joining.head
    planned = planning(units)
    ray = ray_connect.connect("auto")
    ready = time.time() - began
    assert ray.cluster_resources().get("CPU")
    record = ray_connect.clock_record()
    stopping = time.time()
    ray_connect.release()
    for thread in threading.enumerate():
        if thread.name == "cublas-audit ray.shutdown":
            thread.join(ray_connect.STOPPING_S)
    stopped = time.time() - stopping
    left = bool(head is not None and (head.process.poll() is None or head.folder.exists()))
    return {
        "way": way,
        "planning_s": round(planned, 2),
        **{key: record.get(key) for key in ray_connect.CLOCK_KEYS},
        "ready_s": round(ready, 2),
        "stop_s": round(stopped, 2),
        "head_left": left,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=float, default=2.0, help="the planning's seconds alone")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--leg", choices=["head", "thread"], help=argparse.SUPPRESS)
    parser.add_argument("--units", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.leg:  # (a leg's own process)
        print(json.dumps(leg(args.leg, args.units)), flush=True)
        return 0
    units = calibrate(args.work)
    alone = min(planning(units) for _ in range(2))
    print(f"planning alone: {alone:.2f} s ({units} units)", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ray-join-") as ray_tmp:
        env = {**os.environ, "RAY_TMPDIR": ray_tmp}
        for _ in range(args.rounds):
            for way in ("head", "thread"):
                command = [sys.executable, __file__, "--leg", way, "--units", str(units)]
                began = time.time()
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                result = json.loads(done.stdout.strip().splitlines()[-1])
                result["process_s"] = round(time.time() - began, 2)
                print(json.dumps(result), flush=True)
                results.append(result)
    summary = {"planning_alone_s": round(alone, 2), "cores": os.cpu_count(), "rounds": results}
    for way in ("head", "thread"):
        ready = sorted(r["ready_s"] for r in results if r["way"] == way)
        summary[f"{way}_ready_s_median"] = ready[len(ready) // 2]
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
