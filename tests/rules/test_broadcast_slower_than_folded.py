"""CA303 broadcast-slower-than-folded: FP16 8192x512x8192 batch 4 with a shared A
(reports/h100/layouts/...-broadcast) against the one 8192x2048x8192 GEMM it folds into
(...-folded): cuBLAS 0.361575 against 0.363031 ms of kernel time, cuBLASLt 0.411976 against
0.396312 ms (1.04x): within the noise model's floor, neither is slower."""

from __future__ import annotations

from tests.rules.recorded import dataset, joined, judged

RULE = "broadcast-slower-than-folded"


def test_no_penalty_on_cublas_13_1() -> None:
    both = joined("h100/layouts/20261123-225609-broadcast", "h100/layouts/20261123-225609-folded")
    assert judged(both, RULE) == []
    # nor at a margin of nothing: the verdict is the noise model's
    assert judged(both, RULE, fold_margin_pct=0) == []


def test_without_the_folded_gemm_nothing_to_compare() -> None:
    assert judged(dataset("h100/layouts/20261123-225609-broadcast"), RULE) == []
