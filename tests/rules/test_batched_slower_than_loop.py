"""CA302 batched-slower-than-loop: reports/h100/layouts/20261123-225609-layouts timed FP32
2048^3 batch 8 in each layout beside a loop of 8 single calls in the same layout; in tt the
batched cublasSgemmStridedBatched (xmma_64x64x8) took 3.18883 ms of kernel time, its tt loop
2.90425 ms."""

from __future__ import annotations

from tests.rules.recorded import dataset, judged, sliced

RUN = "h100/layouts/20261123-225609-layouts"


def test_the_tt_batched_call_against_its_loop() -> None:
    found = judged(dataset(RUN), "batched-slower-than-loop")
    assert [(f.api, f.batch, f.severity, f.kernel) for f in found] == [
        ("cublas", 8, "medium", "xmma_64x64x8")
    ]
    assert "a loop of 8 single calls" in found[0].message


def test_no_loop_companion_no_finding() -> None:
    alone = sliced(RUN, ["cublas.fp32.2048x2048x2048.b8.tt"])
    assert judged(alone, "batched-slower-than-loop") == []
