"""CA101 no-escalation on recorded tables: the RTX 5090 of the article (published, FP32 batch 8)
keeps simt_128x32_8x5 from 256 to 8192; the H100's batch-4 simt_256x128_8x4 from 1024 to 8192
(tests/fixtures/h100-batched-cublas) runs at 78.3727-81.9489 % FMA and fires only once the
limit is above its best."""

from __future__ import annotations

import math

from tests.rules.recorded import dataset, judged

PUBLISHED = "fixtures:published_article_b8.csv"
H100 = "fixtures:h100-batched-cublas"


def test_the_article_5090_never_escalates() -> None:
    (finding,) = judged(dataset(PUBLISHED, "5090"), "no-escalation")
    assert (finding.severity, finding.kernel) == ("high", "simt_128x32_8x5")
    assert finding.sizes == ["256", "512", "1024", "2048", "4096", "8192"]
    assert "from 256 to 8192 (32x in linear size)" in finding.message


def test_the_h100_escalates_enough_at_the_default_limit() -> None:
    assert judged(dataset(H100), "no-escalation") == []
    assert judged(dataset(PUBLISHED, "h200"), "no-escalation") == []


def test_the_h100_run_fires_just_above_its_best_utilization() -> None:
    above = math.nextafter(81.9489, math.inf)
    (finding,) = judged(dataset(H100), "no-escalation", escalation_max_pct=above)
    assert (finding.batch, finding.sizes) == (4, ["1024", "2048", "4096", "8192"])
    assert judged(dataset(H100), "no-escalation", escalation_max_pct=81.9489) == []
