"""`cublas-audit report` in a terminal: the findings first (most severe first, across GPUs), then
each GPU's dispatch grid, and the full Markdown written to a file whose path it prints."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from cublas_audit.jobs import report
from cublas_audit.judge.audited import audit_all
from cublas_audit.report import render
from cublas_audit.report.output import TERMINAL_REPORT
from cublas_audit.report.terminal import show
from cublas_audit.table.inputs import bundled_runs, load_inputs


def test_findings_come_first_most_severe_first_then_the_grids() -> None:
    out = io.StringIO()
    show(audit_all(load_inputs(bundled_runs())), Console(file=out, width=160, color_system=None))
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
