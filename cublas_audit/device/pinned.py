"""PinnedGemm: one GEMM problem on a pinned cuBLASLt algorithm, called directly from CuPy or
PyTorch code: a fix applied without TunableOp.

    from cublas_audit.device.pinned import PinnedGemm

    gemm = PinnedGemm.for_matmul(x, w, pin)       # x (M x K) @ w (K x N), row-major, as torch.mm
    gemm(x, w, out=y)                             # one cublasLtMatmul on the current stream
    head = PinnedGemm.for_linear(x, w, pin, bias=True)   # F.linear(x, w, b): x @ w.T + b
    head(x, w, bias=b, out=y)
    PinnedGemm(problem, pin)(a, b, out=c)         # a fix.json problem, in cuBLAS's terms

Everything is built once, in the constructor: descriptors and layouts, the algorithm (`pin`
rebuilt through device.lt_pin and checked by cublasLtMatmulAlgoCheck, or with `pin=None`
cuBLASLt's heuristic default on the same descriptors, which is what a comparison of the two
needs) and one workspace of max(pin.workspace_bytes, workspace_bytes). A pin that needs more
workspace than that is refused (PinRefused) at construction: PyTorch given too little workspace
for a pin silently computes nothing, and this class never does.

A call checks each array against what the GEMM was built for (shape, strides, dtype, device,
the pointer's alignment: OperandMismatch, one line, before anything runs), then launches exactly
one cublasLtMatmul on the current stream of the arrays' framework (torch's current stream for
tensors, CuPy's for CuPy arrays): no synchronisation, and no allocation when `out` (or `c`) is
given, so it can be captured in a CUDA graph (torch.cuda.graph, CuPy's stream capture). Keep the
PinnedGemm alive as long as a graph that captured it: the graph holds its workspace's address.
One PinnedGemm's calls must not run concurrently on two streams: they share the workspace.

The row-major mappings (device.row_major has them with a worked example): `for_matmul(x, w)`
runs Y = X @ W as cuBLAS C^T = W^T X^T (m = N, n = M, k = K, A = W, B = X); `for_linear(x, w)`
runs Y = X @ W^T, W of N x K, as cuBLAS tn (A = W with lda = K, B = X with ldb = K, m = N, n = M).
Their calls take (x, w) in that order; `PinnedGemm(problem)` takes cuBLAS's (a, b), each its
stored column-major matrix as a row-major array (shape (cols, rows), strides (ld, 1)).

It is built on CuPy's current device (its cuBLASLt handle and workspace live there; choose with
`cupy.cuda.Device(i)`): arrays on another device are refused. Forward only: PyTorch's autograd
records nothing. bf16 in CuPy is its 16 bits in uint16 (CuPy has no bfloat16 here), as
device.operands stores it. Nothing GPU-related is imported at module level.
"""

from __future__ import annotations

from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from cublas_audit.device.pinned_arrays import FrameworkArrays, arrays_for, mode_of_array, strided
from cublas_audit.device.row_major import (
    GemmArrays,
    checked,
    cublas_arrays,
    linear_arrays,
    matmul_arrays,
)
from cublas_audit.errors import AuditError, OperandMismatch
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES
from cublas_audit.table.fix_file import Pin, Problem

if TYPE_CHECKING:
    from cublas_audit.device.lt import LtCandidate, LtGemm

# The bias vector's pointer: cuBLASLt is told no alignment for it, so ask what every allocator
# gives (CuPy and PyTorch hand out 256-byte aligned blocks) and what a vector load needs.
BIAS_ALIGNMENT = 16


