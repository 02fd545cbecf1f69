"""fix.json: the fixes `cublas-audit fix` selected, as data a user (or `verify`, on another
machine) can rebuild and check. Its schema is docs/schema.md's "fix.json"; this module is its one
reader and writer.

A fix names the exact GEMM problem in cuBLAS's column-major terms (`Problem`: layout, leading
dimensions, batch strides, broadcast, beta, bias epilogue), the change that made it faster
(a cuBLASLt algorithm pinned with every attribute (`Pin`), or a change of the problem's shape),
the measured times with their verdict, and the machine it was proven on (`Stamp`). Reading
checks everything before anything is run: a hand-edited or truncated file is one line, exit 2.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.files import write_text_atomic
from cublas_audit.planning.cases import MAX_DIMENSION, Case
from cublas_audit.planning.lt_enums import NUMBER_LIMITS, split_k_fault
from cublas_audit.planning.modes import MODE_NAMES
from cublas_audit.table.json_records import as_list, as_text, record, require
from cublas_audit.vocabulary import FixKind

SCHEMA = "cublas-audit-fix"
SCHEMA_VERSION = 1
FIX_FILE = "fix.json"
KINDS = tuple(FixKind)
TIMINGS = ("kernel", "call")  # CUPTI's kernel time, CUDA events around the call


@dataclass(frozen=True)
class Problem:
    """One GEMM call in cuBLAS's column-major terms, every stride explicit:
    C (m x n, ldc) = op(A) @ op(B) (+ beta C) (+ bias), `batch` times, batch entry i of X at
    X + i * stride_x elements (0: one matrix shared by the batch). `layout_known` is False where
    the source table predates layouts (the problem was then timed as packed nn)."""

    mode: str
    m: int
    n: int
    k: int
    batch: int = 1
    transa: str = "n"
    transb: str = "n"
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    beta: float = 0.0
    bias: bool = False
    strided: bool = False
    layout_known: bool = True

    @classmethod
    def of_case(cls, case: Case, layout_known: bool = True) -> Problem:
        a, b, c = (case.operand(name) for name in "abc")
        return cls(
            mode=case.mode,
            m=case.m,
            n=case.n,
            k=case.k,
            batch=case.batch,
            transa=case.transa,
            transb=case.transb,
            lda=a.ld,
            ldb=b.ld,
            ldc=c.ld,
            stride_a=a.stride if case.batched_call else 0,
            stride_b=b.stride if case.batched_call else 0,
            stride_c=c.stride if case.batched_call else 0,
            beta=case.beta,
            bias=case.bias,
            strided=case.strided,
            layout_known=layout_known,
        )

    def case(self, workspace_mib: int = -1) -> Case:
        """The cuBLASLt case that runs this problem (a broadcast operand is one of stride 0)."""
        broadcast = "a" if self.batch > 1 and self.stride_a == 0 else ""
        broadcast = broadcast or ("b" if self.batch > 1 and self.stride_b == 0 else "")
        return Case(
            "cublasLt",
            self.mode,
            self.m,
            self.n,
            self.k,
            self.batch,
            transa=self.transa,
            transb=self.transb,
            lda=0 if self.lda == (self.m if self.transa == "n" else self.k) else self.lda,
            ldb=0 if self.ldb == (self.k if self.transb == "n" else self.n) else self.ldb,
            broadcast=broadcast,
            beta=self.beta,
            strided=self.strided,
            bias=self.bias,
            workspace_mib=workspace_mib,
        )

    @property
    def layout(self) -> str:
        return self.transa + self.transb

    @property
    def batched(self) -> bool:
        return self.batch > 1 or self.strided

    @property
    def name(self) -> str:
        """'bf16 5952x832x5952 nn' (+ ' batch 8', ' bias', ' beta 1')."""
        words = [self.mode, f"{self.m}x{self.n}x{self.k}", self.layout]
        if self.batched:
            words.append(f"batch {self.batch}")
        if self.bias:
            words.append("bias")
        if self.beta:
            words.append(f"beta {self.beta:g}")
        return " ".join(words)


@dataclass(frozen=True)
class Pin:
    """A cuBLASLt algorithm, every attribute cublasLtMatmulAlgoInit and
    cublasLtMatmulAlgoConfigSetAttribute need to rebuild it. Enum attributes keep the names the
    candidates table records (tile '128x64', stages '8x5', reduction 'INPLACE', cluster
    '4x1x1'); report.tunableop turns them into cuBLASLt's numbers."""

    algo_id: int
    tile: str
    stages: str
    split_k: int
    reduction_scheme: str
    cta_swizzling: int
    custom_option: int
    inner_shape: int
    cluster_shape: str
    workspace_bytes: int

    def words(self) -> str:
        return (
            f"algo {self.algo_id}, tile {self.tile}, stages {self.stages}, split-K {self.split_k}"
            f" ({self.reduction_scheme}), swizzle {self.cta_swizzling}, custom "
            f"{self.custom_option}, inner {self.inner_shape}, cluster {self.cluster_shape}, "
            f"{self.workspace_bytes} B workspace"
        )


