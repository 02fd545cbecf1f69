"""PyTorch profiler traces: the GEMMs a model really ran, and the cuBLAS kernels each launched.

reader: the streaming read of a Chrome trace (plain or gzipped) into CPU ops, launches and GPU
activities; problems: each GEMM op's problem in PyTorch's and in cuBLAS's terms (the rules and a
worked example are its docstring); attribution: each GEMM op's kernels, through correlation ids
(and the GEMM ops whose dims cannot be read); problem_table: the distinct problems as a table, and
as sweep cases, of a trace that has GEMMs to audit (`gemms` refuses one that has none).
"""

from cublas_audit.observe.torch_trace.attribution import (
    GemmAccount,
    GemmCall,
    UnreadGemm,
    gemm_account,
    gemm_calls,
)
from cublas_audit.observe.torch_trace.problem_table import (
    PROBLEM_COLUMNS,
    cases_of,
    gemms,
    problems,
)
from cublas_audit.observe.torch_trace.problems import GemmProblem, problem_of
from cublas_audit.observe.torch_trace.reader import (
    CONTAINER_OPS,
    GEMM_OPS,
    LEAF_OPS,
    CpuOp,
    GpuActivity,
    Launch,
    Trace,
    read_trace,
)

__all__ = [
    "CONTAINER_OPS",
    "GEMM_OPS",
    "LEAF_OPS",
    "PROBLEM_COLUMNS",
    "CpuOp",
    "GemmAccount",
    "GemmCall",
    "GemmProblem",
    "GpuActivity",
    "Launch",
    "Trace",
    "UnreadGemm",
    "cases_of",
    "gemm_account",
    "gemm_calls",
    "gemms",
    "problem_of",
    "problems",
    "read_trace",
]
