"""`problems(read_trace(...))` on a ~100 MB PyTorch trace: wall time and peak memory (CPU).

    python benchmarks/torch_trace_speed.py [--mb 100] [--json FILE]

Targets: at most 15 s and 1.5 GB on the 2-core CPU machine. The trace is the real one recorded on
the H100 (tests/fixtures/torch_traces/block.json.gz: a bf16 transformer block, 3 steps) tiled
until the file reaches --mb megabytes: copy i moves every timestamp past copy i-1 and offsets
every correlation id, External id and flow id by i * 10,000,000, so each copy is distinct and its
kernels still belong to its own ops. The reading and the table run in a fresh child process whose
peak resident memory (ru_maxrss, interpreter and pandas included) is reported beside the wall
time; the child also checks that every copy's GEMM calls and GPU time were found, no more.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "tests" / "fixtures" / "torch_traces" / "block.json.gz"
RESULT = REPO / "benchmarks" / "results" / "torch_trace_speed_cpu.json"
LIMIT_S, LIMIT_GB = 15.0, 1.5
ID_STEP = 10_000_000


def shifted(event: dict[str, Any], copy: int, span: float) -> dict[str, Any]:
    """Event `event` of copy number `copy`: later by copy * span, its ids offset."""
    if copy == 0:
        return event
    moved = dict(event)
    if isinstance(moved.get("ts"), int | float):
        moved["ts"] = round(moved["ts"] + copy * span, 3)
    if moved.get("ph") in ("s", "f") and isinstance(moved.get("id"), int):
        moved["id"] += copy * ID_STEP  # flow arrows from a launch to its kernel
    args = moved.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += copy * ID_STEP
        moved["args"] = args
    return moved


def write_tiled(path: Path, megabytes: float) -> dict[str, Any]:
    """Writes the tiled trace; returns how it was made."""
    base = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = base.pop("traceEvents")
    metadata = [e for e in events if e.get("ph") == "M"]  # process and thread names: once
    timed = [e for e in events if e.get("ph") != "M"]
    times = [(float(e["ts"]), float(e.get("dur", 0))) for e in timed if "ts" in e]
    span = max(t + d for t, d in times) - min(t for t, _ in times) + 1000.0
    one_copy = len(json.dumps(timed)) + len(timed) * 2
    copies = max(1, round(megabytes * 1e6 / one_copy))
    with path.open("w") as out:
        out.write(json.dumps(base)[:-1] + ', "traceEvents": [\n')
        out.write(",\n".join(json.dumps(e) for e in metadata))
        for copy in range(copies):
            out.write(",\n" + ",\n".join(json.dumps(shifted(e, copy, span)) for e in timed))
        out.write("\n]}\n")
    return {"copies": copies, "events": len(metadata) + copies * len(timed)}


def measure(path: Path, copies: int) -> dict[str, Any]:
    """In the child: the timed work, its peak memory, and a check of what it found."""
    from cublas_audit.observe.torch_trace import problems, read_trace

    start = time.perf_counter()
    table = problems(read_trace(path))
    seconds = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # KiB on Linux
    one = problems(read_trace(SOURCE))
    calls, gpu_ms = int(table["calls"].sum()), float(table["total_gpu_ms"].sum())
    if calls != copies * int(one["calls"].sum()) or len(table) != len(one):
        raise SystemExit(f"tiled trace: {calls} calls in {len(table)} problems, expected "
                         f"{copies} x {int(one['calls'].sum())} in {len(one)}")  # fmt: skip
    if abs(gpu_ms - copies * float(one["total_gpu_ms"].sum())) > 1e-6 * gpu_ms:
        raise SystemExit(f"tiled trace: {gpu_ms} ms of GEMM kernels, not {copies} copies' worth")
    return {"seconds": round(seconds, 2), "peak_gb": round(peak_gb, 3), "problems": len(table),
            "calls": calls, "gemm_gpu_ms": round(gpu_ms, 3)}  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="trace size, MB")
    parser.add_argument("--json", type=Path, default=RESULT, help="result file")
    parser.add_argument("--measure", nargs=2, metavar=("TRACE", "COPIES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(Path(args.measure[0]), int(args.measure[1]))))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        made = write_tiled(path, args.mb)
        size_mb = path.stat().st_size / 1e6
        child = [sys.executable, __file__, "--measure", str(path), str(made["copies"])]
        done = subprocess.run(child, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        print(done.stderr.strip() or done.stdout.strip(), file=sys.stderr)
        return 1
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    result = {
        "benchmark": "torch_trace_speed: problems(read_trace(...))",
        "trace_mb": round(size_mb, 1),
        **made,
        **figures,
        "limit_s": LIMIT_S,
        "limit_gb": LIMIT_GB,
        "within_limits": figures["seconds"] <= LIMIT_S and figures["peak_gb"] <= LIMIT_GB,
        "source": str(SOURCE.relative_to(REPO)),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": _cpus(),
        "python": platform.python_version(),
    }
    print(f"{result['trace_mb']} MB, {made['events']} events: {figures['seconds']} s "
          f"(limit {LIMIT_S} s), peak {figures['peak_gb']} GB (limit {LIMIT_GB} GB), "
          f"{figures['problems']} problems, {figures['calls']} calls")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["within_limits"] else 1


def _cpus() -> str:
    """'2 x <model name>' from /proc/cpuinfo where there is one."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return f"{os.cpu_count()} x {models[0]}" if models else str(os.cpu_count())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
