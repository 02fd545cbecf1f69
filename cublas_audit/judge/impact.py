"""What a finding is worth, and the verdict on a traced model: judged once, in judge.audited.

A finding with a measured faster alternative (`GAIN_RULES`, its severity above info) saves
`effect` of its call's time: the share the alternative gives back (`1 - 1/ratio`). Without a
trace its message states that time per call beside the ratio ('1.12x, 7.4 us a call', on the
audit's own time of the call). With a trace (table.trace_record: the run's trace.json, or a trace
attached by `report`/`fix --torch-trace`), the finding carries the model's side in `impact`:
whether the model makes the call at all (the audit also measures variants: the bias-free form of
a GEMM the model calls with its bias epilogue, companions with a cause removed), the ops, calls
and kernel time a step of the problems it concerns and their share of the trace's GEMM time, and
what it is worth: the time its fix saves a step, as a share of that GEMM time (the problems'
whole share where nothing faster was measured: the most it can be worth). A finding worth under
`trace_worth_pct` of the trace's GEMM time, a variant's included (worth nothing to the model),
is `info`; its rule's severity is kept in `impact['rule_severity']` (a fix still follows the
rule's proof).

The verdict (`TraceVerdict`): the trace's problems, its GEMM time a step, the share of it whose
problem's cuBLASLt default is within the interleaved noise floor of its best candidate, the
share with a gap beyond noise but under the candidate bar, and what the findings give back a
step (each problem counted once, at its largest proven gain); `healthy` where no finding is
worth the bar.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from cublas_audit.judge.candidates import INTERLEAVED_FLOOR, CandidateVerdicts
from cublas_audit.judge.finding import Finding, order
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.judge.timed_rows import ratio_verdict
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.table.dispatch import plain
from cublas_audit.table.fix_file import Fix, FixSet, TorchOp
from cublas_audit.table.trace_record import TracedProblem, TraceRecord
from cublas_audit.vocabulary import Severity

# Rules whose `effect` is the share of the call's time a measured alternative of the same
# problem gives back (a cliff's is a throughput drop between sizes: no time of this call).
GAIN_RULES = ("better-candidate", "unaligned-operand", "layout-penalty", "size-inversion")


def weigh(
    findings: Sequence[Finding],
    rows: pd.DataFrame,
    record: TraceRecord | None,
    thresholds: Thresholds | None = None,
) -> list[Finding]:
    """The findings with what each is worth (module docstring), in `order`. The table is read
    once into plain lookups: a dense map has tens of thousands of findings, and a row read one at
    a time costs a millisecond."""
    bar = (thresholds or Thresholds()).trace_worth_pct / 100
    if record is None and not any(proven_gain(f) for f in findings):
        return sorted(findings, key=order)  # nothing to weigh
    looked = _Rows.of(rows)
    return sorted((_weighed(f, looked, record, bar) for f in findings), key=order)


@dataclass(frozen=True)
class _Rows:
    """Each judged row's case id and time (its kernels' where traced, else its call's)."""

    case_ids: dict[int, str]
    times_ms: dict[int, float]

    @classmethod
    def of(cls, rows: pd.DataFrame) -> _Rows:
        labels = [int(label) for label in rows.index]
        ids = rows["case_id"].astype(str) if "case_id" in rows.columns else None
        took = pd.Series(float("nan"), index=rows.index)
        for column in ("time_ms", "kernel_time_ms"):  # the kernels' where traced win
            if column in rows.columns:
                values = pd.to_numeric(rows[column], errors="coerce").astype(float)
                took = values.where(values.notna(), took)
        return cls(
            dict(zip(labels, ids, strict=True)) if ids is not None else {},
            {label: float(t) for label, t in zip(labels, took, strict=True) if t == t},
        )


def proven_gain(finding: Finding) -> float:
    """The share of its call's time the finding's measured alternative gives back; 0 where
    nothing faster was measured (or the rule's own severity is info: not beyond noise)."""
    severity = finding.impact.get("rule_severity", finding.severity)
    if finding.rule not in GAIN_RULES or severity == Severity.info or not finding.effect > 0:
        return 0.0
    return float(finding.effect)


