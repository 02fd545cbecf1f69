"""What a pinned GEMM's call takes: the shape and strides of each array, from a problem in
cuBLAS's column-major terms or from a row-major user's matmul or linear layer. Pure: no GPU.

Row-major to cuBLAS, as PyTorch issues it (observe.torch_trace.problems.GemmProblem, whose
rules these are; `swapped`: cuBLAS's A is the user's second operand):

- `torch.mm(X, W)`, Y (M x N) = X (M x K) @ W (K x N): cuBLAS computes C^T = W^T X^T, so
  m = N, n = M, k = K, A = W ('n', lda = N), B = X ('n', ldb = K), ldc = N: layout nn.
- `F.linear(X, W)`, Y = X W^T with W (N x K): A = W read transposed ('t', lda = K), B = X
  ('n', ldb = K), m = N, n = M, ldc = N: layout tn. X may have more leading dimensions
  (batch, tokens, K): they are the M rows, where they collapse into one stride. A bias of N
  values is cuBLASLt's BIAS epilogue.
- `torch.bmm(X, W)` (3-D): the same per batch entry, each operand's batch stride its first
  stride (0 for an `expand`ed, shared one); a bmm whose output has N == 1 is issued unswapped.

Worked example (the LM head of shared/data/tunableop_h100_torch2.14.1_models.csv, TunableOp's
`GemmTunableOp_float_TN,tn_32000_4_2048_ld_2048_2048_32000`): F.linear(X[4, 2048],
W[32000, 2048]) is cuBLAS tn, m = 32000, n = 4, k = 2048, lda = 2048, ldb = 2048, ldc = 32000.

An operand whose strides are no layout cuBLAS reads in place (PyTorch would copy it first) is
refused: a pinned GEMM never copies.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from cublas_audit.errors import AuditError
from cublas_audit.observe.torch_trace.problems import GemmProblem
from cublas_audit.planning.cases import OperandLayout
from cublas_audit.planning.modes import MODES
from cublas_audit.table.fix_file import Problem

# The modes a PyTorch dtype's rules know (GemmProblem's, which name FP32 data fp32 whatever its
# compute type): tf32 and bf16x keep FP32 data.
_DATA_MODE = {"fp32": "fp32", "tf32": "fp32", "bf16x": "fp32", "fp16": "fp16", "bf16": "bf16"}


class Strided(NamedTuple):
    """An array's shape and its strides in elements, as a user hands it."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class ArraySpec:
    """What one argument must be: its shape, its strides in elements (those of size-1 dims do
    not matter), and the byte alignment its pointer must honour (cuBLASLt was told it)."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    alignment: int = 1

    def accepts(self, shape: Sequence[int], strides: Sequence[int]) -> bool:
        if tuple(shape) != self.shape or len(strides) != len(self.strides):
            return False
        pairs = zip(self.shape, strides, self.strides, strict=True)
        return all(size == 1 or got == want for size, got, want in pairs)

    def words(self) -> str:
        return f"shape {list(self.shape)}, strides {list(self.strides)}"


@dataclass(frozen=True)
class GemmArrays:
    """A problem and what its call takes: the first and second argument, the output (and C),
    the bias vector; `swapped`: the first argument is cuBLAS's B (the row-major calls)."""

    problem: Problem
    first: ArraySpec
    second: ArraySpec
    out: ArraySpec
    bias: ArraySpec | None
    swapped: bool = False


def cublas_arrays(problem: Problem) -> GemmArrays:
    """cuBLAS's own terms: each operand is its stored column-major matrix (rows x cols, ld) as a
    row-major array, shape (cols, rows) and strides (ld, 1), with the batch first where the call
    is batched (batch stride 0 for a shared operand: a broadcast view)."""
    checked(problem)
    case = problem.case()

    def stored(name: str, label: str) -> ArraySpec:
        layout = case.operand(name)
        shape: tuple[int, ...] = (layout.cols, layout.rows)
        strides: tuple[int, ...] = (layout.ld, 1)
        if problem.batched:
            shape, strides = (problem.batch, *shape), (layout.stride, *strides)
        return ArraySpec(label, shape, strides)

    bias = ArraySpec("bias", (problem.m,), (1,)) if problem.bias else None
    return GemmArrays(problem, stored("a", "a"), stored("b", "b"), stored("c", "out"), bias)


def checked(problem: Problem) -> Problem:
    """The problem, if its fields describe one cuBLAS call (as fix.json's reader demands)."""
    if problem.mode not in MODES:
        raise AuditError(f"mode {problem.mode!r} is not one of {', '.join(MODES)}")
    if Problem.of_case(problem.case(), problem.layout_known) != problem:
        raise AuditError(f"{problem.name}: its fields do not describe one cuBLAS call")
    return problem


