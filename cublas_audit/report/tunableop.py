"""The TunableOp results file `cublas-audit fix` writes: the pins of a FixSet that PyTorch (2.14+)
can apply to an unchanged model, and the environment that makes it read them
(docs/schema.md, "The TunableOp file"; the format is table.tunableop_file).

A row names a call by its element type, transposes, sizes and leading dimensions only. So only a
`pin` fix whose call that row describes exactly is carried: its layout known, its mode one torch
runs through cuBLASLt, a batched call with packed batch strides, beta 0 (or the bias epilogue on
one matrix). Everything else is returned, with the reason, as `NotCarried` for the fix report.

TunableOp inserts the device ordinal into the file name it is given: PYTORCH_TUNABLEOP_FILENAME
=.../tunableop.csv is read from .../tunableop0.csv on device 0 (measured on the H100 with torch
2.14.1). The file is therefore written as tunableop0.csv, and the environment names tunableop.csv.
"""

from __future__ import annotations

import importlib.metadata
import math
import re
from dataclasses import dataclass
from pathlib import Path

from cublas_audit.errors import AuditError
from cublas_audit.files import write_text_atomic
from cublas_audit.observe.environment import cublas_version_number
from cublas_audit.planning.lt_enums import enum_number
from cublas_audit.planning.modes import mode as mode_of
from cublas_audit.table.fix_file import Fix, FixSet, Pin, Problem
from cublas_audit.table.tunableop_file import (
    BATCHED_OP,
    BIAS_OP,
    DTYPE_OF_MODE,
    LtSolution,
    TunableFile,
    TunableRow,
)
from cublas_audit.vocabulary import FixKind

FILE_NAME = "tunableop.csv"  # what PYTORCH_TUNABLEOP_FILENAME names
DEVICE_FILE_NAME = "tunableop0.csv"  # what TunableOp reads on device 0, and what is written
# PyTorch's cuBLASLt workspace on CUDA when CUBLASLT_WORKSPACE_SIZE is unset, KiB
# (CublasHandlePool.cpp, parseCUDABlasLtWorkspaceSize). A pin that needs more fails TunableOp's
# cublasLtMatmulAlgoCheck and torch silently computes nothing: on the H100 the fp32 split-K pins
# (4-16 MB) left torch.mm's output untouched, with no error (docs/schema.md).
TORCH_DEFAULT_LT_WORKSPACE_KIB = 1024
# What each element type's rows assume of torch's settings (TunableGemm.h names float rows tf32
# while TF32 is allowed; CublasLtUtils.h runs Half with FP16 accumulation when that is allowed).
TORCH_SETTINGS = {
    "float": "float rows apply while TF32 is off for matmuls "
    "(torch.backends.cuda.matmul.allow_tf32 = False, the default)",
    "tf32": "tf32 rows apply only while TF32 is on for matmuls "
    "(torch.backends.cuda.matmul.allow_tf32 = True)",
    "Half": "Half rows were proven with FP32 accumulation: leave "
    "torch.backends.cuda.matmul.allow_fp16_accumulation off (the default)",
    "BFloat16": "",
}


@dataclass(frozen=True)
class NotCarried:
    """A fix the file cannot carry, and why."""

    fix_id: str
    problem: str
    reason: str


@dataclass(frozen=True)
class TunableOpExport:
    """The file's content, which fixes it carries (in row order), which it cannot, and the
    workspace its pins need (KiB, never below torch's default)."""

    file: TunableFile
    carried: tuple[str, ...]
    not_carried: tuple[NotCarried, ...]
    workspace_kib: int

    @property
    def torch_version(self) -> str:
        return self.file.validator("PT_VERSION") or ""

    @property
    def torch_settings(self) -> list[str]:
        dtypes = dict.fromkeys(row.dtype for row in self.file.rows)
        return [TORCH_SETTINGS[dtype] for dtype in dtypes if TORCH_SETTINGS.get(dtype)]

    def environment(self, directory: Path) -> dict[str, str]:
        return tunableop_environment(directory, self.workspace_kib)


