"""Kernel-only times through CUPTI: the assignment of kernel records to calls (pure), and what the
committed CUPTI-traced reruns hold, checked against the ncu-profiled run of the same grid."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.device.kernel_trace import MARKER, KernelLaunch, TracedCalls, split_at_markers
from cublas_audit.observe.kernels import normalize

ROOT = Path(__file__).resolve().parents[1]
TRACED = sorted((ROOT / "reports/h100/noise").glob("kernel-*/run-*"))
PROFILED = ROOT / "reports/h100/checks/20261123-193119-batched/dispatch.csv"


def launch(name: str, start: int, end: int, ctas: int = 1) -> KernelLaunch:
    return KernelLaunch(name, start, end, (ctas, 1, 1), (128, 1, 1), 64)


def test_the_kernels_between_two_markers_are_one_call() -> None:
    # GPU order: a stray kernel before any marker, call 0 (gemm + split-K reduction), call 1
    # (gemm alone), call 2 (a 4 us dot that launched nothing CUPTI kept would be empty). Records
    # arrive in any order; only their GPU start times order them.
    records = [
        launch("reduce", 150, 160),
        launch(MARKER, 90, 91),
        launch("gemm", 100, 140, 8),
        launch("stray", 10, 20),
        launch(MARKER, 290, 291),
        launch("gemm", 300, 340),
        launch(MARKER, 400, 401),
    ]
    calls = split_at_markers(records)
    assert [[k.name for k in call] for call in calls] == [["gemm", "reduce"], ["gemm"], []]
    traced = TracedCalls(tuple(calls))
    # kernel-only time sums the kernels' durations (40 + 10 ns), not the span with its gap; an
    # empty call adds no sample
    assert traced.timing().samples_ms == pytest.approx((50e-6, 40e-6))
    columns = traced.launch_columns()
    assert columns["traced_kernels"] == "gemm + reduce"
    assert (columns["traced_launches"], columns["traced_ctas"]) == (2, 8)


def test_a_contender_that_launched_nothing_gives_no_columns() -> None:
    traced = TracedCalls(((), ()))
    assert traced.columns("kernel_time") == {} and traced.launch_columns() == {}


@pytest.fixture(scope="module")
def traced_runs() -> list[pd.DataFrame]:
    assert len(TRACED) >= 10, "the committed CUPTI-traced reruns are missing"
    return [pd.read_csv(run / "dispatch.csv") for run in TRACED]


def test_cupti_saw_the_kernel_ncu_profiled_in_every_case(traced_runs: list[pd.DataFrame]) -> None:
    profiled = pd.read_csv(PROFILED)
    profiled = profiled[profiled["role"] == "main"].set_index("case_id")["kernel"]
    for table in traced_runs:
        single = table[table["routine"] != "sgemm-loop"].set_index("case_id")["traced_kernels"]
        assert len(single) == 36
        for case_id, traced in single.items():
            assert normalize(traced).short == normalize(profiled[case_id]).short, case_id


def test_kernel_time_is_within_call_time(traced_runs: list[pd.DataFrame]) -> None:
    for table in traced_runs:
        assert (table["kernel_time_status"] == "ok").all()
        # traced after the event timing, so a 20-40 ms call that warmed the GPU can run its
        # kernels up to ~2 % slower under the power limit than the calls were timed: 3 % slack
        assert (table["kernel_time_ms"] <= table["time_ms"] * 1.03).all()
        assert (table["kernel_time_ms"] >= table["time_ms"] * 0.2).all()
        # a loop of `batch` calls launches at least `batch` kernels
        loops = table[table["routine"] == "sgemm-loop"]
        assert (loops["traced_launches"] >= loops["batch"]).all()
