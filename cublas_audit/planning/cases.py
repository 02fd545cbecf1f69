"""The plan's records: `Case`, one cuBLAS / cuBLASLt call, with a stable case id; plan.json.

A case id names one cuBLAS / cuBLASLt call; it is the NVTX range the probe opens around the call
and the key that ties ncu's launches, the timings and the table rows together. Ids only use
`[A-Za-z0-9._-]`, so they are safe in file names, NVTX filters and regexes.

The probe child imports this module at start-up: it stays light (no pandas).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from cublas_audit.errors import AuditError
from cublas_audit.planning.modes import mode as mode_of

# Workspace a cuBLASLt call may use, bytes: what the sweep's cuBLASLt cases and every candidate of
# the candidate audit are given (cuBLAS's own default on Hopper is 32 MiB too).
DEFAULT_WORKSPACE_BYTES = 32 * 1024 * 1024

# cuBLAS takes m, n, k, the batch count and the leading dimensions as 32-bit ints.
MAX_DIMENSION = 2**31 - 1

LOOP_ROUTINE = "sgemm-loop"
APIS = ("cublas", "cublasLt")


class OperandLayout(NamedTuple):
    """How one operand sits in memory, in cuBLAS's column-major terms: a `rows` x `cols` matrix
    with leading dimension `ld` (>= rows), batch entry i at offset i * `stride` elements, and
    `stored` entries really held (1 for a broadcast operand, whose stride is 0)."""

    rows: int
    cols: int
    ld: int
    stride: int
    stored: int

    @property
    def elements(self) -> int:
        return self.stored * self.cols * self.ld


@dataclass(frozen=True, order=True)
class Case:
    """One GEMM call, in cuBLAS's column-major terms:
    C (m x n) = alpha * op(A) (m x k) @ op(B) (k x n) + beta * C, `batch` times.

    transa / transb: "n" (op(X) = X) or "t" (op(X) = X^T: A is stored k x m, B n x k). In a
    row-major user's terms (NumPy, PyTorch) the same call computes C^T = op(B)^T op(A)^T, so a
    row-major `X @ W.T` is cuBLAS's transa "t" on W (see docs/schema.md).
    lda / ldb: leading dimensions; 0 means packed (the stored rows). broadcast: "a" or "b" gives
    that operand batch stride 0 (one matrix shared by the batch). strided: call the
    strided-batched routine even at batch 1. bias (cuBLASLt): the BIAS epilogue adds a vector of
    m values to every column. workspace_mib (cuBLASLt): the workspace limit, -1 for the default.
    """

    api: str
    mode: str
    m: int
    n: int
    k: int
    batch: int
    transa: str = "n"
    transb: str = "n"
    loop: bool = False
    lda: int = 0
    ldb: int = 0
    broadcast: str = ""
    beta: float = 0.0
    strided: bool = False
    bias: bool = False
    workspace_mib: int = -1

    def __post_init__(self) -> None:
        # Each check tries its fields at once and names the culprit only when one fails, and the
        # operands' layouts are made only where a leading dimension was given to check: a full
        # map makes 262,144 cases, its shards and probes make them again (65,536 packed cases:
        # 0.73 -> 0.35 s of CPU here).
        if max(self.m, self.n, self.k, self.batch, self.lda, self.ldb) > MAX_DIMENSION:
            for name in ("m", "n", "k", "batch", "lda", "ldb"):
                if getattr(self, name) > MAX_DIMENSION:
                    raise AuditError(
                        f"{name} {getattr(self, name)} is larger than cuBLAS's 32-bit limit "
                        f"{MAX_DIMENSION}"
                    )
        if self.transa not in TRANSPOSES or self.transb not in TRANSPOSES:
            for name in ("transa", "transb"):
                if getattr(self, name) not in TRANSPOSES:
                    raise AuditError(f"{name}: {getattr(self, name)!r} is not one of n, t")
        if self.broadcast not in BROADCASTS:
            raise AuditError(f"broadcast: {self.broadcast!r} is not one of a, b (or empty)")
        for name, given in (("lda", self.lda), ("ldb", self.ldb)):
            if given and given < (rows := self.operand(name[-1]).rows):
                raise AuditError(
                    f"{self.case_id}: {name} {given} is smaller than the {rows} rows "
                    "of the stored operand"
                )
        if not math.isfinite(self.beta):
            raise AuditError(f"beta: {self.beta!r} is not a finite number")
        if (self.bias or self.workspace_mib >= 0) and self.api != "cublasLt":
            raise AuditError("--bias and --workspace-mib are cuBLASLt settings (--api cublasLt)")

    @classmethod
    def checked_before(cls, fields: Sequence[Any]) -> Case:
        """The case of `fields` (Case.fields' order), checked before: made without __init__'s
        checks and its frozen fields' setattr one by one (the probe's copy of a plan the sweep
        wrote from checked cases and reads back checked: 0.72 s for a full map's 262,144 cases
        here, against 1.66 s, ~1.3 s of the H100 probe's start-up with the GPU idle)."""
        case = object.__new__(cls)
        case.__dict__.update(zip(FIELD_NAMES, fields, strict=True))
        return case

    @property
    def batched_call(self) -> bool:
        return self.batch > 1 or self.strided

    @property
    def routine(self) -> str:
        return routine_of(*self.fields())

    @property
    def layout(self) -> str:
        return self.transa + self.transb

    @property
    def case_id(self) -> str:
        """`api.mode.MxNxK.bB.layout`, then only the settings that differ from the defaults; made
        once per case (a shard's table asked each of its 65,536 cases six times)."""
        found: str | None = self.__dict__.get("_case_id")  # (a frozen instance's own cache)
        if found is None:
            found = self.__dict__["_case_id"] = case_id_of(*self.fields())
        return found

    @property
    def variant(self) -> str:
        """How the problem is posed where it is not the default: 'tn lda7 bcast-b', or ''."""
        parts = [self.layout] if self.layout != "nn" else []
        return " ".join([*parts, *_settings(self.fields()[9:], self.batch)])

    def fields(self) -> tuple[Any, ...]:
        """The case's fields in their order (what case_id_of and routine_of take)."""
        return (
            self.api, self.mode, self.m, self.n, self.k, self.batch, self.transa, self.transb,
            self.loop, self.lda, self.ldb, self.broadcast, self.beta, self.strided, self.bias,
            self.workspace_mib,
        )  # fmt: skip

    def workspace_limit(self, default: int = DEFAULT_WORKSPACE_BYTES) -> int:
        """The workspace a cuBLASLt call of this case may use, bytes: its own limit where it has
        one (workspace_mib >= 0), else `default`."""
        return default if self.workspace_mib < 0 else self.workspace_mib * 2**20

    @property
    def reference_computes(self) -> bool:
        """Whether the bundled reference SGEMM computes this call's C: a classic FP32 call,
        packed and untransposed, beta 0, nothing else set."""
        plain = Case("cublas", "fp32", self.m, self.n, self.k, self.batch, strided=self.strided)
        return self == plain

    @property
    def profiled(self) -> bool:
        """Loop companions are only timed: their kernel is the single call's."""
        return not self.loop

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    def operand(self, name: str) -> OperandLayout:
        """The memory layout of operand "a", "b" or "c" (C is packed and never broadcast); made
        once per case (the map's engine asks some 20 times a problem)."""
        layouts: dict[str, OperandLayout] = self.__dict__.setdefault("_layouts", {})
        found = layouts.get(name)  # (a frozen instance's own cache)
        if found is None:
            found = layouts[name] = self._layout(name)
        return found

    def elements(self, name: str) -> int:
        """operand(name).elements, without making the layout: a full map's start-up sizes its
        operand pool and picks its pooled cases from the 786,432 operands of 262,144 cases,
        whose layouts the engine makes later, while the GPU runs (0.84 s of the H100 probe's
        start-up, with the GPU idle, when they were made there)."""
        _rows, cols, ld, stored = self._stored(name)
        return stored * cols * ld

    def _layout(self, name: str) -> OperandLayout:
        rows, cols, ld, stored = self._stored(name)
        stride = 0 if self.broadcast == name else cols * ld  # (a broadcast operand is shared)
        return OperandLayout(rows, cols, ld, stride, stored)

    def _stored(self, name: str) -> tuple[int, int, int, int]:
        """Operand `name` as stored: its rows, columns and leading dimension, and the batch
        entries held (1 for the broadcast operand; C is packed and never broadcast)."""
        if name == "c":
            return self.m, self.n, self.m, self.batch
        trans, ld = (self.transa, self.lda) if name == "a" else (self.transb, self.ldb)
        rows, cols = (self.m, self.k) if name == "a" else (self.k, self.n)
        if trans == "t":
            rows, cols = cols, rows
        return rows, cols, ld or rows, 1 if self.broadcast == name else self.batch

    @property
    def bytes_needed(self) -> int:
        """A, B, C and the bias, bytes; made once per case (a full map's start-up asks each of
        its 262,144 problems twice)."""
        found: int | None = self.__dict__.get("_bytes_needed")  # (a frozen instance's own cache)
        if found is None:
            item = mode_of(self.mode).element_bytes
            elements = self.elements("a") + self.elements("b") + self.elements("c")
            elements += self.bias and self.m
            found = self.__dict__["_bytes_needed"] = item * elements
        return found

    def to_json(self) -> dict[str, Any]:
        # (not dataclasses.asdict, which deep-copies every field: 14 of 15 s of 100,000 cases)
        return {
            **dict(zip(FIELD_NAMES, self.fields(), strict=True)),
            "case_id": self.case_id,
            "routine": self.routine,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        fields = {k: data[k] for k in ("api", "mode", "m", "n", "k", "batch")}
        optional = {
            name: kind(data[name])
            for name, kind in OPTIONAL_FIELDS.items()
            if data.get(name) is not None
        }
        return cls(**fields, **optional)


TRANSPOSES = ("n", "t")
LAYOUTS = ("nn", "nt", "tn", "tt")
BROADCASTS = ("", "a", "b")
# Case fields beyond the problem, with their types: a plan written before one existed reads as
# the default.
OPTIONAL_FIELDS: dict[str, Any] = {
    "transa": str,
    "transb": str,
    "loop": bool,
    "lda": int,
    "ldb": int,
    "broadcast": str,
    "beta": float,
    "strided": bool,
    "bias": bool,
    "workspace_mib": int,
}


FIELD_NAMES = (
    "api", "mode", "m", "n", "k", "batch", "transa", "transb", "loop", "lda", "ldb", "broadcast",
    "beta", "strided", "bias", "workspace_mib",
)  # fmt: skip


def routine_of(api: str, mode: str, m: int, n: int, k: int, batch: int, *rest: Any) -> str:
    """The routine a case calls, from its fields (Case.fields' order)."""
    loop, strided = rest[2], rest[7]
    if loop:
        return LOOP_ROUTINE
    if api == "cublasLt":
        return "cublasLtMatmul"
    batched_call = batch > 1 or strided
    if mode == "fp32":
        return "cublasSgemmStridedBatched" if batched_call else "cublasSgemm"
    return "cublasGemmStridedBatchedEx" if batched_call else "cublasGemmEx"


def case_id_of(
    api: str, mode: str, m: int, n: int, k: int, batch: int, transa: str, transb: str,
    loop: bool, *settings: Any,
) -> str:  # fmt: skip
    """A case's id from its fields (Case.fields' order), without building the case: what a
    plan of 262,144 cases is read by."""
    problem = ["loop" if loop else api, mode, f"{m}x{n}x{k}", f"b{batch}", transa + transb]
    return ".".join([*problem, *_settings(settings, batch)])


def _settings(settings: Sequence[Any], batch: int) -> list[str]:
    """The id's words of the settings that differ from the defaults (lda .. workspace_mib)."""
    lda, ldb, broadcast, beta, strided, bias, workspace_mib = settings
    parts = [f"lda{lda}"] if lda else []
    parts += [f"ldb{ldb}"] if ldb else []
    parts += [f"bcast-{broadcast}"] if broadcast else []
    parts += [f"beta{_number_id(beta)}"] if beta else []
    parts += ["strided"] if strided and batch == 1 else []
    parts += ["bias"] if bias else []
    parts += [f"ws{workspace_mib}m"] if workspace_mib >= 0 else []
    return parts


def _number_id(value: float) -> str:
    """0.5 -> '0p5', -1.0 -> 'm1': a number safe in a case id."""
    text = f"{value:g}".replace("-", "m").replace(".", "p").replace("+", "")
    return text


def candidate_problems(cases: Iterable[Case]) -> list[Case]:
    """The distinct GEMM problems of a plan, each as the cuBLASLt case that poses it whole:
    layout, leading dimensions, broadcast, beta, strided, bias and workspace limit kept. A
    classic-API case and its cuBLASLt twin, and a batched call and its loop companion, are one
    problem (they differ in the API or in how the batch is issued, not in what is computed)."""
    return list(dict.fromkeys(replace(case, api="cublasLt", loop=False) for case in cases))


ALIGN_BYTES = 16  # the row alignment Hopper's TMA-based tensor-core kernels need


def misaligned_strides(case: Case) -> list[str]:
    """The leading dimensions and batch strides cuBLAS is given for this call whose bytes are no
    multiple of ALIGN_BYTES, in words ('ldb = 140 (280 bytes)'). Packed, lda is m (transa n) or
    k (t), ldb k (transb n) or n (t), ldc m: so a dimension no 16-byte multiple leaves some
    layouts' leading dimensions aligned and others' not."""
    item = mode_of(case.mode).element_bytes
    found = []
    for name in "abc":
        layout = case.operand(name)
        # a single call has no batch stride; a shared operand's stride is 0, aligned
        stride = layout.stride if case.batched_call else 0
        for what, value in ((f"ld{name}", layout.ld), (f"stride_{name}", stride)):
            if value * item % ALIGN_BYTES:
                found.append(f"{what} = {value} ({value * item} bytes)")
    return found


def with_cause_removed_companions(cases: Sequence[Case]) -> list[Case]:
    """The cases, each tensor-core one whose M, N or K is no 16-byte multiple followed by the
    same problem with the cause removed, measured beside it so that `unaligned-operand` states
    the effect: padded (M, N, K rounded up, packed: zero padding leaves the product as it was)
    and in the other layout (`other_layout`: the dimensions as they were, every leading
    dimension aligned)."""
    planned = list(cases)
    for case in cases:
        if case.loop or mode_of(case.mode).pipe != "tensor-pipe":
            continue
        planned += [c for c in (_padded(case), other_layout(case)) if c is not None]
    return list(dict.fromkeys(planned))


def _padded(case: Case) -> Case | None:
    per = ALIGN_BYTES // mode_of(case.mode).element_bytes
    m, n, k = (-(-value // per) * per for value in (case.m, case.n, case.k))
    if (m, n, k) == (case.m, case.n, case.k):
        return None
    return replace(case, m=m, n=n, k=k, lda=0, ldb=0)


def other_layout(case: Case) -> Case | None:
    """The same call, packed, in the layout whose leading dimensions and batch strides are all
    16-byte multiples, where the case's own are not: each operand keeps its transpose where its
    packed leading dimension is aligned and flips it where not. None where no layout has them
    (an unaligned M: ldc = m in every layout; K and N both unaligned: ldb is one of them) or
    where that layout is the case's own (its given lda / ldb were the unaligned ones)."""
    if not misaligned_strides(case):
        return None
    packed = replace(case, lda=0, ldb=0)
    flipped = {"n": "t", "t": "n"}
    item = mode_of(case.mode).element_bytes

    def kept(name: str, trans: str) -> str:
        return trans if packed.operand(name).ld * item % ALIGN_BYTES == 0 else flipped[trans]

    other = replace(packed, transa=kept("a", case.transa), transb=kept("b", case.transb))
    if other.layout == case.layout or misaligned_strides(other):
        return None
    return other
