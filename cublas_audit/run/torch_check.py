"""`verify --torch`: the fix file's TunableOp rows run by an unchanged PyTorch program.

Each carried pin's problem is issued as PyTorch issues it (cuBLAS nn: `torch.mm(x, w)`, with a
bias `torch.addmm(b, x, w)`; tn: `F.linear(x, w)` and `F.linear(x, w, b)`: the calls a model
makes), in child processes that alternate ROUNDS times: one with the environment `fix` wrote
beside the file (TunableOp on, no tuning, its workspace), one without it; each times a block of
CALLS calls per fix, L2 flushed before every call as in the model (device.l2; `--warm` leaves
it). Per side: the kernels torch.profiler saw, their time per call in
each round, and the result against a float64 product into a NaN-filled output, so that a pin
TunableOp skipped is seen. judge.framework decides what that means.

TunableOp tunes cuBLASLt on CUDA from torch 2.14 on; an older torch, or none, is one line saying
the check was skipped. The child process is this module run as a script.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from cublas_audit.judge.framework import FrameworkChecked, FrameworkRun, judge_framework
from cublas_audit.table.fix_file import Fix, FixSet

FIRST_TUNABLE_CUBLASLT = (2, 14)
TORCH_CALLS = {"nn": "torch.mm", "tn": "F.linear"}
BIAS_CALLS = {"nn": "torch.addmm", "tn": "F.linear with bias"}
CALLS = 50
ROUNDS = 2


def torch_call(fix: Fix) -> str:
    """The PyTorch call that issues the fix's problem as cuBLAS sees it."""
    p = fix.problem
    return (BIAS_CALLS if p.bias else TORCH_CALLS)[p.layout]


def skip_reason(torch_version: str | None, file_version: str) -> str:
    """'' where this torch can run the file's pins through TunableOp, else why not (one line)."""
    if torch_version is None:
        return "torch is not installed here"
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", torch_version)
    if not found:
        return f"torch {torch_version!r} has no version TunableOp could match"
    if (int(found[1]), int(found[2])) < FIRST_TUNABLE_CUBLASLT:
        return f"torch {torch_version} predates TunableOp's cuBLASLt support on CUDA (torch 2.14)"
    if ".".join(found.groups()) != file_version:
        return (
            f"the TunableOp file is for torch {file_version}, TunableOp refuses it under "
            f"{torch_version} (write it with `fix --torch-version {'.'.join(found.groups())}`)"
        )
    return ""


def installed_torch() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def runnable(fix: Fix) -> bool:
    """A pin whose problem one torch call issues as is: nn (torch.mm, torch.addmm with a bias)
    or tn (F.linear, with or without its bias), one matrix, packed, beta 0."""
    p = fix.problem
    packed = (p.lda, p.ldb) == ((p.m if p.transa == "n" else p.k), p.k)
    return (
        fix.pin is not None
        and p.layout in TORCH_CALLS
        and not p.batched
        and not p.beta
        and p.layout_known
        and packed
    )


def check(
    fixes: FixSet,
    fix_file: Path,
    environment: dict[str, str],
    threshold: float,
    *,
    cold: bool = True,
) -> list[FrameworkChecked]:
    """Each runnable pin through torch with and without the TunableOp file, judged. The sides
    alternate by process (with, without, with, without): TunableOp keeps the solution it found
    for a problem for the life of the process, whatever `torch.cuda.tunable.enable` says later
    (measured with torch 2.14.1 on the H100), so one process cannot time both."""
    chosen = [fix for fix in fixes.pins() if runnable(fix)]
    if not chosen:
        return []
    ids = [f.id for f in chosen]
    rounds = [
        (_child(fix_file, ids, environment, cold), _child(fix_file, ids, {}, cold))
        for _ in range(ROUNDS)
    ]
    return [
        judge_framework(fix, torch_call(fix), *_runs(fix.id, rounds), threshold) for fix in chosen
    ]


