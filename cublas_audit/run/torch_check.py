"""`verify --torch`: the fix file's TunableOp rows run by an unchanged PyTorch program.

Each carried pin's problem is issued as PyTorch issues it (cuBLAS nn: `torch.mm(x, w)`; tn:
`F.linear(x, w)`), once in a process with TunableOp reading the file (the environment `fix`
wrote beside it) and once in a process without it. Per fix: the kernels torch.profiler saw, their
time per call, and the result against a float64 product, so that a pin TunableOp skipped (too
little workspace: the output left as it was, no error) is a wrong result, not a pass.

TunableOp tunes cuBLASLt on CUDA from torch 2.14 on; an older torch, or none, is one line saying
the check was skipped. The child processes are this module run as a script.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cublas_audit.table.fix_file import Fix, FixSet

FIRST_TUNABLE_CUBLASLT = (2, 14)
TORCH_CALLS = {"nn": "torch.mm", "tn": "F.linear (torch.mm of w.t())"}
CALLS = 50


@dataclass(frozen=True)
class TorchChecked:
    fix_id: str
    status: str  # "holds", "another kernel", "wrong result", "no gain"
    line: str


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
    """A pin whose problem one torch call issues as is: nn (torch.mm) or tn (F.linear), one
    matrix, packed, no bias or beta."""
    p = fix.problem
    packed = (p.lda, p.ldb) == ((p.m if p.transa == "n" else p.k), p.k)
    return (
        fix.pin is not None
        and p.layout in TORCH_CALLS
        and not p.batched
        and not p.bias
        and not p.beta
        and p.layout_known
        and packed
    )


def check(fixes: FixSet, fix_file: Path, environment: dict[str, str]) -> list[TorchChecked]:
    """Each runnable pin through torch with and without the TunableOp environment."""
    chosen = [fix for fix in fixes.pins() if runnable(fix)]
    if not chosen:
        return []
    pinned = _child(fix_file, [f.id for f in chosen], environment)
    plain = _child(fix_file, [f.id for f in chosen], {})
    return [_judged(fix, pinned[fix.id], plain[fix.id]) for fix in chosen]


def _child(fix_file: Path, ids: list[str], extra: dict[str, str]) -> dict[str, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_TUNABLEOP")}
    argv = [sys.executable, "-m", "cublas_audit.run.torch_check", str(fix_file), *ids]
    done = subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the torch check's process failed: {last}")
    found: dict[str, dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _judged(fix: Fix, pinned: dict[str, Any], plain: dict[str, Any]) -> TorchChecked:
    from cublas_audit.judge.fixes import short_names

    call = TORCH_CALLS[fix.problem.layout]
    kernels = short_names(" + ".join(pinned["kernels"]))
    wanted = fix.fixed.kernel.split(" + ")[0]
    if not pinned["correct"]:
        words = f"{call} with the TunableOp file: result differs from float64 ({pinned['error']})"
        return TorchChecked(fix.id, "wrong result", words)
    if wanted and wanted not in kernels:
        words = f"{call} with the TunableOp file ran {kernels}, not the pin's {wanted}"
        return TorchChecked(fix.id, "another kernel", words)
    ratio = plain["ms"] / pinned["ms"]
    status = "holds" if ratio > 1 else "no gain"
    words = f"{call} with the TunableOp file: {kernels}, {ratio:.2f}x of torch's own kernel time"
    return TorchChecked(fix.id, status, words)


def _measure(fix: Fix) -> dict[str, Any]:  # pragma: no cover - runs in the child, on a GPU
    import torch

    p = fix.problem
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[p.mode]
    x = torch.randn(p.n, p.k, device="cuda", dtype=dtype)
    w_shape = (p.k, p.m) if p.layout == "nn" else (p.m, p.k)
    w = torch.randn(*w_shape, device="cuda", dtype=dtype)

    # F.linear(x, w) without a bias is torch.mm(x, w.t()): cuBLAS tn, as the trace showed
    operand = w if p.layout == "nn" else w.t()
    out = torch.full((p.n, p.m), float("nan"), device="cuda", dtype=dtype)

    def call() -> Any:
        return torch.mm(x, operand, out=out)  # into NaN: a call that computes nothing shows

    call()
    exact = torch.mm(x.double(), operand.double())
    error = float((out.double() - exact).norm() / exact.norm())
    tolerance = 1e-4 if p.mode == "fp32" else 1e-2
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    return {
        "kernels": [e.key for e in events],
        "ms": sum(e.device_time_total for e in events) / 1e3 / CALLS,
        "error": error,
        "correct": bool(error == error and error <= tolerance),
    }


def main() -> None:  # pragma: no cover - the child process
    from cublas_audit.table.fix_file import read_fix_file

    fixes = read_fix_file(Path(sys.argv[1]))
    wanted = set(sys.argv[2:])
    results = {fix.id: _measure(fix) for fix in fixes.fixes if fix.id in wanted}
    print(json.dumps(results))


if __name__ == "__main__":  # pragma: no cover
    main()
