"""CA601 size-inversion on a recorded map shard (reports/h100/checks/20261125-101230-shards,
shard-2: FP32, N = 64): 1472x64x1408 takes 1.10x the kernel time of the larger 1984x64x2048."""

from __future__ import annotations

from tests.rules.recorded import case_ids, dataset, judged, sliced

SHARD = "h100/checks/20261125-101230-shards/shard-2"
SLOW, FAST = "cublas.fp32.1472x64x1408.b1.nn", "cublas.fp32.1984x64x2048.b1.nn"


def test_a_problem_slower_than_a_larger_one() -> None:
    data = dataset(SHARD)
    (finding,) = judged(data, "size-inversion")
    assert finding.sizes == ["1472x64x1408"] and finding.severity == "medium"
    assert finding.message.startswith(
        "1472x64x1408 takes 1.10x the time of the larger 1984x64x2048"
    )
    assert case_ids(data, finding) == [SLOW]
    compared = data.frame[data.frame["case_id"] == FAST].index
    assert len(compared) == 1 and round(finding.effect, 3) == 0.087


def test_the_two_problems_alone_and_either_alone() -> None:
    assert len(judged(sliced(SHARD, [SLOW, FAST]), "size-inversion")) == 1
    assert judged(sliced(SHARD, [SLOW]), "size-inversion") == []
    # a margin above the recorded 1.10x: none
    assert judged(sliced(SHARD, [SLOW, FAST]), "size-inversion", inversion_margin_pct=11) == []