def tunableop_export(fixes: FixSet, torch_version: str | None = None) -> TunableOpExport:
    """The rows of the fixes TunableOp can carry, validated for `torch_version` (else the
    installed torch's) and the FixSet's GPU and cuBLAS; an AuditError if neither torch is known."""
    version = pt_version(torch_version)
    rows: list[TunableRow] = []
    carried: list[str] = []
    skipped: list[NotCarried] = []
    owner: dict[tuple[str, str], str] = {}
    for fix in fixes.fixes:
        row = _carried_row(fix, owner)
        if isinstance(row, str):
            skipped.append(NotCarried(fix.id, fix.problem.name, row))
            continue
        owner[row.op_signature, row.params] = fix.id
        rows.append(row)
        carried.append(fix.id)
    pins = [fix.pin.workspace_bytes for fix in fixes.fixes if fix.id in carried and fix.pin]
    validators = (
        ("PT_VERSION", version),
        ("CUBLASLT_VERSION", str(_cublaslt_version(fixes.stamp.cublas_version))),
        ("CUDA_DEVICE", f"{fixes.stamp.cc}:{fixes.stamp.gpu_name}"),
    )
    return TunableOpExport(
        TunableFile(validators, tuple(rows)),
        tuple(carried),
        tuple(skipped),
        max(TORCH_DEFAULT_LT_WORKSPACE_KIB, math.ceil(max(pins, default=0) / 1024)),
    )


def _carried_row(fix: Fix, owner: dict[tuple[str, str], str]) -> TunableRow | str:
    """The fix's row, or why it is not carried (`owner`: the fix already holding each call)."""
    reason = not_carried_reason(fix)
    if reason or fix.pin is None:
        return reason
    row = tunable_row(fix.problem, fix.pin, fix.fixed.ms)
    first = owner.get((row.op_signature, row.params))
    return f"fix {first} already pins this call (TunableOp keeps one per call)" if first else row


def write_tunableop(export: TunableOpExport, directory: Path) -> Path:
    """Writes the file as TunableOp reads it on device 0: DIRECTORY/tunableop0.csv."""
    return write_text_atomic(Path(directory) / DEVICE_FILE_NAME, export.file.text)


def tunableop_environment(directory: Path, workspace_kib: int) -> dict[str, str]:
    """The variables that make an unchanged PyTorch program run the file's pins: TunableOp on,
    its own tuning off (the pins stay as proven), the file (by the name TunableOp inserts the
    device ordinal into), and a cuBLASLt workspace large enough for every pin."""
    return {
        "PYTORCH_TUNABLEOP_ENABLED": "1",
        "PYTORCH_TUNABLEOP_TUNING": "0",
        "PYTORCH_TUNABLEOP_FILENAME": str(Path(directory).resolve() / FILE_NAME),
        "CUBLASLT_WORKSPACE_SIZE": str(max(workspace_kib, TORCH_DEFAULT_LT_WORKSPACE_KIB)),
    }


def not_carried_reason(fix: Fix) -> str:
    """Why a TunableOp row cannot carry this fix; '' when it can."""
    problem = fix.problem
    if fix.kind is not FixKind.pin or fix.pin is None:
        instead = f" (it runs {fix.instead.name})" if fix.instead else ""
        return (
            f"a {fix.kind} fix changes the call itself{instead}; TunableOp only chooses the "
            "algorithm of the call the program makes"
        )
    if not problem.layout_known:
        return (
            "the source table predates layouts: the call's transposes and leading dimensions "
            "were not recorded, and a row names the call by them"
        )
    if problem.mode not in DTYPE_OF_MODE:
        compute = mode_of(problem.mode).compute_type_name
        return (
            f"{problem.mode} is FP32 data with {compute} compute, which torch never asks "
            "cuBLASLt for (its FP32 rows are float or, under TF32, tf32)"
        )
    return _call_reason(problem)


