"""trace.json: what a PyTorch trace says of each problem a trace audit planned, kept in its run
directory so that `report`, `fix` and `diff` weigh the run's findings by the model's own time
without the trace.

Written by `sweep --torch-trace` beside plan.json (and by `report RUN --torch-trace TRACE` /
`fix RUN --torch-trace TRACE`, which build it in memory for a run made before this file existed).

- `problems`: one per distinct cuBLAS problem the trace ran, keyed by its problem id (a case id
  without its API: `fp16.3072x12608x768.b1.tn.bias`; the same call on either API), with the
  PyTorch ops that issued it, their calls, their kernels' time in the trace and its share of the
  trace's GEMM time (the kernels of every GEMM op, those whose dims could not be read included),
  and the planned cases that pose it as the model calls it.
- `variants`: every other planned case, with why the model never makes that call: the bias-free
  form of a GEMM the model calls with its bias epilogue, a companion the audit added with a cause
  removed (padded, another layout), a loop companion.
- `unaudited_ms`: GEMM time no planned case poses (unread ops, modes this tool does not run), so
  the problems' shares and its share add up to the whole.

`steps`: the ProfilerStep markers of the trace, 1 where it has none (the trace is one step).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.files import write_text_atomic
from cublas_audit.observe.torch_trace import Trace, gemms
from cublas_audit.observe.torch_trace.problem_table import profiler_steps
from cublas_audit.observe.torch_trace.problems import MODES
from cublas_audit.planning.cases import Case, with_cause_removed_companions
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.table.json_records import as_list, as_text, record, require
from cublas_audit.table.rundir import PLAN_FILE, TRACE_FILE

SCHEMA = "cublas-audit-trace"
SCHEMA_VERSION = 1


def problem_id(case_id: str) -> str | None:
    """The problem a case id poses, on either API (the id without its API); None for a loop
    companion (single calls standing for a batched one: no call a model makes)."""
    api, _, rest = case_id.partition(".")
    return None if api == "loop" or not rest else rest


@dataclass(frozen=True)
class TracedProblem:
    """One cuBLAS problem of the trace: who called it, how often, its kernels' time."""

    problem: str  # its problem id (problem_id)
    ops: str  # the PyTorch ops that issued it, with their containers: 'aten::linear > aten::addmm'
    shape: str  # PyTorch's row-major M x N x K
    batch: int
    calls: int  # in the whole trace
    kernel_ms: float  # its own kernels' time in the whole trace
    share: float  # of the trace's GEMM time
    cases: list[str] = field(default_factory=list)  # the planned cases that pose it

    @property
    def mean_us(self) -> float:
        return 1e3 * self.kernel_ms / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class Variant:
    """A planned case the model never calls, and why."""

    case_id: str
    why: str


@dataclass(frozen=True)
class TraceRecord:
    trace: str
    gpu_name: str
    steps: int
    gemm_ms: float  # every GEMM op's kernels in the whole trace
    unaudited_ms: float
    problems: tuple[TracedProblem, ...]
    variants: tuple[Variant, ...] = ()

    @property
    def gemm_us_per_step(self) -> float:
        return 1e3 * self.gemm_ms / self.steps

    def called(self, case_id: str) -> TracedProblem | None:
        """The trace's problem a case (any API) poses as the model calls it, else None."""
        wanted = problem_id(case_id)
        return next((p for p in self.problems if p.problem == wanted), None)

    def why_not(self, case_id: str) -> str:
        """Why the model never makes this call ('' where it does)."""
        if self.called(case_id) is not None:
            return ""
        # a case the audit posed on the other API (a candidate audit's cuBLASLt form of a
        # cuBLAS case) is the same problem as the planned one
        wanted = problem_id(case_id)
        exact = [v.why for v in self.variants if v.case_id == case_id]
        same = [v.why for v in self.variants if wanted and problem_id(v.case_id) == wanted]
        return next(iter(exact + same), "not a call of the trace's model")


