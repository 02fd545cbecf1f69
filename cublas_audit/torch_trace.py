"""PyTorch profiler traces: the GEMMs a model really ran, with the cuBLAS kernels each launched.

A trace from `torch.profiler.profile(record_shapes=True)` exported as a Chrome trace (plain or
gzipped) holds each `aten::mm/addmm/bmm/baddbmm/matmul/linear` call as a CPU-op event with its
"Input Dims", "Input Strides", "Input type" and "Concrete Inputs" (scalars such as beta), each
CUDA launch as a runtime or driver event with a `correlation` id, and each kernel with the same
`correlation` id, its duration, grid and block. A kernel belongs to the innermost GEMM op whose
time span holds its launch on the same thread (`matmul` and `linear` enclose the `mm`/`addmm`
that does the work): attributed through correlation ids, never by order. No torch, no GPU.

From row-major PyTorch to column-major cuBLAS (what PyTorch issues): C (M x N) = A (M x K) @
B (K x N) is computed as C^T = B^T A^T, so cuBLAS's m = N, n = M, k = K, cuBLAS's A is torch's B
and cuBLAS's B is torch's A. A torch operand with unit stride along its last dimension is
cuBLAS's "n" with leading dimension its first stride; one with unit stride along its first
dimension (a transposed view, `W.t()`) is "t" with leading dimension its second stride. A batch
stride of 0 (`expand`) is a broadcast operand. Worked example: `x @ w.t()` with x (512 x 256,
strides [256, 1]) and w (384 x 256): torch's B = w.t() is 256 x 384 with strides [1, 256], so
cuBLAS runs m = 384, n = 512, k = 256, transa "t" (lda 256), transb "n" (ldb 256): layout `tn`.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.cases import Case
from cublas_audit.errors import AuditError
from cublas_audit.kernels import normalize

GEMM_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::_addmm_activation",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
)
# PyTorch's dtype names -> this tool's modes (FP32 data is `fp32`: the trace does not say
# whether TF32 was allowed).
MODES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Operand:
    """One matrix operand as recorded: its dims and strides (batch first where 3-D)."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM in PyTorch's row-major terms: C (M x N) = A (M x K) @ B (K x N), `batch` times."""

    op: str
    mode: str
    m: int
    n: int
    k: int
    batch: int
    a: Operand
    b: Operand
    bias: bool = False
    beta: float = 0.0

    def cublas_terms(self) -> dict[str, Any]:
        """The column-major call PyTorch makes (module docstring): cuBLAS's A is torch's B."""
        transa, lda = _trans_ld(self.b, rows=self.n)
        transb, ldb = _trans_ld(self.a, rows=self.k)
        shared = [letter for letter, x in (("a", self.b), ("b", self.a)) if _batch_stride(x) == 0]
        stride_a, stride_b = _batch_stride(self.b), _batch_stride(self.a)
        return {
            "m": self.n,
            "n": self.m,
            "k": self.k,
            "batch": self.batch,
            "transa": transa,
            "transb": transb,
            "lda": lda,
            "ldb": ldb,
            "stride_a": stride_a,
            "stride_b": stride_b,
            "broadcast": shared[0] if self.batch > 1 and shared else "",
            "beta": self.beta,
            "bias": self.bias,
            "mode": self.mode,
        }

    def case(self, api: str = "cublas") -> Case:
        """The sweep's case for this problem (packed leading dimensions as 0)."""
        terms = self.cublas_terms()
        packed_a = terms["m"] if terms["transa"] == "n" else terms["k"]
        packed_b = terms["k"] if terms["transb"] == "n" else terms["n"]
        return Case(
            api,
            self.mode,
            terms["m"],
            terms["n"],
            terms["k"],
            self.batch,
            terms["transa"],
            terms["transb"],
            lda=0 if terms["lda"] == packed_a else terms["lda"],
            ldb=0 if terms["ldb"] == packed_b else terms["ldb"],
            broadcast=terms["broadcast"],
            beta=self.beta if not self.bias else 0.0,
            strided=self.op in ("aten::bmm", "aten::baddbmm") and self.batch == 1,
            bias=self.bias and api == "cublasLt",
        )


@dataclass
class Trace:
    path: Path
    events: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sm_count(self) -> int | None:
        devices = self.meta.get("deviceProperties") or []
        counts = [d.get("numSms") for d in devices if isinstance(d, dict)]
        return int(counts[0]) if counts and counts[0] else None

    @property
    def gpu_name(self) -> str:
        devices = self.meta.get("deviceProperties") or []
        names = [d.get("name") for d in devices if isinstance(d, dict)]
        return str(names[0]) if names and names[0] else ""


