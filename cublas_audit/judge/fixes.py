"""From findings to fixes: for every confirmed finding with a measured faster alternative, the
change that gives the time back, on the exact problem the run measured.

- `better-candidate` (both timing rounds beyond the noise floor): pin the best candidate, every
  cuBLASLt attribute and its workspace.
- `unaligned-operand` with the padded problem measured faster beyond the noise model: run the
  padded problem (zeros leave the product as it was) and take the result's slice.
- `layout-penalty`: store the operands as the faster layout expects.

An observation without a measured alternative, or one that did not hold beyond the noise model,
gets no fix. Judging happened in judge.audited: this module only reads its verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.judge.audited import Audited
from cublas_audit.judge.candidates import INTERLEAVED_FLOOR, CandidateVerdicts
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.grouping import members
from cublas_audit.judge.rules.frame import call_of
from cublas_audit.observe.kernels import normalize
from cublas_audit.planning.cases import Case
from cublas_audit.table.candidates_table import problem_case
from cublas_audit.table.dispatch import plain
from cublas_audit.table.env_record import EnvRecord, as_record
from cublas_audit.table.fix_file import Fix, FixSet, Pin, Problem, Stamp, Timed, TorchOp
from cublas_audit.vocabulary import FixKind, Severity

FIXED_BY_SHAPE = {"unaligned-operand": FixKind.pad, "layout-penalty": FixKind.layout}


def fixes_of(audited: Audited, plan: Mapping[str, Case] | None = None) -> list[Fix]:
    """The fixes one judged run gives: pins from its candidate audit, shape changes from its
    findings. `plan`: the run's cases by case id (plan.json), the exact problems measured."""
    source = str(audited.dataset.path)
    kernels = dict(
        zip(audited.rows["case_id"].astype(str), audited.rows["kernel_short"], strict=True)
    )
    pins = [] if audited.candidates is None else pin_fixes(audited.candidates, source, kernels)
    return [*pins, *shape_fixes(audited.rows, audited.findings, plan or {}, source)]


def fix_set(stamped: Sequence[tuple[Stamp, Sequence[Fix], str]]) -> FixSet:
    """Every run's fixes under one stamp (each run: its stamp, its fixes, its path). Fixes are
    proven on one GPU model and cuBLAS: runs of several are refused (one line), as comparing
    them is the diff's job."""
    stamps = {stamp for stamp, _, _ in stamped}
    if len(stamps) > 1:
        names = "; ".join(sorted(stamp.words() for stamp in stamps))
        raise AuditError(f"the runs were measured on different machines ({names}): fix one each")
    if not stamps:
        raise AuditError("no run to take fixes from")
    unique: dict[str, Fix] = {}
    for _, found, source in stamped:
        ids = [fix.id for fix in found]
        if len(set(ids)) < len(ids):  # one run's fixes are one per problem (shape_fixes)
            raise ValueError(f"{source}: fix id {_repeated(ids)!r} made twice from one run")
        unique.update((fix.id, fix) for fix in found)  # a problem audited twice: the later run
    return FixSet(stamps.pop(), tuple(unique.values()), tuple(s for _, _, s in stamped))


def _repeated(ids: Sequence[str]) -> str:
    return next(i for i in ids if ids.count(i) > 1)


def stamp_of(
    given: EnvRecord | Mapping[str, Any], frame: pd.DataFrame | None = None, label: str = ""
) -> Stamp:
    """The machine a run measured on, from its env.json, else its table's columns."""
    env = as_record(given)

    def value(name: str) -> str:
        recorded = getattr(env, name)
        if recorded not in (None, ""):
            return str(recorded)
        if frame is None or name not in frame.columns:
            return "unknown"
        found = frame[name].dropna()
        return str(found.iloc[0]) if len(found) else "unknown"

    return Stamp(
        gpu_name=value("gpu_name"),
        cc=value("cc"),
        cublas_version=value("cublas_version"),
        driver_version=value("driver_version"),
        gpu_label=label or env.gpu_label or "",
    )


def pin_fixes(
    verdicts: CandidateVerdicts, source: str, kernels: Mapping[str, Any] | None = None
) -> list[Fix]:
    """A pin for every case both timing rounds flagged (judge.candidates' `better-candidate`).
    `kernels`: the kernel the run's dispatch table saw each case id's default call launch."""
    return [
        _pin_fix(verdicts.frame, flagged, source, kernels or {}) for flagged in verdicts.flagged
    ]


