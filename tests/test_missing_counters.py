"""Rows without counters (a PyTorch trace's kernels, a run observed with CUPTI instead of ncu)
are judged and reported with their utilization shown as missing, never an internal error (issue
38, item 1: `report --torch-trace` of a Llama-style trace exited 4 in legacy-kernel's message)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.judge.finding import pct_range
from tests.conftest import invoked

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "tests" / "fixtures" / "torch_traces"
LLAMA_RUN = REPO / "reports" / "h100" / "traces" / "20261125-093616-llama-v2"
COUNTERS = ("fma_pct", "fma_inst_pct", "tensor_pct")
runner = CliRunner()


def _heavy_ops(trace: Path) -> object:
    """The ops trace (33 problems, 1.5 s of CPU) in CI's second step: the quick suite reports it
    in test_trace_impact (test_a_small_worth_is_info_on_a_call_the_model_makes)."""
    marks = [pytest.mark.heavy] if trace.name == "ops.json.gz" else []
    return pytest.param(trace, marks=marks, id=trace.name)


@pytest.mark.parametrize("trace", [_heavy_ops(t) for t in sorted(TRACES.glob("*.json.gz"))])
def test_every_recorded_trace_is_reported(trace: Path) -> None:
    result = invoked("report", "--torch-trace", str(trace))
    assert result.exit_code == 0, result.output
    assert "internal error" not in result.output


def test_a_legacy_gemv_without_counters_says_its_utilization_is_unmeasured() -> None:
    # llama.json.gz's LM head over 4 tokens (32000x4x2048 in cuBLAS's terms) runs gemmSN, a
    # gemv-family kernel on a problem that is no matrix-vector one; a trace records no counters.
    result = invoked("report", "--torch-trace", str(TRACES / "llama.json.gz"))  # shared
    assert result.exit_code == 0, result.output
    legacy = [line for line in result.output.splitlines() if "a code path older" in line]
    assert legacy and all("at unmeasured (no counters)" in line for line in legacy)
    assert not any("nan %" in line or "<NA>" in line for line in legacy)


def test_a_run_with_gemv_rows_without_counters_is_reported(tmp_path: Path) -> None:
    """The recorded llama-v2 run with its gemv rows' counters blanked, as a run observed with
    CUPTI records them (kernel names and times, no counters). They move data near the H100's
    bandwidth, so legacy-kernel skips them unless the memory-bound cut is raised past them."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(LLAMA_RUN / "env.json", run / "env.json")
    table = pd.read_csv(LLAMA_RUN / "dispatch.csv", dtype=str, keep_default_na=False)
    gemv = table["family"] == "gemv"
    assert gemv.sum() == 2
    table.loc[gemv, list(COUNTERS)] = ""
    table.to_csv(run / "dispatch.csv", index=False)
    raised = ["--threshold", "memory_bound_min_pct=100"]
    result = runner.invoke(app, ["report", str(run), "--format", "md", *raised])
    assert result.exit_code == 0, result.output
    legacy = [line for line in result.output.splitlines() if "a code path older" in line]
    assert legacy and all("unmeasured (no counters)" in line for line in legacy)


def test_pct_range_of_missing_values() -> None:
    assert pct_range(pd.Series([pd.NA, pd.NA], dtype="Float64")) == "unmeasured (no counters)"
    assert pct_range(pd.Series([12.4, pd.NA, 30.2], dtype="Float64")) == "12-30 %"
    assert pct_range(pd.Series([12.4, 12.2], dtype="Float64")) == "12 %"