@dataclass(frozen=True)
class GemmCall:
    """One GEMM op of the trace and the kernels attributed to it."""

    problem: GemmProblem
    kernels: tuple[dict[str, Any], ...]

    @property
    def gpu_ms(self) -> float:
        return sum(float(k.get("dur", 0.0)) for k in self.kernels) / 1e3


def read_trace(path: Path) -> Trace:
    """A Chrome trace from torch.profiler, plain or gzipped (told apart by its first bytes)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == GZIP_MAGIC else raw
        data = json.loads(text)
    except FileNotFoundError:
        raise AuditError(f"{path}: no such trace file") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise AuditError(f"{path}: cannot read the trace ({exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AuditError(f"{path}: not a JSON trace ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise AuditError(f"{path}: not a PyTorch profiler trace (no traceEvents list)")
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    return Trace(path, [e for e in events if isinstance(e, dict)], meta)


def gemm_calls(trace: Trace) -> list[GemmCall]:
    """Every GEMM op of the trace with the kernels launched inside it (innermost op wins)."""
    kernels = {
        _correlation(e): e for e in trace.events if e.get("cat") == "kernel" and _correlation(e)
    }
    ops_by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    launches_by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for event in trace.events:
        category = event.get("cat")
        if category == "cpu_op" and event.get("name") in GEMM_OPS and "dur" in event:
            ops_by_thread[(event.get("pid"), event.get("tid"))].append(event)
        elif category in LAUNCH_CATEGORIES and _correlation(event) in kernels:
            launches_by_thread[(event.get("pid"), event.get("tid"))].append(event)
    attributed: dict[int, list[dict[str, Any]]] = defaultdict(list)
    ops: dict[int, dict[str, Any]] = {}
    for thread, thread_ops in ops_by_thread.items():
        for op, launch in _innermost(thread_ops, launches_by_thread.get(thread, [])):
            ops[id(op)] = op
            attributed[id(op)].append(kernels[_correlation(launch)])
    calls = []
    for key, op in ops.items():
        problem = problem_of(op)
        if problem is not None:
            calls.append(GemmCall(problem, tuple(attributed[key])))
    return calls


def _innermost(
    ops: list[dict[str, Any]], launches: list[dict[str, Any]]
) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    """(op, launch) for each launch inside a GEMM op: the innermost op open at the launch. One
    sweep in time order with a stack of open ops (ops on one thread nest), so a trace of many
    launches outside any GEMM costs no more than one inside."""
    timeline = sorted(
        [(float(op["ts"]), 0, index) for index, op in enumerate(ops)]
        + [(float(launch.get("ts", math.nan)), 1, index) for index, launch in enumerate(launches)]
    )
    open_ops: list[tuple[float, dict[str, Any]]] = []  # (end, op), innermost last
    for at, kind, index in timeline:
        while open_ops and open_ops[-1][0] < at:
            open_ops.pop()
        if kind == 0:
            op = ops[index]
            open_ops.append((at + float(op["dur"]), op))
        elif open_ops:
            yield open_ops[-1][1], launches[index]


def problem_of(op: dict[str, Any]) -> GemmProblem | None:
    """The GEMM an op computed, from its recorded inputs; None where they do not say."""
    args = op.get("args") or {}
    dims, strides = args.get("Input Dims") or [], args.get("Input Strides") or []
    types, scalars = args.get("Input type") or [], args.get("Concrete Inputs") or []
    name = str(op.get("name"))
    matrices = {
        "aten::mm": (0, 1, None),
        "aten::bmm": (0, 1, None),
        "aten::addmm": (1, 2, 0),
        "aten::_addmm_activation": (1, 2, 0),
        "aten::baddbmm": (1, 2, 0),
        "aten::matmul": (0, 1, None),
        "aten::linear": (0, 1, 2),
    }.get(name)
    if matrices is None or len(dims) <= max(i for i in matrices[:2]):
        return None
    ia, ib, ibias = matrices
    a = Operand(tuple(dims[ia]), tuple(strides[ia]) if ia < len(strides) else ())
    b = Operand(tuple(dims[ib]), tuple(strides[ib]) if ib < len(strides) else ())
    if name == "aten::linear":  # y = x @ W^T: torch's B is W transposed
        b = Operand(tuple(reversed(b.dims)), tuple(reversed(b.strides)))
        a = _flattened(a)
    if len(a.dims) != len(b.dims) or len(a.dims) not in (2, 3):
        return None
    batch = a.dims[0] if len(a.dims) == 3 else 1
    m, k = a.dims[-2], a.dims[-1]
    n = b.dims[-1]
    mode = MODES.get(str(types[ia]) if ia < len(types) else "", str(types[ia]) if types else "?")
    bias = ibias is not None and ibias < len(dims) and bool(dims[ibias])
    beta = _scalar(scalars, 3, 1.0) if name in ("aten::addmm", "aten::baddbmm") else 0.0
    if name == "aten::baddbmm":
        bias = False  # its C is a full batched matrix: beta * C, not a bias vector
    elif bias:
        beta = 0.0 if name == "aten::linear" else beta
    return GemmProblem(name, mode, m, n, k, batch, a, b, bias, beta)


def problems(trace: Trace) -> pd.DataFrame:
    """One row per distinct problem: PyTorch's and cuBLAS's terms, calls, GPU time, its share of
    the trace's GEMM time, and the kernels it ran; the most expensive first."""
    rows = []
    for call in gemm_calls(trace):
        p = call.problem
        terms = {f"cublas_{k}": v for k, v in p.cublas_terms().items()}
        rows.append(
            {
                "op": p.op,
                "mode": p.mode,
                "M": p.m,
                "N": p.n,
                "K": p.k,
                "batch": p.batch,
                "bias": p.bias,
                "beta": p.beta,
                "a_strides": str(list(p.a.strides)),
                "b_strides": str(list(p.b.strides)),
                **terms,
                "gpu_ms": call.gpu_ms,
                "kernels": " + ".join(dict.fromkeys(str(k.get("name")) for k in call.kernels)),
                "ctas": max((_grid(k) for k in call.kernels), default=0),
            }
        )
    if not rows:
        return pd.DataFrame(columns=[*PROBLEM_KEY, "calls", "total_gpu_ms", "share", "kernels"])
    frame = pd.DataFrame(rows)
    grouped = frame.groupby(PROBLEM_KEY, sort=False, dropna=False)
    table = grouped.agg(
        calls=("gpu_ms", "size"),
        total_gpu_ms=("gpu_ms", "sum"),
        kernels=("kernels", lambda names: " | ".join(dict.fromkeys(names))),
        ctas=("ctas", "max"),
    ).reset_index()
    table["mean_gpu_ms"] = table["total_gpu_ms"] / table["calls"]
    total = float(table["total_gpu_ms"].sum())
    table["share"] = table["total_gpu_ms"] / total if total > 0 else 0.0
    table["kernel_short"] = table["kernels"].map(_short_names)
    return table.sort_values("total_gpu_ms", ascending=False, kind="stable").reset_index(drop=True)


