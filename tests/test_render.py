"""The Markdown report on real data: golden files, escaping, inputs, the CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.render import (
    load_inputs,
    md_code,
    md_text,
    render_report,
    shorten,
    write_run_report,
)
from cublas_audit.table import read_table, write_table
from cublas_audit.thresholds import Thresholds
from tests.conftest import FIXTURES, REPO

GOLDEN = REPO / "tests" / "golden"
# UPDATE_GOLDEN=1 pytest tests/test_render.py rewrites the expected files; review the git diff.
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
GOLDEN_INPUTS = {
    "published_article_b8.md": ["tests/fixtures/published_article_b8.csv"],
    "published_article_single_5090.md": ["tests/fixtures/published_article_single_5090.csv"],
    "h100-smoke.md": ["tests/fixtures/h100-smoke"],
    "h100-batched-cublas.md": ["tests/fixtures/h100-batched-cublas"],
}


def _render(paths: list[str]) -> str:
    return render_report(load_inputs([Path(p) for p in paths]), Thresholds())


def _squeeze(markdown: str) -> str:
    """Table rows without tabulate's alignment padding."""
    return re.sub(r" *\| *", "|", markdown)


@pytest.mark.parametrize("name", sorted(GOLDEN_INPUTS))
def test_golden(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # inputs are named as a user in the repository would type them
    text = _render(GOLDEN_INPUTS[name])
    expected = GOLDEN / name
    if UPDATE:
        expected.write_text(text)
    assert text == expected.read_text()


def test_side_by_side_reproduces_the_article_table() -> None:
    text = _squeeze(_render([str(FIXTURES / "published_article_b8.csv")]))
    assert "|size|5090 kernel|FMA %|pro6000 kernel|FMA %|h200 kernel|FMA %|" in text
    assert "|4096|`simt_128x32_8x5`|42|`simt_256x128_8x4`|73|`xmma_128x128x8`|82|" in text
    assert "|256|`simt_128x32_8x5`|33|`magma_Ex`|32|`xmma_32x32x8`|33|" in text


def test_efficiency_matches_the_article_eff_column() -> None:
    text = _squeeze(_render([str(FIXTURES / "published_article_single_5090.csv")]))
    effs = re.findall(r"\|(\d+)\|—\|[\d.]+\|[\d.]+\|(\d+)%\|", text)
    assert effs == [
        ("1024", "96"),
        ("2048", "106"),
        ("4096", "100"),
        ("8192", "94"),
        ("16384", "89"),
    ]


def test_high_finding_gets_a_standalone_script() -> None:
    text = _render([str(FIXTURES / "published_article_b8.csv")])
    assert "cublas.sgemmStridedBatched(h, 0, 0, m, n, k" in text
    assert "m, n, k, batch = 8192, 8192, 8192, 8" in text
    assert "ncu --metrics sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active" in text
    assert "cublas-audit sweep --batched --sizes 8192 --modes fp32 --api cublas --batches 8" in text


def test_full_kernel_names_appear_once_and_tables_use_short_names() -> None:
    text = _render([str(FIXTURES / "h100-batched-cublas")])
    full = "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)"
    assert text.count(full) == 1
    assert text.count("`simt_256x128_8x4`") == 10  # 9 table rows, 1 in the names table


def test_github_escaping() -> None:
    assert md_text("a::b<c|d>_e*") == r"a\:\:b\<c\|d\>\_e\*"
    assert md_code("k<x|y>") == r"`k<x\|y>`"
    assert md_code("k|y", in_table=False) == "`k|y`"
    assert shorten("x" * 50) == "x" * 39 + "…"


def test_run_directory_mixing_gpus_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "h100-smoke", run)
    lines = (run / "dispatch.csv").read_text().splitlines()
    lines[3] = lines[3].replace("h100,", "h200,", 1)
    (run / "dispatch.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(AuditError, match=r"dispatch.csv, row 3, column 'gpu_label': mixes GPUs"):
        load_inputs([run])


def test_write_run_report_writes_markdown_and_plot(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "h100-smoke", run)
    report = write_run_report(run)
    assert report == run / "report.md"
    plots = list((run / "plots").glob("*.png"))
    assert len(plots) == 1 and plots[0].stat().st_size > 10_000
    assert f"](plots/{plots[0].name})" in report.read_text()


def test_cli_report_json_and_errors() -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["report", str(FIXTURES / "published_article_b8.csv"), "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert [(f["rule"], f["gpu_label"]) for f in found] == [
        ("no-escalation", "5090"),
        ("legacy-kernel", "pro6000"),
    ]
    bad = runner.invoke(app, ["report", str(FIXTURES), "--threshold", "nope=1"])
    assert bad.exit_code == 2
    assert "unknown name 'nope'" in bad.output


def test_stall_breakdown_sets_a_flagged_case_beside_a_healthy_one() -> None:
    datasets = load_inputs([FIXTURES / "h100-batched-cublas"])
    assert "### Stall breakdown" not in render_report(datasets, Thresholds())
    # Judging the small calls too flags the 256 batch-4 call (18 % FMA): its warps wait on
    # memory (long scoreboard) where the best call of the run barely does.
    text = _squeeze(render_report(datasets, Thresholds(fill_min_elements=0)))
    assert "#### low-utilization: xmma\\_32x32x8 at 256, batch 4" in text
    assert "|pipe utilization %|18|82|" in text
    assert "|long\\_scoreboard|111.0|0.3|" in text


def test_two_runs_of_one_gpu_get_distinct_sections() -> None:
    text = _render([str(FIXTURES / "h100-smoke"), str(FIXTURES / "h100-batched-cublas")])
    # The path is Markdown text: escaped, so a checkout under e.g. /tmp/ci_clone still matches.
    assert f"## h100: NVIDIA H100 80GB HBM3 ({md_text(FIXTURES / 'h100-smoke')})" in text
    assert "## Side by side" in text
    assert "|1024|`simt_256x128_8x4`|79|`simt_256x128_8x4`|79|" in _squeeze(text)


def test_required_columns_only_and_parquet(tmp_path: Path) -> None:
    table = read_table(FIXTURES / "published_article_b8.csv")
    bare = tmp_path / "bare.parquet"
    write_table(table.drop(columns=["routine"]), bare)
    text = render_report(load_inputs([bare]), Thresholds())
    assert "#### cublas · fp32 · batch 8" in text
    assert "Not measured: the table has no reference timings." in text
    assert "`no-escalation` · cublas fp32, batch 8" in text
