"""judge.candidates' summary, screen, rounds and finding, pinned on the recorded H100 audit.

reports/h100/20261123-012340-batched's FP32 256x256x256 batch 8: 7 candidates, all correct, the
default (candidate 0, algo 55, tile 32x32, stages 8x3) 0.02968 ms at rank 6, the best candidate 5
(algo 20, tile 64x64, stages 8x5) 0.026384 ms; left_on_table 1.124924, confirmed 1.17064; next
best candidate 2 (tile 64x64, stages 8x3) 0.02768 ms. Its run recorded no gpu_label; the finding's
is tested on a copy that says h100.
"""

from __future__ import annotations

import pandas as pd
import pytest

from cublas_audit.judge import candidates
from cublas_audit.judge.candidates import ScreenJudge, is_better, rounds_hold
from cublas_audit.table import candidates_table
from tests.conftest import REPORTS

FLAGGED = "cublasLt.fp32.256x256x256.b8.nn"


@pytest.fixture(scope="module")
def case() -> pd.DataFrame:
    frame = candidates_table.read_candidates(REPORTS / "h100" / "20261123-012340-batched")
    return frame[frame["case_id"] == FLAGGED].reset_index(drop=True)


def skipped(case: pd.DataFrame) -> pd.DataFrame:
    """The case as an audit records one it skipped: one row, no candidate, its reason."""
    first = case.iloc[0][["case_id", "mode", "m", "n", "k", "batch"]].to_dict()
    return candidates_table.from_records([{**first, "status": "skipped", "reason": "no algorithm"}])


def test_the_default_threshold_is_the_thresholds_10_percent() -> None:
    # Thresholds().candidate_gap_pct = 10.0 -> 10.0 / 100
    assert candidates.DEFAULT_THRESHOLD == 0.10 and ScreenJudge().threshold == 0.10
    assert candidates.floor_words(0.10) == "6% interleaved floor + 10%"


def test_the_summary_finds_the_default_wherever_it_is_listed(case: pd.DataFrame) -> None:
    # listed last (rows reversed): still candidate 0 at rank 6, 0.02968 ms
    summary = candidates.case_summary(case.iloc[::-1]).iloc[0]
    assert (summary["default_candidate"], summary["default_rank"]) == (0, 6)
    assert summary["default_ms"] == 0.02968
    assert (summary["best_candidate"], summary["best_ms"]) == (5, 0.026384)
    assert (summary["candidates"], summary["correct"], summary["status"]) == (7, 7, "ok")
    assert pd.isna(summary["reason"])


def test_a_wrong_candidate_is_neither_correct_nor_best(case: pd.DataFrame) -> None:
    wrong = case.assign(status=case["status"].where(case["candidate"] != 5, "wrong"))
    summary = candidates.case_summary(wrong).iloc[0]
    # 6 of 7 correct; the best is the next fastest correct one, candidate 2 at 0.02768 ms
    assert (summary["candidates"], summary["correct"]) == (7, 6)
    assert (summary["best_candidate"], summary["best_ms"]) == (2, 0.02768)


def test_an_untimed_candidate_is_not_best(case: pd.DataFrame) -> None:
    untimed = case.assign(time_ms=case["time_ms"].where(case["candidate"] != 5))
    assert candidates.case_summary(untimed).iloc[0]["best_candidate"] == 2


def test_a_case_without_a_default_or_a_timed_candidate(case: pd.DataFrame) -> None:
    none = case.assign(is_default=0, status="wrong")
    summary = candidates.case_summary(none).iloc[0]
    assert pd.isna(summary["default_candidate"]) and pd.isna(summary["default_rank"])
    assert pd.isna(summary["default_ms"])
    assert pd.isna(summary["best_candidate"]) and pd.isna(summary["best_ms"])
    assert summary["correct"] == 0 and summary["status"] == "ok"


def test_a_skipped_case_has_no_default_best_or_rank(case: pd.DataFrame) -> None:
    summary = candidates.case_summary(skipped(case)).iloc[0]
    assert (summary["status"], summary["reason"], summary["candidates"]) == (
        "skipped",
        "no algorithm",
        0,
    )
    assert pd.isna(summary["best_candidate"]) and pd.isna(summary["default_candidate"])
    assert ScreenJudge().confirm(skipped(case)) is None
    assert ScreenJudge().progress_line("x", skipped(case)) == "x: skipped (no algorithm)"


