"""A flagged candidate as a standalone script (CuPy + nvmath-python, no cublas-audit): the
heuristic's default against that candidate's configuration, set through the cuBLASLt API, on the
problem the audit timed. A problem posed beyond packed nn (transposes, leading dimensions, a
broadcast operand, beta, the bias epilogue, a workspace limit; candidates.csv version 2) is posed
so in the script too; an audit that predates layouts timed packed nn, and its script says so.
"""

from __future__ import annotations

import re

import pandas as pd

from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.planning.lt_enums import ALGO_ATTRIBUTES, MAX_ALIGNMENT, SPECS, alignment
from cublas_audit.planning.modes import mode as mode_of
from cublas_audit.report.markdown import visible
from cublas_audit.table.candidates_table import problem_case
from cublas_audit.table.dispatch import plain

# What a candidates.csv value may be to enter the repro as an enum name or a number.
_ENUM_NAME = re.compile(r"[A-Za-z0-9_]+")
_REPRO = """\
import cupy as cp, numpy as np, nvmath
from nvmath.bindings import cublas, cublasLt as lt

m, n, k, batch = {m}, {n}, {k}, {batch}  # {posed}
dtype, compute = nvmath.CudaDataType.{data_type}, cublas.ComputeType.{compute_type}
def rand(shape):  # {storage} storage
    x = cp.random.standard_normal(shape, dtype=cp.float32)
    return {convert}
{operands}
h, desc = lt.create(), lt.matmul_desc_create(compute, nvmath.CudaDataType.CUDA_R_32F)
def setter(set_fn, dtype_fn, obj):
    def set_(attr, value):
        v = np.array([value], dtype_fn(attr))
        set_fn(obj, attr, v.ctypes.data, v.nbytes)
    return set_
{layouts}
algo = np.zeros(1, lt.matmul_algo_dtype)
lt.matmul_algo_init(h, compute, nvmath.CudaDataType.CUDA_R_32F, dtype, dtype, dtype, dtype,
                    {algo_id}, algo.ctypes.data)
set_ = setter(lt.matmul_algo_config_set_attribute, lt.get_matmul_algo_config_attribute_dtype,
              algo.ctypes.data)
C = lt.MatmulAlgoConfigAttribute
{settings}
ws = cp.empty({workspace}, cp.uint8)  # the workspace the audit allowed every algorithm
pref = lt.matmul_preference_create()
setter(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref)(
    lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, ws.nbytes){alignments}
found, count = np.zeros(1, lt.matmul_heuristic_result_dtype), np.zeros(1, np.int32)
lt.matmul_algo_get_heuristic(h, desc, la, lb, lc, lc, pref, 1, found.ctypes.data,
                             count.ctypes.data)
default = np.ascontiguousarray(found["algo"])  # the heuristic's pick: cuBLASLt's default
alpha, beta = np.ones(1, np.float32), {beta}
def run(algo_ptr):
    lt.matmul(h, desc, alpha.ctypes.data, a.data.ptr, la, b.data.ptr, lb, beta.ctypes.data,
              c.data.ptr, lc, c.data.ptr, lc, algo_ptr, ws.data.ptr, ws.nbytes, 0)
for name, ptr in (("default", default.ctypes.data), ("candidate", algo.ctypes.data)) * 2:
    run(ptr)  # warm-up
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(20):
        run(ptr)
    stop.record()
    stop.synchronize()
    print(name, cp.cuda.get_elapsed_time(start, stop) / 20, "ms")
"""
# The packed, untransposed problem every version-1 audit timed, in the script's words.
_PACKED = {
    "posed": "column-major, no transposes, strided batch",
    "operands": "a, b = rand((batch, k, m)), rand((batch, n, k))\n"
    "c = cp.empty((batch, n, m), dtype=a.dtype)",
    "layouts": """\
def layout(rows, cols):
    lay = lt.matrix_layout_create(dtype, rows, cols, rows)
    set_ = setter(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, lay)
    if batch > 1:
        set_(lt.MatrixLayoutAttribute.BATCH_COUNT, batch)
        set_(lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, rows * cols)
    return lay
la, lb, lc = layout(m, k), layout(k, n), layout(m, n)""",
    "alignments": "",
    "beta": "np.zeros(1, np.float32)",
}
_POSED_LAYOUT = """\
def layout(rows, cols, ld, stride):  # stride 0: one matrix shared by the batch
    lay = lt.matrix_layout_create(dtype, rows, cols, ld){batching}
    return lay
la, lb, lc = {layouts}
set_desc = setter(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc)"""
# A strided-batched call's layouts (the batch count and each entry's offset).
_BATCHING = """
    set_ = setter(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, lay)
    set_(lt.MatrixLayoutAttribute.BATCH_COUNT, batch)
    set_(lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, stride)"""
