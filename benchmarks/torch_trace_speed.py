"""`cublas-audit shapes --torch-trace` on a 100 MB trace: wall time and peak memory (CPU).

    python benchmarks/torch_trace_speed.py [--mb 100] [--json FILE]

The trace is the real one recorded on the H100 (tests/fixtures/torch_traces/block.json.gz: a
transformer block, 3 steps), tiled until it reaches --mb megabytes: each copy's timestamps move
past the previous copy and its correlation and external ids are offset, so every copy is distinct
and its kernels still belong to its own ops. The reading and the problem table run in a fresh
process, whose peak resident memory (ru_maxrss) is reported beside the wall time.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests/fixtures/torch_traces/block.json.gz"
LIMIT_S, LIMIT_GB = 15.0, 1.5


def tiled(megabytes: float) -> dict[str, Any]:
    base = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = base["traceEvents"]
    span = max(float(e.get("ts", 0)) + float(e.get("dur", 0)) for e in events) - min(
        float(e.get("ts", 0)) for e in events if "ts" in e
    )
    one_copy = len(json.dumps(events))
    copies = max(1, int(megabytes * 1e6 / one_copy))
    out = []
    for index in range(copies):
        for event in events:
            moved = copy.deepcopy(event) if index else event
            if "ts" in moved:
                moved["ts"] = float(moved["ts"]) + index * (span + 1000.0)
            args = moved.get("args")
            if isinstance(args, dict) and index:
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += index * 10_000_000
            out.append(moved)
    return {**{k: v for k, v in base.items() if k != "traceEvents"}, "traceEvents": out}


def measure(path: Path) -> dict[str, float]:
    """In this process (started fresh by main): seconds and peak memory of shapes' work."""
    from cublas_audit.torch_trace import problems, read_trace

    start = time.perf_counter()
    table = problems(read_trace(path))
    seconds = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
    return {"seconds": round(seconds, 2), "peak_gb": round(peak_gb, 3), "problems": len(table),
            "calls": int(table["calls"].sum())}  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        path.write_text(json.dumps(tiled(args.mb)))
        size_mb = path.stat().st_size / 1e6
        done = subprocess.run(
            [sys.executable, __file__, "--measure", str(path)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
    figures = {"trace_mb": round(size_mb, 1), **json.loads(done.stdout.strip().splitlines()[-1])}
    figures.update(limit_s=LIMIT_S, limit_gb=LIMIT_GB, source=str(SOURCE.relative_to(ROOT)))
    print(f"shapes --torch-trace on {figures['trace_mb']} MB: {figures['seconds']} s "
          f"(limit {LIMIT_S} s), peak {figures['peak_gb']} GB (limit {LIMIT_GB} GB), "
          f"{figures['problems']} problems, {figures['calls']} calls")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
