"""The timing verdict every timing rule and the diff reach (judge.verdicts.judge), on two recorded
distributions of the same call whose extremes touch: cuBLAS 13.1's fp32 256^3 batch-8 kernel
(reports/h100/versions/20261123-224222-cublas-13.1-batched: median 0.0135525 ms, fastest call
0.013184 ms) against the traced rerun (reports/h100/checks/20261123-231126-batched-traced: median
0.012864 ms, slowest call 0.013184 ms). The medians differ by 5.4 %, beyond a 5 % threshold,
and without a floor the interval is above 1; but the fastest call of the slower side took no
longer than the slowest of the other: the two-mode guard leaves it unsure."""

from __future__ import annotations

from cublas_audit.judge.rules import prepare
from cublas_audit.judge.verdicts import Timed, Verdict, judge
from tests.rules.recorded import dataset

CASE = "cublas.fp32.256x256x256.b8.nn"


def _kernel_time(run: str) -> Timed:
    rows = prepare(dataset(run).frame)  # main launches
    (row,) = [row for _, row in rows[rows["case_id"] == CASE].iterrows()]
    timed = Timed.from_row(row, "kernel_time")
    assert timed is not None
    return timed


def test_touching_extremes_are_not_apart() -> None:
    slow = _kernel_time("h100/versions/20261123-224222-cublas-13.1-batched")
    fast = _kernel_time("h100/checks/20261123-231126-batched-traced")
    assert (slow.median_ms, slow.min_ms, fast.median_ms, fast.max_ms) == (
        0.0135525,
        0.013184,
        0.012864,
        0.013184,
    )
    judged = judge(fast, slow, floor=0.0, threshold=0.05)
    assert round(judged.ratio, 4) == 1.0535 and judged.low > 1
    assert judged.verdict is Verdict.unsure
    # the same the other way round: never faster either
    assert judge(slow, fast, floor=0.0, threshold=0.05).verdict is Verdict.unsure
    # without the extremes the interval alone decides
    bare = Timed(slow.median_ms, slow.n, slow.q1_ms, slow.q3_ms)
    assert judge(fast, bare, floor=0.0, threshold=0.05).verdict is Verdict.slower
