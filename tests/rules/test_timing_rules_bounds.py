"""judge.rules.timing_rules at its boundaries on recorded H100 runs (the shipped noise model).

reference-faster: reports/h100/checks/20261127-102606-rerun-a, FP32 256^3 batch 8 on kernel
time: cuBLAS 0.013856 against the reference's 0.012480 ms (1.1103x), cuBLASLt 0.013600 (1.0897x).
batched-slower-than-loop: reports/h100/layouts/20261123-225609-layouts, FP32 2048^3 batch 8 in tt:
3.18883 against its loop's 2.90425 ms of kernel time (1.0980x).
"""

from __future__ import annotations

from functools import cache

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.frame import RuleContext
from cublas_audit.judge.rules.timing_rules import (
    _compared_time,
    batched_slower_than_loop,
    reference_faster,
)
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.dispatch import from_records
from tests.conftest import REPORTS

RERUN = "h100/checks/20261127-102606-rerun-a"
LAYOUTS = "h100/layouts/20261123-225609-layouts"
CUBLAS, CUBLASLT, REFERENCE = 0.013856, 0.013600, 0.012480  # 256^3 batch 8, kernels' ms
TT, TT_LOOP = 3.18883, 2.90425


@cache
def _rows(run: str) -> pd.DataFrame:
    return prepare(from_records(pd.read_csv(REPORTS / run / "dispatch.csv").to_dict("records")))


def rule(name: str, run: str, **thresholds: float) -> list[Finding]:
    ctx = RuleContext(_rows(run), Thresholds(**thresholds))  # type: ignore[arg-type]
    found = (reference_faster if name == "reference" else batched_slower_than_loop)(ctx)
    return [f for f in found if f.severity != "info"]


def test_the_reference_high_at_exactly_high_ratio() -> None:
    at = rule("reference", RERUN, high_ratio=CUBLAS / REFERENCE)  # 1.1103: cuBLAS's own ratio
    assert [(f.api, f.severity) for f in at] == [("cublas", "high"), ("cublasLt", "medium")]
    above = rule("reference", RERUN, high_ratio=CUBLAS / REFERENCE + 1e-9)
    assert [f.severity for f in above] == ["medium", "medium"]


def test_the_batched_call_high_at_exactly_high_ratio() -> None:
    (at,) = rule("loop", LAYOUTS, high_ratio=TT / TT_LOOP)  # 1.0980
    assert (at.sizes, at.severity, at.batch) == (["2048 tt"], "high", 8)
    assert "takes 1.10x the time of a loop of 8 single calls" in at.message
    (above,) = rule("loop", LAYOUTS, high_ratio=TT / TT_LOOP + 1e-9)
    assert above.severity == "medium"


def test_the_words_of_the_time_compared() -> None:
    assert _compared_time(pd.DataFrame({"judged_on": ["kernel", "kernel"]})) == (
        "comparing the kernels' time (CUPTI)"
    )
    assert _compared_time(pd.DataFrame({"x": [1]})) == "comparing the calls' time (CUDA events)"
    assert _compared_time(pd.DataFrame({"judged_on": ["kernel", "call"]})) == (
        "comparing the kernels' time (CUPTI) where traced, else the calls' time"
    )


def test_the_loop_margin_either_side_of_the_pairs_ratio() -> None:
    # 1.0980x: beyond a margin of 9.75 %, within 9.85 % (read as a fraction of 101: 9.75 %)
    assert [f.sizes for f in rule("loop", LAYOUTS, loop_margin_pct=9.75)] == [["2048 tt"]]
    assert rule("loop", LAYOUTS, loop_margin_pct=9.85) == []


def test_on_the_calls_time_the_tt_gap_is_unsure_between_runs() -> None:
    """Without the kernels' times the calls' judge: tt's 3.20138 against its loop's 2.93664 ms
    (1.0901x) is within the call's floor between two cases at 2.9 ms (10.39 %): an info finding;
    the pair was not timed interleaved, so the ratio's smaller floor (2.18 %) does not apply."""
    rows = _rows(LAYOUTS)
    calls = rows.drop(columns=[c for c in rows.columns if c.startswith("kernel_time")])
    found = batched_slower_than_loop(RuleContext(calls, Thresholds()))
    assert [(f.sizes, f.severity) for f in found] == [(["2048 tt"], "info")]
    assert found[0].message.startswith(
        "Unsure: the measurements put the batched call slower than the loop by 1.09x at size"
    )


def test_the_batched_call_re_measured_inside_its_loop() -> None:
    """reports/h100/maps/20261123-235543-fp32-64-4096: FP32 3392^3 batch 8 took 12.9079 ms of
    kernel time on its own, 13.1728 re-measured inside its loop case (13.5842): faster either
    way, so nothing; the re-measured times replace the row's own."""
    table = REPORTS / "h100/maps/20261123-235543-fp32-64-4096/dispatch.csv"
    frame = pd.read_csv(table, skiprows=lambda i: 0 < i < 209 or i > 212)  # its rows 208-211
    assert frame["case_id"].str.contains("3392x3392x3392").all()
    rows = prepare(from_records(frame.to_dict("records")))
    assert batched_slower_than_loop(RuleContext(rows, Thresholds(loop_margin_pct=0))) == []
