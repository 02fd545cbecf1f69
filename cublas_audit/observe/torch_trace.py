"""PyTorch profiler traces: the GEMMs a model really ran, and the cuBLAS kernels each launched.

No torch and no GPU: a trace from `torch.profiler.profile(record_shapes=True)`, exported as a
Chrome trace (plain or gzipped), already says everything. Each `aten::mm/addmm/bmm/...` call is a
CPU-op event with "Input Dims", "Input Strides", "Input type" and "Concrete Inputs" (scalars such
as beta); each CUDA launch is a runtime or driver event with a `correlation` id; each kernel carries
the same id, its duration, grid and block.

Attribution (`gemm_calls`): a kernel belongs to the innermost GEMM op whose time span holds its
launch event on the same thread, through the launch's correlation id, never by order. `matmul`
and `linear` are containers: they call `mm`/`addmm`/`bmm`, which describe the problem. A kernel
counts as the GEMM's own (its GPU time) when the GEMM op launched it directly and it is not one
of PyTorch's own kernels (`at::native::...`); everything else launched inside a GEMM op (the copy
`.contiguous()` or `reshape` makes, the copy of baddbmm's C, memcpys and memsets) is kept as that
problem's `aux` work, shown apart and never in its GEMM time. A container's launches go to the
GEMM op it calls (the first one starting after the launch, else the last). Each GPU activity is
attributed at most once.

From row-major PyTorch to column-major cuBLAS (`GemmProblem.cublas_terms`, as
aten/src/ATen/native/cuda/Blas.cpp prepares the call): C (M x N) = A (M x K) @ B (K x N) is issued
as C^T = B^T A^T, so cuBLAS's m = N, n = M, k = K, cuBLAS's operand A is torch's B and its B is
torch's A. A torch operand whose rows are contiguous (strides [ld, 1]) is cuBLAS's "n" with
leading dimension ld; a transposed view (strides [1, ld]) is "t" with leading dimension ld; an odd
ld (a column-major 7 x 20000 slice has ld 7) is kept as is, and an operand that is neither is
copied first (its ld is then its row length). For bmm/baddbmm the batch stride of each operand is
its first stride, 0 for an `expand`ed (shared) one. Two PyTorch rules show through: a bmm whose
output has N == 1 is issued without the swap (m = M, n = N, cuBLAS's A is torch's A), and a bias
vector of N values with beta 1 on addmm/linear goes into cuBLASLt's BIAS epilogue (cuBLAS beta 0),
while any other addend (baddbmm's C, a 2-D self, beta != 1) is copied into C first and scaled by
beta.

Worked example: `x @ w.t()` with x of 512 x 256 (strides [256, 1]) and w of 384 x 256: torch's
B = w.t() is 256 x 384 with strides [1, 256]. cuBLAS runs m = 384, n = 512, k = 256 with operand
A = w.t(), transa "t", lda 256, and operand B = x, transb "n", ldb 256: layout `tn`.
"""

from __future__ import annotations

import bisect
import gzip
import io
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.observe.kernels import normalize
from cublas_audit.planning.cases import Case

# The ops that describe a GEMM (their inputs are the operands cuBLAS gets), and the containers
# that call them.
LEAF_OPS = frozenset(
    {"aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::bmm", "aten::baddbmm"}
)
CONTAINER_OPS = frozenset({"aten::matmul", "aten::linear"})
GEMM_OPS = LEAF_OPS | CONTAINER_OPS
# PyTorch's dtype names -> this tool's modes. FP32 data is `fp32`: the trace does not say whether
# TF32 was allowed (the kernel name does).
MODES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}
GZIP_MAGIC = b"\x1f\x8b"
# Event categories, lower-cased (older PyTorch wrote "Operator", "Runtime", "Kernel", "Memcpy").
_CATEGORIES = {
    "cpu_op": "op", "operator": "op",
    "cuda_runtime": "launch", "cuda_driver": "launch", "runtime": "launch", "driver": "launch",
    "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
}  # fmt: skip
# PyTorch's own kernels (copies, fills, elementwise epilogues): never cuBLAS's GEMM.
_PYTORCH_KERNEL = re.compile(r"\bat::native::|\bat::cuda::")
_CHUNK_CHARS = 1 << 23
_NEVER = 1 << 62  # later than any trace time, in nanoseconds


