"""A thin cuBLASLt matmul on `nvmath.bindings.cublasLt`: the heuristic's candidates and a launcher.

Column-major: D = C (m x n) = op(A) (m x k) @ op(B) (k x n) + beta C (+ the BIAS epilogue's
vector), `batch` times with strided batches, on device.operands' operands in the case's layout
(cases.Case.operand: transposes, leading dimensions, batch strides, 0 for a broadcast operand).

Nothing GPU-related is imported at module level (nvmath and cupy load on first use), so the
package imports on a machine without CUDA.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any

from cublas_audit.errors import ToolMissingError
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.planning.lt_enums import ALGO_ATTRIBUTES, SPECS, alignment
from cublas_audit.planning.modes import mode as mode_of

_handles: dict[int, int] = {}


@dataclass
class LtCandidate:
    """One heuristic result: the raw algo struct and its decoded configuration.

    Attributes the library does not report (an older cuBLASLt, an attribute not set for this
    algorithm) are None.
    """

    index: int
    algo: Any = field(repr=False)  # numpy array of one cublasLtMatmulAlgo_t
    algo_id: int | None
    tile: str | None
    stages: str | None
    split_k: int | None
    reduction_scheme: str | None
    cta_swizzling: int | None
    cluster_shape: str | None
    custom_option: int | None
    inner_shape: int | None
    workspace_bytes: int
    waves_count: float

    def attributes(self) -> dict[str, Any]:
        """Everything but the raw struct: what a table row or a repro needs."""
        return {
            "index": self.index,
            "algo_id": self.algo_id,
            "tile": self.tile,
            "stages": self.stages,
            "split_k": self.split_k,
            "reduction_scheme": self.reduction_scheme,
            "cta_swizzling": self.cta_swizzling,
            "cluster_shape": self.cluster_shape,
            "custom_option": self.custom_option,
            "inner_shape": self.inner_shape,
            "workspace_bytes": self.workspace_bytes,
            "waves_count": self.waves_count,
        }


def bindings() -> ModuleType:
    """`nvmath.bindings.cublasLt`, or a ToolMissingError naming the extra that installs it."""
    try:
        from nvmath.bindings import cublasLt as module
    except ImportError as exc:
        # nvmath itself missing, or one of its own dependencies (cuda-bindings): say which.
        missing = "" if (exc.name or "nvmath").startswith("nvmath") else f" ({exc})"
        raise ToolMissingError(
            f"nvmath-python is not installed{missing}: pip install 'cublas-audit[gpu]'"
        ) from exc
    lt: ModuleType = module
    return lt


def handle() -> int:
    """One cuBLASLt handle per device, kept for the process: creating one costs milliseconds."""
    import cupy

    device = cupy.cuda.runtime.getDevice()
    if device not in _handles:
        _handles[device] = int(bindings().create())
    return _handles[device]


def _enum_value(name: str) -> int:
    import nvmath
    from nvmath.bindings import cublas

    if name.startswith("CUDA_"):
        return int(nvmath.CudaDataType[name])
    return int(cublas.ComputeType[name])


class LtGemm:
    """Descriptors, layouts and workspace for one problem; `heuristics()` and `run()` on them.

    Pointers of 0 build the descriptors for operands not yet known (a pinned GEMM takes them at
    each call): cuBLASLt is then told the alignment the batch strides allow, at most
    MAX_ALIGNMENT, and `alignments` says what each pointer must honour. With `case.bias` the
    BIAS epilogue is set; its pointer comes with `bias_ptr` or later through `set_bias`.
    """

    def __init__(
        self,
        case: Case,
        a_ptr: int,
        b_ptr: int,
        c_ptr: int,
        bias_ptr: int = 0,
        workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
        stream: int = 0,
    ) -> None:
        mode_of(case.mode)  # an unknown mode is a KeyError naming the known ones, before work
        self.lt = bindings()  # first: a missing nvmath is the clear error, not a cupy one
        import cupy
        import numpy

        self.case = case
        self.mode, self.m, self.n, self.k, self.batch = (
            case.mode, case.m, case.n, case.k, case.batch,
        )  # fmt: skip
        self.ptrs = (a_ptr, b_ptr, c_ptr)
        self.bias_ptr = bias_ptr
        self.stream = stream
        self.workspace_bytes = workspace_bytes
        self.handle = handle()
        self._desc: int | None = None
        self._layouts: list[int] = []
        self._pref: int | None = None
        self._default: LtCandidate | None = None
        self.alpha = numpy.ones(1, dtype=numpy.float32)
        self.beta = numpy.full(1, case.beta, dtype=numpy.float32)
        self.workspace = cupy.cuda.alloc(workspace_bytes) if workspace_bytes > 0 else None
        # Launch arguments as plain ints, read once: numpy's `.ctypes` builds a new object at
        # every access, host time a pinned GEMM's calls should not spend.
        self._alpha_ptr = int(self.alpha.ctypes.data)
        self._beta_ptr = int(self.beta.ctypes.data)
        self._workspace_ptr = int(self.workspace.ptr) if self.workspace is not None else 0
        self.alignments: dict[str, int] = {}
        try:
            self._create_descriptors()
        except Exception:
            self.close()
            raise

    # ----- set-up --------------------------------------------------------------------------------
    def _create_descriptors(self) -> None:
        spec = mode_of(self.mode)
        data_type = _enum_value(spec.data_type_name)
        # The scale type (alpha, beta) is FP32 in every mode: every mode accumulates in FP32.
        self._desc = int(
            self.lt.matmul_desc_create(
                _enum_value(spec.compute_type_name), _enum_value("CUDA_R_32F")
            )
        )
        for name, trans in (("TRANSA", self.case.transa), ("TRANSB", self.case.transb)):
            if trans == "t":
                self._set_desc(name, 1)  # cublasOperation_t: CUBLAS_OP_T
        if self.case.bias:
            self._set_desc("EPILOGUE", int(self.lt.Epilogue.BIAS))
            if self.bias_ptr:
                self.set_bias(self.bias_ptr)
        # (rows, cols, ld, batch stride) of A, B, C; D is C (in place).
        operands = [self.case.operand(name) for name in "abc"]
        for operand in operands:
            layout = int(
                self.lt.matrix_layout_create(data_type, operand.rows, operand.cols, operand.ld)
            )
            self._layouts.append(layout)
            if self.case.batched_call:
                self._set_layout(layout, "BATCH_COUNT", self.batch)
                self._set_layout(layout, "STRIDED_BATCH_OFFSET", operand.stride)
        self._pref = int(self.lt.matmul_preference_create())
        self._set_pref("MAX_WORKSPACE_BYTES", self.workspace_bytes)
        # Every batch entry starts at ptr + i * stride: both set the alignment cuBLASLt can rely
        # on (leading dimensions it checks itself).
        item = spec.element_bytes
        strides = [o.stride * item if self.case.batched_call else 0 for o in operands]
        names = ("A", "B", "C", "D")
        per_matrix = zip(names, (*self.ptrs, self.ptrs[2]), (*strides, strides[2]), strict=True)
        for name, ptr, stride in per_matrix:
            self.alignments[name] = alignment(ptr, stride)
            self._set_pref(f"MIN_ALIGNMENT_{name}_BYTES", self.alignments[name])

    def set_bias(self, ptr: int) -> None:
        """The BIAS epilogue's vector (m values of the data type) for the launches that follow."""
        self._set_desc("BIAS_POINTER", ptr)
        self.bias_ptr = ptr

    def _set_desc(self, name: str, value: int) -> None:
        attr = self.lt.MatmulDescAttribute[name]
        buf = _scalar(self.lt.get_matmul_desc_attribute_dtype(attr), value)
        self.lt.matmul_desc_set_attribute(self._desc, attr, buf.ctypes.data, buf.nbytes)

    def _set_layout(self, layout: int, name: str, value: int) -> None:
        attr = self.lt.MatrixLayoutAttribute[name]
        buf = _scalar(self.lt.get_matrix_layout_attribute_dtype(attr), value)
        self.lt.matrix_layout_set_attribute(layout, attr, buf.ctypes.data, buf.nbytes)

    def _set_pref(self, name: str, value: int) -> None:
        attr = self.lt.MatmulPreferenceAttribute[name]
        buf = _scalar(self.lt.get_matmul_preference_attribute_dtype(attr), value)
        self.lt.matmul_preference_set_attribute(self._pref, attr, buf.ctypes.data, buf.nbytes)

    # ----- heuristic -----------------------------------------------------------------------------
    def heuristics(self, limit: int) -> list[LtCandidate]:
        """The heuristic's candidates, best first: index 0 is what cuBLASLt runs by default."""
        import numpy

        results = numpy.zeros(max(1, limit), dtype=self.lt.matmul_heuristic_result_dtype)
        count = numpy.zeros(1, dtype=numpy.int32)
        a, b, c = self._layouts
        self.lt.matmul_algo_get_heuristic(
            self.handle,
            self._desc,
            a,
            b,
            c,
            c,
            self._pref,
            len(results),
            results.ctypes.data,
            count.ctypes.data,
        )
        return [self._candidate(i, results[i : i + 1]) for i in range(int(count[0]))]

    def _candidate(self, index: int, result: Any) -> LtCandidate:
        import numpy

        # A private copy of the struct: its pointer stays valid for as long as the candidate.
        algo = numpy.ascontiguousarray(result["algo"]).copy()
        workspace = int(result["workspace_size"][0])
        return self.describe(index, algo, workspace, float(result["waves_count"][0]))

    def describe(self, index: int, algo: Any, workspace_bytes: int, waves: float) -> LtCandidate:
        """An algo struct (a numpy array of one cublasLtMatmulAlgo_t, kept by the candidate)
        with its configuration read back from cuBLASLt."""
        get = functools.partial(algo_config_get, self.lt, algo)
        decoded: dict[str, Any] = {}
        for attribute, name in ALGO_ATTRIBUTES:
            value = get(attribute)
            decoded[name] = _enum_name(self.lt, name, value) if name in SPECS else value
        return LtCandidate(
            index=index,
            algo=algo,
            algo_id=get("ID"),
            workspace_bytes=workspace_bytes,
            waves_count=waves,
            **decoded,
        )

    def check(self, algo: Any) -> Any:
        """cublasLtMatmulAlgoCheck of an algo struct on these descriptors: a heuristic result
        (workspace_size, waves_count); cuBLASLt's error where the algorithm cannot run them."""
        import numpy

        result = numpy.zeros(1, dtype=self.lt.matmul_heuristic_result_dtype)
        a, b, c = self._layouts
        ptrs = (algo.ctypes.data, result.ctypes.data)
        self.lt.matmul_algo_check(self.handle, self._desc, a, b, c, c, *ptrs)
        return result

    def default(self) -> LtCandidate:
        """The heuristic's own pick (a limit-1 query), cached: what `run(None)` launches."""
        if self._default is None:
            found = self.heuristics(1)
            if not found:
                raise RuntimeError("cuBLASLt heuristic returned no algorithm for this problem")
            self._default = found[0]
        return self._default

    # ----- launch --------------------------------------------------------------------------------
    def run(self, candidate: LtCandidate | None = None) -> None:
        """Launches one cublasLtMatmul on the stream (asynchronous), C = op(A) @ op(B) + beta C."""
        chosen = candidate if candidate is not None else self.default()
        if chosen.workspace_bytes > self.workspace_bytes:
            raise ValueError(
                f"candidate needs {chosen.workspace_bytes} workspace bytes, "
                f"{self.workspace_bytes} allowed"
            )
        a_ptr, b_ptr, c_ptr = self.ptrs
        self.launch(int(chosen.algo.ctypes.data), a_ptr, b_ptr, c_ptr, c_ptr, self.stream)

    def launch(
        self, algo_ptr: int, a_ptr: int, b_ptr: int, c_ptr: int, d_ptr: int, stream: int
    ) -> None:
        """One cublasLtMatmul, D = op(A) @ op(B) + beta C (D shaped as C), asynchronous, nothing
        checked: the caller has checked the algorithm's workspace and the pointers' alignment."""
        a, b, c = self._layouts
        self.lt.matmul(
            self.handle, self._desc, self._alpha_ptr, a_ptr, a, b_ptr, b, self._beta_ptr,
            c_ptr, c, d_ptr, c, algo_ptr, self._workspace_ptr, self.workspace_bytes, stream,
        )  # fmt: skip

    # ----- clean-up ------------------------------------------------------------------------------
    def close(self) -> None:
        """Frees the descriptors; the handle stays cached for the next problem."""
        for layout in self._layouts:
            self.lt.matrix_layout_destroy(layout)
        self._layouts = []
        if self._pref is not None:
            self.lt.matmul_preference_destroy(self._pref)
            self._pref = None
        if self._desc is not None:
            self.lt.matmul_desc_destroy(self._desc)
            self._desc = None
        self.workspace = None
        self._workspace_ptr = 0

    def __enter__(self) -> LtGemm:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def algo_config_get(lt: ModuleType, algo: Any, name: str) -> int | None:
    """One MatmulAlgoConfigAttribute of an algo struct; None where this cuBLASLt lacks it."""
    import numpy

    attr = getattr(lt.MatmulAlgoConfigAttribute, name, None)
    if attr is None:
        return None
    try:
        buf = numpy.zeros(1, dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
        written = numpy.zeros(1, dtype=numpy.uint64)
        lt.matmul_algo_config_get_attribute(
            algo.ctypes.data, attr, buf.ctypes.data, buf.nbytes, written.ctypes.data
        )
    except Exception:  # an attribute this library version rejects: unknown, not fatal
        return None
    return int(buf[0])


def _enum_name(lt: ModuleType, column: str, value: int | None) -> str | None:
    """MatmulTile 18 -> '128x64', the name the table records (planning.lt_enums.SPECS says which
    enum and prefix); an id this binding does not know keeps its number."""
    if value is None:
        return None
    spec = SPECS[column]
    enum = getattr(lt, spec.nvmath_enum, None)
    try:
        name = str(enum(value).name) if enum is not None else str(value)
    except ValueError:
        return str(value)
    return name.removeprefix(spec.nvmath_prefix)


def _scalar(dtype: Any, value: int) -> Any:
    import numpy

    return numpy.array([value], dtype=dtype)
