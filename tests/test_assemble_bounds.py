"""table/assemble.py's row arithmetic pinned (issue 39 item 6) on the H100 smoke run's recorded
pieces (tests/fixtures/h100-smoke: timing.jsonl, profile.jsonl, and its dispatch.csv's two
launches of cublas.fp32.256x256x256.b1.nn): which status wins, the TFLOP/s of a time, which
launch is main (the longest, a launch of no recorded time counted as 0), and which probe values
are kept. Pure calls on a few records."""

from __future__ import annotations

import pytest

from cublas_audit.observe.ncu_export import METRIC_COLUMNS, Launch
from cublas_audit.planning.cases import Case
from cublas_audit.table import assemble
from cublas_audit.table.rundir import read_results
from tests.conftest import FIXTURES

SMOKE = FIXTURES / "h100-smoke"
CASE = Case("cublas", "fp32", 256, 256, 256, 1)
TIMED = read_results(SMOKE / "timing.jsonl")[CASE.case_id]
PROFILED = read_results(SMOKE / "profile.jsonl")[CASE.case_id]
MAIN_KERNEL = (
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_"
    "alignc4_execute_kernel__5x_cublas"
)
SPLIT_K = MAIN_KERNEL.replace("execute_kernel", "execute_split_k_kernel")


def launch(ncu_id: int, kernel: str, duration_us: float | None, reference: bool = False) -> Launch:
    return Launch(ncu_id, CASE.case_id, reference, kernel, "8x8x4", "64x1x1", duration_us, 7552,
                  {METRIC_COLUMNS["fma_pct"]: 12.8618})  # fmt: skip


def test_the_recorded_case_s_status_time_and_tflops() -> None:
    out = assemble._result_columns(CASE, PROFILED, TIMED)
    assert out["status"] == "ok" and out["status_detail"] is None
    assert out["time_ms"] == TIMED["time_ms"] and out["max_rel_err"] == TIMED["max_rel_err"]
    # 2 x 256^3 = 33,554,432 FLOP in 0.01728 ms: 1.94181 TFLOP/s (the recorded table's)
    assert out["tflops"] == pytest.approx(1.94181, abs=5e-6)
    seconds = TIMED["time_ms"] / 1000  # FLOP per second, in units of 10^12
    assert out["tflops"] == pytest.approx(33_554_432 / seconds / 10**12, rel=1e-14)
    assert out["time_min_ms"] == TIMED["time_min_ms"] and "time_q1_ms" not in out  # no None kept


def test_a_failure_in_either_phase_wins() -> None:
    failed = {"status": "error", "detail": "CUBLAS_STATUS_NOT_SUPPORTED"}
    for profiled, timed in ((failed, TIMED), (PROFILED, failed)):
        out = assemble._result_columns(CASE, profiled, timed)
        assert (out["status"], out["status_detail"]) == ("error", "CUBLAS_STATUS_NOT_SUPPORTED")
    only = assemble._result_columns(CASE, PROFILED, None)
    assert only == {"status": "ok", "status_detail": None}  # no time without a timed result
    assert assemble._result_columns(CASE, None, None)["status"] == "not-run"
    untimed = assemble._result_columns(CASE, None, {**TIMED, "time_ms": None})
    assert "time_ms" not in untimed and "tflops" not in untimed
    assert untimed["max_rel_err"] == TIMED["max_rel_err"]


def test_the_longest_launch_is_main_in_ncu_order() -> None:
    rows = assemble._launch_rows({"case_id": CASE.case_id}, [
        launch(7, SPLIT_K, 5.472), launch(6, MAIN_KERNEL, 6.528),
    ])  # fmt: skip
    assert [(r["kernel"], r["launch"], r["role"]) for r in rows] == [
        (MAIN_KERNEL, 0, "main"), (SPLIT_K, 1, "aux"),
    ]  # fmt: skip
    assert rows[0]["tile"] == "32x32x8" and rows[1]["tile"] is None  # the reduction has none
    assert rows[0]["fma_pct"] == 12.8618 and rows[0]["smem_bytes"] == 7552
    # a launch of no recorded time counts as 0: the timed one is main, wherever it stands
    for durations in ((None, 0.5), (0.5, None)):
        rows = assemble._launch_rows({}, [launch(1, MAIN_KERNEL, durations[0]),
                                          launch(2, SPLIT_K, durations[1])])  # fmt: skip
        assert [r["role"] for r in rows] == (
            ["aux", "main"] if durations[0] is None else ["main", "aux"]
        )
    assert assemble._launch_rows({"x": 1}, []) == [{"x": 1, "kernel": None}]


def test_the_reference_goes_on_every_row_of_its_problem() -> None:
    refs = {CASE.case_id: [launch(3, "ref_short", None, True), launch(4, "ref_long", 0.5, True)]}
    timed = {CASE.case_id: {**TIMED, "ref_time_ms": 0.02, "ref_time_n": None}}
    got = assemble._reference_by_problem([CASE], refs, timed)
    assert got == {("fp32", 256, 256, 256, 1): {
        "ref_time_ms": 0.02, "ref_fma_pct": 12.8618, "ref_kernel": "ref_long",
    }}  # fmt: skip
    assert assemble._reference_by_problem([CASE], {}, {}) == {}
    longest_first = {CASE.case_id: [launch(3, "a", 2.0, True), launch(4, "b", 1.0, True)]}
    assert (
        assemble._reference_by_problem([CASE], longest_first, {})[("fp32", 256, 256, 256, 1)][
            "ref_kernel"
        ]
        == "a"
    )


def test_recorded_keeps_the_present_values() -> None:
    assert assemble._recorded({"a": 0, "b": None, "c": ""}, ("a", "b", "c", "d")) == {
        "a": 0,
        "c": "",
    }