@dataclass(frozen=True)
class Timed:
    """One side of a fix: what ran and how long it took (median kernel or call time, ms), and
    the independent confirmation round's median where there was one."""

    kernel: str
    ms: float
    confirm_ms: float | None = None


@dataclass(frozen=True)
class Stamp:
    """Where a fix was proven: `verify` re-measures fixes from anywhere, and says so."""

    gpu_name: str
    cc: str
    cublas_version: str
    driver_version: str
    gpu_label: str = ""

    def words(self) -> str:
        return (
            f"{self.gpu_name} (cc {self.cc}), cuBLAS {self.cublas_version}, "
            f"driver {self.driver_version}"
        )


@dataclass(frozen=True)
class TorchOp:
    """A fix's `torch`: the PyTorch op of a trace that makes the fix's call, its row-major shape
    ('2048x5632x2048'), batch and share of the trace's GEMM time (0..1). fix.json holds it as an
    object of these four fields, in this order."""

    op: str
    shape: str
    batch: int
    share: float


@dataclass(frozen=True)
class Fix:
    """One confirmed finding's fix. `kind` pin: run `pin` on `problem`; pad / layout:
    run `instead` (the problem padded, or in the other layout) and take the result's slice."""

    id: str
    kind: FixKind
    problem: Problem
    default: Timed
    fixed: Timed
    timing: str  # "kernel" (CUPTI kernel time) or "call" (CUDA events around the call)
    verdict: str  # the noise model's words for default against fixed
    change: str  # the change in words
    pin: Pin | None = None
    instead: Problem | None = None
    source: dict[str, str] = field(default_factory=dict)  # run, case_id, rule
    torch: TorchOp | None = None  # the trace's op and its share of GPU time

    def __post_init__(self) -> None:
        # the kind is a member however the fix was made (a word FixKind lacks: ValueError)
        object.__setattr__(self, "kind", FixKind(self.kind))

    @property
    def speedup(self) -> float:
        return self.default.ms / self.fixed.ms

    @property
    def confirm_speedup(self) -> float | None:
        if self.default.confirm_ms is None or self.fixed.confirm_ms is None:
            return None
        return self.default.confirm_ms / self.fixed.confirm_ms

    @property
    def claimed(self) -> float:
        """The speedup the fix claims: the confirmation round's, where there was one. That round
        times the default and the fix alone, interleaved pairwise, as `verify` and a framework's
        own call see them; the audit's first round screens every candidate together, and there
        the ViT-B/16 MLP default (fp16 3072x12608x768 tn) timed 3-16 % slower than PyTorch's call
        of the same kernel (benchmarks/results/framework_agreement_h100.json), inflating the
        ratio."""
        confirmed = self.confirm_speedup
        return confirmed if confirmed is not None else self.speedup


@dataclass(frozen=True)
class FixSet:
    """fix.json: the fixes, the machine they were proven on, and the workspace the pins need."""

    stamp: Stamp
    fixes: tuple[Fix, ...]
    sources: tuple[str, ...] = ()

    @property
    def workspace_bytes(self) -> int:
        """The largest workspace any pin needs: what a caller must give cuBLASLt."""
        return max((f.pin.workspace_bytes for f in self.fixes if f.pin), default=0)

    def pins(self) -> list[Fix]:
        return [f for f in self.fixes if f.pin is not None]


def to_json(fixes: FixSet) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "stamp": asdict(fixes.stamp),
        "workspace_bytes": fixes.workspace_bytes,
        "sources": list(fixes.sources),
        "fixes": [
            {
                **asdict(fix),
                "speedup": _rounded(fix.speedup),
                "confirm_speedup": _rounded(fix.confirm_speedup),
                "claimed": _rounded(fix.claimed),
            }
            for fix in fixes.fixes
        ],
    }


def _rounded(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio, 4)


def write_fix_file(fixes: FixSet, path: Path) -> Path:
    return write_text_atomic(path, json.dumps(to_json(fixes), indent=2) + "\n")


def read_fix_file(path: Path) -> FixSet:
    """fix.json, checked whole before it is used: one AuditError (exit 2) naming the file and
    the first thing wrong."""
    try:
        data = json.loads(Path(path).read_text(), parse_constant=_not_json)
    except OSError as exc:
        raise AuditError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise AuditError(f"{path}: not a fix file: not valid JSON ({exc})") from exc
    try:
        return from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise AuditError(f"{path}: not a valid fix file: {exc}") from exc


