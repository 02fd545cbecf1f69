"""The table of distinct problems of a trace (`cublas-audit shapes`), and its sweep cases.

Both read a trace's GEMM ops through `gemms`, which refuses a trace with nothing to audit (no
GEMM op, or recorded without record_shapes=True), so `shapes`, `report --torch-trace` and
`sweep --torch-trace` say the same. The table's `attrs["notices"]` carries what a reader must be
told beside it: GEMM ops whose dims could not be read (their kernel time still counts in the
GEMM time the shares are of), problems beyond cuBLAS's 32-bit dimensions (flagged per row in
`beyond_int32`).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.observe.kernels import normalize
from cublas_audit.observe.torch_trace.attribution import GemmAccount, gemm_account
from cublas_audit.observe.torch_trace.problems import MODES, GemmProblem
from cublas_audit.observe.torch_trace.reader import LEAF_OPS, Trace
from cublas_audit.planning.cases import MAX_DIMENSION, Case

PROBLEM_COLUMNS = [
    "op", "via", "mode", "M", "N", "K", "batch", "a_strides", "b_strides", "bias", "beta",
    "cublas_m", "cublas_n", "cublas_k", "cublas_transa", "cublas_transb", "cublas_lda",
    "cublas_ldb", "cublas_stride_a", "cublas_stride_b", "cublas_broadcast", "cublas_beta",
    "cublas_bias",
    "calls", "total_gpu_ms", "mean_gpu_ms", "share", "kernels", "kernel_short", "ctas",
    "aux_kernels", "aux_gpu_ms", "beyond_int32",
]  # fmt: skip
# cuBLAS's terms it takes as 32-bit ints (its batch strides are 64-bit)
_INT32_TERMS = ("m", "n", "k", "batch", "lda", "ldb")


@dataclass
class _Totals:
    calls: int = 0
    gpu_us: float = 0.0
    aux_us: float = 0.0
    kernels: dict[str, None] = field(default_factory=dict)
    aux: dict[str, None] = field(default_factory=dict)
    via: dict[str, None] = field(default_factory=dict)
    ctas: int = 0


def gemms(trace: Trace) -> GemmAccount:
    """The trace's leaf GEMM ops (attribution.gemm_account), or a one-line AuditError where it
    has nothing to audit: no GEMM op at all, or none whose problem it recorded (a trace made
    without record_shapes=True, or one whose every GEMM op has dims no matrix product has)."""
    account = gemm_account(trace)
    if account.calls:
        return account
    if not account.unread:
        ops = ", ".join(sorted(LEAF_OPS))
        raise AuditError(f"{trace.path}: no GEMM op in the trace ({ops}): nothing to audit")
    count = f"{len(account.unread)} GEMM op{'s' if len(account.unread) > 1 else ''}"
    dims = any("Input Dims" in (u.op.args or {}) for u in account.unread)
    if not dims or trace.meta.get("record_shapes") == 0:
        raise AuditError(
            f"{trace.path}: recorded without record_shapes=True: its {count} have no input dims "
            "(profile with torch.profiler.profile(record_shapes=True))"
        )
    raise AuditError(f"{trace.path}: none of its {count} has the dims of a matrix product")


def profiler_steps(trace: Trace) -> int:
    """The steps the trace holds (torch.profiler's ProfilerStep#N markers, with a schedule), 1
    where it has none: the trace is then one step."""
    return max(1, len(trace.steps))


def problems(trace: Trace) -> pd.DataFrame:
    """One row per distinct problem (op, mode, shape, strides, bias, beta): both terms, calls,
    GPU time of its own kernels (total, mean, share of all GEMM time in the trace, that of GEMM
    ops whose dims could not be read included), the kernels (full and short names), the largest
    grid, the aux work, and whether a cuBLAS term is beyond 32 bits; most expensive first.
    `attrs["notices"]`: the sentences a reader needs beside it (module docstring)."""
    account = gemms(trace)
    totals: dict[GemmProblem, _Totals] = defaultdict(_Totals)
    for call in account.calls:
        row = totals[call.problem]
        row.calls += 1
        row.gpu_us += sum(k.duration_us for k in call.kernels)
        row.aux_us += sum(k.duration_us for k in call.aux)
        row.kernels.update(dict.fromkeys(k.name for k in call.kernels))
        row.aux.update(dict.fromkeys(k.name for k in call.aux))
        row.via[" > ".join(call.via)] = None
        row.ctas = max([row.ctas, *(math.prod(k.grid) for k in call.kernels if k.grid)])
    unread_us = sum(k.duration_us for unread in account.unread for k in unread.kernels)
    grand = sum(row.gpu_us for row in totals.values()) + unread_us
    rows = [_row(problem, row, grand) for problem, row in totals.items()]
    table = pd.DataFrame(rows, columns=PROBLEM_COLUMNS)
    table = table.sort_values("total_gpu_ms", ascending=False, kind="stable")
    table = table.reset_index(drop=True)
    table.attrs["notices"] = _notices(account, table, unread_us)
    return table


def _notices(account: GemmAccount, table: pd.DataFrame, unread_us: float) -> list[str]:
    notices = []
    if account.unread:
        names = Counter(unread.op.name for unread in account.unread)
        listed = ", ".join(f"{n} x {name}" if n > 1 else name for name, n in sorted(names.items()))
        notices.append(
            f"{len(account.unread)} GEMM op{'s' if len(account.unread) > 1 else ''} ({listed}) "
            f"could not be read (input dims missing or not a matrix product's): "
            f"{unread_us / 1e3:.4g} ms of GEMM kernels, not in the table but in the GEMM time "
            "the shares are of."
        )
    beyond = table[table["beyond_int32"]]
    if len(beyond):
        shapes = ", ".join(f"{r.op} {r.M}x{r.N}x{r.K}" for r in beyond.itertuples())
        notices.append(
            f"{len(beyond)} problem{'s' if len(beyond) > 1 else ''} ({shapes}) beyond cuBLAS's "
            f"32-bit dimensions (m, n, k, batch, leading dimensions at most {MAX_DIMENSION}): "
            "no single cuBLAS call poses them, and sweep --torch-trace refuses them."
        )
    return notices


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
        "beyond_int32": any(terms[key] > MAX_DIMENSION for key in _INT32_TERMS),
    }


_TERMS_SHOWN = ("m", "n", "k", "transa", "transb", "lda", "ldb", "stride_a", "stride_b", "beta",
                "bias")  # fmt: skip


def _short_names(names: dict[str, None]) -> str:
    return " + ".join(dict.fromkeys(normalize(name).short for name in names))


def cases_of(trace: Trace, apis: Sequence[str] = ("cublas",)) -> list[Case]:
    """The distinct problems of a trace as sweep cases, in the modes this tool runs; a problem
    no case can pose (beyond cuBLAS's 32-bit dimensions) is a one-line error naming it."""
    found: list[Case] = []
    for call in gemms(trace).calls:
        problem = call.problem
        if problem.mode in MODES.values():
            try:
                found += [problem.case(api) for api in apis]
            except AuditError as exc:
                shape = f"{problem.m}x{problem.n}x{problem.k}"
                raise AuditError(f"{trace.path}: {problem.op} {shape}: {exc}") from None
    return list(dict.fromkeys(found))
