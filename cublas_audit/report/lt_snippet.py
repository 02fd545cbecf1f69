"""A pin as a standalone C function (templates/lt_pin.c.j2): the exact call (data and compute
types, transposes, leading dimensions, batch strides, beta, the bias epilogue) with the pinned
algorithm rebuilt by cublasLtMatmulAlgoInit and cublasLtMatmulAlgoConfigSetAttribute, checked by
cublasLtMatmulAlgoCheck (which also says the workspace it needs) before cublasLtMatmul.

C compiles as C and as C++ (nvcc -c); tests/test_fix_report.py compiles every example with nvcc
where cuBLAS's header is installed. Text from fix.json reaches the code only inside comments, on
one line and unable to close them, or as an identifier made of [A-Za-z0-9_].
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cublas_audit.planning.lt_enums import lt_enums
from cublas_audit.planning.modes import mode as mode_of
from cublas_audit.report.markdown import template, visible
from cublas_audit.table.fix_file import Fix, Pin, Problem, Stamp

SCALE_TYPE = "CUDA_R_32F"  # every mode accumulates in FP32 (as device.lt sets it)


@dataclass(frozen=True)
class CAttribute:
    """One cublasLtMatmulAlgoConfigSetAttribute call: the attribute, the C type cuBLASLt stores
    it as (cublasLt.h), the variable holding it, its number and, for an enum, its C name."""

    name: str
    c_type: str
    variable: str
    value: int
    comment: str = ""


@dataclass(frozen=True)
class CLayout:
    """One operand's cublasLtMatrixLayoutCreate: stored rows x cols, ld, batch stride."""

    name: str
    rows: int
    cols: int
    ld: int
    stride: int
    words: str


def c_snippet(fix: Fix, stamp: Stamp) -> str:
    """The C source of a pin fix's call with its algorithm, proven on `stamp`."""
    if fix.pin is None:
        raise ValueError(f"fix {fix.id} has no pin to write as C")
    problem, pin, mode = fix.problem, fix.pin, mode_of(fix.problem.mode)
    function = c_identifier(fix.id)
    return template("lt_pin.c.j2").render(
        fix_id=c_comment(fix.id),
        problem=c_comment(problem.name),
        stamp=c_comment(stamp.words()),
        default=c_comment(f"{fix.default.kernel}: {fix.default.ms:.4g} ms"),
        fixed=c_comment(f"{fix.fixed.kernel}: {fix.fixed.ms:.4g} ms"),
        timing=c_comment(fix.timing),
        function=function,
        workspace_macro=f"{function.upper()}_WORKSPACE_BYTES",
        workspace=pin.workspace_bytes,
        bias=problem.bias,
        batched=problem.batched,
        batch=problem.batch,
        beta=f"{float(problem.beta)!r}f",
        transa=_op(problem.transa),
        transb=_op(problem.transb),
        data_type=mode.data_type_name,
        compute_type=f"CUBLAS_{mode.compute_type_name}",
        scale_type=SCALE_TYPE,
        algo_id=pin.algo_id,
        attributes=algo_attributes(pin),
        layouts=c_layouts(problem),
    )


# cublasLtMatmulAlgoConfigSetAttribute's calls after AlgoInit (which sets the id), in
# cublasLt.h's order: (attribute, the C type cuBLASLt stores it as, variable, the Pin's field).
_ATTRIBUTES = (
    ("TILE_ID", "uint32_t", "tile", "tile"),
    ("STAGES_ID", "uint32_t", "stages", "stages"),
    ("SPLITK_NUM", "int32_t", "split_k", "split_k"),
    ("REDUCTION_SCHEME", "uint32_t", "reduction", "reduction_scheme"),
    ("CTA_SWIZZLING", "uint32_t", "swizzle", "cta_swizzling"),
    ("CUSTOM_OPTION", "uint32_t", "custom", "custom_option"),
    ("INNER_SHAPE_ID", "uint16_t", "inner_shape", "inner_shape"),
    ("CLUSTER_SHAPE_ID", "uint16_t", "cluster_shape", "cluster_shape"),
)


def algo_attributes(pin: Pin) -> list[CAttribute]:
    """Every attribute of the pin as cuBLASLt's number; an enum's C name as the comment."""
    attributes = []
    for name, c_type, variable, field in _ATTRIBUTES:
        value = getattr(pin, field)
        enum = lt_enums().get(field)
        comment = ""
        if enum is not None:
            comment = enum.c_name(value) or f"{field} {value}: a number the binding did not name"
            value = enum.number(value)
        attributes.append(
            CAttribute(f"CUBLASLT_ALGO_CONFIG_{name}", c_type, variable, value, comment)
        )
    return attributes


def c_layouts(problem: Problem) -> list[CLayout]:
    """A, B and C as cuBLASLt stores them (a transposed operand is stored the other way round)."""
    case = problem.case()
    lds = {"a": problem.lda, "b": problem.ldb, "c": problem.ldc}
    strides = {"a": problem.stride_a, "b": problem.stride_b, "c": problem.stride_c}
    transposed = {"a": problem.transa == "t", "b": problem.transb == "t", "c": False}
    layouts = []
    for name in "abc":
        stored = case.operand(name)
        words = (
            f"{name.upper()}: stored {stored.rows} x {stored.cols}, leading dimension {lds[name]}"
        )
        words += ", transposed (op = T)" if transposed[name] else ""
        words += f", batch stride {strides[name]}" if problem.batched else ""
        layouts.append(
            CLayout(name, stored.rows, stored.cols, lds[name], strides[name], c_comment(words))
        )
    return layouts


def c_identifier(text: str) -> str:
    """'fix_' + the text with everything but [A-Za-z0-9_] as '_': a valid C identifier."""
    return "fix_" + re.sub(r"[^A-Za-z0-9_]", "_", text)


def c_comment(text: object) -> str:
    """Text safe inside a /* */ comment: on one line (invisible characters written out), never
    closing it, never opening another (which compilers warn of)."""
    return visible(text).replace("*/", "* /").replace("/*", "/ *")


def _op(trans: str) -> str:
    return "CUBLAS_OP_T" if trans == "t" else "CUBLAS_OP_N"