def shape_fixes(
    rows: pd.DataFrame, findings: Sequence[Finding], plan: Mapping[str, Case], source: str
) -> list[Fix]:
    """A shape change for every cause whose removal was measured faster beyond the noise model
    (the finding's `compared` row is the measured alternative)."""
    proven = [
        finding
        for grouped in findings
        for finding in members(grouped)  # each call of one cause (judge.grouping), its own fix
        # proven by its rule: a trace's small share makes a finding info, not its fix unproven
        if finding.rule in FIXED_BY_SHAPE
        and _rule_severity(finding) is not Severity.info
        and finding.compared
    ]
    # The same problem through cuBLAS and cuBLASLt is one fix (one id: verify runs it, and the
    # fix's snippet calls it, through cuBLASLt): the cuBLASLt call's measurement where the run
    # made both, in place of whichever came last.
    kept: dict[str, Fix] = {}
    for finding in sorted(proven, key=lambda f: f.api == "cublasLt"):
        fix = _shape_fix(rows, finding, plan, source)
        kept[fix.id] = fix
    return list(kept.values())


def _rule_severity(finding: Finding) -> Severity:
    """The severity the rule gave (judge.impact keeps it where a trace made the finding info)."""
    return Severity(finding.impact.get("rule_severity", finding.severity))


# ----- pins --------------------------------------------------------------------------------------


def _pin_fix(frame: pd.DataFrame, flagged: Finding, source: str, kernels: Mapping[str, Any]) -> Fix:
    default, best = (_row(frame, label) for label in flagged.rows)
    basis = _basis(default)
    problem = problem_of_candidates_row(default)
    pin = pin_of(best)
    left, confirm = float(default["left_on_table"]), float(default["confirm_left_on_table"])
    return Fix(
        id=fix_id(problem),
        kind=FixKind.pin,
        problem=problem,
        default=_timed(default, basis, kernels.get(str(default["case_id"]))),
        fixed=_timed(best, basis),
        timing=basis,
        verdict=(
            f"{left:.2f}x, and {confirm:.2f}x in an independent second round: beyond the "
            f"{INTERLEAVED_FLOOR:.0%} floor of interleaved timing"
        ),
        change=f"pin cuBLASLt's candidate #{int(best['candidate'])}: {pin.words()}",
        pin=pin,
        source={"run": source, "case_id": str(default["case_id"]), "rule": flagged.rule},
    )


def _basis(row: pd.Series) -> str:
    """'kernel' where the audit compared kernel times (CUPTI), else 'call' (CUDA events)."""
    return "kernel" if plain(row.get("timing_basis")) == "kernel" else "call"


def _timed(row: pd.Series, basis: str, dispatched: Any = None) -> Timed:
    took, confirm = ("kernel_ms", "kernel_confirm_ms") if basis == "kernel" else (
        "time_ms", "confirm_time_ms",
    )  # fmt: skip
    again = plain(row.get(confirm))
    kernels = plain(row.get("kernels")) or plain(dispatched)
    return Timed(
        kernel=short_names(str(kernels)) if kernels else _described(row),
        ms=float(row[took]),
        confirm_ms=None if again is None else float(again),
    )


def short_names(kernels: str) -> str:
    """'simt_128x64_8x5 + splitKreduce' from the traced (mangled) names a call launched."""
    return " + ".join(normalize(name.strip()).short for name in kernels.split(" + "))


def _described(row: pd.Series) -> str:
    return f"algo {plain(row['algo_id'])} tile {plain(row['tile'])}"


def pin_of(row: pd.Series) -> Pin:
    """The candidate's configuration; an attribute the table lacks (an older cuBLASLt reported
    none) is cuBLASLt's own default for it, 0 or AUTO."""

    def number(name: str) -> int:
        return int(plain(row.get(name)) or 0)

    def name(column: str, default: str = "0") -> str:
        return str(plain(row.get(column)) or default)

    return Pin(
        algo_id=number("algo_id"),
        tile=name("tile"),
        stages=name("stages"),
        split_k=number("split_k"),
        reduction_scheme=name("reduction_scheme", "NONE"),
        cta_swizzling=number("cta_swizzling"),
        custom_option=number("custom_option"),
        inner_shape=number("inner_shape"),
        cluster_shape=name("cluster_shape", "AUTO"),
        workspace_bytes=number("workspace_bytes"),
    )


