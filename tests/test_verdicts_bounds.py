"""verdicts.judge's last condition pinned: where both sides recorded their extremes, SLOWER and
FASTER need every call of one side beyond every call of the other (strictly), and a side without
them leaves the interval alone to decide. Sides without quartiles (log_se 0) and a floor of 0,
so the interval is the ratio itself: 1.5 / 1.0 = 1.5 lies above 1 on its own."""

from __future__ import annotations

import pytest

from cublas_audit.judge.verdicts import Timed, Verdict, judge


def _side(median: float, low: float | None, high: float | None) -> Timed:
    return Timed(median, None, None, None, low, high)


FAST = _side(1.0, 0.9, 1.1)  # its calls from 0.9 to 1.1 ms


@pytest.mark.parametrize(
    ("slow_min", "verdict"),
    [
        (1.2, Verdict.slower),  # every slow call beyond 1.1
        (1.1, Verdict.unsure),  # its fastest call equals the fast side's slowest: not apart
        (1.05, Verdict.unsure),  # overlapping
        (None, Verdict.slower),  # its extremes not recorded: the interval decides
    ],
)
def test_slower_needs_the_calls_apart(slow_min: float | None, verdict: Verdict) -> None:
    slow = _side(1.5, slow_min, 1.9 if slow_min is not None else None)
    assert judge(FAST, slow, 0.0, 0.05).verdict is verdict
    # the converse, the same pair read the other way: FASTER or UNSURE alike
    back = judge(slow, FAST, 0.0, 0.05)
    assert back.verdict is (Verdict.faster if verdict is Verdict.slower else Verdict.unsure)


def test_one_side_s_extremes_alone_leave_the_interval_to_decide() -> None:
    # the fast side without its slowest call, the slow side with its fastest (and the converse)
    assert judge(_side(1.0, 0.9, None), _side(1.5, 1.05, 1.9), 0.0, 0.05).verdict is Verdict.slower
    assert judge(_side(1.0, None, None), _side(1.5, 1.05, 1.9), 0.0, 0.05).verdict is Verdict.slower
    assert judge(_side(1.0, 0.9, 1.1), _side(1.5, None, 1.9), 0.0, 0.05).verdict is Verdict.slower
    assert judge(_side(1.5, None, 1.9), _side(1.0, 0.9, 1.1), 0.0, 0.05).verdict is Verdict.faster


def test_the_extremes_from_a_row() -> None:
    row = {"time_ms": 1.5, "time_min_ms": 1.2, "time_max_ms": 1.9, "time_n": 5}
    assert Timed.from_row(row) == Timed(1.5, 5, None, None, 1.2, 1.9)
