"""The compute modes: every per-mode fact in one table (docs/schema.md lists the modes).

A mode names what the GEMM stores and how it accumulates: `fp32` is FP32 data with
CUBLAS_COMPUTE_32F (the classic `cublasSgemm*`), `tf32` and `bf16x` FP32 data with the fast TF32
and BF16 compute types, `fp16` and `bf16` half-width data with FP32 accumulation. Adding a mode
means adding one `Mode` here; everything else (the plan, the probe, cuBLASLt, the checks, the
report and its repro scripts) reads this table.
"""

from __future__ import annotations

from dataclasses import dataclass

# cudaDataType (library_types.h) and cublasComputeType_t (cublas_api.h) values.
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
COMPUTE_32F, COMPUTE_32F_FAST_16BF, COMPUTE_32F_FAST_TF32 = 68, 75, 77


@dataclass(frozen=True)
class Mode:
    name: str
    # How A, B and C live in CuPy: bf16 as the upper 16 bits of float32 (uint16), since CuPy has
    # no bfloat16 dtype.
    storage: str
    data_type: int  # cudaDataType of A, B and C
    data_type_name: str  # its name in nvmath's CudaDataType
    compute_type: int  # cublasComputeType_t
    compute_type_name: str  # its name in nvmath's cublas.ComputeType
    element_bytes: int  # of A, B and C
    # The pipe whose utilization judges the dispatched kernel: FP32 math runs on the FMA pipe,
    # every reduced-precision mode on the tensor cores.
    pipe: str
    # Largest accepted normwise relative error ||C - ref||_F / ||ref||_F against a float64 product
    # of the same stored inputs (device.operands.relative_error): a few units of the mode's input
    # rounding (tf32, bf16x) or output rounding (fp16, bf16) for N(0, 1) data, with room for
    # split-K's different summation order; a wrong kernel is off by order one.
    tolerance: float

    @property
    def is_bf16_bits(self) -> bool:
        return self.storage == "uint16"


MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode("fp32", "float32", CUDA_R_32F, "CUDA_R_32F", COMPUTE_32F, "COMPUTE_32F", 4,
             "FMA-pipe", 3e-5),
        Mode("tf32", "float32", CUDA_R_32F, "CUDA_R_32F", COMPUTE_32F_FAST_TF32,
             "COMPUTE_32F_FAST_TF32", 4, "tensor-pipe", 4e-3),
        Mode("bf16x", "float32", CUDA_R_32F, "CUDA_R_32F", COMPUTE_32F_FAST_16BF,
             "COMPUTE_32F_FAST_16BF", 4, "tensor-pipe", 3e-2),
        Mode("fp16", "float16", CUDA_R_16F, "CUDA_R_16F", COMPUTE_32F, "COMPUTE_32F", 2,
             "tensor-pipe", 4e-3),
        Mode("bf16", "uint16", CUDA_R_16BF, "CUDA_R_16BF", COMPUTE_32F, "COMPUTE_32F", 2,
             "tensor-pipe", 3e-2),
    )
}  # fmt: skip
MODE_NAMES = tuple(MODES)
PIPE_METRICS = {
    "FMA-pipe": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor-pipe": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
}


def mode(name: str) -> Mode:
    """The mode of that name; a KeyError names the known ones."""
    try:
        return MODES[name]
    except KeyError:
        raise KeyError(f"unknown mode {name!r} (known: {', '.join(MODES)})") from None


def pipe_name(name: str) -> str:
    """'FMA-pipe' or 'tensor-pipe'; a mode this table lacks (a foreign table) counts as FMA."""
    known = MODES.get(name)
    return known.pipe if known else "FMA-pipe"
