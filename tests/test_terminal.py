"""`cublas-audit report` in a terminal: the findings first (most severe first, across GPUs), then
each GPU's dispatch grid, and the full Markdown written to a file whose path it prints."""

from __future__ import annotations

import functools
import io
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from rich.text import Text

from cublas_audit.jobs import report
from cublas_audit.judge.audited import Audited, audit_dataset
from cublas_audit.report import render
from cublas_audit.report.output import TERMINAL_REPORT
from cublas_audit.report.terminal import cell, dispatch_grids, show
from cublas_audit.table.inputs import bundled_runs, load_inputs

from .conftest import REPORTS, audited_run


def test_findings_come_first_most_severe_first_then_the_grids() -> None:
    out = io.StringIO()
    judged = [audited_run(run) for run in bundled_runs()]  # shared with other modules
    show(judged, Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    severities = [
        word for line in text.splitlines() for word in ("medium", "info") if f"│ {word}" in line
    ]
    assert severities == sorted(severities, key=["medium", "info"].index)  # medium before info
    assert (
        text.index("Findings:") < text.index("h100: NVIDIA H100") < text.index("h200: NVIDIA H200")
    )
    # The H100 row of DESIGN.md's table: 256^3 batch 8 runs xmma 32x32x8 at 33 % FMA pipe.
    row_256 = next(line for line in text.splitlines() if line.startswith("│ 256"))
    assert "xmma_32x32x8 33%" in row_256


def test_a_terminal_gets_the_summary_and_the_markdown_in_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    # the pictures are tests/test_render.py's; here they would only cost seconds
    monkeypatch.setattr(render, "plot", lambda title, rows, plots: None)
    lines: list[str] = []
    report.run(report.ReportJob(), terminal=True, echo=lambda text, **_: lines.append(text))
    written = tmp_path / TERMINAL_REPORT
    assert written.read_text().startswith("# cuBLAS dispatch audit")
    assert str(TERMINAL_REPORT) in lines[-1]
    assert "Findings:" in capsys.readouterr().out


SINGLE = REPORTS / "h100" / "20261123-012340-single"


@functools.cache
def _judged(run: Path, mode: str = "") -> Audited:
    """A recorded run judged once per process (only its rows of `mode`, where one is named: a
    grid shows one kind of call, and the ops run's 75 rows cost seconds to judge whole)."""
    if not mode:
        return audited_run(run)
    (dataset,) = load_inputs([run])
    return audit_dataset(replace(dataset, frame=dataset.frame[dataset.frame["mode"] == mode]))


def _grids(run: Path, mode: str = "") -> dict[str, list[str]]:
    """Each grid of a recorded run as the terminal prints it: title -> its lines."""
    judged = _judged(run, mode)
    grids = {}
    for table in dispatch_grids(judged.dataset, judged.rows):
        out = io.StringIO()
        Console(file=out, width=400, color_system=None).print(table)
        title = table.title.plain if isinstance(table.title, Text) else str(table.title)
        grids[title.removeprefix(f"{judged.dataset.title} · ")] = out.getvalue().splitlines()
    return grids


def test_tensor_core_grids_head_and_fill_their_cells_with_tensor_percent() -> None:
    """The H100 single run: tf32 and bf16x dispatch tensor-core kernels (tensorop s1688gemm,
    sm90 xmma); each cell shows the tensor-pipe % the CSV records, the heading says 'tensor %'."""
    recorded = pd.read_csv(SINGLE / "dispatch.csv")
    main = recorded[(recorded["role"] == "main") & recorded["mode"].isin(["tf32", "bf16x"])]
    grids = _grids(SINGLE)
    for _, row in main.iterrows():
        lines = grids[f"{row['api']} {row['routine']} {row['mode']} (kernel, tensor %, TFLOP/s)"]
        line = next(line for line in lines if line.startswith(f"│ {row['m']} "))
        assert f" {row['tensor_pct']:.0f}% {row['tflops']:.1f} " in line
        assert f" {row['fma_pct']:.0f}% " not in line
    assert "cublas cublasSgemm fp32 (kernel, FMA %, TFLOP/s)" in grids


def test_nvjet_cells_never_show_the_fma_pipes_zero() -> None:
    """The ops run's fp16 grid: nvjet kernels at the tensor-pipe % the CSV records."""
    run = REPORTS / "h100" / "traces" / "20261123-233621-ops"
    recorded = pd.read_csv(run / "dispatch.csv", low_memory=False)
    nvjet = recorded[
        (recorded["role"] == "main")
        & (recorded["family"] == "nvjet")
        & (recorded["api"] == "cublas")
        & (recorded["routine"] == "cublasGemmEx")
        & (recorded["mode"] == "fp16")
    ]
    assert len(nvjet) >= 4
    text = "\n".join(_grids(run, "fp16")["cublas cublasGemmEx fp16 (kernel, tensor %, TFLOP/s)"])
    for _, row in nvjet.iterrows():
        assert f"{row['kernel_short']} {row['tensor_pct']:.0f}% {row['tflops']:.1f}" in text
    assert not re.search(r"nvjet_\S+ 0%", text)


def test_a_cell_without_its_pipes_column_shows_no_percentage() -> None:
    rows = _judged(SINGLE).rows.drop(columns=["tensor_pct"])
    tf32 = rows[(rows["mode"] == "tf32") & (rows["m"] == 256)].iloc[0]
    assert "%" not in cell(tf32)
    assert cell(tf32).endswith(f" {tf32['tflops_shown']:.1f}")