def _call_reason(problem: Problem) -> str:
    """The call's settings a row cannot carry: a row has no strides and no beta, so a row would
    also pin the same shape's canonical calls (packed, beta 0), which the fix did not measure."""
    if problem.bias and problem.batched:
        return f"the bias epilogue on a batched call: {BIAS_OP} is for one matrix"
    if problem.beta:
        return (
            f"beta {problem.beta:g}: a row has no beta, so it would pin this shape's beta-0 "
            "calls too, which the fix did not measure"
        )
    if not problem.batched:
        return ""
    for name, stride, packed in _batch_strides(problem):
        if stride != packed:
            shared = " (shared by the batch)" if stride == 0 else ""
            return (
                f"operand {name}'s batch stride {stride}{shared} is not the packed {packed}: "
                f"{BATCHED_OP}'s parameters carry no strides, so a row would pin the packed "
                "calls of this shape, which the fix did not measure"
            )
    return ""


def _batch_strides(problem: Problem) -> list[tuple[str, int, int]]:
    """(operand, batch stride, packed stride: ld x stored columns) of A, B and C."""
    case = problem.case()
    strides = (problem.stride_a, problem.stride_b, problem.stride_c)
    return [
        (name.upper(), stride, case.operand(name).cols * ld)
        for name, stride, ld in zip(
            "abc", strides, (problem.lda, problem.ldb, problem.ldc), strict=True
        )
    ]


def tunable_row(problem: Problem, pin: Pin, ms: float) -> TunableRow:
    """The row that makes TunableOp run `pin` for `problem` (assumed carried: see
    not_carried_reason), with `ms` as its time."""
    op = BATCHED_OP if problem.batched else BIAS_OP if problem.bias else "GemmTunableOp"
    return TunableRow(
        op=op,
        dtype=DTYPE_OF_MODE[problem.mode],
        transa=problem.transa,
        transb=problem.transb,
        m=problem.m,
        n=problem.n,
        k=problem.k,
        batch=problem.batch if problem.batched else None,
        lda=problem.lda,
        ldb=problem.ldb,
        ldc=problem.ldc,
        solution=lt_solution(pin),
        ms=ms,
    )


def lt_solution(pin: Pin) -> LtSolution:
    """The pin with cuBLASLt's numbers for its enum attributes."""
    return LtSolution(
        algo_id=pin.algo_id,
        tile=enum_number("tile", pin.tile),
        stages=enum_number("stages", pin.stages),
        split_k=pin.split_k,
        reduction=enum_number("reduction_scheme", pin.reduction_scheme),
        swizzle=pin.cta_swizzling,
        custom=pin.custom_option,
        inner=pin.inner_shape,
        cluster=enum_number("cluster_shape", pin.cluster_shape),
    )


# A torch version as PEP 440 writes it: MAJOR.MINOR.PATCH, then a pre-, post- or dev-release and
# a local part (2.14.1+cu130, 2.15.0a0+git5c48869). All three numbers: TunableOp compares them.
_TORCH_VERSION = re.compile(
    r"(\d+\.\d+\.\d+)(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?",
    re.IGNORECASE,
)


def pt_version(given: str | None = None) -> str:
    """The PT_VERSION validator: torch's MAJOR.MINOR.PATCH, from `given` (--torch-version) or the
    installed torch's distribution (not imported). TunableOp writes only those three numbers: torch
    2.14.1+cu130 wrote PT_VERSION 2.14.1 on the H100. Unknown or malformed: one AuditError."""
    text = given if given is not None else _installed_torch()
    if text is None:
        raise AuditError(
            "no torch version for the TunableOp file: TunableOp reads only a file written for "
            "its own version; give --torch-version (the torch that will read it) or install torch"
        )
    match = _TORCH_VERSION.fullmatch(text.strip())
    if not match:
        raise AuditError(
            f"torch version {text!r} is not MAJOR.MINOR.PATCH as PEP 440 writes it (2.14.1, "
            "2.14.1+cu130): TunableOp compares all three numbers with the torch that reads the file"
        )
    return match[1]


def _installed_torch() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _cublaslt_version(text: str) -> int:
    try:
        return cublas_version_number(text)
    except ValueError as exc:
        raise AuditError(f"the fixes' stamp: {exc}") from None
