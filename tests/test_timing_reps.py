"""How many times a call is timed: device.timing.repetitions sizes the run to about
TARGET_SECONDS of work per contender, never fewer than min_reps nor more than MAX_REPS, except
that a call so long that min_reps of them pass min_reps x SECONDS_PER_REP runs as many as fit
that budget, never under LONG_MIN_REPS.

The expected counts are worked out by hand from that rule (TARGET_SECONDS = 0.1 s = 100 ms),
written next to each case, so a change of the rule or of its bounds shows here. The module
imports CuPy only inside its timing functions, so this runs without a GPU.
"""

from __future__ import annotations

import pytest

from cublas_audit.device import timing


def test_the_documented_constants() -> None:
    # the numbers every expectation below is worked out from
    assert timing.TARGET_SECONDS == 0.1
    assert (timing.MIN_REPS, timing.MAX_REPS) == (20, 200)
    assert (timing.SECONDS_PER_REP, timing.LONG_MIN_REPS) == (0.1, 5)


@pytest.mark.parametrize(
    ("estimate_ms", "reps"),
    [
        (0.01, 200),  # 100 ms / 0.01 ms = 10,000 runs, capped at MAX_REPS
        (0.5, 200),  # 100 / 0.5 = 200 exactly: the cap itself
        (0.8, 125),  # 100 / 0.8 = 125
        (1.0, 100),  # 100 / 1 = 100
        (3.0, 34),  # 100 / 3 = 33.3, rounded up
        (5.0, 20),  # 100 / 5 = 20 = min_reps
        (50.0, 20),  # 100 / 50 = 2, raised to min_reps
        (100.0, 20),  # 20 x 100 ms = 2 s: the budget (20 x 0.1 s) exactly
        (120.0, 16),  # 2,000 / 120 = 16.7, rounded down into the budget
        (350.0, 5),  # 2,000 / 350 = 5.7 -> 5: the default sweep's 8192^3 batch 16 SGEMM
        (1000.0, 5),  # 2,000 / 1,000 = 2, raised to LONG_MIN_REPS
    ],
)
def test_about_target_seconds_of_work_within_the_bounds(estimate_ms: float, reps: int) -> None:
    assert timing.repetitions(estimate_ms) == reps


@pytest.mark.parametrize(
    ("estimate_ms", "min_reps", "reps"),
    [
        (50.0, 5, 5),  # 100 / 50 = 2, raised to the caller's floor of 5
        (10.0, 5, 10),  # 100 / 10 = 10, above the floor: the floor does not bind
        (1.0, 150, 150),  # 100 / 1 = 100, raised to a floor of 150
        (0.01, 150, 200),  # a floor below MAX_REPS leaves the cap alone
        (350.0, 100, 28),  # --min-reps 100 buys a 10 s budget: 10,000 / 350 = 28.6 -> 28
        (300.0, 3, 3),  # a floor under LONG_MIN_REPS stays the caller's
    ],
)
def test_min_reps_is_a_floor_not_the_answer(estimate_ms: float, min_reps: int, reps: int) -> None:
    assert timing.repetitions(estimate_ms, min_reps) == reps


def test_a_call_too_fast_to_measure_gets_the_cap() -> None:
    # CUDA events can read 0.0 ms for a tiny call: no division, the most repetitions
    assert timing.repetitions(0.0) == timing.MAX_REPS


def test_more_work_per_call_never_means_more_repetitions() -> None:
    estimates = [0.001 * 1.5**i for i in range(40)]  # 1 us up to about 7.6 s
    counts = [timing.repetitions(e) for e in estimates]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == timing.MAX_REPS and counts[-1] == timing.LONG_MIN_REPS


def test_summary_takes_the_median_and_quartiles_as_the_statistics_module_does() -> None:
    # Timing.summary interpolates itself (the map summarises two distributions a problem): the
    # same floats as statistics.median and statistics.quantiles(method="inclusive"), n = 1..9
    import random
    import statistics

    from cublas_audit.device.timing import Timing

    rng = random.Random(5)
    for n in range(1, 10):
        for _ in range(50):
            samples = tuple(rng.choice([rng.random(), 0.0105, 3.57]) for _ in range(n))
            found = Timing(samples).summary("t")
            quartiles = (
                statistics.quantiles(samples, n=4, method="inclusive")
                if n > 1
                else [samples[0]] * 3
            )
            assert found["t_ms"] == statistics.median(samples)
            assert (found["t_q1_ms"], found["t_q3_ms"]) == (quartiles[0], quartiles[2])
            assert (found["t_min_ms"], found["t_max_ms"]) == (min(samples), max(samples))
