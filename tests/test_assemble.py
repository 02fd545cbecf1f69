"""The recorded H100 run re-assembles into the dispatch table it wrote on the GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from cublas_audit.planning.plan_file import read_plan
from cublas_audit.run.run_table import collect_launches
from cublas_audit.run.sweep import SweepConfig, write_table
from cublas_audit.table import dispatch
from cublas_audit.table.rundir import read_results
from cublas_audit.table.validation import read_table

from .conftest import FIXTURES

RUN = FIXTURES / "h100-batched-cublas"
KEY = ["case_id", "launch"]


def test_rebuilt_table_matches_the_recorded_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    config = SweepConfig(read_plan(run / "plan.json"), run, "h100", None)
    rebuilt = write_table(config)
    recorded = read_table(RUN)
    columns = ["case_id", "kernel", "role", "fma_pct", "time_ms", "status", "cublas_version"]
    pd.testing.assert_frame_equal(
        rebuilt[columns].reset_index(drop=True),
        recorded[columns].reset_index(drop=True),
        check_exact=False,
        rtol=1e-5,
    )


def test_split_k_reduction_is_kept_as_an_aux_row() -> None:
    frame = read_table(FIXTURES / "h100-smoke")
    small = frame[frame["case_id"] == "cublas.fp32.256x256x256.b1.nn"]
    assert list(small["role"]) == ["main", "aux"]
    assert list(small["family"]) == ["xmma", "splitk-reduce"]
    mains = dispatch.main_launches(frame)
    assert mains["case_id"].is_unique


def test_h100_escalates_like_the_published_h200() -> None:
    frame = dispatch.main_launches(read_table(RUN))
    batched = frame[(frame["routine"] == "cublasSgemmStridedBatched") & (frame["batch"] == 8)]
    shorts = dict(zip(batched["m"], batched["kernel_short"], strict=True))
    assert shorts[256] == "xmma_32x32x8"
    assert shorts[1024] == "simt_256x128_8x4"
    assert shorts[8192] == "xmma_128x128x8"
    fma = dict(zip(batched["m"], batched["fma_pct"], strict=True))
    assert fma[256] < 40 < 75 < fma[1024] < fma[8192]


def test_results_with_a_torn_last_line_are_read(tmp_path: Path) -> None:
    path = tmp_path / "timing.jsonl"
    text = (RUN / "timing.jsonl").read_text()
    path.write_text(text + '{"event": "done", "case_id": "x", "sta')
    assert read_results(path) == read_results(RUN / "timing.jsonl")
    assert len(collect_launches(RUN)) >= 18