PROBLEM_KEY = [
    "op", "mode", "M", "N", "K", "batch", "bias", "beta", "a_strides", "b_strides",
    "cublas_m", "cublas_n", "cublas_k", "cublas_transa", "cublas_transb", "cublas_lda",
    "cublas_ldb", "cublas_broadcast",
]  # fmt: skip


def cases_of(trace: Trace, apis: Sequence[str] = ("cublas",)) -> list[Case]:
    """The distinct problems of a trace as sweep cases (in the modes this tool knows)."""
    found: list[Case] = []
    for call in gemm_calls(trace):
        if call.problem.mode not in MODES.values():
            continue
        found += [call.problem.case(api) for api in apis]
    return list(dict.fromkeys(found))


def _short_names(kernels: str) -> str:
    names = [n for part in kernels.split(" | ") for n in part.split(" + ") if n]
    return " + ".join(dict.fromkeys(normalize(n).short for n in names))


def _correlation(event: dict[str, Any]) -> int:
    args = event.get("args") or {}
    value = args.get("correlation")
    return int(value) if isinstance(value, int | float) else 0


def _grid(kernel: dict[str, Any]) -> int:
    grid = (kernel.get("args") or {}).get("grid") or [0]
    return int(math.prod(int(g) for g in grid))


def _trans_ld(operand: Operand, rows: int) -> tuple[str, int]:
    """cuBLAS's op and leading dimension of a row-major torch operand (module docstring)."""
    strides = operand.strides[-2:]
    if len(strides) < 2:
        return "n", rows
    first, last = strides
    if last == 1 and first >= max(1, operand.dims[-1]):
        return "n", int(first)
    if first == 1:
        return "t", int(last)
    return "n", int(first)


def _batch_stride(operand: Operand) -> int:
    return int(operand.strides[0]) if len(operand.strides) == 3 else 0


def _flattened(operand: Operand) -> Operand:
    """A linear layer's input [..., K] as the 2-D matrix the addmm sees (leading dims folded)."""
    if len(operand.dims) <= 2:
        return operand
    rows = math.prod(operand.dims[:-1])
    return Operand((rows, operand.dims[-1]), operand.strides[-2:])


def _scalar(values: Sequence[Any], index: int, default: float) -> float:
    try:
        return float(values[index])
    except (IndexError, TypeError, ValueError):
        return default
