"""CA202 underfilled-grid: the M = N = 1, K = 131072 dot of pytorch#114911 on the H100
(reports/h100/layouts/20261123-225609-gemv) ran on 496 CTAs of the 132 SMs in 0.00392 ms
(cublasSgemm) and 0.00416 ms (strided batched): fixed on cuBLAS 13.1. Only thresholds beyond
the recorded figures make it fire: fewer CTAs than 4 x 132 = 528, from 0.00392 ms up."""

from __future__ import annotations

import math

from tests.rules.recorded import dataset, judged

GEMV = "h100/layouts/20261123-225609-gemv"
RULE = "underfilled-grid"


def test_the_dot_fills_the_h100() -> None:
    assert judged(dataset(GEMV), RULE) == []


def test_fewer_ctas_than_the_share_of_sms_on_a_long_enough_kernel() -> None:
    found = judged(dataset(GEMV), RULE, underfill_sm_fraction=4, underfill_min_ms=0.00392)
    assert sorted(f.sizes[0] for f in found) == ["1x1x131072", "1x1x131072 strided"]
    assert {f.severity for f in found} == {"high"}
    # 496 CTAs are not below 496 / 132 of the SMs
    assert judged(dataset(GEMV), RULE, underfill_sm_fraction=496 / 132, underfill_min_ms=0) == []
    # the cublasSgemm call's 0.00392 ms is below a minimum just above it
    shorter = math.nextafter(0.00392, math.inf)
    found = judged(dataset(GEMV), RULE, underfill_sm_fraction=4, underfill_min_ms=shorter)
    assert [f.sizes[0] for f in found] == ["1x1x131072 strided"]


def test_every_operand_counts_toward_the_bytes_gate() -> None:
    """64^3 fp32 (4 CTAs): A, B and C are 3 x 64 x 64 x 4 = 49152 bytes, 372.4 a SM of 132. At
    300 bytes a SM (39600) it fires, at 373 (49236) not; without B (32772) it would not at 300."""
    loose = {"underfill_sm_fraction": 1, "underfill_min_ms": 0}
    found = judged(dataset(GEMV), RULE, underfill_bytes_per_sm=300, **loose)
    assert sorted(f.sizes[0] for f in found) == ["64", "64 strided"]
    assert "launches 4-4 CTAs on a GPU of 132 SMs" in found[0].message
    assert judged(dataset(GEMV), RULE, underfill_bytes_per_sm=373, **loose) == []
