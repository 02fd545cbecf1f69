"""The problem of one GEMM op, in PyTorch's row-major terms and in cuBLAS's column-major ones.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from cublas_audit.observe.torch_trace.reader import CpuOp
from cublas_audit.planning.cases import Case

# PyTorch's dtype names -> this tool's modes. FP32 data is `fp32`: the trace does not say whether
# TF32 was allowed (the kernel name does).
MODES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}


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
    def swapped(self) -> bool:
        """Whether cuBLAS's A is torch's B (the row-major output read as column-major C^T):
        always, but for a bmm whose output has N == 1 (baddbmm_out_cuda_impl)."""
        return not self.batched or self.n != 1

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
        swap = self.swapped
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
