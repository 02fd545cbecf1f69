"""The table of distinct problems of a trace (`cublas-audit shapes`), and its sweep cases."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from cublas_audit.observe.kernels import normalize
from cublas_audit.observe.torch_trace.attribution import gemm_calls
from cublas_audit.observe.torch_trace.problems import MODES, GemmProblem
from cublas_audit.observe.torch_trace.reader import Trace
from cublas_audit.planning.cases import Case

PROBLEM_COLUMNS = [
    "op", "via", "mode", "M", "N", "K", "batch", "a_strides", "b_strides", "bias", "beta",
    "cublas_m", "cublas_n", "cublas_k", "cublas_transa", "cublas_transb", "cublas_lda",
    "cublas_ldb", "cublas_stride_a", "cublas_stride_b", "cublas_broadcast", "cublas_beta",
    "cublas_bias",
    "calls", "total_gpu_ms", "mean_gpu_ms", "share", "kernels", "kernel_short", "ctas",
    "aux_kernels", "aux_gpu_ms",
]  # fmt: skip


@dataclass
class _Totals:
    calls: int = 0
    gpu_us: float = 0.0
    aux_us: float = 0.0
    kernels: dict[str, None] = field(default_factory=dict)
    aux: dict[str, None] = field(default_factory=dict)
    via: dict[str, None] = field(default_factory=dict)
    ctas: int = 0


def problems(trace: Trace) -> pd.DataFrame:
    """One row per distinct problem (op, mode, shape, strides, bias, beta): both terms, calls,
    GPU time of its own kernels (total, mean, share of all GEMM time in the trace), the kernels
    (full and short names), the largest grid, and the aux work; most expensive first."""
    totals: dict[GemmProblem, _Totals] = defaultdict(_Totals)
    for call in gemm_calls(trace):
        row = totals[call.problem]
        row.calls += 1
        row.gpu_us += sum(k.duration_us for k in call.kernels)
        row.aux_us += sum(k.duration_us for k in call.aux)
        row.kernels.update(dict.fromkeys(k.name for k in call.kernels))
        row.aux.update(dict.fromkeys(k.name for k in call.aux))
        row.via[" > ".join(call.via)] = None
        row.ctas = max([row.ctas, *(math.prod(k.grid) for k in call.kernels if k.grid)])
    grand = sum(row.gpu_us for row in totals.values())
    rows = [_row(problem, row, grand) for problem, row in totals.items()]
    table = pd.DataFrame(rows, columns=PROBLEM_COLUMNS)
    table = table.sort_values("total_gpu_ms", ascending=False, kind="stable")
    return table.reset_index(drop=True)


def _row(problem: GemmProblem, totals: _Totals, grand_us: float) -> dict[str, Any]:
    terms = problem.cublas_terms()
    return {
        "op": problem.op,
        "via": " | ".join(v or "direct" for v in totals.via) if any(totals.via) else "",
        "mode": problem.mode,
        "M": problem.m,
        "N": problem.n,
        "K": problem.k,
        "batch": problem.batch,
        "a_strides": problem.a_strides,
        "b_strides": problem.b_strides,
        "bias": problem.bias,
        "beta": problem.beta,
        **{f"cublas_{key}": terms[key] for key in _TERMS_SHOWN},
        "cublas_broadcast": problem.shared_operand(),
        "calls": totals.calls,
        "total_gpu_ms": totals.gpu_us / 1e3,
        "mean_gpu_ms": totals.gpu_us / 1e3 / totals.calls,
        "share": totals.gpu_us / grand_us if grand_us > 0 else 0.0,
        "kernels": " + ".join(totals.kernels),
        "kernel_short": _short_names(totals.kernels),
        "ctas": totals.ctas,
        "aux_kernels": _short_names(totals.aux),
        "aux_gpu_ms": totals.aux_us / 1e3,
    }


_TERMS_SHOWN = ("m", "n", "k", "transa", "transb", "lda", "ldb", "stride_a", "stride_b", "beta",
                "bias")  # fmt: skip


def _short_names(names: dict[str, None]) -> str:
    return " + ".join(dict.fromkeys(normalize(name).short for name in names))


def cases_of(trace: Trace, apis: Sequence[str] = ("cublas",)) -> list[Case]:
    """The distinct problems of a trace as sweep cases, in the modes this tool runs."""
    found: list[Case] = []
    for call in gemm_calls(trace):
        if call.problem.mode in MODES.values():
            found += [call.problem.case(api) for api in apis]
    return list(dict.fromkeys(found))
