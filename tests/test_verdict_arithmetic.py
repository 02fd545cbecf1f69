"""verdicts.judge and noise.fit against hand-computed numbers (the mutation audit of
benchmarks/results/mutation_cpu.json): every constant and comparison of the verdict arithmetic,
each boundary on both sides. Synthetic times: these are pure arithmetic, no table is judged.

The two sides used below: A = 1.0 ms, B = 1.2 ms, each 16 calls with quartiles at +-10 % of the
median (A: 0.9 .. 1.1, B: 1.08 .. 1.32). By hand:
  MEDIAN_SE = 1.2533 / 1.349                         = 0.929059
  log_se(A) = 0.929059 * (1.1 - 0.9) / 1.0 / sqrt(16) = 0.929059 * 0.05 = 0.0464529
  log_se(B) = 0.929059 * (1.32 - 1.08) / 1.2 / 4      = 0.0464529
  within-run half width = 2.576 * hypot(0.0464529, 0.0464529) = 2.576 * 0.0656946 = 0.169229
  floor 5 %: + log1p(0.05) = + 0.0487902              -> half = 0.218019
  log(1.2) = 0.182322
  floor 5 %: low = exp(0.182322 - 0.218019) = 0.964932, high = exp(0.400341) = 1.492333
  floor 0:   low = exp(0.182322 - 0.169229) = 1.013179, high = exp(0.351551) = 1.421269
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.judge import noise
from cublas_audit.judge.noise import EDGES_MS, NoiseModel, fit
from cublas_audit.judge.verdicts import MEDIAN_SE, Z_99, Timed, Verdict, detectable_slowdown, judge
from cublas_audit.table.dispatch import main_launches
from cublas_audit.table.validation import read_table

A = Timed(1.0, 16, 0.9, 1.1)
B = Timed(1.2, 16, 1.08, 1.32)


def test_the_constants_are_the_documented_ones() -> None:
    assert Z_99 == 2.576
    assert pytest.approx(0.929059, abs=1e-6) == MEDIAN_SE  # 1.2533 / 1.349


def test_log_se_by_hand() -> None:
    assert A.log_se == pytest.approx(0.0464529, rel=1e-5)
    assert B.log_se == pytest.approx(0.0464529, rel=1e-5)
    # n = 4 doubles it: 0.929059 * 0.2 / 1.0 / 2 = 0.0929059
    assert Timed(1.0, 4, 0.9, 1.1).log_se == pytest.approx(0.0929059, rel=1e-5)
    # no distribution, no count, a zero median: 0
    assert Timed(1.0).log_se == 0.0
    assert Timed(1.0, 0, 0.9, 1.1).log_se == 0.0
    assert Timed(1.0, 16, None, 1.1).log_se == 0.0
    assert Timed(1.0, 16, 0.9, None).log_se == 0.0
    assert Timed(0.0, 16, 0.0, 0.0).log_se == 0.0


def test_judge_with_a_floor_by_hand() -> None:
    j = judge(A, B, 0.05, 0.05)
    assert j.ratio == pytest.approx(1.2, rel=1e-12)
    assert j.low == pytest.approx(0.964932, rel=1e-5)
    assert j.high == pytest.approx(1.492333, rel=1e-5)
    assert j.floor == 0.05
    assert j.verdict is Verdict.unsure  # +20 % >= 5 %, but the interval reaches below 1
    assert j.change_pct == pytest.approx(20.0)
    assert j.describe() == "+20.0 % (interval -3.5 .. +49.2 %, noise floor 5 %)"


def test_judge_without_a_floor_by_hand() -> None:
    j = judge(A, B, 0.0, 0.05)
    assert j.low == pytest.approx(1.013179, rel=1e-5)
    assert j.high == pytest.approx(1.421269, rel=1e-5)
    assert j.verdict is Verdict.slower
    # reversed: ratio 1 / 1.2 = 0.833333, interval 1 / 1.421269 .. 1 / 1.013179 = 0.703597 ..
    # 0.986993: wholly below 1, a speed-up
    back = judge(B, A, 0.0, 0.05)
    assert back.ratio == pytest.approx(0.833333, rel=1e-5)
    assert back.low == pytest.approx(0.703597, rel=1e-5)
    assert back.high == pytest.approx(0.986993, rel=1e-5)
    assert back.verdict is Verdict.faster
    # with the 5 % floor the reversed interval 0.670093 .. 1.036342 reaches 1
    assert judge(B, A, 0.05, 0.05).verdict is Verdict.unsure


def test_judge_on_the_floor_alone() -> None:
    # No distributions (schema 1): half = log1p(floor) only. 1.0 -> 1.5 at floor 0.2:
    # low = 1.5 / 1.2 = 1.25, high = 1.5 * 1.2 = 1.8
    j = judge(Timed(1.0), Timed(1.5), 0.2, 0.05)
    assert j.low == pytest.approx(1.25) and j.high == pytest.approx(1.8)
    assert j.verdict is Verdict.slower
    # floor 0.5: low = 1.5 / 1.5 = 1.0, not above 1 -> unsure (low > 1 is strict)
    edge = judge(Timed(1.0), Timed(1.5), 0.5, 0.05)
    assert edge.low == pytest.approx(1.0, abs=1e-12)
    assert edge.verdict is Verdict.unsure
    # the converse: 1.5 -> 1.0 at floor 0.5, high = 1.0 exactly -> unsure; at 0.4 faster
    assert judge(Timed(1.5), Timed(1.0), 0.5, 0.05).verdict is Verdict.unsure
    assert judge(Timed(1.5), Timed(1.0), 0.4, 0.05).verdict is Verdict.faster
    assert math.isinf(judge(Timed(1.0), Timed(1.5), math.inf, 0.05).high)
    inf = judge(Timed(1.0), Timed(1.5), math.inf, 0.05)
    assert inf.verdict is Verdict.unsure
    assert inf.describe() == "+50.0 % (between runs, this time says nothing at this scale)"


def test_the_threshold_is_at_least_on_both_sides() -> None:
    # threshold 0.25: band 1.25 (exact in binary), slower from ratio 1.25 on
    at = judge(Timed(1.0), Timed(1.25), 0.0, 0.25)
    assert at.ratio == 1.25 and at.verdict is Verdict.slower
    below = judge(Timed(1.0), Timed(math.nextafter(1.25, 0.0)), 0.0, 0.25)
    assert below.verdict is Verdict.same
    # speed-ups: the same band, 1 / 1.25 = 0.8 is a change of at least the threshold
    at = judge(Timed(1.0), Timed(0.8), 0.0, 0.25)
    assert at.ratio == 0.8 and at.verdict is Verdict.faster
    above = judge(Timed(1.0), Timed(math.nextafter(0.8, 1.0)), 0.0, 0.25)
    assert above.verdict is Verdict.same
    # an unchanged time is the same, whatever the floor
    assert judge(Timed(1.0), Timed(1.0), 0.0, 0.25).verdict is Verdict.same


def test_detectable_slowdown_by_hand() -> None:
    # max(1 + 0.05, exp(2.576 * sqrt(2) * 0.02) * 1.05) - 1 = 1.075582 * 1.05 - 1 = 0.129359
    assert detectable_slowdown(0.05, 0.05, 0.02) == pytest.approx(0.129359, rel=1e-5)
    # without within-run error the floor alone: max(1.05, 1.2) - 1 = 0.2; the threshold wins
    # where the floor is smaller: max(1.10, 1.05) - 1 = 0.10
    assert detectable_slowdown(0.2, 0.05) == pytest.approx(0.2)
    assert detectable_slowdown(0.05, 0.10) == pytest.approx(0.10)


def test_timed_from_row() -> None:
    row = {"time_ms": 2.0, "time_n": 20, "time_q1_ms": 1.9, "time_q3_ms": 2.2}
    assert Timed.from_row(row) == Timed(2.0, 20, 1.9, 2.2)
    kernel = {"kernel_time_ms_b": 0.5, "kernel_time_n_b": 5.0}
    assert Timed.from_row(kernel, "kernel_time", "_b") == Timed(0.5, 5, None, None)
    assert Timed.from_row({"time_ms": 0.0}) is None  # a time must be above 0
    assert Timed.from_row({"time_ms": float("nan")}) is None
    assert Timed.from_row({}) is None
    assert Timed.from_row({"time_ms": 1.0, "time_n": 0}) == Timed(1.0, None, None, None)


# ----- noise ------------------------------------------------------------------------------------


def test_the_fitted_bins_are_half_decades_from_30_us_to_100_ms() -> None:
    assert (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, math.inf) == EDGES_MS
    # the shipped H100 model was fitted on them
    assert noise.load().edges_ms == EDGES_MS
    assert (noise.MARGIN, noise.MIN_FLOOR) == (1.25, 0.01)


def test_bins_are_upper_edges_inclusive() -> None:
    model = NoiseModel(EDGES_MS, tuple(range(len(EDGES_MS))))
    assert model.bin(0.03) == 0  # 0.03 ms is the upper edge of the first bin
    assert model.bin(math.nextafter(0.03, 1.0)) == 1
    assert model.bin(1.0) == 3 and model.bin(math.nextafter(1.0, 2.0)) == 4
    assert model.bin(1e9) == len(EDGES_MS) - 1
    assert model.bin(0.0) == 0 and model.bin(-1.0) == 0 and model.bin(math.nan) == 0
    assert model.bin(math.inf) == 0
    assert model.floor(0.5) == 3


def test_host_bound_floor_is_at_least() -> None:
    # HOST_BOUND_FLOOR = 0.5: a call floor of exactly 0.5 is host-bound (infinite between
    # runs), one just below it is judged with itself
    assert noise.HOST_BOUND_FLOOR == 0.5
    below = math.nextafter(0.5, 0.0)
    model = NoiseModel((1.0, math.inf), (0.5, below), others={"kernel": (0.5, 0.5)})
    assert math.isinf(model.between_runs(0.5))
    assert model.between_runs(2.0) == below
    # only the call's time is host-bound: a kernel floor of 0.5 is a floor
    assert model.between_runs(0.5, "kernel") == 0.5


def test_floors_fall_back_to_the_kind_that_bounds_them() -> None:
    model = NoiseModel((math.inf,), (0.3,), others={"kernel": (0.1,)})
    assert model.floors_of("kernel_ratio") == (0.1,)  # kernel_ratio -> kernel
    assert model.floors_of("kernel_tensor") == (0.3,)  # -> call
    assert model.floors_of("call_ratio") == (0.3,)  # -> call
    assert model.has("call") and model.has("kernel") and not model.has("kernel_ratio")


def test_launches_of_a_loop_are_its_batch() -> None:
    rows = pd.DataFrame({"routine": ["sgemm-loop", "cublasSgemm", None], "batch": [8, 8, 4]})
    assert noise.launches(rows).tolist() == [8, 1, 1]
    assert noise.launches(rows.drop(columns=["routine"])).tolist() == [1, 1, 1]


def _table(rows: list[tuple[str, str, int, float, float | None]]) -> pd.DataFrame:
    return pd.DataFrame(
        rows, columns=["case_id", "routine", "batch", "time_ms", "kernel_time_ms"]
    ).assign(mode="fp32", api="cublas")


def test_fit_by_hand() -> None:
    # Two runs of four cases (time per launch -> bin of EDGES_MS):
    #   x: 0.020 / 0.025 ms              -> bin 0, spread 1.25 - 1 = 0.25, x 1.25 = 0.3125
    #   w: a loop of 8, 1.6 / 1.6 ms      -> 0.2 ms per launch, bin 2, spread 0 -> MIN_FLOOR 0.01
    #   y: 2.0 / 2.02 ms                  -> bin 4 (1 < 2.01 <= 3), spread 0.01 x 1.25 = 0.0125
    #   z: 20 / 20 ms                     -> bin 6 (10 < 20 <= 30), spread 0 -> 0.01
    # Bins no run reached take the one below: 1 <- 0.3125, 3 <- 0.01, 5 <- 0.0125, 7, 8 <- 0.01.
    # Then a shorter time is never quieter (from the top down): bin 3 = max(0.01, 0.0125),
    # bin 2 = max(0.01, 0.0125):
    #   (0.3125, 0.3125, 0.0125, 0.0125, 0.0125, 0.0125, 0.01, 0.01, 0.01)
    # Kernels (x only): 0.010 / 0.011 -> spread 0.1 x 1.25 = 0.125 in bin 0, carried up.
    first = _table(
        [
            ("x", "cublasSgemm", 1, 0.020, 0.010),
            ("w", "sgemm-loop", 8, 1.6, None),
            ("y", "cublasSgemm", 1, 2.0, None),
            ("z", "cublasSgemm", 1, 20.0, None),
        ]
    )
    second = _table(
        [
            ("x", "cublasSgemm", 1, 0.025, 0.011),
            ("w", "sgemm-loop", 8, 1.6, None),
            ("y", "cublasSgemm", 1, 2.02, None),
            ("z", "cublasSgemm", 1, 20.0, None),
        ]
    )
    model = fit([first, second], {"device": "test"})
    assert model.edges_ms == EDGES_MS
    assert model.floors == (0.3125, 0.3125, 0.0125, 0.0125, 0.0125, 0.0125, 0.01, 0.01, 0.01)
    assert model.others == {"kernel": (0.125,) * 9}
    assert model.source == {"device": "test"}
    # the margin is a parameter: 1.0 leaves the bare spread (0.25 in bin 0)
    assert fit([first, second], {}, margin=1.0).floors[0] == 0.25


def test_fit_needs_a_shared_case() -> None:
    first = _table([("x", "cublasSgemm", 1, 0.02, None)])
    second = _table([("y", "cublasSgemm", 1, 0.02, None)])
    with pytest.raises(AuditError, match="at least two tables"):
        fit([first, second], {})
    with pytest.raises(AuditError, match="at least two tables"):
        fit([first], {})


def test_from_json_refuses_what_is_not_a_model() -> None:
    with pytest.raises(ValueError):
        NoiseModel.from_json({"edges_ms": [1.0, None], "floors": [0.1]})  # unpaired
    with pytest.raises(ValueError):
        NoiseModel.from_json({"edges_ms": [None], "floors": [-0.1]})  # negative
    with pytest.raises(ValueError):
        NoiseModel.from_json({"edges_ms": [None], "floors": {"call": [0.1], "nope": [0.1]}})
    model = NoiseModel.from_json({"edges_ms": [None], "floors": [0.0]})  # 0 is a floor
    assert model.floors == (0.0,) and math.isinf(model.edges_ms[0])


def test_only_the_classic_call_is_interleaved_with_the_reference() -> None:
    # reports/h100/checks/20261123-193119-batched: the probe timed each classic cuBLAS call
    # interleaved with the reference (ref_time_n recorded on every row: the reference's columns
    # are copied onto the problem's cuBLASLt and loop rows, which were not timed with it)
    run = Path(__file__).resolve().parents[1] / "reports/h100/checks/20261123-193119-batched"
    rows = main_launches(read_table(run / "dispatch.csv"))
    assert rows["ref_time_n"].notna().all()
    interleaved = noise.interleaved_with_reference(rows)
    # 6 sizes x batches 4, 8, 16 = 18 classic calls (not cublasLt., not loop.)
    expected = rows["case_id"].str.startswith("cublas.")
    assert expected.sum() == 18 and (interleaved == expected).all()
    # a table without the reference's distribution has no interleaved floor
    assert not noise.interleaved_with_reference(rows.drop(columns=["ref_time_n"])).any()