Found = dict[str, dict[str, Any]]


def _runs(fix_id: str, rounds: list[tuple[Found, Found]]) -> tuple[FrameworkRun, FrameworkRun]:
    """One fix's sides over the rounds, as (with the file, without it): the first round's kernels
    and result, every round's time."""

    def side(index: int) -> FrameworkRun:
        first = rounds[0][index][fix_id]
        return FrameworkRun(
            kernels=tuple(first["kernels"]),
            ms=tuple(float(found[index][fix_id]["ms"]) for found in rounds),
            error=first["error"],
            correct=bool(first["correct"]),
        )

    return side(0), side(1)


def _child(fix_file: Path, ids: list[str], extra: dict[str, str], cold: bool) -> Found:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_TUNABLEOP")}
    argv = [sys.executable, "-m", "cublas_audit.run.torch_check", str(fix_file), *ids]
    argv += [] if cold else ["--warm"]
    done = subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the torch check's process failed: {last}")
    found: Found = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _measure(fix: Fix, cold: bool) -> dict[str, Any]:  # pragma: no cover - on a GPU
    """One side of one fix, as this process's TunableOp setting runs it: the result into a
    NaN-filled output against float64, then CALLS calls under the profiler, each after an L2
    flush (`cold`), the block starting with the clocks free (device.clocks.cool_down)."""
    import torch

    from cublas_audit.device import clocks, l2

    p = fix.problem
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[p.mode]
    x = torch.randn(p.n, p.k, device="cuda", dtype=dtype)
    w = torch.randn(*((p.k, p.m) if p.layout == "nn" else (p.m, p.k)), device="cuda", dtype=dtype)
    b = torch.randn(p.m, device="cuda", dtype=dtype) if p.bias else None
    operand = w if p.layout == "nn" else w.t()  # F.linear(x, w[, b]) is addmm(b, x, w.t())
    out = torch.full((p.n, p.m), float("nan"), device="cuda", dtype=dtype)

    def call() -> None:  # into `out`: a call that computes nothing leaves its NaN
        if b is None:
            torch.mm(x, operand, out=out)
        else:
            torch.addmm(b, x, operand, out=out)

    call()
    exact = x.double() @ operand.double() + (b.double() if b is not None else 0.0)
    error = float((out.double() - exact).norm() / exact.norm())
    tolerance = 1e-4 if p.mode == "fp32" else 1e-2
    torch.cuda.synchronize()
    clocks.cool_down()
    kernels, ms = _block(call, l2.flush if cold else None)
    return {
        "kernels": kernels,
        "ms": ms,
        "error": error,
        "correct": bool(error == error and error <= tolerance),
    }


def _block(call: Any, flush: Any) -> tuple[list[str], float]:  # pragma: no cover - on a GPU
    """CALLS calls under torch.profiler: the GEMM kernels one call launched (the L2 flush's
    kernel left out) and their kernel time per call."""
    import torch

    from cublas_audit.device import l2

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            if flush is not None:
                flush()
            call()
        torch.cuda.synchronize()
    events = [
        e for e in prof.key_averages() if e.device_time_total > 0 and e.key != l2.FLUSH_KERNEL
    ]
    kernels = [e.key for e in events if e.count >= CALLS]  # a call's own, not one-off copies
    ms = sum(e.device_time_total for e in events) / 1e3 / CALLS
    return kernels, ms


def main() -> None:  # pragma: no cover - the child process
    from cublas_audit.table.fix_file import read_fix_file

    args = sys.argv[1:]
    cold = "--warm" not in args
    args = [a for a in args if a != "--warm"]
    fixes = read_fix_file(Path(args[0]))
    wanted = set(args[1:])
    results = {fix.id: _measure(fix, cold) for fix in fixes.fixes if fix.id in wanted}
    print(json.dumps(results))


if __name__ == "__main__":  # pragma: no cover
    main()