class CpuOp(NamedTuple):
    """A CPU op: times in integer nanoseconds (exact containment tests); `args` kept for GEMM
    ops only, the rest only nest."""

    name: str
    thread: tuple[Any, Any]
    start: int
    end: int
    args: dict[str, Any] | None


class Launch(NamedTuple):
    """A CUDA runtime or driver call that carries a correlation id (a launch, a memcpy...)."""

    thread: tuple[Any, Any]
    start: int
    correlation: int


class GpuActivity(NamedTuple):
    """A kernel, memcpy or memset on the GPU, tied to its launch by the correlation id."""

    kind: str  # kernel, memcpy or memset
    name: str
    correlation: int
    duration_us: float
    grid: tuple[int, ...]
    block: tuple[int, ...]
    registers: int


@dataclass
class Trace:
    """What a trace holds that this module reads: CPU ops, launches, GPU activities by
    correlation id, and the top-level metadata (deviceProperties...)."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    ops: list[CpuOp] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    activities: dict[int, list[GpuActivity]] = field(default_factory=dict)
    event_count: int = 0

    @property
    def sm_count(self) -> int | None:
        device = self._device()
        count = device.get("numSms")
        return int(count) if isinstance(count, int) and count > 0 else None

    @property
    def gpu_name(self) -> str:
        return str(self._device().get("name") or "")

    def _device(self) -> dict[str, Any]:
        devices = self.meta.get("deviceProperties")
        first = devices[0] if isinstance(devices, list) and devices else None
        return first if isinstance(first, dict) else {}


# ---------------------------------------------------------------------------------------------
# Reading: a streaming parse, so a trace of hundreds of MB never sits in memory as JSON objects.


def read_trace(path: Path | str) -> Trace:
    """A Chrome trace from torch.profiler, plain or gzipped (told apart by its magic bytes, not
    its suffix). Events are decoded one at a time and only what the GEMM table needs is kept, so
    memory follows the kept records, not the file. A missing, unreadable, truncated or non-trace
    file is an AuditError naming it."""
    path = Path(path)
    trace = Trace(path)
    try:
        _parse_file(path, trace)
    except FileNotFoundError:
        raise AuditError(f"{path}: no such trace file") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise AuditError(f"{path}: cannot read the trace ({_one_line(exc)})") from None
    except UnicodeDecodeError as exc:
        raise AuditError(f"{path}: not a JSON trace (not UTF-8 text: {_one_line(exc)})") from None
    except _NotJson as exc:
        raise AuditError(f"{path}: not a JSON trace ({exc})") from None
    except _NotATrace as exc:
        raise AuditError(f"{path}: not a PyTorch profiler trace ({exc})") from None
    return trace


class _NotATrace(Exception):
    """Valid JSON so far, but not a Chrome trace object with a traceEvents list."""


class _NotJson(Exception):
    """Text that is not JSON (or ends early), with where."""


def _parse_file(path: Path, trace: Trace) -> None:
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        binary = gzip.GzipFile(fileobj=raw) if gzipped else raw
        with io.TextIOWrapper(binary, encoding="utf-8-sig") as text:
            _parse(_Cursor(text), _Collector(trace))


def _one_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]


_SPACE = re.compile(r"[ \t\n\r]*")
_SPACE_OR_COMMA = re.compile(r"[ \t\n\r,]*")


class _Cursor:
    """The decompressed text, read in chunks, with a position: JSON values are decoded at the
    position one by one (json's own C decoder), reading on when a value runs past the chunk."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters of the text before buf
        self.decoder = json.JSONDecoder()

    def _more(self) -> bool:
        data = self.stream.read(_CHUNK_CHARS)
        if not data:
            return False
        self.offset += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def peek(self, skip: re.Pattern[str] = _SPACE) -> str:
        """The next character after what `skip` matches ('' at the end of the text)."""
        while True:
            match = skip.match(self.buf, self.pos)
            self.pos = match.end() if match else self.pos
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def take(self, char: str) -> None:
        if self.peek() != char:
            found = self.buf[self.pos : self.pos + 20] or "the end of the file"
            raise _NotATrace(f"expected {char!r}, found {found!r}")
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value; one cut by the chunk's end (or a number that might go on) is
        decoded again with more text."""
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                raise _NotJson(f"{exc.msg} at character {self.offset + exc.pos}") from None
            if end == len(self.buf) and self._more():
                continue
            self.pos = end
            return value


def _parse(cursor: _Cursor, collector: _Collector) -> None:
    """The top-level object: every key but traceEvents is metadata; traceEvents is streamed."""
    if cursor.peek() != "{":
        raise _NotATrace("not a JSON object")
    cursor.take("{")
    found = False
    while (char := cursor.peek(_SPACE_OR_COMMA)) != "}":
        if char != '"':
            raise _NotATrace(f"expected a key, found {char or 'the end of the file'!r}")
        key = cursor.value()
        cursor.take(":")
        if key == "traceEvents":
            cursor.take("[")
            while (char := cursor.peek(_SPACE_OR_COMMA)) != "]":
                if not char:
                    raise _NotATrace("the traceEvents list ends early (a truncated file?)")
                collector.add(cursor.value())
            cursor.take("]")
            found = True
        else:
            collector.trace.meta[key] = cursor.value()
    if not found:
        raise _NotATrace("no traceEvents list")


class _Collector:
    """Turns each event into the compact record this module needs, or drops it. Names repeat
    (kernel names run to kilobytes), so they are interned."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.activities: dict[int, list[GpuActivity]] = defaultdict(list)
        trace.activities = self.activities

    def add(self, event: Any) -> None:
        self.trace.event_count += 1
        if not isinstance(event, dict):
            return
        category = event.get("cat")
        kind = _CATEGORIES.get(category.lower()) if isinstance(category, str) else None
        start = event.get("ts")
        if kind is None or not isinstance(start, int | float):
            return
        if kind == "op":
            self._op(event, start)
            return
        args = event.get("args")
        correlation = args.get("correlation") if isinstance(args, dict) else None
        if not isinstance(correlation, int) or correlation <= 0:
            return
        if kind == "launch":
            thread = (event.get("pid"), event.get("tid"))
            self.trace.launches.append(Launch(thread, _ns(start), correlation))
        else:
            assert isinstance(args, dict)
            self.activities[correlation].append(_activity(kind, event, args, correlation))

    def _op(self, event: dict[str, Any], start: float) -> None:
        name, duration = event.get("name"), event.get("dur")
        if not isinstance(name, str) or not isinstance(duration, int | float):
            return
        args = event.get("args") if name in GEMM_OPS else None
        begin = _ns(start)
        self.trace.ops.append(
            CpuOp(
                sys.intern(name),
                (event.get("pid"), event.get("tid")),
                begin,
                begin + _ns(duration),
                args if isinstance(args, dict) else None,
            )
        )


def _activity(kind: str, event: dict[str, Any], args: dict[str, Any], corr: int) -> GpuActivity:
    duration = event.get("dur")
    registers = args.get("registers per thread")
    return GpuActivity(
        kind,
        sys.intern(str(event.get("name", ""))),
        corr,
        float(duration) if isinstance(duration, int | float) else 0.0,
        _ints(args.get("grid")),
        _ints(args.get("block")),
        registers if isinstance(registers, int) else 0,
    )


def _ns(microseconds: float) -> int:
    """Trace times are microseconds with three decimals: integer nanoseconds compare exactly."""
    return round(microseconds * 1000)


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(int(v) for v in value if isinstance(v, int | float))


# ---------------------------------------------------------------------------------------------
# The problem of one GEMM op, in PyTorch's and in cuBLAS's terms.


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM in PyTorch's row-major terms: C (M x N) = A (M x K) @ B (K x N), `batch` times
    (1 for mm/addmm), with A's and B's strides as recorded (batch stride first for bmm).
    `bias`: the op adds an input tensor (addmm's or baddbmm's self, a linear layer's bias), whose
    dims are `bias_dims`; `beta` its scale as recorded in Concrete Inputs (0 without one)."""

    op: str
    mode: str
    m: int
    n: int
    k: int
    batch: int
    a_strides: tuple[int, ...]
    b_strides: tuple[int, ...]
    bias: bool = False
    beta: float = 0.0
    bias_dims: tuple[int, ...] = ()
    bias_strides: tuple[int, ...] = ()

    @property
    def batched(self) -> bool:
        return len(self.a_strides) == 3

    @property
    def bias_epilogue(self) -> bool:
        """PyTorch's cuBLASLt path (isInputCompliesAddmmCudaLt): addmm (so linear) with a
        contiguous vector of N values, beta 1, every dimension above 1, a real float dtype."""
        if not self.bias or self.batched or self.beta != 1.0 or min(self.m, self.n, self.k) < 2:
            return False
        vector = self.bias_dims == (self.n,) and self.bias_strides in ((1,), ())
        return vector and self.mode in ("fp32", "fp16", "bf16", "double")

    def cublas_terms(self) -> dict[str, Any]:
        """The column-major call PyTorch issues (module docstring): m, n, k, batch, transa,
        transb, lda, ldb, stride_a, stride_b (batch strides; 0 for a shared operand and for
        calls that are not batched), beta (cuBLAS's), bias (the cuBLASLt BIAS epilogue), mode."""
        if self.batched:
            m, n, a, b = self._batched_operands()
        else:
            m, n = self.n, self.m  # the output is always a fresh row-major matrix: swapped
            a = _matrix_operand((self.k, self.n), self.b_strides)
            b = _matrix_operand((self.m, self.k), self.a_strides)
        epilogue = self.bias_epilogue
        return {
            "m": m,
            "n": n,
            "k": self.k,
            "batch": self.batch,
            "transa": a.trans,
            "transb": b.trans,
            "lda": a.ld,
            "ldb": b.ld,
            "stride_a": a.batch_stride,
            "stride_b": b.batch_stride,
            "beta": 0.0 if epilogue or not self.bias else self.beta,
            "bias": epilogue,
            "mode": self.mode,
        }

    def _batched_operands(self) -> tuple[int, int, _Layout, _Layout]:
        """baddbmm_out_cuda_impl: the fresh [batch, M, N] output is read as column-major (no
        swap) when N == 1, else as row-major, which swaps the operands."""
        swap = self.n != 1
        a_dims, b_dims = (self.batch, self.m, self.k), (self.batch, self.k, self.n)
        if swap:
            m, n = self.n, self.m
            a = _batch_operand(b_dims, self.b_strides, swap, m, self.k)
            b = _batch_operand(a_dims, self.a_strides, swap, self.k, n)
        else:
            m, n = self.m, self.n
            a = _batch_operand(a_dims, self.a_strides, swap, m, self.k)
            b = _batch_operand(b_dims, self.b_strides, swap, self.k, n)
        return m, n, a, b

    def shared_operand(self) -> str:
        """The cuBLAS operand, "a" or "b", that a batched call shares (batch stride 0), or ""."""
        terms = self.cublas_terms()
        if self.batch < 2:
            return ""
        return "a" if terms["stride_a"] == 0 else "b" if terms["stride_b"] == 0 else ""

    def case(self, api: str = "cublas") -> Case:
        """The sweep's case for this problem: packed leading dimensions as 0, a shared operand as
        `broadcast`, a batch of 1 as the single call PyTorch makes (it calls gemm, not bgemm)."""
        t = self.cublas_terms()
        packed_a = t["m"] if t["transa"] == "n" else t["k"]
        packed_b = t["k"] if t["transb"] == "n" else t["n"]
        return Case(
            api, self.mode, t["m"], t["n"], t["k"], self.batch, t["transa"], t["transb"],
            lda=0 if t["lda"] <= packed_a else t["lda"],
            ldb=0 if t["ldb"] <= packed_b else t["ldb"],
            broadcast=self.shared_operand(),
            beta=t["beta"],
            bias=t["bias"] and api == "cublasLt",
        )  # fmt: skip


class _Layout(NamedTuple):
    trans: str
    ld: int
    batch_stride: int


def _matrix_operand(dims: tuple[int, int], strides: tuple[int, ...]) -> _Layout:
    """cuBLAS's op and ld of a 2-D torch operand of `dims` (rows, cols), PyTorch's
    prepare_matrix_for_cublas with the swapped (row-major) output: a dense operand is "n" when
    row-major contiguous, else "t"; any other is "t" when its columns are contiguous, "n" when its
    rows are, else copied contiguous first ("n", ld = its row length)."""
    rows, cols = dims
    if len(strides) != 2:
        return _Layout("n", max(1, cols), 0)
    row_stride, col_stride = strides
    if _dense(dims, strides):
        if _contiguous(dims, strides):
            return _Layout("n", row_stride, 0)
        return _Layout("t", col_stride, 0)
    if row_stride == 1 and col_stride >= max(1, rows):
        return _Layout("t", col_stride, 0)
    if col_stride == 1 and row_stride >= max(1, cols):
        return _Layout("n", row_stride, 0)
    return _Layout("n", max(1, cols), 0)


def _batch_operand(
    dims: tuple[int, int, int], strides: tuple[int, ...], swap: bool, m: int, n: int
) -> _Layout:
    """PyTorch's prepare_batch_matrix_for_cublas for a [batch, rows, cols] operand that cuBLAS
    sees as m x n (before its op)."""
    if len(strides) != 3:
        return _Layout("n" if swap else "t", max(1, dims[2]), dims[1] * dims[2])
    fast, leading = (2, 1) if swap else (1, 2)
    if strides[fast] == 1 and strides[leading] >= max(1, m):
        return _Layout("n", strides[leading], strides[0])
    if strides[leading] == 1 and strides[fast] >= max(1, n):
        return _Layout("t", strides[fast], strides[0])
    trans = "n" if swap else "t"
    if _contiguous(dims, strides) and strides[1] != 0 and strides[2] != 0:
        return _Layout(trans, strides[1], strides[0])
    return _Layout(trans, max(1, dims[2]), dims[1] * dims[2])  # copied contiguous


def _contiguous(dims: Sequence[int], strides: Sequence[int]) -> bool:
    """torch's is_contiguous: strides of size-1 dims do not matter."""
    expected = 1
    for size, stride in zip(reversed(dims), reversed(strides), strict=True):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def _dense(dims: Sequence[int], strides: Sequence[int]) -> bool:
    """torch's is_non_overlapping_and_dense: some order of the dims is contiguous."""
    order = sorted((i for i in range(len(dims)) if dims[i] >= 2), key=lambda i: strides[i])
    expected = 1
    for i in order:
        if strides[i] != expected:
            return False
        expected *= dims[i]
    return True


# Where each leaf op's operands sit in its inputs: (A, B, addend or None, beta's index or None).
_OPERANDS = {
    "aten::mm": (0, 1, None, None),
    "aten::bmm": (0, 1, None, None),
    "aten::addmm": (1, 2, 0, 3),
    "aten::_addmm_activation": (1, 2, 0, 3),
    "aten::baddbmm": (1, 2, 0, 3),
}


def problem_of(op: CpuOp) -> GemmProblem | None:
    """The GEMM a leaf op computed, from its recorded inputs; None where the trace lacks them
    (recorded without record_shapes) or they are not a 2-D / 3-D matrix product."""
    layout = _OPERANDS.get(op.name)
    args = op.args or {}
    dims, strides = args.get("Input Dims"), args.get("Input Strides")
    if layout is None or not isinstance(dims, list) or not isinstance(strides, list):
        return None
    ia, ib, iadd, ibeta = layout
    a, b = _shape(dims, ia), _shape(dims, ib)
    rank = 3 if op.name in ("aten::bmm", "aten::baddbmm") else 2
    if len(a) != rank or len(b) != rank or a[-1] != b[-2] or (rank == 3 and a[0] != b[0]):
        return None
    types = args.get("Input type") or []
    dtype = str(types[ia]) if isinstance(types, list) and ia < len(types) else ""
    # addmm's and baddbmm's self is always a tensor; beta 0 leaves it out (PyTorch skips it)
    beta = _scalar(args.get("Concrete Inputs"), ibeta, 1.0) if iadd is not None else 0.0
    bias = iadd is not None and beta != 0.0
    addend = _shape(dims, iadd) if bias and iadd is not None else ()
    return GemmProblem(
        op.name, mode_of(dtype), a[-2], b[-1], a[-1], a[0] if rank == 3 else 1,
        _shape(strides, ia), _shape(strides, ib), bias, beta,
        addend, _shape(strides, iadd) if addend and iadd is not None else (),
    )  # fmt: skip


def mode_of(dtype: str) -> str:
    """PyTorch's dtype name as this tool's mode; an unknown one keeps a readable name."""
    return MODES.get(dtype) or dtype.removeprefix("c10::") or "unknown"


def _shape(values: list[Any], index: int) -> tuple[int, ...]:
    item = values[index] if index < len(values) else None
    if not isinstance(item, list) or not all(isinstance(v, int) for v in item):
        return ()
    return tuple(item)


def _scalar(values: Any, index: int | None, default: float) -> float:
    try:
        return float(values[index])
    except (IndexError, TypeError, ValueError):
        return default


# ---------------------------------------------------------------------------------------------
# Attribution: kernels to GEMM ops, through correlation ids.


@dataclass(frozen=True)
class GemmCall:
    """One leaf GEMM op of the trace: its problem, the kernels that did its GEMM, the other GPU
    work launched inside it or its container (`aux`), and its containers' names (`via`)."""

    problem: GemmProblem
    op: CpuOp
    kernels: tuple[GpuActivity, ...]
    aux: tuple[GpuActivity, ...] = ()
    via: tuple[str, ...] = ()

    @property
    def gpu_ms(self) -> float:
        return sum(k.duration_us for k in self.kernels) / 1e3

    @property
    def aux_ms(self) -> float:
        return sum(k.duration_us for k in self.aux) / 1e3


class _Attributed(NamedTuple):
    gemm: int  # index into trace.ops of the innermost GEMM op holding the launch
    direct: bool  # launched by that op itself, not inside an op it called
    launch: Launch


def gemm_calls(trace: Trace) -> list[GemmCall]:
    """Every leaf GEMM op with a recorded problem, each with its kernels (module docstring)."""
    parent: dict[int, int] = {}
    attributed: list[_Attributed] = []
    for ops, launches in _by_thread(trace):
        attributed += _sweep(trace.ops, ops, launches, parent)
    children: dict[int, list[int]] = defaultdict(list)
    for child, up in sorted(parent.items(), key=lambda item: trace.ops[item[0]].start):
        children[up].append(child)
    own: dict[int, list[GpuActivity]] = defaultdict(list)
    aux: dict[int, list[GpuActivity]] = defaultdict(list)
    seen: set[int] = set()
    for item in attributed:
        correlation = item.launch.correlation
        activities = trace.activities.get(correlation)
        if not activities or correlation in seen:
            continue
        seen.add(correlation)  # a correlation launched twice (runtime and driver) counts once
        leaf = _leaf(trace.ops, children, item.gemm, item.launch.start)
        if leaf is None:
            continue
        for activity in activities:
            mine = leaf == item.gemm and item.direct and _is_gemm_kernel(activity)
            (own if mine else aux)[leaf].append(activity)
    calls = []
    for index, op in enumerate(trace.ops):
        if op.name not in LEAF_OPS:
            continue
        problem = problem_of(op)
        if problem is not None:
            via = _containers(trace.ops, parent, index)
            calls.append(GemmCall(problem, op, tuple(own[index]), tuple(aux[index]), via))
    return calls


def _by_thread(trace: Trace) -> Iterator[tuple[list[int], list[Launch]]]:
    """Per thread: the indices of its CPU ops, and its launches."""
    ops: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for index, op in enumerate(trace.ops):
        ops[op.thread].append(index)
    launches: dict[tuple[Any, Any], list[Launch]] = defaultdict(list)
    for launch in trace.launches:
        if launch.thread in ops:
            launches[launch.thread].append(launch)
    for thread, indices in ops.items():
        if any(trace.ops[i].name in GEMM_OPS for i in indices):
            yield indices, launches.get(thread, [])


def _sweep(
    all_ops: list[CpuOp], indices: list[int], launches: list[Launch], parent: dict[int, int]
) -> list[_Attributed]:
    """One pass over a thread's ops and launches in time order with a stack of the open ops:
    each launch gets the innermost GEMM op around it, each GEMM op its enclosing GEMM op."""
    order = sorted(indices, key=lambda i: (all_ops[i].start, -all_ops[i].end))
    starts = [all_ops[i].start for i in order]
    # stack entries: (end, op index, innermost GEMM op index at or above it, or -1)
    stack: list[tuple[int, int, int]] = []
    found: list[_Attributed] = []
    pushed = 0

    def open_until(time: int, upto: int) -> None:
        nonlocal pushed
        for position in range(pushed, upto):
            index = order[position]
            op = all_ops[index]
            while stack and stack[-1][0] < op.start:
                stack.pop()
            above = stack[-1][2] if stack else -1
            if op.name in GEMM_OPS:
                if above >= 0:
                    parent[index] = above
                above = index
            stack.append((op.end, index, above))
        pushed = max(pushed, upto)
        while stack and stack[-1][0] < time:
            stack.pop()

    for launch in sorted(launches, key=lambda launch: launch.start):
        open_until(launch.start, bisect.bisect_right(starts, launch.start))
        if stack and stack[-1][2] >= 0:
            _, innermost, gemm = stack[-1]
            found.append(_Attributed(gemm, innermost == gemm, launch))
    open_until(_NEVER, len(order))
    return found


def _leaf(ops: list[CpuOp], children: dict[int, list[int]], index: int, time: int) -> int | None:
    """The leaf GEMM op that work launched at `time` inside op `index` belongs to: the op
    itself, or for a container the GEMM op it calls (first starting after `time`, else last)."""
    while ops[index].name not in LEAF_OPS:
        inner = children.get(index)
        if not inner:
            return None  # a container that ran no GEMM op (matmul of vectors: dot, mv)
        index = next((c for c in inner if ops[c].start >= time), inner[-1])
    return index


def _containers(ops: list[CpuOp], parent: dict[int, int], index: int) -> tuple[str, ...]:
    names = []
    while index in parent:
        index = parent[index]
        names.append(ops[index].name)
    return tuple(reversed(names))


def _is_gemm_kernel(activity: GpuActivity) -> bool:
    return activity.kind == "kernel" and not _PYTORCH_KERNEL.search(activity.name)


# ---------------------------------------------------------------------------------------------
# The table of distinct problems.

PROBLEM_COLUMNS = [
    "op", "via", "mode", "M", "N", "K", "batch", "a_strides", "b_strides", "bias", "beta",
    "cublas_m", "cublas_n", "cublas_k", "cublas_transa", "cublas_transb", "cublas_lda",
    "cublas_ldb", "cublas_stride_a", "cublas_stride_b", "cublas_broadcast", "cublas_beta",
    "cublas_bias",
    "calls", "total_gpu_ms", "mean_gpu_ms", "share", "kernels", "kernel_short", "ctas",
    "aux_kernels", "aux_gpu_ms",
]  # fmt: skip


@dataclass
class _Totals:
    calls: int = 0
    gpu_us: float = 0.0
    aux_us: float = 0.0
    kernels: dict[str, None] = field(default_factory=dict)
    aux: dict[str, None] = field(default_factory=dict)
    via: dict[str, None] = field(default_factory=dict)
    ctas: int = 0


def problems(trace: Trace) -> pd.DataFrame:
    """One row per distinct problem (op, mode, shape, strides, bias, beta): both terms, calls,
    GPU time of its own kernels (total, mean, share of all GEMM time in the trace), the kernels
    (full and short names), the largest grid, and the aux work; most expensive first."""
    totals: dict[GemmProblem, _Totals] = defaultdict(_Totals)
    for call in gemm_calls(trace):
        row = totals[call.problem]
        row.calls += 1
        row.gpu_us += sum(k.duration_us for k in call.kernels)
        row.aux_us += sum(k.duration_us for k in call.aux)
        row.kernels.update(dict.fromkeys(k.name for k in call.kernels))
        row.aux.update(dict.fromkeys(k.name for k in call.aux))
        row.via[" > ".join(call.via)] = None
        row.ctas = max([row.ctas, *(math.prod(k.grid) for k in call.kernels if k.grid)])
    grand = sum(row.gpu_us for row in totals.values())
    rows = [_row(problem, row, grand) for problem, row in totals.items()]
    table = pd.DataFrame(rows, columns=PROBLEM_COLUMNS)
    table = table.sort_values("total_gpu_ms", ascending=False, kind="stable")
    return table.reset_index(drop=True)


def _row(problem: GemmProblem, totals: _Totals, grand_us: float) -> dict[str, Any]:
    terms = problem.cublas_terms()
    return {
        "op": problem.op,
        "via": " | ".join(v or "direct" for v in totals.via) if any(totals.via) else "",
        "mode": problem.mode,
        "M": problem.m,
        "N": problem.n,
        "K": problem.k,
        "batch": problem.batch,
        "a_strides": problem.a_strides,
        "b_strides": problem.b_strides,
        "bias": problem.bias,
        "beta": problem.beta,
        **{f"cublas_{key}": terms[key] for key in _TERMS_SHOWN},
        "cublas_broadcast": problem.shared_operand(),
        "calls": totals.calls,
        "total_gpu_ms": totals.gpu_us / 1e3,
        "mean_gpu_ms": totals.gpu_us / 1e3 / totals.calls,
        "share": totals.gpu_us / grand_us if grand_us > 0 else 0.0,
        "kernels": " + ".join(totals.kernels),
        "kernel_short": _short_names(totals.kernels),
        "ctas": totals.ctas,
        "aux_kernels": _short_names(totals.aux),
        "aux_gpu_ms": totals.aux_us / 1e3,
    }


_TERMS_SHOWN = ("m", "n", "k", "transa", "transb", "lda", "ldb", "stride_a", "stride_b", "beta",
                "bias")  # fmt: skip


def _short_names(names: dict[str, None]) -> str:
    return " + ".join(dict.fromkeys(normalize(name).short for name in names))


def cases_of(trace: Trace, apis: Sequence[str] = ("cublas",)) -> list[Case]:
    """The distinct problems of a trace as sweep cases, in the modes this tool runs."""
    found: list[Case] = []
    for call in gemm_calls(trace):
        if call.problem.mode in MODES.values():
            found += [call.problem.case(api) for api in apis]
    return list(dict.fromkeys(found))


def problems_markdown(trace: Trace, table: pd.DataFrame) -> str:
    """The table for a person: every text through cublas_audit.report.markdown's escaping."""
    from cublas_audit.report.markdown import md_code, md_number, md_table, md_text

    calls = int(table["calls"].sum()) if len(table) else 0
    total = float(table["total_gpu_ms"].sum()) if len(table) else 0.0
    aux = float(table["aux_gpu_ms"].sum()) if len(table) else 0.0
    gpu = f" ({md_text(trace.gpu_name)})" if trace.gpu_name else ""
    lines = [
        "# GEMMs of a PyTorch trace",
        "",
        f"Trace: {md_code(trace.path, in_table=False)}{gpu}",
        "",
        f"{len(table)} distinct problems, {calls} calls, {md_number(total, 3)} ms of GEMM kernels"
        f" (and {md_number(aux, 3)} ms of other GPU work launched inside the GEMM ops: copies,"
        " fills). Shapes in PyTorch's row-major terms (C = A @ B, M x K by K x N) and as cuBLAS"
        " runs them (column-major m x n x k, transa transb, leading dimensions, batch strides).",
        "",
    ]
    if not len(table) and not trace.meta.get("record_shapes"):
        lines += ["No GEMM with recorded shapes: record the trace with record_shapes=True.", ""]
    headers = ["op", "mode", "MxNxK", "batch", "cuBLAS call", "calls", "GPU ms", "ms per call",
               "share", "kernels", "aux"]  # fmt: skip
    rows = [
        [
            md_text(r["op"] + (f" (in {r['via']})" if r["via"] else "")),
            md_text(r["mode"]),
            md_text(f"{r['M']}x{r['N']}x{r['K']}"),
            md_text(r["batch"]),
            md_text(_cublas_text(r)),
            md_text(r["calls"]),
            md_number(r["total_gpu_ms"], 4),
            md_number(r["mean_gpu_ms"], 4),
            md_text(f"{100 * r['share']:.1f} %"),
            md_code(r["kernel_short"]) if r["kernel_short"] else "—",
            md_code(r["aux_kernels"]) if r["aux_kernels"] else "—",
        ]
        for r in table.to_dict("records")
    ]
    return "\n".join(lines) + "\n" + md_table(headers, rows) + "\n"


def _cublas_text(row: Mapping[Any, Any]) -> str:
    text = (
        f"{row['cublas_m']}x{row['cublas_n']}x{row['cublas_k']} "
        f"{row['cublas_transa']}{row['cublas_transb']} lda {row['cublas_lda']} "
        f"ldb {row['cublas_ldb']}"
    )
    if row["batch"] > 1:
        text += f" strides {row['cublas_stride_a']}/{row['cublas_stride_b']}"
    if row["cublas_beta"]:
        text += f" beta {row['cublas_beta']:g}"
    return text + (" bias" if row["cublas_bias"] else "")