def _weighed(finding: Finding, rows: _Rows, record: TraceRecord | None, bar: float) -> Finding:
    gain = proven_gain(finding)
    impact: dict[str, Any] = {"ratio": round(1 / (1 - gain), 4)} if gain else {}
    call_ms = _call_ms(finding, rows) if gain else None
    words = ""
    if call_ms is not None:
        impact["saved_us_per_call"] = round(1e3 * call_ms * gain, 3)
        words = f" Gain: {impact['ratio']:.2f}x, {us_text(impact['saved_us_per_call'])} us a call."
    if record is None:
        if not impact:
            return finding
        return replace(finding, impact=impact, message=_said(finding.message, words))
    judged = _judged_case(finding, rows)
    ids = list(dict.fromkeys([*case_ids(finding, rows), *([judged] if judged else [])]))
    called = list({p.problem: p for i in ids if (p := record.called(i)) is not None}.values())
    if not called:
        why = record.why_not(judged or (ids[0] if ids else ""))
        impact |= {"called": False, "why": why, "share": 0.0, "worth": 0.0}
        words = f" Not a call the traced model makes ({why}): nothing for it to gain."
    else:
        impact |= _model_side(called, record)
        target = record.called(judged) if judged else None
        if gain and target is not None:  # the model's own time of the call the gain is of
            impact["saved_us_per_call"] = round(gain * target.mean_us, 3)
            impact["saved_us_per_step"] = round(gain * 1e3 * target.kernel_ms / record.steps, 3)
            impact["worth"] = round(impact["saved_us_per_step"] / record.gemm_us_per_step, 6)
        else:  # nothing faster measured on a call the model makes: at most its whole time
            impact.pop("saved_us_per_call", None)
            impact["worth"] = 0.0 if gain else impact["share"]
        words = _trace_words(impact, record)
        if gain and target is None:
            words += f" Its measured gain is of {judged}, {record.why_not(judged)}."
    severity = finding.severity
    if impact["worth"] < bar and severity != Severity.info:
        impact["rule_severity"] = severity
        severity = Severity.info
        if called:
            words += f" Worth under {pct_text(bar)} of the trace's GEMM time: info."
    return replace(finding, severity=severity, impact=impact, message=_said(finding.message, words))


def _said(message: str, words: str) -> str:
    """The rule's message, then what the finding is worth as sentences of their own."""
    if not words:
        return message
    return (message if message.endswith(".") else message + ".") + words


def _model_side(called: Sequence[TracedProblem], record: TraceRecord) -> dict[str, Any]:
    steps = record.steps
    kernel_us = 1e3 * sum(p.kernel_ms for p in called)
    calls = sum(p.calls for p in called)
    return {
        "called": True,
        "ops": " | ".join(dict.fromkeys(p.ops for p in called)),
        "problems": [p.problem for p in called],
        "calls_per_step": round(calls / steps, 3),
        "us_per_step": round(kernel_us / steps, 3),
        "us_per_call": round(kernel_us / calls, 3) if calls else 0.0,
        "share": round(sum(p.share for p in called), 6),
    }


def _trace_words(impact: dict[str, Any], record: TraceRecord) -> str:
    step = "a step" if record.steps > 1 else "in the trace"
    said = (
        f" In the traced model: {impact['ops']}, {impact['calls_per_step']:g} "
        f"call{'' if impact['calls_per_step'] == 1 else 's'} {step}, "
        f"{us_text(impact['us_per_step'])} us ({pct_text(impact['share'])} of its GEMM time)"
    )
    if impact.get("saved_us_per_step"):  # on the model's time of the call, not the audit's
        per_call, per_step = impact["saved_us_per_call"], impact["saved_us_per_step"]
        said += (
            f"; the gain: {impact['ratio']:.2f}x, {us_text(per_call)} us a call, "
            f"{us_text(per_step)} us {step} ({pct_text(impact['worth'])} of it)"
        )
    return said + "."