_ALIGNMENTS = """
for name, value in {values}:  # what the batch strides allow
    setter(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref)(
        lt.MatmulPreferenceAttribute[f"MIN_ALIGNMENT_{{name}}_BYTES"], value)"""


def repro(row: pd.Series) -> str:
    """A standalone script timing the default against this candidate's configuration."""
    mode = str(row["mode"])
    spec = mode_of(mode)
    data_type, compute_type, storage = spec.data_type_name, spec.compute_type_name, spec.storage
    convert = (
        "(x.view(cp.uint32) >> 16).astype(cp.uint16)  # bf16 bits"
        if storage == "uint16"
        else f"x.astype(cp.{storage})"
    )
    case = problem_case(row)
    limit = plain(row.get("workspace_limit_bytes"))  # none recorded: the audit's default
    return _REPRO.format(
        m=int(row["m"]),
        n=int(row["n"]),
        k=int(row["k"]),
        batch=int(row["batch"]),
        data_type=data_type,
        compute_type=compute_type,
        storage=storage,
        convert=convert,
        algo_id=int(row["algo_id"]),
        settings="\n".join(_repro_settings(row)),
        workspace=DEFAULT_WORKSPACE_BYTES if limit is None else int(limit),
        **(_posed(case) if case is not None and case.variant else _PACKED),
    ).rstrip()


def _posed(case: Case) -> dict[str, str]:
    """The script's lines that pose the problem as `case` does (the operands in device.operands'
    layout: each a C-ordered array of (stored entries, columns, leading dimension))."""
    a, b = case.operand("a"), case.operand("b")
    operands = [
        f"a, b = rand(({a.stored}, {a.cols}, {a.ld})), rand(({b.stored}, {b.cols}, {b.ld}))"
        "  # (entries, columns, leading dimension)",
        "c = rand((batch, n, m))  # beta != 0: C is read"
        if case.beta
        else "c = cp.empty((batch, n, m), dtype=a.dtype)",
    ]
    if case.bias:
        operands.append("bias = rand((m,))  # the BIAS epilogue's vector, added to every column")
    shapes = [f"{o.rows}, {o.cols}, {o.ld}, {o.stride}" for o in (a, b)]
    layouts = [
        _POSED_LAYOUT.format(
            batching=_BATCHING if case.batched_call else "",
            layouts=f"layout({shapes[0]}), layout({shapes[1]}), layout(m, n, m, m * n)",
        )
    ]
    layouts += [
        f"set_desc(lt.MatmulDescAttribute.{name}, 1)  # op({operand}) = {operand}^T"
        for name, operand, trans in (("TRANSA", "A", case.transa), ("TRANSB", "B", case.transb))
        if trans == "t"
    ]
    if case.bias:
        layouts.append("set_desc(lt.MatmulDescAttribute.EPILOGUE, int(lt.Epilogue.BIAS))")
        layouts.append("set_desc(lt.MatmulDescAttribute.BIAS_POINTER, bias.data.ptr)")
    return {
        "posed": f"column-major, {case.variant}",
        "operands": "\n".join(operands),
        "layouts": "\n".join(layouts),
        "alignments": _alignments(case),
        "beta": f"np.full(1, {case.beta!r}, np.float32)" if case.beta else _PACKED["beta"],
    }


def _alignments(case: Case) -> str:
    """The alignment preferences the audit gave cuBLASLt where a batch stride allows less than
    its default (MAX_ALIGNMENT bytes): every batch entry starts at ptr + i * stride."""
    if not case.batched_call:
        return ""
    item = mode_of(case.mode).element_bytes
    a, b, c = (alignment(case.operand(name).stride * item) for name in "abc")
    if min(a, b, c) >= MAX_ALIGNMENT:
        return ""
    values = (("A", a), ("B", b), ("C", c), ("D", c))
    return _ALIGNMENTS.format(values=values)


def _repro_settings(row: pd.Series) -> list[str]:
    lines = []
    for attribute, column in ALGO_ATTRIBUTES:
        value = row[column]
        if pd.isna(value):
            continue  # this cuBLASLt did not report it: leave the algo's initial value
        text = str(value)
        if not _ENUM_NAME.fullmatch(text):
            lines.append(f"# {attribute}: not set, {visible(text)!r} is not a plain name or number")
            continue  # a table value never becomes code
        spec = SPECS.get(column)
        if spec and not text.isdigit():
            text = f"lt.{spec.nvmath_enum}.{spec.nvmath_prefix}{text}"
        lines.append(f"set_(C.{attribute}, {text})")
    return lines
