"""judge.units' arithmetic and words, pinned: a slower unit's ratio and effect, each unit's state
(clock, power) and the speed spread's ratios, medians and rounding.

The figures are the H200 replicated run's (reports/h200/checks/20261124-004820-batched-replicate:
two units at 1980 MHz, around 700 W); a test sets the times to hand-checked ratios.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.judge.units import _median, _slower, _speed_row, _state
from cublas_audit.table.inputs import Dataset


def unit(label: str, frame: pd.DataFrame | None = None) -> Dataset:
    return Dataset(label, label, Path(label), pd.DataFrame() if frame is None else frame)


GPU0, GPU1 = unit("gpu0"), unit("gpu1")


def matched(**columns: object) -> pd.Series:
    row = {
        "api": "cublas",
        "routine": "gemm",
        "mode": "bf16",
        "batch": 8,
        "shape": "1024x1024x1024",
        "kernel_short_b": "nvjet_tst_256x128",
    }
    row.update(columns)
    return pd.Series(row)


def test_a_slower_second_unit_on_the_kernels_time() -> None:
    # regression: gpu1 (b) 0.025 ms against gpu0 (a) 0.020 ms = 1.25x; effect 1 - 1/1.25 = 0.2
    row = matched(
        kernel_time_ms_a=0.020,
        kernel_time_ms_b=0.025,
        time_ms_a=1.0,
        time_ms_b=1.0,
        sm_clock_mhz_a=1980.0,
        sm_clock_mhz_b=1755.0,
        power_w_a=690.4,
        power_w_b=700.0,
    )
    found = _slower(GPU0, GPU1, row, "regression")
    assert found.gpu_label == "gpu1" and found.effect == 0.2 and found.severity == "medium"
    assert found.kernel == "nvjet_tst_256x128" and found.batch == 8 and found.mode == "bf16"
    assert found.message == (
        "gpu1 takes 1.25x the time of gpu0 at 1024x1024x1024 (the kernels, beyond the noise "
        "floor; gpu1 1755 MHz 700 W, gpu0 1980 MHz 690 W)."
    )


def test_a_faster_second_unit_makes_the_first_the_slower_on_the_calls() -> None:
    # improvement: gpu0 (a) 0.03 ms over gpu1 (b) 0.02 ms = 1.50x; effect 1 - 1/1.5 = 0.3333
    row = matched(time_ms_a=0.03, time_ms_b=0.02, kernel_time_ms_a=float("nan"))
    found = _slower(GPU0, GPU1, row, "improvement")
    assert found.gpu_label == "gpu0" and found.effect == 0.3333
    assert "gpu0 takes 1.50x the time of gpu1" in found.message
    assert "(the calls, beyond the noise floor; gpu0 clock not read, gpu1 clock not read)" in (
        found.message
    )


def test_a_units_state_in_words() -> None:
    row = pd.Series({"sm_clock_mhz_a": 1980.4, "power_w_a": float("nan"), "power_w_b": 450.6})
    assert _state(row, "a") == "1980 MHz"
    assert _state(row, "b") == "clock not read 451 W"


def test_the_first_units_speed_is_one() -> None:
    frame = pd.DataFrame(
        {
            "status": ["ok", "ok", "error"],
            "gpu_uuid": [None, "GPU-1", "GPU-2"],
            "sm_clock_mhz": [1980.0, 1755.0, 1830.0],
            "power_w": [700.04, 690.0, 1.0],
        }
    )
    row = _speed_row(unit("gpu0", frame), None)
    assert row == {
        "unit": "gpu0",
        "gpu_uuid": "GPU-1",
        "cases": 2,
        "sm_clock_mhz": 1830.0,
        "power_w": 690.0,
        "median_ratio": 1.0,
        "min_ratio": 1.0,
        "max_ratio": 1.0,
    }


def test_a_units_ratios_on_the_kernels_time_else_the_calls() -> None:
    # b over a: 1.10004, 1.20006, 1.23456, rounded to 4 places: min 1.1, median 1.2001, max 1.2346
    kernels = pd.DataFrame(
        {
            "kernel_time_ms_a": [1.0, 1.0, 1.0],
            "kernel_time_ms_b": [1.10004, 1.20006, 1.23456],
            "time_ms_a": [1.0] * 3,
            "time_ms_b": [9.0] * 3,
        }
    )
    row = _speed_row(unit("gpu1", pd.DataFrame({"x": [1, 2]})), kernels)
    assert (row["median_ratio"], row["min_ratio"], row["max_ratio"]) == (1.2001, 1.1, 1.2346)
    assert row["cases"] == 2 and row["gpu_uuid"] == "" and row["sm_clock_mhz"] is None
    calls = pd.DataFrame({"time_ms_a": [2.0, 2.0], "time_ms_b": [1.0, 3.0]})
    row = _speed_row(GPU1, calls)
    assert (row["median_ratio"], row["min_ratio"], row["max_ratio"]) == (1.0, 0.5, 1.5)
    none = _speed_row(GPU1, pd.DataFrame({"time_ms_a": [float("nan")], "time_ms_b": [1.0]}))
    assert (none["median_ratio"], none["min_ratio"], none["max_ratio"]) == (None, None, None)


@pytest.mark.parametrize(
    ("values", "median"),
    [([1980.04, 1755.0, float("nan")], 1867.5), ([float("nan")], None), ([700.06], 700.1)],
)
def test_a_median_rounded_to_a_tenth(values: list[float], median: float | None) -> None:
    assert _median(pd.DataFrame({"power_w": values}), "power_w") == median
    assert _median(pd.DataFrame({"x": values}), "power_w") is None