def us_text(value: float) -> str:
    """Microseconds as a reader takes them in: '7.25', '1,129'."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def pct_text(share: float) -> str:
    """A share as a percentage: '0.14 %', '34.9 %', '1 %'."""
    return f"{100 * share:.3g} %"


def case_ids(finding: Finding, rows: _Rows) -> list[str]:
    """The case ids a finding concerns: its rows' in the judged table, and the cases its evidence
    names (a candidate audit's problem may have no row of its own)."""
    found = [rows.case_ids[label] for label in finding.rows if label in rows.case_ids]
    found += [str(item["case_id"]) for item in finding.evidence if item.get("case_id")]
    return list(dict.fromkeys(found))


def _judged_case(finding: Finding, rows: _Rows) -> str:
    """The call whose time the finding's gain is of: a candidate audit's default, else the
    judged (slow) row, the last of its rows."""
    for item in finding.evidence:
        if item.get("role") == "default" and item.get("case_id"):
            return str(item["case_id"])
    return rows.case_ids.get(finding.rows[-1], "") if finding.rows else ""


def _call_ms(finding: Finding, rows: _Rows) -> float | None:
    """The judged call's time: a candidate audit's default on its basis (the confirmation
    round's, whose ratio is the claim), else the row's kernels' time (CUPTI) where traced, else
    the call's."""
    for item in finding.evidence:
        if item.get("role") == "default":  # the round its claim is of: the pairwise one's first
            kernel = item.get("timing_basis") == "kernel"
            names = ("kernel_confirm_ms", "kernel_ms") if kernel else ("confirm_time_ms", "time_ms")
            took = next((item[n] for n in names if item.get(n) is not None), None)
            return float(took) if took is not None else None
    return rows.times_ms.get(finding.rows[-1]) if finding.rows else None


# ----- the verdict ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProblemVerdict:
    problem: str
    ops: str
    shape: str  # PyTorch's
    share: float
    gap: float | None  # the default over its best candidate (the claim), None: no audit
    within_noise: bool
    flagged: bool = False  # the candidate audit's finding


@dataclass(frozen=True)
class TraceVerdict:
    trace: str
    problems: int  # the trace's distinct problems this tool poses
    steps: int
    gemm_us: float  # the trace's GEMM time a step
    unaudited_share: float
    within_noise: float  # share of GEMM time: default within noise of its best candidate
    under_bar: tuple[ProblemVerdict, ...]  # a gap beyond noise, under the candidate bar
    no_audit: float  # share of GEMM time with no candidate verdict
    gain_us: float  # what the findings give back a step
    worth: int  # findings worth the bar (above info)
    bar: float
    candidate_bar: float

    @property
    def healthy(self) -> bool:
        return self.worth == 0

    @property
    def gain_share(self) -> float:
        return self.gain_us / self.gemm_us if self.gemm_us else 0.0


def trace_verdict(
    record: TraceRecord | None,
    candidates: CandidateVerdicts | None,
    findings: Sequence[Finding],
    thresholds: Thresholds | None = None,
) -> TraceVerdict | None:
    """The verdict on a traced model (module docstring); None without a trace."""
    if record is None:
        return None
    limits = thresholds or Thresholds()
    gaps = _candidate_gaps(candidates)
    judged = [_problem_verdict(p, gaps) for p in record.problems if p.cases]
    gains: dict[str, float] = {}
    for finding in findings:
        impact = finding.impact
        if impact.get("called") and impact.get("saved_us_per_step"):
            for problem in impact.get("problems", []):
                gains[problem] = max(gains.get(problem, 0.0), float(impact["saved_us_per_step"]))
    return TraceVerdict(
        trace=record.trace,
        problems=len(judged),
        steps=record.steps,
        gemm_us=record.gemm_us_per_step,
        unaudited_share=record.unaudited_ms / record.gemm_ms if record.gemm_ms else 0.0,
        within_noise=sum(v.share for v in judged if v.within_noise),
        under_bar=tuple(
            v for v in judged if v.gap is not None and not v.within_noise and not v.flagged
        ),
        no_audit=sum(v.share for v in judged if v.gap is None),
        gain_us=sum(gains.values()),
        worth=sum(f.severity != Severity.info for f in findings),
        bar=limits.trace_worth_pct / 100,
        candidate_bar=candidates.threshold
        if candidates is not None
        else limits.candidate_gap_pct / 100,
    )


def _candidate_gaps(candidates: CandidateVerdicts | None) -> dict[str, tuple[float, bool]]:
    """Each audited case's claimed gap (the confirmation round's where there was one, else the
    screen's: a gap under the bar is not confirmed) and whether it is a finding."""
    if candidates is None:
        return {}
    found = {}
    for row in candidates.summary.to_dict("records"):
        claim = plain(row.get("confirm_left_on_table"))
        claim = claim if claim is not None else plain(row.get("left_on_table"))
        if claim is not None and claim > 0:
            found[str(row["case_id"])] = (float(claim), bool(row.get("flagged")))
    return found


def _problem_verdict(
    problem: TracedProblem, gaps: Mapping[str, tuple[float, bool]]
) -> ProblemVerdict:
    gap, flagged = gaps.get(f"cublasLt.{problem.problem}", (None, False))
    within = gap is not None and ratio_verdict(gap, INTERLEAVED_FLOOR, 0.0) is not Verdict.slower
    return ProblemVerdict(
        problem.problem, problem.ops, problem.shape, problem.share, gap, within, flagged
    )


# ----- a trace's fixes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NotProposed:
    """A measured fix that is no fix for the traced model: the call it changes is not one the
    model makes (a TunableOp row for it would never match a call)."""

    fix_id: str
    problem: str
    why: str


def model_fixes(
    fixes: FixSet, records: Mapping[str, TraceRecord]
) -> tuple[FixSet, list[NotProposed]]:
    """A trace's fixes are for the calls its model makes: each fix of a run with a trace
    (`records`: by the run a fix's source names) kept where the model makes its call, with the
    model's op, shape and share of GEMM time (`Fix.torch`), else left out with why. A fix of a
    run without a trace is kept as it is."""
    kept: list[Fix] = []
    left: list[NotProposed] = []
    for fix in fixes.fixes:
        record = records.get(fix.source.get("run", ""))
        case_id = fix.source.get("case_id", "")
        traced = record.called(case_id) if record is not None else None
        if record is None:
            kept.append(fix)
        elif traced is None:
            why = f"not a call the traced model makes: {case_id} is {record.why_not(case_id)}"
            left.append(NotProposed(fix.id, fix.problem.name, why))
        else:
            batch = traced.batch
            side = TorchOp(traced.ops, traced.shape, batch, traced.share)
            kept.append(replace(fix, torch=side))
    return replace(fixes, fixes=tuple(kept)), left
