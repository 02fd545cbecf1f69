"""Assembling real H100 launches into dispatch rows: which launch of a case is its GEMM (`main`)
and which its split-K reduction (`aux`), the TFLOP/s of a timed case, and the reference kernel's
columns on every row of its problem.

Every input is a recorded run: ncu's own CSV exports (parsed with ncu_parse.parse_csv_file) and
the probe's profile.jsonl / timing.jsonl. Every expected value is read off those files by hand and
written out here, so that a test states a fact of the recording, not what assemble computes.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.observe.ncu_export import parse_csv_file
from cublas_audit.planning.cases import APIS
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.table import assemble, dispatch
from cublas_audit.table.rundir import PLAN_FILE, PROFILE_RESULTS, TIME_RESULTS, read_results

REPO = Path(__file__).resolve().parent.parent
# tests/fixtures/h100-smoke: 10 cases, one ncu chunk, no reference (its build was unavailable).
SMOKE = REPO / "tests" / "fixtures" / "h100-smoke"
# tests/fixtures/h100-batched-cublas: 36 batched cases, three ncu chunks.
BATCHED = REPO / "tests" / "fixtures" / "h100-batched-cublas"
# A bundled real H100 audit with the reference kernel built: its ncu export holds `audit-ref.`
# launches and its timing.jsonl holds ref_time_ms (the fixtures above have neither).
SINGLE_WITH_REF = REPO / "reports" / "h100" / "20261123-145452-single"

SPLIT_K_CASE = "cublas.fp32.256x256x256.b1.nn"


@cache
def assembled(run_dir: Path) -> pd.DataFrame:
    """The dispatch table of a recorded run directory, straight from its raw files (built once;
    the tests only read it)."""
    launches = [
        launch
        for csv_path in sorted((run_dir / "ncu").glob("chunk-*.csv"))
        for launch in parse_csv_file(csv_path)
    ]
    return assemble.build_table(
        read_plan(run_dir / PLAN_FILE),
        launches,
        read_results(run_dir / PROFILE_RESULTS),
        read_results(run_dir / TIME_RESULTS),
        {"gpu_label": "h100"},
    )


def rows_of(frame: pd.DataFrame, case_id: str) -> pd.DataFrame:
    return frame[frame["case_id"] == case_id].sort_values("launch")


# ----- main and aux launches -----------------------------------------------------------------


def test_split_k_gemm_is_main_and_its_shorter_reduction_is_aux() -> None:
    # h100-smoke/ncu/chunk-000.csv, range audit.cublas.fp32.256x256x256.b1.nn, two launches:
    #   ID 0  ..._execute_kernel__5x_cublas          grid (8, 8, 4)  6.528000 us  (the split GEMM)
    #   ID 1  ..._execute_split_k_kernel__5x_cublas  grid (8, 8, 1)  5.472000 us  (the reduction)
    rows = rows_of(assembled(SMOKE), SPLIT_K_CASE)
    assert list(rows["launch"]) == [0, 1]
    assert list(rows["grid"]) == ["8x8x4", "8x8x1"]
    assert list(rows["duration_us"]) == pytest.approx([6.528, 5.472])
    assert list(rows["kernel_short"]) == ["xmma_32x32x8", "splitKreduce"]
    assert list(rows["role"]) == ["main", "aux"]


@pytest.mark.parametrize(
    ("case_id", "grids", "durations_us"),
    [
        # reports/h100/20261123-145452-single/ncu/chunk-000.csv (durations exported in ms):
        #   IDs 0, 1: 0.006656 ms (8, 8, 4) then 0.005504 ms (8, 8, 1) -> the first is the GEMM
        ("cublas.fp32.256x256x256.b1.nn", ["8x8x4", "8x8x1"], [6.656, 5.504]),
        #   IDs 5, 6: 0.011840 ms (8, 8, 4) then 0.005952 ms (8, 8, 2)
        ("cublas.fp32.512x512x512.b1.nn", ["8x8x4", "8x8x2"], [11.84, 5.952]),
        #   IDs 8, 9: 0.011936 ms (8, 8, 4) then 0.005824 ms (8, 8, 2), through cuBLASLt
        ("cublasLt.fp32.512x512x512.b1.nn", ["8x8x4", "8x8x2"], [11.936, 5.824]),
    ],
)
def test_the_longest_launch_is_main_in_the_bundled_split_k_cases(
    case_id: str, grids: list[str], durations_us: list[float]
) -> None:
    rows = rows_of(assembled(SINGLE_WITH_REF), case_id)
    assert list(rows["grid"]) == grids
    assert list(rows["duration_us"]) == pytest.approx(durations_us)
    assert list(rows["role"]) == ["main", "aux"]
    assert list(rows["family"]) == ["xmma", "splitk-reduce"]


@pytest.mark.parametrize("run_dir", [SMOKE, BATCHED, SINGLE_WITH_REF], ids=lambda p: p.name)
def test_every_case_has_exactly_one_main_row(run_dir: Path) -> None:
    frame = assembled(run_dir)
    mains = dispatch.main_launches(frame)
    assert sorted(mains["case_id"]) == sorted(c.case_id for c in read_plan(run_dir / PLAN_FILE))
    # only the split-K reductions are aux: the smoke run has one, the batched run none
    aux = frame[frame["role"] == "aux"]
    assert set(aux["family"]) <= {"splitk-reduce"}
    expected_aux = {SMOKE: 1, BATCHED: 0, SINGLE_WITH_REF: 4}[run_dir]
    assert len(aux) == expected_aux


def test_main_row_carries_the_gemms_fma_not_the_reductions() -> None:
    # h100-smoke, ID 0 (the GEMM) FMA pipe 12.861812 %, ID 1 (the reduction) 1.664662 %
    mains = dispatch.main_launches(assembled(SMOKE)).set_index("case_id")
    assert mains.loc[SPLIT_K_CASE, "fma_pct"] == pytest.approx(12.861812)
    # a one-launch case: ID 4, cutlass simt 256x128, 349.408 us, FMA 78.522015 %
    assert mains.loc["cublas.fp32.1024x1024x1024.b8.nn", "fma_pct"] == pytest.approx(78.522015)


# ----- TFLOP/s -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case_id", "tflops"),
    [
        # h100-smoke/timing.jsonl: time_ms 0.01727999933063984
        # 2 * 256*256*256 * 1 = 33,554,432 flop / 1.727999933e-5 s = 1.9418074826e12 flop/s
        ("cublas.fp32.256x256x256.b1.nn", 1.9418074826254956),
        # time_ms 0.3544960021972656
        # 2 * 1024^3 * 8 = 17,179,869,184 flop / 3.544960022e-4 s = 4.846280093e13 flop/s
        ("cublas.fp32.1024x1024x1024.b8.nn", 48.4628009272724),
        # the loop companion of the same problem: time_ms 0.497871994972229
        # 17,179,869,184 flop / 4.97871995e-4 s = 3.450659879e13 flop/s
        ("loop.fp32.1024x1024x1024.b8.nn", 34.50659879947311),
    ],
)
def test_tflops_is_flops_over_the_timed_median(case_id: str, tflops: float) -> None:
    rows = rows_of(assembled(SMOKE), case_id)
    assert len(rows) >= 1
    assert list(rows["tflops"]) == pytest.approx([tflops] * len(rows), rel=1e-9)


def test_tflops_stays_under_the_h100s_fp32_peak() -> None:
    # H100 SXM FP32 (non-tensor) peak: 132 SMs * 128 FMA/clk * 2 flop * 1.98 GHz = 66.9 TFLOP/s.
    # The biggest recorded single call, 8192^3 in 21.44374370574951 ms, reaches
    # 2 * 8192^3 / 21.44374370574951e-3 s = 51.27 TFLOP/s.
    frame = assembled(SINGLE_WITH_REF)
    timed = frame["tflops"].dropna()
    assert len(timed) == len(frame)
    assert timed.max() == pytest.approx(51.274238438188306, rel=1e-3)
    assert (timed < 132 * 128 * 2 * 1.98e9 / 1e12).all()


# ----- the reference kernel's columns ---------------------------------------------------------


@pytest.mark.parametrize(
    ("problem", "ref_time_ms", "ref_fma_pct"),
    [
        # timing.jsonl of cublas.fp32.256x256x256.b1.nn: ref_time_ms 0.024272000417113304;
        # ncu ID 2, range audit-ref.cublas.fp32.256x256x256.b1.nn, FMA pipe 24.233138 %
        ("256x256x256", 0.024272000417113304, 24.233138),
        # cublas.fp32.512x512x512.b1.nn: ref_time_ms 0.03697599843144417; ncu ID 7: 41.083907 %
        ("512x512x512", 0.03697599843144417, 41.083907),
        # cublas.fp32.8192x8192x8192.b1.nn: ref_time_ms 21.62123203277588; ncu ID 20: 77.426208 %
        ("8192x8192x8192", 21.62123203277588, 77.426208),
    ],
)
def test_reference_columns_are_on_every_row_of_the_problem(
    problem: str, ref_time_ms: float, ref_fma_pct: float
) -> None:
    frame = assembled(SINGLE_WITH_REF)
    # the cuBLAS and the cuBLASLt call of the problem, each of their launches (aux included)
    rows = frame[frame["case_id"].isin([f"{api}.fp32.{problem}.b1.nn" for api in APIS])]
    assert set(rows["api"]) == {"cublas", "cublasLt"}
    assert list(rows["ref_time_ms"]) == pytest.approx([ref_time_ms] * len(rows))
    assert list(rows["ref_fma_pct"]) == pytest.approx([ref_fma_pct] * len(rows))
    assert set(rows["ref_kernel"]) == {"cublas_audit_ref_tma_sgemm"}


def test_reference_launches_are_columns_never_rows() -> None:
    # the export holds 22 launches: 6 reference (IDs 2, 7, 11, 14, 17, 20) and 16 calls;
    # 12 cases, 4 of them split-K with a second launch -> 16 rows
    frame = assembled(SINGLE_WITH_REF)
    assert len(frame) == 16
    assert "cublas_audit_ref_tma_sgemm" not in set(frame["kernel"])
    assert frame["ref_kernel"].notna().all()


def test_a_run_without_reference_has_no_reference_values() -> None:
    # h100-smoke's probe could not build the reference: ref_status 'unavailable: ImportError ...'
    frame = assembled(SMOKE)
    for column in ("ref_time_ms", "ref_fma_pct", "ref_kernel"):
        assert column not in frame.columns or frame[column].isna().all()