def matmul_arrays(mode: str, x: Strided, w: Strided) -> GemmArrays:
    """torch.mm (2-D) or torch.bmm (3-D) of X and W: Y = X @ W."""
    rank = len(x.shape)
    if rank not in (2, 3) or len(w.shape) != rank:
        raise AuditError(f"matmul of {list(x.shape)} and {list(w.shape)}: 2-D or 3-D, alike")
    (m, k), (k_w, n) = x.shape[-2:], w.shape[-2:]
    batch = x.shape[0] if rank == 3 else 1
    if k != k_w or (rank == 3 and w.shape[0] != batch):
        raise AuditError(f"matmul of {list(x.shape)} and {list(w.shape)}: the shapes differ")
    op = "aten::bmm" if rank == 3 else "aten::mm"
    torch_gemm = GemmProblem(op, _data_mode(mode), m, n, k, batch, x.strides, w.strides)
    out = (batch, m, n) if rank == 3 else (m, n)
    return _row_major(mode, torch_gemm, x, w, w, out)


def linear_arrays(mode: str, x: Strided, w: Strided, bias: bool = False) -> GemmArrays:
    """F.linear(X, W, bias): Y = X @ W^T (+ bias), W of N x K, X of (..., K)."""
    shapes = f"linear of {list(x.shape)} and weight {list(w.shape)}"
    if len(w.shape) != 2 or len(x.shape) < 2 or x.shape[-1] != w.shape[1]:
        raise AuditError(f"{shapes}: not (..., K) and (N, K)")
    n, k = w.shape
    rows = _collapsed(x)
    if rows is None:
        raise AuditError(
            f"{shapes}: the input's leading dimensions (strides {list(x.strides)}) do not "
            "collapse into rows; pass it .contiguous()"
        )
    w_t = Strided((k, n), (w.strides[1], w.strides[0]))  # torch's B is W^T, a view
    torch_gemm = GemmProblem(
        "aten::addmm" if bias else "aten::mm", _data_mode(mode), rows.shape[0], n, k, 1,
        rows.strides, w_t.strides, bias, 1.0 if bias else 0.0, (n,) if bias else (), (1,),
    )  # fmt: skip
    if bias and not torch_gemm.bias_epilogue:
        raise AuditError(
            f"{shapes}: the BIAS epilogue needs M, N and K of at least 2 (PyTorch adds this "
            "bias as C instead)"
        )
    return _row_major(mode, torch_gemm, rows, w_t, w, (*x.shape[:-1], n), x)


def _row_major(
    mode: str,
    torch_gemm: GemmProblem,
    x: Strided,
    w_as_b: Strided,
    w: Strided,
    out: tuple[int, ...],
    x_given: Strided | None = None,
) -> GemmArrays:
    """The problem PyTorch would issue, checked to read X and W where they are (no copy);
    `w_as_b` is torch's B (W itself for matmul, W^T for linear), `x_given` X before its rows
    were collapsed."""
    problem = replace(Problem.of_case(torch_gemm.case("cublasLt")), mode=mode)
    case = problem.case()
    swapped = torch_gemm.swapped
    x_name, w_name = ("b", "a") if swapped else ("a", "b")
    for label, given, name in (("x", x, x_name), ("w", w_as_b, w_name)):
        trans = case.transa if name == "a" else case.transb
        if not _reads_in_place(given, case.operand(name), trans, swapped):
            raise AuditError(
                f"{label}: shape {list(given.shape)}, strides {list(given.strides)} is no "
                f"layout cuBLAS reads in place (PyTorch would copy it); pass it .contiguous()"
            )
    x_spec = x_given or x
    bias = ArraySpec("bias", (problem.m,), (1,)) if problem.bias else None
    return GemmArrays(
        problem,
        ArraySpec("x", x_spec.shape, x_spec.strides),
        ArraySpec("w", w.shape, w.strides),
        ArraySpec("out", out, _contiguous_strides(out)),
        bias,
        swapped,
    )


def _reads_in_place(given: Strided, layout: OperandLayout, trans: str, swapped: bool) -> bool:
    """Whether the user's operand is the memory cuBLAS's operand describes. In the swapped
    call an 'n' operand is the stored column-major matrix read as row-major (strides (ld, 1))
    and a 't' one the matrix itself (strides (1, ld)); unswapped, the other way round."""
    row_major = (trans == "n") == swapped
    matrix = (layout.ld, 1) if row_major else (1, layout.ld)
    expected = (layout.stride, *matrix) if len(given.shape) == 3 else matrix
    return ArraySpec("", given.shape, expected).accepts(given.shape, given.strides)


def _collapsed(x: Strided) -> Strided | None:
    """X (..., K) as its (M, K) rows, where the leading dimensions collapse into one row stride;
    None where they do not. Size-1 dimensions are skipped (their stride means nothing)."""
    pairs = zip(x.shape[:-1], x.strides[:-1], strict=True)
    lead = [(size, stride) for size, stride in pairs if size != 1]
    rows = math.prod(size for size, _ in lead)
    for (_, outer), (size, inner) in itertools.pairwise(lead):
        if outer != inner * size:
            return None
    row_stride = lead[-1][1] if lead else x.shape[-1]
    return Strided((rows, x.shape[-1]), (row_stride, x.strides[-1]))


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _data_mode(mode: str) -> str:
    if mode not in _DATA_MODE:
        raise AuditError(f"mode {mode!r} is not one of {', '.join(_DATA_MODE)}")
    return _DATA_MODE[mode]
