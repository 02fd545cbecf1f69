"""judge/impact.py pinned on the H100's recorded ViT-B/16 trace audit
(reports/h100/traces/20261127-100356-vit: its dispatch table, its trace.json record and its
candidate audit): what a finding with a measured gain is worth per call without a trace, and with
it the model's side, the worth against `trace_worth_pct`, the words, and the verdict on the model.

The record (trace.json): one step, GEMM time 3.232819 ms = 3232.819 us; the MLP up-projection
fp16.3072x12608x768.b1.tn.bias (FC1) is called 12 times for 1.129306 ms (share 0.349325, 94.10883 us
a call); its bias-free cuBLAS form (row 4) is a variant the model never calls. Table rows used:
4 cublas FC1 (kernel 0.087123 ms), 5 cublasLt FC1 with bias (kernel 0.091298 ms), 7 cublasLt
768x12608x3072 with bias (share 0.295804), 9 the head 1000x64x768 (share 0.001396).

The findings are made here with the rules' fields (rule, severity, effect, rows): what impact
weighs, never a measurement of its own; every time and share is the recording's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from cublas_audit.judge.candidates import CandidateVerdicts, judge_candidates
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.impact import (
    ProblemVerdict,
    _candidate_gaps,
    _problem_verdict,
    _Rows,
    model_fixes,
    pct_text,
    proven_gain,
    trace_verdict,
    us_text,
    weigh,
)
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.fix_file import TorchOp, read_fix_file
from cublas_audit.table.inputs import load_run
from cublas_audit.table.trace_record import TraceRecord, read_trace_record
from cublas_audit.vocabulary import Severity
from tests.conftest import REPORTS

VIT = REPORTS / "h100" / "traces" / "20261127-100356-vit"
FC1 = "fp16.3072x12608x768.b1.tn.bias"
DOWN = "fp16.768x12608x3072.b1.tn.bias"
LINEAR = "aten::linear > aten::addmm"


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return prepare(load_run(VIT).frame)


@pytest.fixture(scope="module")
def record() -> TraceRecord:
    found = read_trace_record(VIT)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def candidates() -> CandidateVerdicts:
    audited = load_run(VIT).candidates
    assert audited is not None
    return judge_candidates(audited, 0.10)


def _finding(rule: str, severity: Severity, rows: list[int], effect: float, **more: Any) -> Finding:
    return Finding(
        rule, severity, "h100", "cublasLt", "cublasLtMatmul", "fp16", 1, ["x"], "k", "Slow",
        "w", rows=rows, effect=effect, **more,
    )  # fmt: skip


def _one(
    findings: list[Finding], rows: pd.DataFrame, record: TraceRecord | None, **t: float
) -> Finding:
    (found,) = weigh(findings, rows, record, Thresholds(**t) if t else None)  # type: ignore[arg-type]
    return found


def test_rows_take_the_kernels_time_where_traced(rows: pd.DataFrame) -> None:
    looked = _Rows.of(rows)
    assert looked.times_ms[5] == 0.091298 and looked.case_ids[5] == f"cublasLt.{FC1}"
    # without kernel times, the call's; a row without either has none; without case ids, none
    calls = rows[["time_ms"]].copy()
    calls.loc[4, "time_ms"] = float("nan")
    plain = _Rows.of(calls)
    assert plain.times_ms[5] == 0.094752 and 4 not in plain.times_ms and plain.case_ids == {}
    mixed = rows[["case_id", "time_ms", "kernel_time_ms"]].copy()
    mixed.loc[5, "kernel_time_ms"] = float("nan")
    assert _Rows.of(mixed).times_ms[5] == 0.094752


@pytest.mark.parametrize(
    ("finding", "gain"),
    [
        (_finding("layout-penalty", Severity.medium, [5], 0.1), 0.1),
        (_finding("low-utilization", Severity.medium, [5], 0.1), 0.0),  # no measured alternative
        (_finding("layout-penalty", Severity.info, [5], 0.1), 0.0),  # within noise
        (_finding("layout-penalty", Severity.medium, [5], 0.0), 0.0),
        (_finding("layout-penalty", Severity.medium, [5], 0.9), 0.9),  # above 1 - 0
        # weighed already (info for the model), the rule's severity decides
        (
            _finding("layout-penalty", Severity.info, [5], 0.1, impact={"rule_severity": "medium"}),
            0.1,
        ),
        (
            _finding("layout-penalty", Severity.medium, [5], 0.1, impact={"rule_severity": "info"}),
            0.0,
        ),
    ],
)
def test_proven_gain(finding: Finding, gain: float) -> None:
    assert proven_gain(finding) == gain


def test_without_a_trace_the_gain_a_call(rows: pd.DataFrame) -> None:
    found = _one([_finding("layout-penalty", Severity.medium, [5], 0.1)], rows, None)
    # 1 / (1 - 0.1) = 1.11111 -> 1.1111; 1e3 * 0.091298 ms * 0.1 = 9.1298 -> 9.13 us
    assert found.impact == {"ratio": 1.1111, "saved_us_per_call": 9.13}
    assert found.message == "Slow. Gain: 1.11x, 9.13 us a call."
    assert found.severity is Severity.medium
    # the judged row is the last: row 4's 0.087123 ms -> 8.7123 us (not row 0's or 5's)
    last = _one([_finding("layout-penalty", Severity.medium, [5, 0, 4], 0.1)], rows, None)
    assert last.impact["saved_us_per_call"] == 8.712
    # a finding without a gain, and no trace: nothing weighed, the very finding back
    plain = _finding("low-utilization", Severity.medium, [5], 0.0)
    assert weigh([plain], rows, None)[0] is plain


def test_a_call_the_model_makes_with_its_gain(rows: pd.DataFrame, record: TraceRecord) -> None:
    found = _one([_finding("layout-penalty", Severity.medium, [5], 0.1)], rows, record)
    # FC1: 1e3 * 1.129306 = 1129.306 us over 12 calls = 94.109 us a call; the gain 0.1 of it:
    # 9.411 us a call, 112.931 us a step, 112.931 / 3232.819 = 0.034933 of the GEMM time
    assert found.impact == {
        "ratio": 1.1111,
        "saved_us_per_call": 9.411,
        "called": True,
        "ops": LINEAR,
        "problems": [FC1],
        "calls_per_step": 12.0,
        "us_per_step": 1129.306,
        "us_per_call": 94.109,
        "share": 0.349325,
        "saved_us_per_step": 112.931,
        "worth": 0.034933,
    }
    assert found.severity is Severity.medium  # 3.49 % >= 1 %
    assert found.message == (
        f"Slow. In the traced model: {LINEAR}, 12 calls in the trace, 1,129 us (34.9 % of its "
        "GEMM time); the gain: 1.11x, 9.41 us a call, 113 us in the trace (3.49 % of it)."
    )


def test_two_steps_divide_the_model_s_side(rows: pd.DataFrame, record: TraceRecord) -> None:
    # the same trace read as two steps (ProfilerStep marks): per step, half
    two = replace(record, steps=2)
    found = _one([_finding("layout-penalty", Severity.medium, [5], 0.1)], rows, two)
    assert found.impact["calls_per_step"] == 6.0
    assert found.impact["us_per_step"] == 564.653  # 1129.306 / 2
    assert found.impact["us_per_call"] == 94.109  # per call, steps do not matter
    assert found.impact["saved_us_per_step"] == 56.465  # 112.9306 / 2 = 56.4653
    # the GEMM time a step halves too: 56.465 / 1616.4095 = 0.034932 (56.465 rounded down)
    assert found.impact["worth"] == 0.034932
    assert "6 calls a step, 565 us (34.9 % of its GEMM time)" in found.message
    assert "56.5 us a step (3.49 % of it)" in found.message


def test_a_variant_the_model_never_calls_is_worth_nothing(
    rows: pd.DataFrame, record: TraceRecord
) -> None:
    found = _one([_finding("layout-penalty", Severity.medium, [4], 0.1)], rows, record)
    why = record.why_not(f"cublas.{FC1.removesuffix('.bias')}")
    assert why.startswith("the bias-free form of")
    assert found.impact == {"ratio": 1.1111, "saved_us_per_call": 8.712, "called": False,
                            "why": why, "share": 0.0, "worth": 0.0,
                            "rule_severity": Severity.medium}  # fmt: skip
    assert found.severity is Severity.info
    assert (
        found.message == f"Slow. Not a call the traced model makes ({why}): nothing for it to gain."
    )
    # two variants: why of the judged (last) row, not of the first
    (two,) = weigh([_finding("layout-penalty", Severity.medium, [2, 4], 0.1)], rows, record)
    assert two.impact["why"] == why
    assert two.impact["why"] != record.why_not("cublas.fp16.768x12608x768.b1.tn")


def test_a_finding_without_rows_is_named_by_its_evidence(
    rows: pd.DataFrame, record: TraceRecord
) -> None:
    evidence = [{"case_id": "cublas.fp16.768x12608x768.b1.tn"}]
    found = _one(
        [_finding("low-utilization", Severity.medium, [], 0.0, evidence=evidence)], rows, record
    )
    assert found.impact["why"] == record.why_not("cublas.fp16.768x12608x768.b1.tn")
    assert found.impact["called"] is False


def test_the_gain_of_a_variant_on_a_called_problem(rows: pd.DataFrame, record: TraceRecord) -> None:
    # rows 5 (FC1, called) and 4 (its variant, judged: the last): the model makes the call, the
    # gain is of one it never makes -> worth 0 -> info
    found = _one([_finding("layout-penalty", Severity.medium, [5, 0, 4], 0.1)], rows, record)
    assert found.impact["worth"] == 0.0 and "saved_us_per_call" not in found.impact
    assert "saved_us_per_step" not in found.impact
    assert found.severity is Severity.info
    assert found.impact["rule_severity"] is Severity.medium
    judged = f"cublas.{FC1.removesuffix('.bias')}"
    assert f" Its measured gain is of {judged}, {record.why_not(judged)}." in found.message
    assert found.message.endswith(" Worth under 1 % of the trace's GEMM time: info.")


@pytest.mark.parametrize(
    ("row", "share", "severity"),
    [(7, 0.295804, Severity.medium), (9, 0.001396, Severity.info)],
)
def test_without_a_gain_the_worth_is_the_whole_share(
    rows: pd.DataFrame, record: TraceRecord, row: int, share: float, severity: Severity
) -> None:
    found = _one([_finding("low-utilization", Severity.medium, [row], 0.0)], rows, record)
    assert found.impact["worth"] == share and found.impact["share"] == share
    assert "saved_us_per_call" not in found.impact and "ratio" not in found.impact
    assert found.severity is severity
    assert found.message.endswith("Worth under 1 % of the trace's GEMM time: info.") is (
        severity is Severity.info
    )


def test_the_bar_at_and_beside_the_worth(rows: pd.DataFrame, record: TraceRecord) -> None:
    # DOWN's share 0.295804: a bar of exactly it is not above it (worth < bar is info)
    low = _finding("low-utilization", Severity.medium, [7], 0.0)
    assert 29.5804 / 100 == 0.295804
    assert _one([low], rows, record, trace_worth_pct=29.5804).severity is Severity.medium
    assert _one([low], rows, record, trace_worth_pct=29.5805).severity is Severity.info
    # a bar's words: 0.99 % where trace_worth_pct is 0.99
    head = _finding("low-utilization", Severity.medium, [9], 0.0)
    assert "Worth under 0.99 % of" in _one([head], rows, record, trace_worth_pct=0.99).message
    # an info finding stays info without a rule severity of its own
    info = _one([replace(head, severity=Severity.info)], rows, record)
    assert "rule_severity" not in info.impact and "Worth under" not in info.message


def test_a_message_ending_in_a_full_stop_keeps_one(rows: pd.DataFrame) -> None:
    found = _finding("layout-penalty", Severity.medium, [5], 0.1)
    said = _one([replace(found, message="Slow.")], rows, None)
    assert said.message == "Slow. Gain: 1.11x, 9.13 us a call."


def test_a_candidate_audit_s_default_is_the_judged_call(
    rows: pd.DataFrame, record: TraceRecord
) -> None:
    # the evidence's default names the call and its time: the confirmation round's on the
    # kernel basis (0.0913 ms: 9.13 us at 0.1), a row of another problem notwithstanding
    default = {"role": "default", "case_id": f"cublasLt.{FC1}", "timing_basis": "kernel",
               "kernel_ms": 0.095, "kernel_confirm_ms": 0.0913, "time_ms": 0.2}  # fmt: skip
    best = {"role": "best", "case_id": f"cublasLt.{DOWN}", "kernel_ms": 0.05}
    finding = _finding("better-candidate", Severity.medium, [7], 0.1, evidence=[best, default])
    alone = _one([finding], rows, None)
    assert alone.impact["saved_us_per_call"] == 9.13
    traced = _one([finding], rows, record)
    assert traced.impact["problems"] == [DOWN, FC1]  # the row's and the evidence's
    assert traced.impact["saved_us_per_call"] == 9.411  # of FC1's model time, the default's
    # without the confirmation round, the screen's kernel time; on the call basis, its times
    screen = {**default, "kernel_confirm_ms": None}
    assert (
        _one([replace(finding, evidence=[screen])], rows, None).impact["saved_us_per_call"] == 9.5
    )
    calls = {**default, "timing_basis": "call", "confirm_time_ms": None}
    assert (
        _one([replace(finding, evidence=[calls])], rows, None).impact["saved_us_per_call"] == 20.0
    )
    # a default without any time: no time a call
    bare = {"role": "default", "case_id": f"cublasLt.{FC1}"}
    assert "saved_us_per_call" not in _one([replace(finding, evidence=[bare])], rows, None).impact
    # a default without a case id names no call: the judged row's (DOWN, not FC1)
    nameless = {**default, "case_id": ""}
    traced = _one([replace(finding, evidence=[nameless])], rows, record)
    # DOWN's model time: 1e3 * 0.956281 ms / 12 calls = 79.690 us, 0.1 of it 7.969
    assert traced.impact["problems"] == [DOWN] and traced.impact["saved_us_per_call"] == 7.969


def test_us_and_pct_text() -> None:
    assert us_text(1129.306) == "1,129" and us_text(99.96) == "100" and us_text(7.254) == "7.25"
    assert pct_text(0.001396) == "0.14 %" and pct_text(0.01) == "1 %"


def test_the_verdict_on_the_model(record: TraceRecord, candidates: CandidateVerdicts) -> None:
    assert trace_verdict(None, candidates, []) is None
    worth = replace(
        _finding("layout-penalty", Severity.medium, [5], 0.1),
        impact={"called": True, "saved_us_per_step": 112.931, "problems": [FC1]},
    )
    smaller = replace(
        worth, impact={**worth.impact, "saved_us_per_step": 50.0}, severity=Severity.info
    )
    not_called = replace(
        worth,
        severity=Severity.info,
        impact={"called": False, "saved_us_per_step": 7.0, "problems": [DOWN]},
    )
    verdict = trace_verdict(record, candidates, [smaller, worth, not_called])
    assert verdict is not None
    assert (verdict.problems, verdict.steps, verdict.gemm_us) == (5, 1, 3232.819)
    assert verdict.unaudited_share == 0.0
    assert verdict.gain_us == 112.931  # FC1 once, at its largest gain; the uncalled none
    assert verdict.gain_share == pytest.approx(112.931 / 3232.819)
    assert verdict.worth == 1 and not verdict.healthy
    assert (verdict.bar, verdict.candidate_bar) == (0.01, 0.1)
    # cuBLASLt's gaps (confirmed where confirmed): FC1 1.08203 (screen 1.114511), beyond the
    # interleaved noise, not flagged: under the bar; the others' 1.007601, 1.011244, 1.020291
    # and 1.0 within it; every problem audited
    assert [(v.problem, v.gap, v.flagged) for v in verdict.under_bar] == [(FC1, 1.08203, False)]
    within = {v.problem for v in judged_all(record, candidates) if v.within_noise}
    assert FC1 not in within and DOWN in within
    assert verdict.no_audit == 0.0
    assert verdict.within_noise == pytest.approx(1 - 0.349325, abs=2e-6)  # every other share
    healthy = trace_verdict(
        record, None, [smaller], Thresholds(candidate_gap_pct=20, trace_worth_pct=2)
    )
    assert healthy is not None and healthy.healthy and healthy.worth == 0
    assert (healthy.bar, healthy.candidate_bar) == (0.02, 0.2)
    assert healthy.no_audit == pytest.approx(1.0, abs=2e-6) and healthy.under_bar == ()
    assert healthy.within_noise == 0


def judged_all(record: TraceRecord, candidates: CandidateVerdicts) -> list[ProblemVerdict]:
    gaps = _candidate_gaps(candidates)
    return [_problem_verdict(p, gaps) for p in record.problems]


def test_a_problem_verdict_is_not_flagged_unless_said() -> None:
    assert ProblemVerdict("p", "o", "s", 0.1, None, False).flagged is False


def test_the_verdict_s_shares_of_a_record_without_gemm_time(
    record: TraceRecord, candidates: CandidateVerdicts
) -> None:
    # 0.323282 of 3.232819 ms unaudited: 0.1 of the GEMM time
    part = trace_verdict(replace(record, unaudited_ms=0.323282), candidates, [])
    assert part is not None and part.unaudited_share == pytest.approx(0.1, abs=1e-6)
    # a gain under 1 us a step counts as itself (gains start from nothing)
    small = replace(
        _finding("layout-penalty", Severity.info, [7], 0.1),
        impact={"called": True, "saved_us_per_step": 0.5, "problems": [DOWN]},
    )
    some = trace_verdict(record, candidates, [small])
    assert some is not None and some.gain_us == 0.5
    # a record without GEMM time: no share of it
    empty = trace_verdict(replace(record, gemm_ms=0.0), candidates, [small])
    assert empty is not None and empty.unaudited_share == 0.0 and empty.gain_share == 0.0


def test_a_problem_without_a_candidate_audit(record: TraceRecord) -> None:
    alone = _problem_verdict(record.problems[0], {})
    assert (alone.gap, alone.within_noise, alone.flagged) == (None, False, False)


def test_a_trace_s_fixes_are_the_model_s_calls(record: TraceRecord) -> None:
    """The recorded fix set of the FP32 map (reports/h100/fixes/20261125-092546): its run traced
    by the ViT record, no fix is a call the model makes; re-pointed at FC1's cuBLASLt case, one is
    kept with the model's op, shape, batch and share."""
    fixes = read_fix_file(REPORTS / "h100" / "fixes" / "20261125-092546" / "fix.json")
    first = replace(fixes, fixes=fixes.fixes[:2])
    run = first.fixes[0].source["run"]
    assert model_fixes(first, {}) == (first, [])  # no trace for its run: kept as it is
    kept, left = model_fixes(first, {run: record})
    assert kept.fixes == () and [n.fix_id for n in left] == [f.id for f in first.fixes]
    case = first.fixes[0].source["case_id"]
    assert left[0].why == f"not a call the traced model makes: {case} is {record.why_not(case)}"
    fc1 = replace(first.fixes[0], source={**first.fixes[0].source, "case_id": f"cublasLt.{FC1}"})
    kept, left = model_fixes(replace(first, fixes=(fc1,)), {run: record})
    assert left == [] and kept.fixes[0].torch == TorchOp(LINEAR, "12608x3072x768", 1, 0.349325)


def test_per_step_figures_to_3_decimals(rows: pd.DataFrame, record: TraceRecord) -> None:
    # the trace read as 7 steps: 12 / 7 = 1.714286 calls and 1129.306 / 7 = 161.329429 us a step
    seven = replace(record, steps=7)
    found = _one([_finding("low-utilization", Severity.medium, [5], 0.0)], rows, seven)
    assert (found.impact["calls_per_step"], found.impact["us_per_step"]) == (1.714, 161.329)


def test_a_case_without_any_gap_recorded_has_no_audit(
    record: TraceRecord, candidates: CandidateVerdicts
) -> None:
    # FC1's case as a screen that measured no gap (a failed candidate round): neither claim
    summary = candidates.summary.copy()
    fc1 = summary["case_id"] == f"cublasLt.{FC1}"
    summary.loc[fc1, ["left_on_table", "confirm_left_on_table"]] = float("nan")
    verdict = trace_verdict(record, replace(candidates, summary=summary), [])
    assert verdict is not None and verdict.no_audit == 0.349325 and verdict.under_bar == ()
