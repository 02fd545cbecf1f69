"""CA103 better-candidate: the H100 run reports/h100/20261123-094558-batched audited cuBLASLt's
heuristic; FP32 256^3 batch 8's default (algo 55, tile 32x32) took 1.16x the time of candidate
#5 (tile 64x64) alone, interleaved, after a screen of 1.12x. A run without a candidate audit
has nothing to flag."""

from __future__ import annotations

from tests.rules.recorded import dataset, judged

RUN = "h100/20261123-094558-batched"


def test_a_candidate_confirmed_in_both_rounds() -> None:
    (finding,) = judged(dataset(RUN), "better-candidate")
    assert (finding.api, finding.batch, finding.sizes) == ("cublasLt", 8, ["256x256x256"])
    assert finding.severity == "medium"
    assert "takes 1.16x the call time of its heuristic's candidate #5" in finding.message
    assert "(the screen of every candidate measured 1.12x)" in finding.message


def test_a_gap_the_threshold_does_not_reach() -> None:
    # both rounds must reach 1 + candidate_gap_pct: the screen's 1.12x misses 15 %
    assert judged(dataset(RUN), "better-candidate", candidate_gap_pct=15) == []


def test_no_candidate_audit_nothing_to_flag() -> None:
    assert judged(dataset("fixtures:h100-batched-cublas"), "better-candidate") == []
