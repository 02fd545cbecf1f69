"""One launcher per API: zero-argument callables that run one planned GEMM on the current stream.

`classic` makes the classic cuBLAS call a case names (cublasSgemm, cublasSgemmStridedBatched,
cublasGemmEx, cublasGemmStridedBatchedEx), `loop` the batch as separate cublasSgemm calls, `lt` one
cublasLtMatmul with the heuristic's default (or a given) algorithm, and `reference` the bundled
SGEMM. The probe, the candidate audit and the reference benchmark all launch through these, on
operands from device.operands (its docstring gives the layout): transposes, leading dimensions
and batch strides (0 for a broadcast operand) come from the case. Alpha is 1 and beta the case's,
host pointer mode: cuBLAS reads them through a pointer at every call, so each launcher keeps its
scalar array alive (`_Scalars`); a launcher that kept only the pointer read freed memory once
the array was collected, and cuBLAS then dispatched its beta != 0 kernel ("_bx_" instead of
"_bz_" in nvjet names) with whatever beta it found, as CUPTI showed on the H100.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from cublas_audit.device.operands import Operands
from cublas_audit.planning.cases import Case
from cublas_audit.planning.modes import mode as mode_of

if TYPE_CHECKING:
    from cublas_audit.device.lt import LtGemm
    from cublas_audit.device.reference.build import Launch

Launcher = Callable[[], None]
OPERATION = {"n": 0, "t": 1}  # cublasOperation_t
GEMM_DEFAULT_ALGO = -1


class _Scalars:
    """[alpha, beta] in host memory, with the pointers cuBLAS reads them through: a launcher
    holds this object, so the memory lives as long as the launcher."""

    def __init__(self, beta: float) -> None:
        import numpy

        self.values = numpy.array([1.0, beta], dtype=numpy.float32)
        self.alpha = int(self.values.ctypes.data)
        self.beta = self.alpha + self.values.itemsize


def _blas(beta: float = 0.0) -> tuple[Any, int, _Scalars]:
    """CuPy's cuBLAS bindings, this device's handle (host pointer mode), and [alpha, beta]."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    key = (threading.get_ident(), cupy.cuda.runtime.getDevice())
    handle = _HANDLES.get(key)
    if handle is None:  # CuPy's handle of this thread and device, set up once (the map makes
        # a launcher a problem: looking the handle up cost ~50 us each on the H100's host)
        handle = cupy.cuda.device.get_cublas_handle()
        _HANDLES[key] = handle
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.setMathMode(handle, cublas.CUBLAS_DEFAULT_MATH)
    return cublas, handle, _Scalars(beta)


_HANDLES: dict[tuple[int, int], int] = {}


ROUTINES = (  # a ClassicCall's `routine` indexes this (also in data/heuristic_warm.c)
    "cublasSgemm",
    "cublasSgemmStridedBatched",
    "cublasGemmEx",
    "cublasGemmStridedBatchedEx",
)


class ClassicCall(NamedTuple):
    """Every argument of a case's classic cuBLAS call but the handle and alpha (1): what the
    launcher passes, and what device.heuristic_warm hands cuBLAS ahead of it (a named tuple:
    the map makes one a problem on its one thread, 262,144 a full grid)."""

    routine: int  # index into ROUTINES
    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    batch: int
    data_type: int
    compute_type: int
    stride_a: int
    stride_b: int
    stride_c: int
    a: int
    b: int
    c: int
    beta: float


def classic_call(case: Case, a: int, b: int, c: int) -> ClassicCall | None:
    """The classic call of `case` on operands at device addresses a, b and c (None where the
    case is not one: cuBLASLt, or a batch looped as separate calls)."""
    if case.api == "cublasLt" or case.loop or case.routine not in ROUTINES:
        return None
    la, lb = case.operand("a"), case.operand("b")
    mode = mode_of(case.mode)
    return ClassicCall(
        ROUTINES.index(case.routine), OPERATION[case.transa], OPERATION[case.transb],
        case.m, case.n, case.k, la.ld, lb.ld, case.m, case.batch, mode.data_type,
        mode.compute_type, la.stride, lb.stride, case.m * case.n, a, b, c, case.beta,
    )  # fmt: skip


