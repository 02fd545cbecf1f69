"""CA602 dispatch-cliff on a recorded map shard (reports/h100/checks/20261125-101230-shards,
shard-2: FP32, N = 192): from 1792x192x576 to 1792x192x1920 (K's neighbouring grid values) the
kernel changes and throughput drops by a third (effect 0.337)."""

from __future__ import annotations

from tests.rules.recorded import case_ids, dataset, judged

SHARD = "h100/checks/20261125-101230-shards/shard-2"


def test_the_kernel_change_with_a_drop() -> None:
    data = dataset(SHARD)
    (finding,) = judged(data, "dispatch-cliff")
    assert (finding.sizes, finding.severity) == (["1792x192x1920"], "medium")
    assert case_ids(data, finding) == ["cublas.fp32.1792x192x1920.b1.nn"]
    assert case_ids(data, finding, "compared") == ["cublas.fp32.1792x192x576.b1.nn"]
    assert round(finding.effect, 3) == 0.337
    # a drop of 33.7 % is no cliff at a 34 % threshold
    assert judged(data, "dispatch-cliff", cliff_drop_pct=34) == []
