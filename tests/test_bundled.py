"""The real audits bundled in reports/: what the H100 and H200 here really dispatched, and the
committed report, per-run reports and diffs are exactly what the tool renders from them."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.diff import compare, to_markdown
from cublas_audit.findings import audit, prepare
from cublas_audit.render import (
    REPORT_FILE,
    bundled_runs,
    load_inputs,
    load_one_gpu,
    render_report,
)
from cublas_audit.table import read_table
from cublas_audit.thresholds import Thresholds
from tests.conftest import FIXTURES, REPO, REPORTS

H100 = REPORTS / "h100" / "20261123-145452-batched"
# The H100 run of the bundled H100-vs-H200 diff (reports/diffs/h100-vs-h200-batched.md).
H100_DIFFED = REPORTS / "h100" / "20261123-083413-batched"
H200 = REPORTS / "h200" / "20261123-083048-batched"
RUNS = sorted(table.parent for table in REPORTS.glob("*/*/dispatch.csv"))


@pytest.fixture(autouse=True)
def in_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths in reports are shown as a user in the repository would type them."""
    monkeypatch.chdir(REPO)


def test_the_default_input_is_each_gpus_newest_batched_run() -> None:
    assert bundled_runs() == [H100, H200]


def test_the_recorded_h200_reproduces_the_articles_h200_column() -> None:
    published = read_table(FIXTURES / "published_article_b8.csv").query("gpu_label == 'h200'")
    rows = prepare(read_table(H200)).query("routine == 'cublasSgemmStridedBatched' and batch == 8")
    ours = rows.set_index("m")[["kernel_short", "util"]]
    for row in published.itertuples():
        assert ours.loc[row.m, "kernel_short"] == row.kernel, row.m
        assert ours.loc[row.m, "util"] == pytest.approx(row.fma_pct, abs=2.0), row.m


def test_both_hoppers_dispatch_the_same_kernels() -> None:
    diff = compare(load_one_gpu(H100_DIFFED), load_one_gpu(H200))
    assert len(diff.matched) == 54 and diff.kernel_changes.empty
    assert not diff.has_regression
    assert {row.key for row in diff.env if row.differs} == {"gpu_label", "gpu_name"}


@pytest.mark.parametrize("run", [H100, H200], ids=["h100", "h200"])
def test_the_candidate_gap_at_256_batch_8_is_flagged_on_its_cublaslt_row(run: Path) -> None:
    (dataset,) = load_inputs([run])
    found = audit(dataset.frame, Thresholds(), dataset.candidates)
    (finding,) = [f for f in found if f.rule == "better-candidate"]
    assert (finding.gpu_label, finding.batch) == (run.parent.name, 8)
    assert finding.sizes == ["256x256x256"]
    assert [e["tile"] for e in finding.evidence] == ["32x32", "64x64"]
    (row,) = finding.rows
    flagged = prepare(dataset.frame).loc[row]
    assert (flagged["api"], flagged["m"], flagged["batch"]) == ("cublasLt", 256, 8)
    strict = audit(dataset.frame, Thresholds(candidate_gap_pct=25.0), dataset.candidates)
    assert "better-candidate" not in {f.rule for f in strict}


def test_the_committed_audit_is_what_report_renders(tmp_path: Path) -> None:
    text = render_report(load_inputs(bundled_runs()), Thresholds(), tmp_path / "plots")
    assert text == (REPORTS / "audit.md").read_text()
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(
        p.name for p in (REPORTS / "plots").iterdir()
    )


def test_report_without_arguments_prints_the_bundled_audit() -> None:
    result = CliRunner().invoke(app, ["report"])
    assert result.exit_code == 0, result.output
    assert f"Inputs: `{H100.relative_to(REPO)}`, `{H200.relative_to(REPO)}`" in result.output
    assert "### cublas · cublasSgemmStridedBatched · fp32 · batch 8" in result.output


@pytest.mark.parametrize("run", RUNS, ids=[f"{r.parent.name}/{r.name}" for r in RUNS])
def test_each_run_report_is_current(run: Path, tmp_path: Path) -> None:
    text = render_report(load_inputs([run.relative_to(REPO)]), Thresholds(), tmp_path)
    assert text == (run / REPORT_FILE).read_text()


DIFFS = sorted((REPORTS / "diffs").glob("*.md"))


@pytest.mark.parametrize("committed", DIFFS, ids=[d.stem for d in DIFFS])
def test_each_bundled_diff_is_current(committed: Path) -> None:
    text = committed.read_text()
    a, b = re.findall(r"^[AB] \((?:baseline|compared)\): `(.+)`$", text, re.MULTILINE)
    assert to_markdown(compare(load_one_gpu(Path(a)), load_one_gpu(Path(b)))) == text


def test_the_workspace_setting_is_what_differs_and_changes_the_512_pick() -> None:
    runs = REPORTS / "h100"
    default = load_one_gpu(runs / "20261123-012340-single-fp32-ws-default")
    no_workspace = load_one_gpu(runs / "20261123-012340-single-fp32-ws-0-0")
    diff = compare(default, no_workspace)
    (differs,) = [row for row in diff.env if row.differs]
    assert (differs.key, differs.b) == ("probe_env", "CUBLAS_WORKSPACE_CONFIG=:0:0")
    changes = diff.kernel_changes.set_index(["routine", "m"])
    assert changes.loc[("cublasSgemm", 512), ["kernel_short_a", "kernel_short_b"]].tolist() == [
        "xmma_64x64x8",
        "xmma_32x32x8",
    ]
    assert set(diff.rows("regression")["m"]) >= {256, 512}


def test_every_bundled_run_has_a_complete_table() -> None:
    for run in RUNS:
        frame = read_table(run)
        assert not frame.empty, run
        assert set(frame["status"].dropna()) <= {"ok"}, run
        assert pd.notna(prepare(frame)["time_ms"]).all(), run