def classic(case: Case, ops: Operands) -> Launcher:
    """The classic cuBLAS routine of `case.routine`."""
    blas, h, scalars = _blas(case.beta)
    call = classic_call(case, ops.a.data.ptr, ops.b.data.ptr, ops.c.data.ptr)
    assert call is not None, case.routine  # the probe sends cuBLASLt and loops elsewhere
    ta, tb, m, n, k, batch = call.transa, call.transb, call.m, call.n, call.k, call.batch
    lda, ldb, ldc = call.lda, call.ldb, call.ldc
    sa, sb, sc = call.stride_a, call.stride_b, call.stride_c
    alpha, beta = scalars.alpha, scalars.beta
    a, b, c = call.a, call.b, call.c
    dtype, compute = call.data_type, call.compute_type

    def sgemm() -> None:
        blas.sgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def sgemm_strided() -> None:
        blas.sgemmStridedBatched(
            h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch
        )

    def gemm_ex() -> None:
        blas.gemmEx(
            h, ta, tb, m, n, k, alpha, a, dtype, lda, b, dtype, ldb, beta, c, dtype, ldc,
            compute, GEMM_DEFAULT_ALGO,
        )  # fmt: skip

    def gemm_strided_ex() -> None:
        blas.gemmStridedBatchedEx(
            h, ta, tb, m, n, k, alpha, a, dtype, lda, sa, b, dtype, ldb, sb,
            beta, c, dtype, ldc, sc, batch, compute, GEMM_DEFAULT_ALGO,
        )  # fmt: skip

    calls = (sgemm, sgemm_strided, gemm_ex, gemm_strided_ex)
    return _Holding(calls[call.routine], scalars)


def loop(case: Case, ops: Operands) -> Launcher:
    """The batch as `batch` separate cublasSgemm calls on consecutive matrices (FP32)."""
    blas, h, scalars = _blas(case.beta)
    m, n, k = case.m, case.n, case.k
    ta, tb = OPERATION[case.transa], OPERATION[case.transb]
    la, lb = case.operand("a"), case.operand("b")
    alpha, beta = scalars.alpha, scalars.beta
    item = ops.a.itemsize
    calls = [
        (
            ops.a.data.ptr + i * la.stride * item,
            ops.b.data.ptr + i * lb.stride * item,
            ops.c.data.ptr + i * m * n * item,
        )
        for i in range(case.batch)
    ]

    def run() -> None:
        for a, b, c in calls:
            blas.sgemm(h, ta, tb, m, n, k, alpha, a, la.ld, b, lb.ld, beta, c, m)

    return _Holding(run, scalars)


class _Holding:
    """A launcher that owns what its call reads through pointers."""

    def __init__(self, launch: Launcher, scalars: _Scalars) -> None:
        self.launch = launch
        self.scalars = scalars

    def __call__(self) -> None:
        self.launch()


def lt(case: Case, ops: Operands, workspace_bytes: int | None = None) -> LtGemm:
    """A cuBLASLt matmul of the case; calling `.run()` (or `.run(candidate)`) launches it. The
    caller closes it (it holds descriptors and a workspace). The workspace is `workspace_bytes`,
    else the case's limit, else the default."""
    from cublas_audit.device.lt import LtGemm

    if workspace_bytes is None:
        workspace_bytes = case.workspace_limit()
    bias = ops.bias.data.ptr if ops.bias is not None else 0
    return LtGemm(
        case,
        ops.a.data.ptr,
        ops.b.data.ptr,
        ops.c.data.ptr,
        bias_ptr=bias,
        workspace_bytes=workspace_bytes,
    )


def reference(case: Case, ops: Operands, out: Any | None = None) -> Launch:
    """The bundled reference SGEMM writing C (or `out`, shaped like C); FP32 only."""
    from cublas_audit.device.reference.build import prepare

    target = ops.c if out is None else out
    return prepare(case.m, case.n, case.k, case.batch, ops.a, ops.b, target)
