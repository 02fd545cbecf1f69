"""judge.roofline's figures, boundaries and arithmetic, pinned one by one.

Every expected number is hand-computed in a comment. The shapes are chosen so that the float
arithmetic is exact (a 6x6x6 fp32 GEMM moves 432 bytes and does 432 FLOP: intensity 1.0), so an
exact comparison tells a constant off by one part in 1e12 (1e12 -> 1e12 + 1) from the right one.
The per-SM rates and data-sheet bandwidths are NVIDIA's published figures (A100 / H100
whitepapers; the data sheets of each card).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cublas_audit.judge.roofline import (
    COMPUTE,
    L2_RESIDENT,
    MEMORY,
    Machine,
    attained_ms,
    attained_tflops,
    bound_words,
    bytes_moved,
    machine_of,
    memory_bound,
    near_memory_bound,
    with_roofline,
)
from tests.conftest import REPORTS

EMPTY = pd.DataFrame()
# A machine whose figures make the arithmetic exact: 1 TB/s, fp32 peak 1 TFLOP/s (ridge 1 FLOP/B).
UNIT = Machine("unit", 1000.0, "sheet", {"fp32": 1.0}, "spec")


def rows(**columns: list[object]) -> pd.DataFrame:
    base: dict[str, list[object]] = {"mode": ["fp32"], "m": [6], "n": [6], "k": [6], "batch": [1]}
    base.update(columns)
    return pd.DataFrame(base)


# ----- the GPU's figures ------------------------------------------------------------------------

# FLOP per SM and clock: FP32 = FMA lanes x 2 (A100 64 lanes, Ampere/Ada/Hopper/Blackwell consumer
# and H100 128); tensor cores dense: A100 1024 TF32, 2048 FP16/BF16; H100 2048 TF32, 4096 FP16/BF16.
PUBLISHED = {
    "8.0": {"fp32": 128, "tf32": 1024, "bf16x": 2048, "fp16": 2048, "bf16": 2048},
    "8.6": {"fp32": 256},
    "8.9": {"fp32": 256},
    "9.0": {"fp32": 256, "tf32": 2048, "bf16x": 4096, "fp16": 4096, "bf16": 4096},
    "10.0": {"fp32": 256},
    "12.0": {"fp32": 256},
}


@pytest.mark.parametrize("cc", sorted(PUBLISHED))
def test_each_derived_peak_is_the_published_rate(cc: str) -> None:
    # one SM at 1e6 MHz (1e12 clocks a second): the peak in TFLOP/s is the rate itself, exactly
    env = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": cc, "sm_count": 1, "sm_clock_max_mhz": 1e6}
    machine = machine_of(env, EMPTY)
    assert machine is not None
    assert dict(machine.peaks) == {mode: float(rate) for mode, rate in PUBLISHED[cc].items()}
    assert (
        machine.peak_source.startswith("SMs x SM clock")
        and f"capability {cc})" in machine.peak_source
    )


def test_peaks_scale_with_sms_and_clock() -> None:
    # 132 SMs x 256 FLOP x 1980 MHz = 33792 x 1.98e9 = 66.90816 TFLOP/s (the H100's FP32 peak)
    env = {"cc": "9.0", "sm_count": 132, "sm_clock_max_mhz": 1980}
    machine = machine_of(env, EMPTY)
    assert machine is not None
    assert machine.peaks["fp32"] == pytest.approx(66.90816, rel=1e-12)


# The data sheets' DRAM bandwidth, GB/s, by the name nvidia-smi gives.
SHEETS = [
    ("NVIDIA H200", 4800.0),
    ("NVIDIA H100 80GB HBM3", 3350.0),
    ("NVIDIA H100 NVL", 3900.0),
    ("NVIDIA H100 PCIe", 2000.0),
    ("NVIDIA A100-SXM4-80GB", 2039.0),
    ("NVIDIA A100 80GB PCIe", 1935.0),
    ("NVIDIA A100-SXM4-40GB", 1555.0),
    ("NVIDIA A100-PCIE-40GB", 1555.0),
    ("NVIDIA GeForce RTX 5090", 1792.0),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 1792.0),
]


@pytest.mark.parametrize(("name", "gbps"), SHEETS)
def test_a_known_gpu_without_peaks_keeps_its_data_sheet_bandwidth(name: str, gbps: float) -> None:
    machine = machine_of({"gpu_name": name}, EMPTY)  # no cc, SMs or clock: no peaks
    assert machine == Machine(name, gbps, f"data sheet of the {name}", {}, "unknown")


def test_peaks_without_a_data_sheet_leave_the_bandwidth_unknown() -> None:
    env = {"gpu_name": "Some Future GPU", "cc": "9.0", "sm_count": 1, "sm_clock_max_mhz": 1e6}
    machine = machine_of(env, EMPTY)
    assert machine is not None
    assert machine.dram_gbps is None and machine.dram_source == "unknown"
    assert machine.peaks["fp32"] == 256.0


@pytest.mark.parametrize("missing", ["cc", "sm_count", "sm_clock_max_mhz"])
def test_any_missing_figure_derives_no_peaks(missing: str) -> None:
    env = {"gpu_name": "Some Future GPU", "cc": "9.0", "sm_count": 1, "sm_clock_max_mhz": 1e6}
    del env[missing]
    assert machine_of(env, EMPTY) is None


def test_an_unknown_compute_capability_derives_no_peaks() -> None:
    env = {"gpu_name": "Some Future GPU", "cc": "7.0", "sm_count": 1, "sm_clock_max_mhz": 1e6}
    assert machine_of(env, EMPTY) is None


def test_cc_and_sms_come_from_the_table_when_env_lacks_them() -> None:
    # the first non-empty value of each column: a NaN first row is skipped, the 2nd row not read
    frame = pd.DataFrame(
        {
            "gpu_name": [None, "NVIDIA H100 80GB HBM3", "NVIDIA H200"],
            "cc": [None, "9.0", "8.0"],
            "sm_count": [np.nan, 1.0, 2.0],
        }
    )
    machine = machine_of({"sm_clock_max_mhz": 1e6}, frame)
    assert machine is not None
    assert machine.name == "NVIDIA H100 80GB HBM3" and machine.dram_gbps == 3350.0
    assert machine.peaks["bf16"] == 4096.0  # cc 9.0 x 1 SM
    assert "capability 9.0)" in machine.peak_source


def test_a_measured_bandwidth_wins_and_keeps_the_derived_peaks() -> None:
    env = {
        "gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0", "sm_count": 1, "sm_clock_max_mhz": 1e6,
        "roofline": {"dram_gbps": 2798.1},
    }  # fmt: skip
    machine = machine_of(env, EMPTY)
    assert machine is not None
    assert machine.dram_gbps == 2798.1 and machine.dram_source == "measured"
    assert machine.peaks["fp32"] == 256.0 and machine.peak_source.startswith("SMs x SM clock")


def test_measured_peaks_win_over_derived_ones() -> None:
    env = {
        "gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0", "sm_count": 1, "sm_clock_max_mhz": 1e6,
        "roofline": {"dram_gbps": 3000, "dram_source": "copy", "peaks_tflops": {"fp32": 60}},
    }  # fmt: skip
    machine = machine_of(env, EMPTY)
    assert machine == Machine("NVIDIA H100 80GB HBM3", 3000.0, "copy", {"fp32": 60.0}, "measured")
    env["roofline"] = {"dram_gbps": 3000, "peaks_tflops": {"fp32": 60}, "peak_source": "fma loop"}
    machine = machine_of(env, EMPTY)
    assert machine is not None and machine.peak_source == "fma loop"


@pytest.mark.parametrize("roofline", [None, {}, {"dram_gbps": 0}])
def test_no_measured_bandwidth_falls_back_to_the_data_sheet(roofline: object) -> None:
    env = {"gpu_name": "NVIDIA H200", "roofline": roofline}
    assert machine_of(env, EMPTY) == Machine(
        "NVIDIA H200", 4800.0, "data sheet of the NVIDIA H200", {}, "unknown"
    )


def test_the_recorded_h100_trace_run_measured_its_bandwidth() -> None:
    from cublas_audit.table.rundir import read_env

    machine = machine_of(read_env(REPORTS / "h100" / "traces" / "20261125-075427-llama"), EMPTY)
    assert machine is not None
    assert 2700.0 < (machine.dram_gbps or 0) < 2900.0 and machine.dram_source.startswith("measured")


def test_the_ridge_is_peak_over_bandwidth_exactly() -> None:
    # 1 TFLOP/s over 1000 GB/s = 1e12 / 1e12 = 1.0 FLOP/B; 3 TFLOP/s over 1500 GB/s = 2.0
    assert UNIT.ridge("fp32") == 1.0
    assert Machine("x", 1500.0, "s", {"fp32": 3.0}).ridge("fp32") == 2.0
    assert UNIT.ridge("bf16") is None  # no peak for that mode
    assert Machine("x", None, "s", {"fp32": 1.0}).ridge("fp32") is None
    assert Machine("x", 0.0, "s", {"fp32": 1.0}).ridge("fp32") is None


# ----- bytes and FLOP ---------------------------------------------------------------------------


def test_bytes_moved_reads_a_and_b_and_writes_c() -> None:
    # fp32 (4 B), m 2, n 3, k 5, batch 7: A 2*5*7 = 70, B 5*3*7 = 105, C 2*3*7 = 42 -> 217 x 4 = 868
    frame = rows(m=[2], n=[3], k=[5], batch=[7])
    assert bytes_moved(frame).tolist() == [868.0]
    # fp16 (2 B) halves it; an unknown mode is NA
    assert bytes_moved(rows(m=[2], n=[3], k=[5], batch=[7], mode=["fp16"])).tolist() == [434.0]
    assert bytes_moved(rows(mode=["int8"])).isna().all()


def test_bytes_moved_counts_a_broadcast_operand_once() -> None:
    # broadcast A: 2*5 = 10 (not 70) -> 10 + 105 + 42 = 157 x 4 = 628; broadcast B: 70 + 15 + 42
    # = 127 x 4 = 508; no broadcast (NA or "") reads both per batch: 868
    frame = rows(m=[2] * 4, n=[3] * 4, k=[5] * 4, batch=[7] * 4, mode=["fp32"] * 4,
                 broadcast=["a", "b", None, ""])  # fmt: skip
    assert bytes_moved(frame).tolist() == [628.0, 508.0, 868.0, 868.0]


def test_bytes_moved_reads_c_too_when_beta_is_not_zero_and_adds_the_bias() -> None:
    # beta 1: C read and written, 42 x 2 = 84 -> 70 + 105 + 84 = 259 x 4 = 1036; beta 0 or NaN:
    # 868; beta -1 reads C too; a bias vector adds m = 2 elements: 219 x 4 = 876 (NaN bias: none)
    frame = rows(m=[2] * 5, n=[3] * 5, k=[5] * 5, batch=[7] * 5, mode=["fp32"] * 5,
                 beta=[1.0, 0.0, np.nan, -1.0, 0.0], bias=[0, 0, 0, 0, 1])  # fmt: skip
    assert bytes_moved(frame).tolist() == [1036.0, 868.0, 868.0, 1036.0, 876.0]
    assert bytes_moved(rows(bias=[np.nan])).tolist() == [432.0]


def test_bytes_moved_without_the_optional_columns() -> None:
    # 6x6x6 fp32: (36 + 36 + 36) x 4 = 432, no beta, no bias, no broadcast column at all
    assert bytes_moved(rows()).tolist() == [432.0]


def test_attained_tflops_on_the_kernels_time_else_the_calls() -> None:
    # 2 x 10^4 x 10^4 x 10^4 = 2e12 FLOP in 1000 ms = 2.0 TFLOP/s exactly; in 500 ms (kernels) 4.0
    big = {"m": [10_000] * 2, "n": [10_000] * 2, "k": [10_000] * 2, "batch": [1] * 2,
           "mode": ["fp32"] * 2}  # fmt: skip
    frame = rows(**big, time_ms=[1000.0] * 2, kernel_time_ms=[np.nan, 500.0])
    assert attained_tflops(frame).tolist() == [2.0, 4.0]
    assert attained_ms(frame).tolist() == [1000.0, 500.0]
    untraced = rows(**big, time_ms=[1000.0, 250.0])  # no kernel_time_ms column: the call's
    assert attained_tflops(untraced).tolist() == [2.0, 8.0]
    assert attained_ms(untraced).tolist() == [1000.0, 250.0]
    # batch 2 doubles the FLOP
    assert (
        attained_tflops(rows(**{**big, "batch": [2, 2]}, time_ms=[1000.0] * 2)).tolist()
        == [4.0] * 2
    )


# ----- the bound, its side and the fraction attained -------------------------------------------


def test_at_the_ridge_the_bound_is_compute() -> None:
    # 6x6x6 fp32: 432 FLOP over 432 B = intensity 1.0; x 1000 GB/s / 1000 = 1.0 TFLOP/s = the peak
    # 432 FLOP in 432e-9 ms = 1.0 TFLOP/s: exactly 100 % of the bound, not beyond it
    out = with_roofline(rows(time_ms=[432e-9]), UNIT)
    assert out["bytes_moved"].tolist() == [432.0] and out["intensity"].tolist() == [1.0]
    assert out["bound_tflops"].tolist() == [1.0]
    assert out["bound_side"].tolist() == [COMPUTE]
    assert out["roofline_pct"].tolist() == [100.0] and out["l2_resident"].tolist() == [False]


def test_below_the_ridge_the_bound_is_the_bandwidths() -> None:
    # peak 2 TFLOP/s: the memory bound 1.0 < 2.0 -> memory-bound at 1.0 TFLOP/s; 216e-9 ms is
    # 2.0 TFLOP/s: 200 % of DRAM's bound, i.e. L2-resident, no DRAM fraction
    machine = Machine("x", 1000.0, "sheet", {"fp32": 2.0})
    frame = rows(m=[6, 6], n=[6, 6], k=[6, 6], batch=[1, 1], mode=["fp32"] * 2,
                 time_ms=[864e-9, 216e-9])  # fmt: skip
    out = with_roofline(frame, machine)
    assert out["bound_tflops"].tolist() == [1.0, 1.0]
    assert out["bound_side"].tolist() == [MEMORY, MEMORY]
    # 432 FLOP in 864e-9 ms = 0.5 TFLOP/s = 50 % of the 1.0 bound
    assert out["roofline_pct"].iloc[0] == 50.0
    assert out["l2_resident"].tolist() == [False, True] and pd.isna(out["roofline_pct"].iloc[1])


def test_just_past_the_bandwidths_bound_is_l2_resident() -> None:
    # 432 FLOP at 100.5 % of 1.0 TFLOP/s: 432e-9 / 1.005 ms; memory-bound (peak 2.0)
    machine = Machine("x", 1000.0, "sheet", {"fp32": 2.0})
    out = with_roofline(rows(time_ms=[432e-9 / 1.005]), machine)
    assert out["l2_resident"].tolist() == [True] and out["roofline_pct"].isna().all()


def test_a_compute_bound_row_past_its_peak_stays_a_fraction() -> None:
    # above the ridge (peak 0.5 < memory 1.0): compute-bound, 200 % of the peak is no L2 sign
    machine = Machine("x", 1000.0, "sheet", {"fp32": 0.5})
    out = with_roofline(rows(time_ms=[432e-9]), machine)
    assert out["bound_side"].tolist() == [COMPUTE] and out["bound_tflops"].tolist() == [0.5]
    assert out["roofline_pct"].tolist() == [200.0] and out["l2_resident"].tolist() == [False]


def test_a_batch_multiplies_flop_and_bytes_alike() -> None:
    # batch 3: 1296 FLOP over 1296 B, intensity still 1.0; 1296 FLOP in 1296e-9 ms = 1 TFLOP/s
    out = with_roofline(rows(batch=[3], time_ms=[1296e-9]), UNIT)
    assert out["intensity"].tolist() == [1.0]
    assert out["roofline_pct"].tolist() == [pytest.approx(100.0)]


def test_the_memory_bound_scales_with_the_bandwidth() -> None:
    # 3000 GB/s x intensity 1.0 / 1000 = 3.0 TFLOP/s, below a 4.0 peak
    out = with_roofline(rows(time_ms=[432e-9]), Machine("x", 3000.0, "s", {"fp32": 4.0}))
    assert out["bound_tflops"].tolist() == [3.0] and out["bound_side"].tolist() == [MEMORY]


@pytest.mark.parametrize("machine", [None, Machine("x", None, "unknown", {"fp32": 1.0})])
def test_an_unknown_bound_leaves_the_columns_empty(machine: Machine | None) -> None:
    out = with_roofline(rows(time_ms=[432e-9]), machine)
    assert out["intensity"].tolist() == [1.0]  # known from the shape alone
    assert out["bound_tflops"].isna().all() and out["bound_side"].isna().all()
    assert out["roofline_pct"].isna().all() and out["l2_resident"].tolist() == [False]


def test_a_mode_without_a_peak_has_no_bound() -> None:
    out = with_roofline(rows(mode=["fp16"], time_ms=[216e-9]), UNIT)
    assert out["bound_tflops"].isna().all() and out["bound_side"].isna().all()
    assert out["l2_resident"].tolist() == [False]


def test_the_input_frame_is_left_as_it_was() -> None:
    frame = rows(time_ms=[432e-9])
    with_roofline(frame, UNIT)
    assert list(frame.columns) == ["mode", "m", "n", "k", "batch", "time_ms"]


# ----- selections -------------------------------------------------------------------------------


def judged() -> pd.DataFrame:
    # the dtypes with_roofline gives: NA in them must read as False, never as True
    return pd.DataFrame(
        {
            "bound_side": pd.array([MEMORY, MEMORY, COMPUTE, None, MEMORY, MEMORY], "string"),
            "bytes_moved": pd.array([0.0, 100.0, 100.0, 100.0, None, 100.0], "Float64"),
            "roofline_pct": pd.array([80.0, 79.9, 95.0, 90.0, None, None], "Float64"),
            "l2_resident": pd.array([False, False, False, False, True, None], "boolean"),
        }
    )


def test_memory_bound_rows_by_side_and_bytes() -> None:
    frame = judged()
    assert memory_bound(frame).tolist() == [True, True, False, False, False, True]
    # at least 100 bytes: the boundary itself counts
    assert memory_bound(frame, 100.0).tolist() == [False, True, False, False, False, True]
    assert memory_bound(frame.drop(columns="bound_side")).tolist() == [False] * 6


def test_near_memory_bound_by_fraction_or_l2() -> None:
    frame = judged()
    frame.loc[4, "bytes_moved"] = 100.0
    # 80 % meets an 80 % floor, 79.9 does not; compute-bound never; L2-resident always
    assert near_memory_bound(frame, 80.0).tolist() == [True, False, False, False, True, False]
    assert near_memory_bound(frame.drop(columns="l2_resident"), 80.0).tolist() == [
        True, False, False, False, False, False,
    ]  # fmt: skip


# ----- the reader's words -----------------------------------------------------------------------

H100 = Machine("NVIDIA H100 80GB HBM3", 3350.0, "data sheet", {"fp32": 66.9}, "spec")


def words_rows(side: list[object], pct: list[float], intensity: list[float]) -> pd.DataFrame:
    n = len(side)
    return pd.DataFrame({"mode": ["fp32"] * n, "bound_side": side, "roofline_pct": pct,
                         "intensity": intensity})  # fmt: skip


def test_memory_bound_words_give_the_range_and_the_bandwidth() -> None:
    frame = words_rows([MEMORY, MEMORY], [13.04, 41.6], [1.04, 1.96])
    assert bound_words(frame, H100) == (
        "memory-bound at 1.0-2.0 FLOP/B: 13-42 % of the 3.35 TB/s this GPU moves (data sheet)"
    )
    one = words_rows([MEMORY], [13.0], [1.0])
    assert bound_words(one, H100).startswith("memory-bound at 1.0 FLOP/B: 13 % of the 3.35 TB/s")
    # a row past DRAM's bound (NaN fraction) is left out of the range
    mixed = words_rows([MEMORY, MEMORY], [13.0, math.nan], [1.0, 9.0])
    assert bound_words(mixed, H100).startswith("memory-bound at 1.0 FLOP/B: 13 % of")


def test_memory_bound_words_with_an_unknown_bandwidth() -> None:
    machine = Machine("x", None, "unknown", {"fp32": 1.0})
    assert "of the 0.00 TB/s" in bound_words(words_rows([MEMORY], [13.0], [1.0]), machine)


def test_compute_bound_words_give_the_peak() -> None:
    frame = words_rows([COMPUTE, MEMORY], [90.0, 50.0], [200.0, 3.0])
    assert bound_words(frame, H100) == (
        "compute-bound at 3.0-200.0 FLOP/B: 50-90 % of the 66.9 TFLOP/s fp32 peak (spec)"
    )
    one = words_rows([COMPUTE], [90.0], [200.0])
    assert bound_words(one, H100).startswith("compute-bound at 200.0 FLOP/B: 90 % of the 66.9")
    no_peak = Machine("x", 3350.0, "sheet", {})
    assert bound_words(frame, no_peak) == "compute-bound at 3.0-200.0 FLOP/B"


def test_words_when_nothing_is_known_or_all_is_l2() -> None:
    unknown = "no roofline bound (this GPU's bandwidth and peak are not known here)"
    frame = words_rows([MEMORY], [13.0], [1.0])
    assert bound_words(frame, None) == unknown
    assert bound_words(words_rows([None], [math.nan], [1.0]), H100) == unknown
    assert bound_words(frame.drop(columns="bound_side"), H100) == unknown
    l2 = words_rows([MEMORY, MEMORY], [math.nan, math.nan], [1.0, 1.0])
    assert bound_words(l2, H100).startswith(f"{L2_RESIDENT}: faster than this GPU's DRAM")