def _not_json(literal: str) -> float:
    """NaN and Infinity, which Python's json reads and JSON has not: a time or a beta of NaN
    would reach the GPU."""
    raise ValueError(f"{literal} is not a number JSON allows")


def from_json(data: Any) -> FixSet:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"'schema' is not {SCHEMA!r}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"schema_version {version!r} is not {SCHEMA_VERSION}, the version this cublas-audit "
            "reads"
        )
    require(data, ("stamp", "fixes"), "the file")
    stamp = record(Stamp, data["stamp"], "stamp")
    fixes = tuple(_fix(entry, i) for i, entry in enumerate(as_list(data["fixes"], "fixes")))
    ids = [fix.id for fix in fixes]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"fix id {repeated[0]!r} appears twice")
    return FixSet(stamp, fixes, tuple(str(s) for s in as_list(data.get("sources", []), "sources")))


def _fix(entry: Any, index: int) -> Fix:
    where = f"fixes[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    require(entry, FIX_KEYS, where)
    if entry.get("kind") not in KINDS:
        raise ValueError(f"{where}.kind {entry.get('kind')!r} is not one of {', '.join(KINDS)}")
    kind = FixKind(entry["kind"])
    problem = _problem(entry["problem"], f"{where}.problem")
    pin = _pin(entry["pin"], f"{where}.pin") if entry.get("pin") is not None else None
    instead = entry.get("instead")
    if kind is FixKind.pin and pin is None:
        raise ValueError(f"{where}: a pin fix without its 'pin'")
    fault = split_k_fault(pin.split_k, problem.k) if pin is not None else ""
    if fault:
        raise ValueError(f"{where}.pin.{fault}")
    if kind is not FixKind.pin and instead is None:
        raise ValueError(f"{where}: a {kind} fix without the problem to run 'instead'")
    fix = Fix(
        id=as_text(entry["id"], f"{where}.id"),
        kind=kind,
        problem=problem,
        default=_timed(entry["default"], f"{where}.default"),
        fixed=_timed(entry["fixed"], f"{where}.fixed"),
        timing=_timing(entry["timing"], f"{where}.timing"),
        verdict=as_text(entry["verdict"], f"{where}.verdict"),
        change=as_text(entry["change"], f"{where}.change"),
        pin=pin,
        instead=_problem(instead, f"{where}.instead") if instead is not None else None,
        source={str(k): str(v) for k, v in dict(entry.get("source") or {}).items()},
        torch=_torch(entry["torch"], f"{where}.torch") if entry.get("torch") is not None else None,
    )
    return fix


FIX_KEYS = ("id", "kind", "problem", "default", "fixed", "timing", "verdict", "change")


def _problem(data: Any, where: str) -> Problem:
    problem = record(Problem, data, where)
    if problem.mode not in MODE_NAMES:
        raise ValueError(f"{where}.mode {problem.mode!r} is not one of {', '.join(MODE_NAMES)}")
    for name in ("m", "n", "k", "batch"):
        value = getattr(problem, name)
        if not 1 <= value <= MAX_DIMENSION:
            raise ValueError(f"{where}.{name} {value} is not in 1..{MAX_DIMENSION}")
    if problem.transa not in ("n", "t") or problem.transb not in ("n", "t"):
        raise ValueError(f"{where}: transa / transb must be 'n' or 't'")
    try:
        case = problem.case()  # the Case's own checks: leading dimensions against rows, ...
    except AuditError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    expected = Problem.of_case(case, problem.layout_known)
    if expected != problem:
        differs = [
            f.name for f in fields(Problem) if getattr(expected, f.name) != getattr(problem, f.name)
        ]
        raise ValueError(
            f"{where}: {', '.join(differs)} do not describe one cuBLAS call "
            f"(expected {', '.join(str(getattr(expected, d)) for d in differs)})"
        )
    return problem


def _pin(data: Any, where: str) -> Pin:
    pin = record(Pin, data, where)
    for name, high in NUMBER_LIMITS.items():
        value = getattr(pin, name)
        if not 0 <= value <= high:
            raise ValueError(f"{where}.{name} {value} is not in 0..{high}")
    return pin


def _torch(data: Any, where: str) -> TorchOp:
    op = record(TorchOp, data, where)
    if op.batch < 1:
        raise ValueError(f"{where}.batch {op.batch} is not a batch count")
    if not 0 <= op.share <= 1:
        raise ValueError(f"{where}.share {op.share} is not in 0..1 (a share of GEMM time)")
    return op


def _timed(data: Any, where: str) -> Timed:
    timed = record(Timed, data, where)
    for name in ("ms", "confirm_ms"):
        value = getattr(timed, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{where}.{name} {value!r} is not a positive time")
    return timed


def _timing(value: Any, where: str) -> str:
    if value not in TIMINGS:
        raise ValueError(f"{where} {value!r} is not one of {', '.join(TIMINGS)}")
    return str(value)
