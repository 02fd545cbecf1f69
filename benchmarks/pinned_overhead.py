"""Host time per call of PinnedGemm against torch.mm, and both against their kernels (GPU).

    python3 benchmarks/pinned_overhead.py [--out [FILE]] [--calls 200] [--rounds 7]

Target (issue "apply without TunableOp"): a PinnedGemm call costs at most 10 us of host time, so
that eager pins of ~20-90 us kernels keep their gain (nvmath's Matmul.execute cost 76-114 us a
call on this H100, DESIGN.md). The problems are the two pins DESIGN.md records on the H100
(cuBLAS 13.1), run as torch.mm would, Y (M x N) = X (M x K) @ W (K x N) (cuBLAS nn, m = N,
n = M): fp32 2496x128x1600 (algo 20, tile 128x64, stages 8x5, split-K 2 INPLACE) and bf16
7744x448x1664 (algo 66, tile 24, stages 35, custom 7, cluster 5: cuBLASLt's numbers), each pinned,
on cuBLASLt's heuristic default through the same descriptors, and through torch.mm, on the same
tensors. For each:

- host_us: perf_counter around an eager loop of --calls calls with no synchronisation inside
  (the launch queue, about a thousand launches, never fills at 200 calls, so the loop times the
  host's work alone), per call, the median over --rounds; `launch_only` is LtGemm.launch with
  the pointers fixed, no checks: what PinnedGemm's checks add;
- kernel_ms: the median CUPTI kernel time per call (device.kernel_trace.trace_calls), and the
  kernels each contender ran;
- eager_ms: CUDA events around --calls back-to-back calls, per call: what a loop costs on the
  GPU's clock (the larger of the host's and the kernel's time, in the steady state);
- graph_ms, graph_host_us: the same --calls calls captured in one torch.cuda.graph, replayed:
  events per call, and the host time of one replay per call.

Prints one JSON line per problem, then the whole result; `--out` writes it (default
benchmarks/results/pinned_overhead_h100.json).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES  # noqa: E402
from cublas_audit.table.fix_file import Pin  # noqa: E402

TARGET_HOST_US = 10.0
DEFAULT_OUT = REPO / "benchmarks" / "results" / "pinned_overhead_h100.json"


@dataclass(frozen=True)
class Bench:
    name: str
    dtype: str
    m: int  # row-major M: cuBLAS's n
    k: int
    n: int  # row-major N: cuBLAS's m
    pin: Pin


PROBLEMS = [
    Bench("fp32 2496x128x1600 nn", "float32", 128, 1600, 2496,
          Pin(20, "128x64", "8x5", 2, "INPLACE", 0, 0, 0, "AUTO", 0)),
    Bench("bf16 7744x448x1664 nn", "bfloat16", 448, 1664, 7744,
          Pin(66, "24", "35", 1, "0", 0, 7, 0, "5", 0)),
]  # fmt: skip


def measure(bench: Bench, calls: int, rounds: int) -> dict[str, Any]:
    import torch

    from cublas_audit.device.pinned import PinnedGemm

    kind = getattr(torch, bench.dtype)
    x = torch.randn(bench.m, bench.k, device="cuda").to(kind)
    w = torch.randn(bench.k, bench.n, device="cuda").to(kind)
    y = torch.empty(bench.m, bench.n, device="cuda", dtype=kind)
    pinned = PinnedGemm.for_matmul(x, w, bench.pin, workspace_bytes=DEFAULT_WORKSPACE_BYTES)
    default = PinnedGemm.for_matmul(x, w, workspace_bytes=DEFAULT_WORKSPACE_BYTES)
    contenders: dict[str, Callable[[], Any]] = {
        "pinned": lambda: pinned(x, w, out=y),
        "default": lambda: default(x, w, out=y),
        "torch.mm": lambda: torch.mm(x, w, out=y),
    }
    errors = {name: relative_error(launch, y, x, w) for name, launch in contenders.items()}
    stream = torch.cuda.current_stream().cuda_stream
    algo_ptr = int(pinned.algorithm.algo.ctypes.data)
    launch_only = functools.partial(
        pinned.gemm.launch, algo_ptr, w.data_ptr(), x.data_ptr(), y.data_ptr(), y.data_ptr(),
        stream,
    )  # fmt: skip
    host = {name: host_us(launch, calls, rounds) for name, launch in contenders.items()}
    host["launch_only"] = host_us(launch_only, calls, rounds)
    kernels = kernel_times(contenders, calls)
    eager = {name: events_ms(launch, calls, rounds) for name, launch in contenders.items()}
    graphs = {name: graph_times(contenders[name], calls, rounds) for name in ("pinned", "torch.mm")}
    pinned.close()
    default.close()
    return {
        "problem": bench.name,
        "pin": pinned.pin.words() if pinned.pin else "",
        "pin_workspace_bytes": pinned.algorithm.workspace_bytes,
        "default_algorithm": default.algorithm.attributes(),
        "rel_err_vs_float64": {name: round(err, 8) for name, err in errors.items()},
        "calls": calls,
        "rounds": rounds,
        "host_us": {name: round(us, 2) for name, us in host.items()},
        "checks_us": round(host["pinned"] - host["launch_only"], 2),
        "kernel": kernels,
        "eager_ms": {name: round(ms, 5) for name, ms in eager.items()},
        "graph_ms": {name: round(ms, 5) for name, (ms, _) in graphs.items()},
        "graph_host_us": {name: round(us, 2) for name, (_, us) in graphs.items()},
        "pinned_host_within_target": host["pinned"] <= TARGET_HOST_US,
    }


def relative_error(launch: Callable[[], Any], y: Any, x: Any, w: Any) -> float:
    """One checked call: the output poisoned first, then ||Y - X W||_F / ||X W||_F in float64."""
    import torch

    y.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    exact = x.double() @ w.double()
    return float((y.double() - exact).norm() / exact.norm())


def host_us(launch: Callable[[], Any], calls: int, rounds: int) -> float:
    """Host time per call of an eager loop, median over rounds (each round starts idle)."""
    import torch

    samples = []
    gc.disable()  # a collection inside a loop is no cost of the call
    try:
        for _ in range(rounds):
            torch.cuda.synchronize()
            start = time.perf_counter_ns()
            for _ in range(calls):
                launch()
            took = time.perf_counter_ns() - start
            torch.cuda.synchronize()
            samples.append(took / calls / 1e3)
    finally:
        gc.enable()
    return statistics.median(samples)


def events_ms(launch: Callable[[], Any], calls: int, rounds: int) -> float:
    """GPU time per call of `calls` back-to-back calls, median over rounds."""
    import torch

    samples = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            launch()
        stop.record()
        stop.synchronize()
        samples.append(float(start.elapsed_time(stop)) / calls)
    return statistics.median(samples)


def graph_times(launch: Callable[[], Any], calls: int, rounds: int) -> tuple[float, float]:
    """`calls` calls captured in one CUDA graph: (GPU ms per call, host us per call of a
    replay), medians over rounds."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch asks
        launch()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            launch()
    graph.replay()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter_ns()
        graph.replay()
        host.append((time.perf_counter_ns() - began) / calls / 1e3)
        stop.record()
        stop.synchronize()
        gpu.append(float(start.elapsed_time(stop)) / calls)
    return statistics.median(gpu), statistics.median(host)


def kernel_times(contenders: dict[str, Callable[[], Any]], reps: int) -> dict[str, Any]:
    """Median kernel-only time per call (CUPTI) and the kernels of the first traced call; the
    reason where CUPTI cannot trace here."""
    from cublas_audit.device import kernel_trace

    why = kernel_trace.available()
    if why is not None:
        return {"unavailable": why}
    traced = kernel_trace.trace_calls(contenders, reps)
    return {
        name: {
            "ms": round(calls.timing().median_ms, 5),
            "kernels": calls.launch_columns().get("traced_kernels", ""),
        }
        for name, calls in traced.items()
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, nargs="?", const=DEFAULT_OUT)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    import torch

    rows = []
    for bench in PROBLEMS:
        row = measure(bench, args.calls, args.rounds)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "target_host_us": TARGET_HOST_US,
        "rows": rows,
        "worst_pinned_host_us": max(r["host_us"]["pinned"] for r in rows),
        "within_target": all(r["pinned_host_within_target"] for r in rows),
    }
    text = json.dumps(result, indent=2) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