def test_the_screen_asks_for_a_confirmation_at_the_bar_and_not_below(case: pd.DataFrame) -> None:
    # 1.0 + 0.10 == 1.10 exactly in floats: a gap at the bar is worth a confirmation round
    assert ScreenJudge(0.10).confirm(case.assign(left_on_table=1.10)) == "5"
    assert ScreenJudge(0.10).confirm(case.assign(left_on_table=1.0999)) is None
    # no gap measured, or the default is the best: nothing to confirm
    assert ScreenJudge(0.0).confirm(case.assign(left_on_table=pd.NA)) is None
    default_best = case.assign(is_default=(case["candidate"] == 5).astype(int))
    assert ScreenJudge(0.0).confirm(default_best) is None


def test_the_progress_line(case: pd.DataFrame) -> None:
    line = ScreenJudge().progress_line("256^3 b8", case)
    assert line == (
        "256^3 b8 (layout unknown): 7 candidates, 7 correct, default rank 6, "
        "left on table 1.125 on call time"
    )
    # no basis recorded, no gap measured: neither is said
    bare = ScreenJudge().progress_line("x", case.assign(timing_basis=pd.NA, left_on_table=pd.NA))
    assert bare.endswith("default rank 6, left on table —")


def test_is_better_refuses_a_missing_or_unphysical_round() -> None:
    # both rounds above 1.06 + 0.10 (the floor and the bar): better; any round missing or at or
    # below zero (no time ratio) is never better, and never reaches the verdict's logarithm
    assert is_better(1.25, 1.25, 0.10)
    for left, confirm in ((None, 1.25), (1.25, None), (0.0, 1.25), (1.25, -1.0), (pd.NA, pd.NA)):
        assert not is_better(left, confirm, 0.10)


def test_rounds_hold_needs_a_round_and_every_round_slower() -> None:
    assert not rounds_hold([], 0.10)  # no round measured holds nothing
    assert rounds_hold([1.25, 1.30], 0.10)
    assert not rounds_hold([1.25, 1.0], 0.10)
    assert not rounds_hold([1.0], 0.10)


def test_the_finding_of_the_flagged_case(case: pd.DataFrame) -> None:
    (finding,) = candidates.find_better_candidates(case.assign(gpu_label="h100"), 0.10)
    assert finding.gpu_label == "h100" and finding.batch == 8 and finding.mode == "fp32"
    assert finding.rows == [0, 5]  # the default's and the best's rows
    assert finding.kernel == "algo 55, tile 32x32, stages 8x3, split-K 1"
    # 1 - 1 / 1.17064 = 0.14576... -> 0.1458
    assert finding.effect == 0.1458
    assert "takes 1.17x the call time of its heuristic's candidate #5" in finding.message
    assert "(the screen of every candidate measured 1.12x)" in finding.message
    assert [e["role"] for e in finding.evidence] == ["default", "best"]
    assert finding.evidence[1]["candidate"] == 5
    # a gpu_label the run did not record is empty, never 'None'
    (unlabelled,) = candidates.find_better_candidates(case, 0.10)
    assert unlabelled.gpu_label == ""


def test_judge_candidates_describes_each_best(case: pd.DataFrame) -> None:
    verdicts = candidates.judge_candidates(case, 0.10)
    row = verdicts.summary.iloc[0]
    assert bool(row["flagged"]) and len(verdicts.flagged) == 1
    assert row["best_described"] == "algo 20, tile 64x64, stages 8x5, split-K 1"
    # an audit whose every case was skipped (no best anywhere): described as nothing
    none = candidates.judge_candidates(skipped(case), 0.10)
    assert none.summary.iloc[0]["best_described"] == "" and not none.flagged


def test_problem_name_says_the_layout_only_where_recorded(case: pd.DataFrame) -> None:
    row = case.iloc[0]
    assert candidates.problem_name(row) == "fp32 256x256x256 batch 8"
    assert candidates.layout_words(row) == candidates.LAYOUT_UNKNOWN


def test_layout_words_of_recorded_layouts() -> None:
    # a packed nn problem has no variant: its layout is said ('nn'); a transposed one with a bias
    # is its variant ('tn bias') (reports/h100/checks/20261127-100356-2073, traces/...-vit)
    nn = candidates_table.read_candidates(REPORTS / "h100/checks/20261127-100356-2073").iloc[0]
    vit = candidates_table.read_candidates(REPORTS / "h100/traces/20261127-100356-vit")
    biased = vit[vit["case_id"] == "cublasLt.fp16.2304x12608x768.b1.tn.bias"].iloc[0]
    assert candidates.layout_words(nn) == "nn"
    assert candidates.problem_name(nn) == "bf16 256x256x256 batch 1"
    assert candidates.layout_words(biased) == "tn bias"
    assert candidates.problem_name(biased) == "fp16 2304x12608x768 batch 1 tn bias"