def trace_record(trace: Trace, cases: Sequence[Case]) -> TraceRecord:
    """The record of `trace` for the planned `cases` (module docstring)."""
    account = gemms(trace)
    totals: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"ops": {}, "calls": 0, "us": 0.0, "shape": "", "batch": 1}
    )
    unposed_us = sum(k.duration_us for unread in account.unread for k in unread.kernels)
    for call in account.calls:
        us = sum(k.duration_us for k in call.kernels)
        key = _key(call.problem)
        if key is None:
            unposed_us += us
            continue
        entry = totals[key]
        entry["ops"][" > ".join([*call.via, call.problem.op])] = None
        entry["calls"] += 1
        entry["us"] += us
        entry["shape"], entry["batch"] = _shape(call.problem), call.problem.batch
    grand_us = sum(entry["us"] for entry in totals.values()) + unposed_us
    planned: dict[str, list[str]] = defaultdict(list)
    for case in cases:
        key = problem_id(case.case_id)
        if key in totals:
            planned[key].append(case.case_id)
    problems = [
        TracedProblem(
            problem=key,
            ops=" | ".join(entry["ops"]),
            shape=entry["shape"],
            batch=int(entry["batch"]),
            calls=int(entry["calls"]),
            kernel_ms=round(entry["us"] / 1e3, 6),
            share=round(entry["us"] / grand_us, 6) if grand_us > 0 else 0.0,
            cases=planned.get(key, []),
        )
        for key, entry in totals.items()
    ]
    problems.sort(key=lambda p: -p.kernel_ms)
    unaudited = unposed_us + sum(e["us"] for key, e in totals.items() if not planned.get(key))
    return TraceRecord(
        trace=str(trace.path),
        gpu_name=trace.gpu_name,
        steps=profiler_steps(trace),
        gemm_ms=round(grand_us / 1e3, 6),
        unaudited_ms=round(unaudited / 1e3, 6),
        problems=tuple(problems),
        variants=tuple(_variants(cases, {p.problem: p for p in problems})),
    )


def run_record(run_dir: Path, trace: Trace) -> TraceRecord:
    """The record of a trace for a run made from it (`report`/`fix RUN --torch-trace TRACE`): its
    plan.json's cases; an input without one is a one-line error."""
    plan = Path(run_dir) / PLAN_FILE
    if not plan.is_file():
        raise AuditError(
            f"{run_dir}: --torch-trace weighs a run directory's planned cases (its {PLAN_FILE}), "
            "and this input has none"
        )
    return trace_record(trace, read_plan(plan))


def table_record(trace: Trace, table: pd.DataFrame, case_ids: Sequence[str]) -> TraceRecord:
    """The record of a trace audited alone (`report --torch-trace TRACE`): one problem per row of
    its problem table (observe.torch_trace.problems), under the case id its dispatch table gives
    that row (`case_ids`, in the table's order)."""
    total_ms = float(table["total_gpu_ms"].sum()) if len(table) else 0.0
    share = float(table["share"].sum()) if len(table) else 0.0
    gemm_ms = total_ms / share if share > 0 else total_ms  # the unread ops' kernels included
    problems = tuple(
        TracedProblem(
            problem=str(problem_id(case_id)),
            ops=str(row["op"]) + (f" (in {row['via']})" if row["via"] else ""),
            shape=f"{row['M']}x{row['N']}x{row['K']}",
            batch=int(row["batch"]),
            calls=int(row["calls"]),
            kernel_ms=float(row["total_gpu_ms"]),
            share=float(row["share"]),
            cases=[case_id],
        )
        for case_id, row in zip(case_ids, table.to_dict("records"), strict=True)
    )
    return TraceRecord(
        trace=str(trace.path),
        gpu_name=trace.gpu_name,
        steps=profiler_steps(trace),
        gemm_ms=gemm_ms,
        unaudited_ms=round(max(0.0, gemm_ms - total_ms), 6),  # the unread ops' (float noise: 0)
        problems=problems,
    )


def _key(problem: Any) -> str | None:
    """The problem id of a trace's GEMM as the model calls it: its cuBLASLt case (the bias
    epilogue where PyTorch uses it); None where this tool poses no case for it."""
    if problem.mode not in MODES.values():
        return None
    try:
        return problem_id(problem.case("cublasLt").case_id)
    except AuditError:  # beyond cuBLAS's 32-bit dimensions: no single call poses it
        return None


def _shape(problem: Any) -> str:
    return f"{problem.m}x{problem.n}x{problem.k}"


