"""CA302 batched-slower-than-loop: reports/h100/layouts/20261123-225609-layouts timed FP32
2048^3 batch 8 in each layout beside a loop of 8 single calls in the same layout (kernel time,
ms):

    layout   batched   its loop
    nn       2.74502   2.7729
    nt       2.68709   2.67602
    tn       2.75439   2.84742
    tt       3.18883   2.90425   -> 1.098x: the one finding

Each batched call is judged against its own layout's loop: against all four, the tt call was
one finding on four rows "1.10-1.19x" (1.19x being the nt loop's time).
"""

from __future__ import annotations

from cublas_audit.judge.rules import unsure_case_ids
from cublas_audit.judge.thresholds import Thresholds
from tests.rules.recorded import case_ids, dataset, judged, sliced

RUN = "h100/layouts/20261123-225609-layouts"
TT = "cublas.fp32.2048x2048x2048.b8.tt"


def test_the_tt_batched_call_against_its_own_loop() -> None:
    (finding,) = judged(dataset(RUN), "batched-slower-than-loop")
    assert (finding.api, finding.batch, finding.severity, finding.kernel) == (
        "cublas",
        8,
        "medium",
        "xmma_64x64x8",
    )
    assert finding.sizes == ["2048 tt"] and case_ids(dataset(RUN), finding) == [TT]
    assert "takes 1.10x the time of a loop of 8 single calls at size 2048 tt" in finding.message
    assert finding.evidence[0]["loop_time_ms"] == 2.9366  # the tt loop's call time


def test_no_loop_companion_no_finding() -> None:
    assert judged(sliced(RUN, [TT]), "batched-slower-than-loop") == []
    # another layout's loop is no companion
    assert (
        judged(sliced(RUN, [TT, "loop.fp32.2048x2048x2048.b8.nt"]), "batched-slower-than-loop")
        == []
    )


def test_an_unsure_pair_is_measured_again_both_sides() -> None:
    """With no margin, nt's 1.004x is a gap the noise model cannot confirm: the sweep re-measures
    the batched call and its loop companion."""
    found = judged(dataset(RUN), "batched-slower-than-loop", loop_margin_pct=0)
    assert [(f.sizes, f.severity) for f in found] == [
        (["2048 tt"], "medium"),
        (["2048 nt"], "info"),
    ]
    assert unsure_case_ids(dataset(RUN).frame, Thresholds(loop_margin_pct=0)) == [
        "cublas.fp32.2048x2048x2048.b8.nt",
        "loop.fp32.2048x2048x2048.b8.nt",
    ]
    assert unsure_case_ids(dataset(RUN).frame) == []
