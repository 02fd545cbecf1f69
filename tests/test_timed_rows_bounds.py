"""judge.timed_rows' choices pinned: which rows judge the kernels' time, the ratio's direction,
the floor between runs at the geometric mean per launch, a side without a time, the floor kind a
row names, the ratio of an interleaved timing. Times: the H100's K = 140 layouts check
(reports/h100/checks/20261125-092057-k140-layouts: cuBLAS bf16 1024x1024x140 batch 8 in nn, call
0.031120 and kernels 0.020832 ms; in nt 0.022128 and 0.009888) and the shipped noise model's bins
(call floors 0.5062 in (0.03, 0.1] ms, 0.1985 in (0.1, 0.3], 0.1039 in (3, 10])."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cublas_audit.judge import noise
from cublas_audit.judge.timed_rows import (
    between_runs,
    floor_kind,
    judge_sides,
    judged_ratio,
    judged_time,
    on_kernels,
    pair_verdict,
    ratio_verdict,
    row_verdicts,
    time_words,
)
from cublas_audit.judge.verdicts import Timed, Verdict
from cublas_audit.vocabulary import FloorKind
from tests.conftest import ZERO_NOISE

# cuBLAS nn (slow) and nt (fast) as one row each, and as one row with the fast side as ref_
NN = {"mode": "bf16", "time_ms": 0.031120, "kernel_time_ms": 0.020832}
NT = {"mode": "bf16", "time_ms": 0.022128, "kernel_time_ms": 0.009888}
PAIRED = {**NN, "ref_time_ms": NT["time_ms"], "ref_kernel_time_ms": NT["kernel_time_ms"]}


def test_the_kernels_time_only_where_every_side_traced_it() -> None:
    rows = pd.DataFrame([PAIRED, {**PAIRED, "ref_kernel_time_ms": None}])
    assert on_kernels(rows, sides=("ref_", "")).tolist() == [True, False]
    assert on_kernels(rows).tolist() == [True, True]  # the own side alone
    assert on_kernels(rows.drop(columns="ref_kernel_time_ms"), sides=("ref_", "")).tolist() == [
        False, False,
    ]  # fmt: skip
    assert judged_time(rows.iloc[:1]) == "kernel"
    untraced = pd.DataFrame([NN, {**NT, "kernel_time_ms": None}])
    assert judged_time(untraced) == judged_time(rows.iloc[0:0]) == "call"  # nothing to judge


def test_the_ratio_is_slow_over_fast_on_each_rows_time() -> None:
    rows = pd.DataFrame([PAIRED, {**PAIRED, "ref_kernel_time_ms": None}])
    kernels = on_kernels(rows, sides=("ref_", ""))
    ratio = judged_ratio(rows, kernels, "ref_", "")
    # kernels 0.020832 / 0.009888 = 2.1068; the call 0.031120 / 0.022128 = 1.4064
    assert ratio.tolist() == pytest.approx([0.020832 / 0.009888, 0.031120 / 0.022128])


def test_the_floor_kind_and_the_words_of_each_time() -> None:
    assert floor_kind("kernel", "bf16") is FloorKind.kernel_tensor
    assert floor_kind("kernel", "fp32") is FloorKind.kernel
    assert floor_kind("call", "bf16") is FloorKind.call
    assert time_words("kernel") == "the kernels' time (CUPTI)"
    assert time_words("call") == "the calls' time (CUDA events)"


def test_between_runs_at_the_geometric_mean_per_launch() -> None:
    model = noise.load()
    # sqrt(0.2 x 5.0) = 1.0 ms over 5 launches: 0.2 ms a launch, floor 0.1985 (not sqrt(0.2 / 5)
    # / 5 = 0.04 ms, host-bound: infinite; nor 1.0 x 5 = 5 ms, 0.1039)
    assert between_runs(model, FloorKind.call, 5)(Timed(0.2), Timed(5.0)) == 0.1985


def test_a_side_without_a_time_is_no_judgement() -> None:
    floor = between_runs(ZERO_NOISE, FloorKind.kernel, 1)
    a, b = pd.Series(NT), pd.Series(NN)
    assert judge_sides(a, b, "kernel", 0.1, floor) is not None
    assert judge_sides(a, b.drop("kernel_time_ms"), "kernel", 0.1, floor) is None
    assert judge_sides(a.drop("kernel_time_ms"), b, "kernel", 0.1, floor) is None
    assert pair_verdict(a, b.drop("kernel_time_ms"), "kernel", 0.1, ZERO_NOISE) is Verdict.same
    # each side its own suffix: B's time from `_b`, A's from `_a`
    both = pd.Series({"time_ms_a": 0.022128, "time_ms_b": 0.031120, "time_ms": 1.0})
    judged = judge_sides(both, both, "call", 0.1, floor, suffixes=("_a", "_b"))
    assert judged is not None and judged.ratio == pytest.approx(0.031120 / 0.022128)


def test_the_model_given_judges_a_pair() -> None:
    a, b = pd.Series(NT), pd.Series(NN)
    # 2.1068x on tensor-pipe kernels: beyond 1 + 1.0 without noise; the shipped model's floor
    # for kernel_tensor (9.71 %) is under it too, but a threshold of 1.15 (band 2.15) is not
    assert pair_verdict(a, b, "kernel", 1.0, ZERO_NOISE) is Verdict.slower
    assert pair_verdict(a, b, "call", 0.4, ZERO_NOISE) is Verdict.slower  # 1.4064 >= 1.4
    # the shipped model: the call's floor at 0.031 ms (0.5062) leaves 1.41x unsure
    assert pair_verdict(a, b, "call", 0.4) is Verdict.unsure


def test_row_verdicts_read_each_rows_time_and_floor_kind() -> None:
    rows = pd.DataFrame([PAIRED] * 3).assign(
        judged_on=["kernel", "call", "call"],
        floor_kind=[FloorKind.kernel_tensor, FloorKind.call, FloorKind.call_ratio],
    )
    # threshold 0.3: kernels 2.1068x beyond the shipped tensor floor (9.71 %): slower; the call's
    # 1.4064x within its floor at 0.031 ms (50.62 %): unsure; against the interleaved floor of
    # the call's ratio (5.24 %): slower
    assert row_verdicts(rows, "ref_", "", 0.3).tolist() == [
        Verdict.slower, Verdict.unsure, Verdict.slower,
    ]  # fmt: skip
    untimed = rows.assign(ref_time_ms=None, ref_kernel_time_ms=None)
    assert row_verdicts(untimed, "ref_", "", 0.3).tolist() == [Verdict.same] * 3


def test_an_interleaved_ratio_against_one() -> None:
    assert ratio_verdict(1.5, 0.0, 0.1) is Verdict.slower
    assert ratio_verdict(1.05, 0.0, 0.1) is Verdict.same
    assert ratio_verdict(1 / 1.5, 0.0, 0.1) is Verdict.faster
    assert math.isinf(between_runs(noise.load(), FloorKind.call, 1)(Timed(0.04), Timed(0.04)))