def _variants(cases: Sequence[Case], called: Mapping[str, TracedProblem]) -> list[Variant]:
    """Each planned case the model never calls, with why (module docstring)."""
    companions: dict[str, str] = {}
    for case in cases:
        if problem_id(case.case_id) in called:
            for other in with_cause_removed_companions([case])[1:]:
                companions.setdefault(other.case_id, case.case_id)
    found = []
    for case in cases:
        key = problem_id(case.case_id)
        if key in called:
            continue
        found.append(Variant(case.case_id, _why(case, key, called, companions)))
    return found


def _why(
    case: Case, key: str | None, called: Mapping[str, TracedProblem], companions: Mapping[str, str]
) -> str:
    if key is None:
        return "a loop companion: the batched call as single calls, timed beside it"
    with_bias = _with_bias(case)
    if with_bias is not None and with_bias in called:
        problem = called[with_bias]
        return (
            f"the bias-free form of {problem.ops} {problem.shape}, which the model calls with "
            "its bias (cuBLASLt's bias epilogue)"
        )
    if case.case_id in companions:
        return (
            f"added by the audit: {companions[case.case_id]} with a cause removed (padded, or "
            "another layout), measured beside it"
        )
    return "not a problem of the trace"


def _with_bias(case: Case) -> str | None:
    if case.bias:
        return None
    try:
        return problem_id(replace(case, api="cublasLt", bias=True).case_id)
    except AuditError:
        return None


# ----- the file ----------------------------------------------------------------------------------


def to_json(found: TraceRecord) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        **{key: value for key, value in asdict(found).items() if key != "variants"},
        "problems": [asdict(p) for p in found.problems],
        "variants": [asdict(v) for v in found.variants],
    }


def write_trace_record(found: TraceRecord, run_dir: Path) -> Path:
    return write_text_atomic(
        Path(run_dir) / TRACE_FILE, json.dumps(to_json(found), indent=1) + "\n"
    )


def read_trace_record(run_dir: Path) -> TraceRecord | None:
    """A run directory's trace.json, None where it has none; a broken one is one AuditError
    naming the file and the first thing wrong (exit 2)."""
    path = Path(run_dir) / TRACE_FILE
    if not path.is_file():
        return None
    try:
        return from_json(json.loads(path.read_text(), parse_constant=_not_json))
    except OSError as exc:
        raise AuditError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise AuditError(f"{path}: not a valid trace record: {exc}") from exc


def _not_json(literal: str) -> float:
    raise ValueError(f"{literal} is not a number JSON allows")


def from_json(data: Any) -> TraceRecord:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"'schema' is not {SCHEMA!r}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"schema_version {data.get('schema_version')!r} is not {SCHEMA_VERSION}")
    keys = ("trace", "gpu_name", "steps", "gemm_ms", "unaudited_ms", "problems", "variants")
    require(data, keys, "the file")
    problems = tuple(_problem(p, i) for i, p in enumerate(as_list(data["problems"], "problems")))
    variants = tuple(
        record(Variant, v, f"variants[{i}]")
        for i, v in enumerate(as_list(data["variants"], "variants"))
    )
    found = TraceRecord(
        trace=as_text(data["trace"], "trace"),
        gpu_name=as_text(data["gpu_name"], "gpu_name"),
        steps=data["steps"],
        gemm_ms=data["gemm_ms"],
        unaudited_ms=data["unaudited_ms"],
        problems=problems,
        variants=variants,
    )
    if not isinstance(found.steps, int) or isinstance(found.steps, bool) or found.steps < 1:
        raise ValueError(f"steps: {found.steps!r} is not a count of at least 1")
    for name in ("gemm_ms", "unaudited_ms"):
        _time(getattr(found, name), name)
    return found


def _problem(data: Any, index: int) -> TracedProblem:
    where = f"problems[{index}]"
    found = record(TracedProblem, data, where)
    cases = as_list(found.cases, f"{where}.cases")
    for position, case_id in enumerate(cases):
        as_text(case_id, f"{where}.cases[{position}]")
    if found.calls < 1:
        raise ValueError(f"{where}.calls: {found.calls!r} is not a count of at least 1")
    _time(found.kernel_ms, f"{where}.kernel_ms")
    if not 0.0 <= found.share <= 1.0:
        raise ValueError(f"{where}.share: {found.share!r} is not a fraction from 0 to 1")
    return replace(found, cases=list(cases))


def _time(value: float, where: str) -> None:
    if not value >= 0.0 or value == float("inf"):
        raise ValueError(f"{where}: {value!r} is not a time of 0 ms or more")
