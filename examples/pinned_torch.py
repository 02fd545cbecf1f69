"""A PyTorch program's GEMM before and after a fix, through `PinnedGemm` (no TunableOp needed):

    python examples/pinned_torch.py FIXFILE [--out RESULT.json] [--calls 200]

For every pin of FIXFILE whose problem PyTorch issues as `torch.mm` (cuBLAS nn) or `F.linear`
(cuBLAS tn), batch 1, it builds the row-major tensors of that call and runs, each under
torch.profiler: the unchanged torch call; the pinned GEMM called eagerly; the pinned GEMM
captured once in a CUDA graph and replayed. It prints and writes, per problem, the kernels the
profiler saw with their mean device time, the host time per call, and the largest difference of
the pinned result from torch's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cublas_audit.device.pinned import PinnedGemm
from cublas_audit.table.fix_file import Fix, read_fix_file

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def tensors(fix: Fix) -> tuple[torch.Tensor, torch.Tensor, Callable[..., torch.Tensor]]:
    """x and w of the row-major call cuBLAS sees as the fix's problem, and that call."""
    p = fix.problem
    dtype = DTYPES[p.mode]
    torch.manual_seed(0)
    x = torch.randn(p.n, p.k, device="cuda", dtype=dtype)
    if p.layout == "nn":  # Y (n x m) = X (n x k) @ W (k x m)
        return x, torch.randn(p.k, p.m, device="cuda", dtype=dtype), torch.mm
    return x, torch.randn(p.m, p.k, device="cuda", dtype=dtype), F.linear  # tn: X @ W^T


def profiled(run: Callable[[], Any], calls: int) -> dict[str, Any]:
    """The kernels `calls` runs launched (name -> mean device ms per call) and host ms per call."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    kernels = {
        event.key: round(event.device_time_total / 1e3 / calls, 5)
        for event in prof.key_averages()
        if event.device_time_total > 0
    }
    start = time.perf_counter()
    for _ in range(calls):
        run()
    host = (time.perf_counter() - start) * 1e3 / calls  # enqueue time: the host's share
    torch.cuda.synchronize()
    return {"kernels": kernels, "kernel_ms": round(sum(kernels.values()), 5), "host_ms": host}


def before_after(fix: Fix, calls: int) -> dict[str, Any]:
    x, w, torch_call = tensors(fix)
    build = PinnedGemm.for_matmul if torch_call is torch.mm else PinnedGemm.for_linear
    pinned = build(x, w, fix.pin)
    expected = torch_call(x, w)
    out = torch.empty_like(expected)
    pinned(x, w, out=out)
    torch.cuda.synchronize()
    difference = float((out.float() - expected.float()).abs().max())
    scale = float(expected.float().abs().max())
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        pinned(x, w, out=out)  # warm-up on the capture stream, as torch.cuda.graph asks
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        pinned(x, w, out=out)
    result = {
        "fix": fix.id,
        "problem": fix.problem.name,
        "torch_call": "torch.mm" if torch_call is torch.mm else "F.linear",
        "pin": fix.pin.words() if fix.pin else "",
        "max_abs_difference": difference,
        "max_abs_value": scale,
        "torch": profiled(lambda: torch_call(x, w), calls),
        "pinned_eager": profiled(lambda: pinned(x, w, out=out), calls),
        "pinned_graph": profiled(graph.replay, calls),
    }
    pinned.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fix_file", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    fixes = read_fix_file(args.fix_file)
    runnable = [
        f
        for f in fixes.pins()
        if f.problem.layout in ("nn", "tn")
        and not f.problem.batched
        and f.problem.mode in DTYPES
        and not f.problem.bias
        and not f.problem.beta
    ]
    if not runnable:
        sys.exit(f"{args.fix_file}: no pin of a torch.mm / F.linear problem")
    results = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "proven_on": fixes.stamp.words(),
        "problems": [before_after(fix, args.calls) for fix in runnable],
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
