"""judge.rules.frame's derived columns, pinned on the H100's recorded K = 140 check
(reports/h100/checks/20261125-074637-k140: bf16 1024x1024x140 batch 8, its ldb 144 variant and
K = 144): TFLOP/s where the table has none, the kernel named by the trace where ncu named none,
the linear size, the pipe's utilization, the runs of one kernel and the measured rows."""

from __future__ import annotations

from functools import cache

import pandas as pd
import pytest

from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.frame import kept, kernel_runs, measured
from cublas_audit.table.dispatch import from_records
from tests.conftest import REPORTS

K140 = REPORTS / "h100" / "checks" / "20261125-074637-k140" / "dispatch.csv"


@cache
def recorded() -> pd.DataFrame:
    return pd.read_csv(K140)


def prepared(frame: pd.DataFrame) -> pd.DataFrame:
    return prepare(from_records(frame.to_dict("records")))


def test_tflops_from_the_time_where_the_table_has_none() -> None:
    # 2 x 1024 x 1024 x 140 x 8 = 2.348810e9 FLOP in 0.03536 ms = 66.4256 TFLOP/s (the table's)
    rows = prepared(recorded().drop(columns=["tflops"]))
    assert rows["tflops_shown"].iloc[0] == pytest.approx(2 * 1024 * 1024 * 140 * 8 / 0.03536e9)
    assert rows["tflops_shown"].round(4).tolist() == recorded()["tflops"].tolist()
    kept_shown = prepared(recorded())["tflops_shown"].tolist()
    assert kept_shown == recorded()["tflops"].tolist()


def test_the_first_traced_kernel_names_a_row_without_ncus_name() -> None:
    frame = recorded().drop(columns=["kernel"])
    frame.loc[2, "traced_kernels"] = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT + x + y"
    rows = prepared(frame)
    assert rows["kernel_name"].iloc[2] == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    assert rows["kernel_short"].tolist()[1:] == [
        "tensorop_s16816gemm_256x128_64x3", "nvjet_tst_256x128_64x4_1x2",
    ]  # fmt: skip


def test_size_shape_and_the_tensor_pipes_utilization() -> None:
    rows = prepared(recorded())
    # cube root of 1024 x 1024 x 140 = 527.525; of 1024 x 1024 x 144 = 532.501
    assert rows["size"].tolist() == [527.525, 527.525, 532.501]
    assert rows["shape"].tolist() == ["1024x1024x140", "1024x1024x140 ldb144", "1024x1024x144"]
    assert rows["util"].tolist() == recorded()["tensor_pct"].tolist()  # bf16: the tensor pipe
    fp32 = prepared(recorded().assign(mode="fp32"))
    assert fp32["util"].tolist() == recorded()["fma_pct"].tolist()


def test_measured_rows_have_a_positive_time() -> None:
    rows = prepared(recorded())
    rows.loc[1, "kernel_time_ms"] = 0.0
    assert measured(rows, "kernel_time_ms").index.tolist() == [0, 2]
    assert measured(rows, "time_ms").index.tolist() == [0, 1, 2]
    assert kept(rows, [False, False, False]).empty


def test_a_run_of_one_kernel_spans_its_sizes() -> None:
    rows = prepared(recorded())
    # K 140's two rows are one run of one size (527.525 / 527.525 = 1.0 >= 1.0), K 144 another
    assert [run.index.tolist() for run in kernel_runs(rows)] == [[0, 1], [2]]
    assert list(kernel_runs(rows, 1.0 + 1e-9)) == []