class PinnedGemm:
    """One problem, one algorithm (the pin, or the heuristic's default), one workspace; calling
    it launches one cublasLtMatmul (module docstring)."""

    def __init__(
        self,
        problem: Problem,
        pin: Pin | None = None,
        workspace_bytes: int | None = None,
        *,
        arrays: GemmArrays | None = None,
    ) -> None:
        from cublas_audit.device.lt import LtGemm

        spec = arrays if arrays is not None else cublas_arrays(problem)
        if spec.problem != checked(problem):
            raise AuditError(f"{problem.name}: the arrays given were mapped for another problem")
        self.problem = problem
        self.pin = pin
        self.gemm: LtGemm = LtGemm(
            problem.case(), 0, 0, 0, workspace_bytes=workspace_for(pin, workspace_bytes)
        )
        try:
            self.algorithm: LtCandidate = self._algorithm()
            self.device = self._device()
        except BaseException:
            self.gemm.close()
            raise
        self.arrays = self._aligned(spec)
        self._c_spec = replace(self.arrays.out, name="c")
        self._algo_ptr = int(self.algorithm.algo.ctypes.data)
        self._swapped = self.arrays.swapped
        self._frameworks: dict[type, FrameworkArrays] = {}
        self._bias_ptr = 0

    # ----- row-major users -----------------------------------------------------------------------
    @classmethod
    def for_matmul(
        cls,
        x: Any,
        w: Any,
        pin: Pin | None = None,
        *,
        mode: str | None = None,
        workspace_bytes: int | None = None,
    ) -> PinnedGemm:
        """Y = X @ W as torch.mm (2-D) or torch.bmm (3-D) runs it, for arrays shaped and strided
        as `x` and `w` (fp32 data runs in mode fp32 unless `mode` says tf32 or bf16x)."""
        mapped = matmul_arrays(_mode(x, w, mode), strided(x), strided(w))
        return cls(mapped.problem, pin, workspace_bytes, arrays=mapped)

    @classmethod
    def for_linear(
        cls,
        x: Any,
        w: Any,
        pin: Pin | None = None,
        *,
        bias: bool = False,
        mode: str | None = None,
        workspace_bytes: int | None = None,
    ) -> PinnedGemm:
        """Y = F.linear(X, W) = X @ W^T (W of N x K; `bias`: calls pass a bias of N values, run
        as cuBLASLt's BIAS epilogue), for arrays shaped and strided as `x` and `w`."""
        mapped = linear_arrays(_mode(x, w, mode), strided(x), strided(w), bias=bias)
        return cls(mapped.problem, pin, workspace_bytes, arrays=mapped)

    # ----- the call ------------------------------------------------------------------------------
    def __call__(self, a: Any, b: Any, c: Any = None, bias: Any = None, out: Any = None) -> Any:
        """out = op(A) @ op(B) (+ beta C) (+ bias), as the GEMM was built: (a, b) are (x, w) for
        `for_matmul` / `for_linear`, cuBLAS's (A, B) otherwise. `out` defaults to `c` (in place),
        else a new array; where beta != 0 and no `c` is given, `out` holds C. Returns `out`."""
        framework = self._frameworks.get(type(a)) or self._framework_of(a)
        arrays = self.arrays
        first = framework.pointer(a, arrays.first)
        second = framework.pointer(b, arrays.second)
        if out is None:
            out = c if c is not None else framework.empty(arrays.out)
        d_ptr = framework.pointer(out, arrays.out)
        c_ptr = d_ptr if c is None else framework.pointer(c, self._c_spec)
        if (bias is None) != (arrays.bias is None):
            raise OperandMismatch(self._bias_words(bias))
        if bias is not None and arrays.bias is not None:
            bias_ptr = framework.pointer(bias, arrays.bias)
            if bias_ptr != self._bias_ptr:  # set only when it changes: a descriptor write
                self.gemm.set_bias(bias_ptr)
                self._bias_ptr = bias_ptr
        a_ptr, b_ptr = (second, first) if self._swapped else (first, second)
        self.gemm.launch(self._algo_ptr, a_ptr, b_ptr, c_ptr, d_ptr, framework.stream())
        return out

    # ----- set-up --------------------------------------------------------------------------------
    def _algorithm(self) -> LtCandidate:
        from cublas_audit.device.lt_pin import pinned_candidate, refused

        if self.pin is None:
            return self.gemm.default()
        candidate = pinned_candidate(self.gemm, self.pin)
        given = self.gemm.workspace_bytes
        if candidate.workspace_bytes > given:
            why = f"it needs {candidate.workspace_bytes} B of workspace, {given} B given"
            raise refused(self.pin, self.gemm, why)
        return candidate

    @staticmethod
    def _device() -> int:
        import cupy

        return int(cupy.cuda.runtime.getDevice())

    def _aligned(self, spec: GemmArrays) -> GemmArrays:
        """The call's specs with the alignment cuBLASLt was told for each pointer (C's and D's
        both bind `out`, which is C where no `c` is given)."""
        told = self.gemm.alignments
        a, b = told["A"], told["B"]
        first, second = (b, a) if spec.swapped else (a, b)
        bias = replace(spec.bias, alignment=BIAS_ALIGNMENT) if spec.bias is not None else None
        return replace(
            spec,
            first=replace(spec.first, alignment=first),
            second=replace(spec.second, alignment=second),
            out=replace(spec.out, alignment=max(told["C"], told["D"])),
            bias=bias,
        )

    def _framework_of(self, a: Any) -> FrameworkArrays:
        framework = arrays_for(a, self.problem.mode, self.device, self._where())
        self._frameworks[type(a)] = framework
        return framework

    def _where(self) -> str:
        return f"PinnedGemm({self.problem.name})"

    def _bias_words(self, bias: Any) -> str:
        if bias is None:
            return f"{self._where()}: built with a bias epilogue, called without a bias"
        return f"{self._where()}: built without a bias epilogue, called with a bias"

    # ----- clean-up ------------------------------------------------------------------------------
    @property
    def workspace_bytes(self) -> int:
        return int(self.gemm.workspace_bytes)

    def close(self) -> None:
        """Frees the descriptors and the workspace; no call (nor captured graph) may follow."""
        self.gemm.close()

    def __enter__(self) -> PinnedGemm:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def workspace_for(pin: Pin | None, requested: int | None) -> int:
    """The one workspace: the heuristic's default gets `requested` (else the tool's default,
    32 MiB, what cuBLAS gives itself on Hopper); a pin gets at least what it recorded."""
    if requested is not None and requested < 0:
        raise AuditError(f"workspace_bytes {requested} is negative")
    if pin is None:
        return DEFAULT_WORKSPACE_BYTES if requested is None else requested
    return max(pin.workspace_bytes, requested or 0)


def _mode(x: Any, w: Any, mode: str | None) -> str:
    """The mode the arrays' dtype implies (or `mode`, if their dtype stores it)."""
    found = mode_of_array(x)
    if mode_of_array(w) != found:
        raise AuditError(f"x and w have different dtypes ({x.dtype} and {w.dtype})")
    if mode is None:
        return found
    from cublas_audit.planning.modes import mode as mode_spec

    try:
        stores_same = mode_spec(mode).storage == mode_spec(found).storage
    except KeyError as exc:
        raise AuditError(str(exc.args[0])) from None
    if not stores_same:
        raise AuditError(f"mode {mode} does not compute on {x.dtype} data")
    return mode