def problem_of_candidates_row(row: pd.Series) -> Problem:
    """The problem a candidates row timed (table.candidates_table.problem_case, schema 2), or
    packed nn, said as unknown, for a table written before the audit kept the layout."""
    case = problem_case(row)
    if case is not None:
        return Problem.of_case(case)
    packed = Case("cublasLt", str(row["mode"]), int(row["m"]), int(row["n"]), int(row["k"]),
                  int(row["batch"]))  # fmt: skip
    return Problem.of_case(packed, layout_known=False)


def fix_id(problem: Problem) -> str:
    """A stable id from the problem: `fp32.2496x128x1600.b1.nn`, then its other settings."""
    return problem.case().case_id.removeprefix("cublasLt.")


# ----- shape changes ------------------------------------------------------------------------------


def _shape_fix(rows: pd.DataFrame, finding: Finding, plan: Mapping[str, Case], source: str) -> Fix:
    slow, fast = _row(rows, finding.rows[-1]), _row(rows, finding.compared[0])
    problem, instead = (Problem.of_case(case_of_row(row, plan)) for row in (slow, fast))
    basis = "kernel" if _traced(slow) and _traced(fast) else "call"
    took = "kernel_time_ms" if basis == "kernel" else "time_ms"
    kind = FIXED_BY_SHAPE[finding.rule]
    change = (
        f"pad to {instead.m}x{instead.n}x{instead.k} with zeros and take the "
        f"{problem.m}x{problem.n} slice"
        if kind is FixKind.pad
        else f"store the operands for layout {instead.layout} (transpose once, outside the loop)"
    )
    return Fix(
        id=f"{fix_id(problem)}.{kind}",
        kind=kind,
        problem=problem,
        default=Timed(str(slow["kernel_short"]), float(slow[took])),
        fixed=Timed(str(fast["kernel_short"]), float(fast[took])),
        timing=basis,
        verdict=f"{finding.severity}: {finding.message}",
        change=change,
        instead=instead,
        source={"run": source, "case_id": str(slow["case_id"]), "rule": finding.rule},
    )


def _row(rows: pd.DataFrame, label: int) -> pd.Series:
    found = rows.loc[label]
    assert isinstance(found, pd.Series)  # index labels of a prepared table are unique
    return found


def _traced(row: pd.Series) -> bool:
    return plain(row.get("kernel_time_ms")) is not None


def case_of_row(row: pd.Series, plan: Mapping[str, Case]) -> Case:
    """The exact call of a prepared dispatch-table row: its plan.json case, else its columns."""
    known = plan.get(str(row.get("case_id"))) or call_of(row)
    if known is None:
        raise AuditError(f"{row.get('case_id')}: the row's columns make no cuBLAS call")
    return known


# ----- PyTorch's side ---------------------------------------------------------------------------


def with_torch_ops(fixes: FixSet, table: pd.DataFrame) -> FixSet:
    """Each fix whose exact problem a PyTorch trace ran (observe.torch_trace's problem table,
    cuBLAS terms) with that op, its row-major shape and its share of the trace's GEMM time."""
    ops: dict[Problem, TorchOp] = {}
    for _, row in table.iterrows():
        problem = _traced_problem(row)
        if problem is not None:
            ops.setdefault(problem, _torch_side(row))
    found = tuple(
        replace(fix, torch=ops.get(replace(fix.problem, layout_known=True), fix.torch))
        for fix in fixes.fixes
    )
    return replace(fixes, fixes=found)


def _traced_problem(row: pd.Series) -> Problem | None:
    try:
        case = Case(
            "cublasLt",
            str(row["mode"]),
            int(row["cublas_m"]),
            int(row["cublas_n"]),
            int(row["cublas_k"]),
            int(row["batch"]),
            transa=str(row["cublas_transa"]),
            transb=str(row["cublas_transb"]),
            lda=int(row["cublas_lda"]),
            ldb=int(row["cublas_ldb"]),
            broadcast=str(plain(row["cublas_broadcast"]) or ""),
            beta=float(row["cublas_beta"]),
            bias=bool(row["cublas_bias"]),
        )
    except (AuditError, ValueError, KeyError):
        return None  # a problem this tool cannot pose (a mode it does not run): no fix names it
    return Problem.of_case(case)


def _torch_side(row: pd.Series) -> TorchOp:
    return TorchOp(
        op=str(row["op"]),
        shape=f"{int(row['M'])}x{int(row['N'])}x{int(row['K'])}",
        batch=int(row["batch"]),
        share=round(float(row["share"]), 4),
    )
