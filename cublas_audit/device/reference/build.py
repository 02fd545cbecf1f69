"""The reference SGEMM on the GPU: specialize the CUDA source, compile it with CuPy, launch it.

Layout is the probe's (column-major, cuBLAS "nn"): for a problem (m, n, k, batch), `a` is a float32
CuPy array of shape (batch, k, m), `b` (batch, n, k) and `c` (batch, n, m), all C-contiguous.

Each problem gets a source with M, N, K and the tile parameters as #defines, compiled once per
process (and once per machine: CuPy keeps compiled cubins in its kernel cache, keyed by the full
source). The batch count is the grid's z extent, so every batch count of a problem shares a module.
CuPy and cuda-bindings are imported inside the functions: this module imports anywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cublas_audit.device.reference.config import (
    KERNEL_NAMES,
    AccLayout,
    Config,
    fit,
    strategy_for,
    units_for,
)
from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.resources import shipped

SOURCES = {"tma": "sgemm_tma.cu", "cpasync": "sgemm_cpasync.cu"}
COMMON_HEADER = "sgemm_common.cuh"
ZERO_KERNEL = "cublas_audit_ref_zero_tiles"


# ----- source and compilation --------------------------------------------------------------------


def source_for(config: Config, m: int, n: int, k: int) -> str:
    """A self-contained source: the problem's #defines, then the kernel with its header inlined
    (inlined rather than #included so that CuPy's cache key, the source text, changes with it)."""
    values = {
        "M": m,
        "N": n,
        "K": k,
        "BM": config.bm,
        "BN": config.bn,
        "BK": config.bk,
        "TM": config.tm,
        "TN": config.tn,
        "STAGES": config.stages,
        "SWIZZLE": config.swizzle,
        "MIN_BLOCKS": config.min_blocks,
        "VEC": config.vec,
        "ORDER": config.order,
    }
    layout = AccLayout.parse(config.acc_layout)
    if layout is not None:  # an unknown layout is reported by Config.problems()
        values |= layout.defines(config.tm, config.tn)
    defines = "".join(f"#define {name} {value}\n" for name, value in values.items())
    kernels = shipped("reference_kernels")
    header = (kernels / COMMON_HEADER).read_text()
    body = (kernels / SOURCES[config.kernel]).read_text()
    return defines + body.replace(f'#include "{COMMON_HEADER}"', header)


@dataclass(frozen=True)
class Kernels:
    """One compiled specialization: the SGEMM and the kernel that zeroes the tiles it splits."""

    sgemm: Any
    zero: Any


@functools.lru_cache(maxsize=256)
def _kernel(source: str, name: str, smem_bytes: int) -> Kernels:
    import cupy

    # CuPy adds -arch=sm_<cc> (cubin) itself; TMA and mbarrier need only plain sm_90.
    module = cupy.RawModule(code=source, options=("-std=c++17",))
    kernel = module.get_function(name)
    if smem_bytes > 48 * 1024:  # above 48 KB a kernel must opt in to more dynamic shared memory
        kernel.max_dynamic_shared_size_bytes = smem_bytes
    return Kernels(kernel, module.get_function(ZERO_KERNEL))


def build(config: Config, m: int, n: int, k: int) -> Kernels:
    """The compiled kernels of one specialization (cached in the process and on disk)."""
    require_gpu()
    return _kernel(source_for(config, m, n, k), KERNEL_NAMES[config.kernel], config.smem_bytes)


def resident_ctas(kernel: Any, threads: int, smem_bytes: int) -> int:
    """CTAs of this kernel the whole GPU holds at once (the driver's occupancy calculation)."""
    from cuda.bindings import driver

    cupy = require_gpu()
    err, per_sm = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        driver.CUfunction(kernel.kernel.ptr), threads, smem_bytes
    )
    if err != driver.CUresult.CUDA_SUCCESS or per_sm < 1:
        raise AuditError(f"the reference kernel cannot be resident on this GPU ({err})")
    return int(per_sm) * int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def build_all(specializations: Iterable[tuple[Config, int, int, int]], workers: int = 8) -> None:
    """Builds (config, m, n, k) specializations at once: NVRTC runs outside the GIL, so a cold
    kernel cache costs one compile's time per `workers` modules, not one per module. A build that
    fails is left for its first use to meet again and report."""

    def attempt(item: tuple[Config, int, int, int]) -> None:
        with contextlib.suppress(Exception):
            build(*item)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(attempt, set(specializations)))


