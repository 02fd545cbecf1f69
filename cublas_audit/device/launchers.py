"""One launcher per API: zero-argument callables that run one planned GEMM on the current stream.

`classic` makes the classic cuBLAS call a case names (cublasSgemm, cublasSgemmStridedBatched,
cublasGemmEx, cublasGemmStridedBatchedEx), `loop` the batch as separate cublasSgemm calls, `lt` one
cublasLtMatmul with the heuristic's default (or a given) algorithm, and `reference` the bundled
SGEMM. The probe, the candidate audit and the reference benchmark all launch through these, on
operands from device.operands (its docstring gives the layout). Alpha is 1 and beta 0, host
pointer mode; the host scalars live in the closures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cublas_audit.cases import Case
from cublas_audit.device.operands import Operands
from cublas_audit.modes import mode as mode_of

if TYPE_CHECKING:
    from cublas_audit.device.lt import LtGemm
    from cublas_audit.device.reference.build import Launch

Launcher = Callable[[], None]
OP_N = 0
GEMM_DEFAULT_ALGO = -1


def _blas() -> tuple[Any, int, Any]:
    """CuPy's cuBLAS bindings, this device's handle (host pointer mode), and [alpha, beta]."""
    import cupy
    import numpy
    from cupy_backends.cuda.libs import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.setMathMode(handle, cublas.CUBLAS_DEFAULT_MATH)
    return cublas, handle, numpy.array([1.0, 0.0], dtype=numpy.float32)


def classic(case: Case, ops: Operands) -> Launcher:
    """The classic cuBLAS routine of `case.routine`."""
    blas, h, scalars = _blas()
    m, n, k, batch = case.m, case.n, case.k, case.batch
    alpha = scalars.ctypes.data
    beta = alpha + scalars.itemsize
    a, b, c = ops.a.data.ptr, ops.b.data.ptr, ops.c.data.ptr
    mode = mode_of(case.mode)
    dtype, compute = mode.data_type, mode.compute_type

    def sgemm() -> None:
        blas.sgemm(h, OP_N, OP_N, m, n, k, alpha, a, m, b, k, beta, c, m)

    def sgemm_strided() -> None:
        blas.sgemmStridedBatched(
            h, OP_N, OP_N, m, n, k, alpha, a, m, m * k, b, k, k * n, beta, c, m, m * n, batch
        )

    def gemm_ex() -> None:
        blas.gemmEx(
            h, OP_N, OP_N, m, n, k, alpha, a, dtype, m, b, dtype, k, beta, c, dtype, m,
            compute, GEMM_DEFAULT_ALGO,
        )  # fmt: skip

    def gemm_strided_ex() -> None:
        blas.gemmStridedBatchedEx(
            h, OP_N, OP_N, m, n, k, alpha, a, dtype, m, m * k, b, dtype, k, k * n, beta,
            c, dtype, m, m * n, batch, compute, GEMM_DEFAULT_ALGO,
        )  # fmt: skip

    calls = {
        "cublasSgemm": sgemm,
        "cublasSgemmStridedBatched": sgemm_strided,
        "cublasGemmEx": gemm_ex,
        "cublasGemmStridedBatchedEx": gemm_strided_ex,
    }
    return calls[case.routine]


def loop(case: Case, ops: Operands) -> Launcher:
    """The batch as `batch` separate cublasSgemm calls on consecutive matrices (FP32)."""
    blas, h, scalars = _blas()
    m, n, k = case.m, case.n, case.k
    alpha = scalars.ctypes.data
    beta = alpha + scalars.itemsize
    item = ops.a.itemsize
    calls = [
        (
            ops.a.data.ptr + i * m * k * item,
            ops.b.data.ptr + i * k * n * item,
            ops.c.data.ptr + i * m * n * item,
        )
        for i in range(case.batch)
    ]

    def run() -> None:
        for a, b, c in calls:
            blas.sgemm(h, OP_N, OP_N, m, n, k, alpha, a, m, b, k, beta, c, m)

    return run


def lt(case: Case, ops: Operands, workspace_bytes: int | None = None) -> LtGemm:
    """A cuBLASLt matmul of the case; calling `.run()` (or `.run(candidate)`) launches it. The
    caller closes it (it holds descriptors and a workspace)."""
    from cublas_audit.cases import DEFAULT_WORKSPACE_BYTES
    from cublas_audit.device.lt import LtGemm

    return LtGemm(
        case.mode,
        case.m,
        case.n,
        case.k,
        case.batch,
        ops.a.data.ptr,
        ops.b.data.ptr,
        ops.c.data.ptr,
        workspace_bytes=DEFAULT_WORKSPACE_BYTES if workspace_bytes is None else workspace_bytes,
    )


def reference(case: Case, ops: Operands, out: Any | None = None) -> Launch:
    """The bundled reference SGEMM writing C (or `out`, shaped like C); FP32 only."""
    from cublas_audit.device.reference.build import prepare

    target = ops.c if out is None else out
    return prepare(case.m, case.n, case.k, case.batch, ops.a, ops.b, target)