def precompile(problems: Iterable[tuple[int, int, int, int]]) -> None:
    """Builds the strategy table's specialization of every (m, n, k, batch): a sweep's first,
    cold-cache run compiles in parallel, not case by case."""
    cc = device_cc()
    build_all((strategy_for(cc, m, n, k, batch), m, n, k) for m, n, k, batch in problems)


def require_gpu() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise ToolMissingError(f"the reference kernel needs cupy ({exc})") from exc
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise ToolMissingError("the reference kernel needs a CUDA GPU; none is visible")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise ToolMissingError(f"the reference kernel needs a CUDA GPU: {exc}") from exc
    return cupy


def device_cc() -> str:
    return str(require_gpu().cuda.Device().compute_capability)


# ----- launch ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """A prepared reference call on the current CuPy stream. Calling it computes c = a x b:
    `zero` clears the tiles that receive partial sums (nothing when no tile is split), then
    `sgemm` runs the kernel; a profiler can take the two apart to see the SGEMM alone."""

    zero: Callable[[], None]
    sgemm: Callable[[], None]

    def __call__(self) -> None:
        self.zero()
        self.sgemm()


def prepare(
    m: int, n: int, k: int, batch: int, a: Any, b: Any, c: Any, config: Config | None = None
) -> Launch:
    """The launcher computing c = a x b."""
    import numpy

    cupy = require_gpu()
    _check_operands(m, n, k, batch, a, b, c)
    cc = device_cc()
    config = fit(config, cc, m, n, k) if config else strategy_for(cc, m, n, k, batch)
    limit = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    if config.smem_bytes > limit:
        raise AuditError(f"{config.label()} needs {config.smem_bytes} B of shared memory > {limit}")
    kernels = build(config, m, n, k)
    tiles = -(-m // config.bm) * -(-n // config.bn) * batch
    slots = resident_ctas(kernels.sgemm, config.threads, config.smem_bytes)
    units = units_for(config, tiles, k, slots)
    if config.kernel == "tma":
        operands: tuple[Any, ...] = (
            _tensor_map(a.data.ptr, (m, k, batch), (config.bm, config.bk)),
            _tensor_map(b.data.ptr, (k, n, batch), (config.bk, config.bn)),
            c,
        )
    else:
        operands = (a, b, c)
    args = (*operands, numpy.int32(units.whole), numpy.int32(units.split))
    zero_args = (c, numpy.int32(units.whole))

    def zero() -> None:
        if units.zeroed:
            kernels.zero((units.zeroed,), (256,), zero_args)

    def sgemm() -> None:
        kernels.sgemm((units.ctas,), (config.threads,), args, shared_mem=config.smem_bytes)

    return Launch(zero, sgemm)


def _check_operands(m: int, n: int, k: int, batch: int, a: Any, b: Any, c: Any) -> None:
    for name, array, shape in (
        ("a", a, (batch, k, m)),
        ("b", b, (batch, n, k)),
        ("c", c, (batch, n, m)),
    ):
        if tuple(array.shape) != shape or array.dtype.name != "float32":
            raise AuditError(f"{name}: expected float32 {shape}, got {array.dtype} {array.shape}")
        if not array.flags.c_contiguous:
            raise AuditError(f"{name}: must be C-contiguous")


def _tensor_map(ptr: int, dims: tuple[int, int, int], box: tuple[int, int]) -> Any:
    """A 3-D FP32 tensor map (rows, columns, batch) of a column-major batch, as the 128 raw bytes
    that the kernel's __grid_constant__ parameter takes by value (a one-element numpy array is
    passed by value by CuPy's launcher)."""
    import numpy

    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise ToolMissingError(f"the TMA reference kernel needs cuda-bindings ({exc})") from exc
    rows, cols, _ = dims
    strides = (rows * 4, rows * cols * 4)  # bytes, of dims 1 and 2
    err, tmap = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        3,
        ptr,
        [driver.cuuint64_t(d) for d in dims],
        [driver.cuuint64_t(s) for s in strides],
        [driver.cuuint32_t(x) for x in (*box, 1)],
        [driver.cuuint32_t(1)] * 3,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != driver.CUresult.CUDA_SUCCESS:
        raise AuditError(f"cuTensorMapEncodeTiled{(dims, box)} failed: {err}")
    raw = ctypes.string_at(tmap.getPtr(), 128)
    return numpy.frombuffer(raw, dtype=numpy.dtype((numpy.void, 128))).copy()
