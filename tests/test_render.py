"""The Markdown report on real data: golden files, escaping, inputs, the CLI.

The golden files (tests/golden/*.md) are rewritten, with every other file a test compares output
against, by one command; review the diff before committing it:

    .venv/bin/python tests/regenerate_golden.py markdown

Each golden test also checks facts that do not come from the code: the article's published
numbers (tests/fixtures/PUBLISHED.md) and TFLOP/s worked out by hand from the recorded times.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.jobs.run_reports import write_run_report
from cublas_audit.judge.audited import audit_all
from cublas_audit.judge.stall_pairs import StallPairs
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.report.markdown import md_code, md_text, shorten, template
from cublas_audit.report.render import render_report
from cublas_audit.table.dispatch import write_table
from cublas_audit.table.inputs import load_inputs
from cublas_audit.table.validation import read_table
from tests.conftest import ARTICLE_B8, FIXTURES, REPO, audited_run, cell, table_under
from tests.regenerate_golden import GOLDEN, GOLDEN_INPUTS, fixture_report

# Per golden file, (headings down to a dispatch table, size, TFLOP/s) worked out by hand:
# 2 * m * n * k * batch flop over the recorded time.
HAND_TFLOPS = {
    # 2 * 1024^3 = 2,147,483,648 flop in 0.044 ms (the article's cuBLAS time) = 48.8 TFLOP/s
    # 2 * 16384^3 = 8,796,093,022,208 flop in 131.991 ms = 66.6 TFLOP/s
    "published_article_single_5090.md": [
        (("## 5090", "#### cublas · cublasSgemm · fp32 · batch 1"), "1024", "48.8"),
        (("## 5090", "#### cublas · cublasSgemm · fp32 · batch 1"), "16384", "66.6"),
    ],
    # 2 * 1024^3 * 8 = 17,179,869,184 flop in 0.354496 ms (timing.jsonl) = 48.5 TFLOP/s
    "h100-smoke.md": [
        (("#### cublas · cublasSgemmStridedBatched · fp32 · batch 8",), "1024", "48.5"),
    ],
    # 2 * 8192^3 * 16 = 17,592,186,044,416 flop in 338.236 ms = 52.0 TFLOP/s
    "h100-batched-cublas.md": [
        (("#### cublas · cublasSgemmStridedBatched · fp32 · batch 16",), "8192", "52.0"),
    ],
    "published_article_b8.md": [],  # the article gives no times: its table is checked instead
}
# The article's "Single matmul on RTX 5090" Eff column (cuBLAS ms / kernel ms), size -> %.
ARTICLE_SINGLE_5090_EFF = {
    "1024": "96%",
    "2048": "106%",
    "4096": "100%",
    "8192": "94%",
    "16384": "89%",
}


def _render(paths: list[str]) -> str:
    return render_report(audit_all(load_inputs([Path(p) for p in paths]), Thresholds()))


@functools.cache
def _golden_text(name: str) -> str:
    """The report of a golden file's fixture, rendered once per process: the golden test
    compares it whole, the tests below read their facts from it (a render is ~0.5 s of CPU)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # inputs are named as a user in the repository would type them
        return fixture_report(name)


def _squeeze(markdown: str) -> str:
    """Table rows without tabulate's alignment padding."""
    return re.sub(r" *\| *", "|", markdown)


@pytest.mark.parametrize("name", sorted(GOLDEN_INPUTS))
def test_golden(name: str) -> None:
    text = _golden_text(name)
    # Facts first, so that they hold even while the golden file is out of date.
    for headings, size, tflops in HAND_TFLOPS[name]:
        assert cell(table_under(text, *headings), size, "TFLOP/s") == tflops, (headings, size)
    if name == "published_article_b8.md":
        side = table_under(text, "## Side by side")
        gpus = [(f"{gpu} kernel", "FMA %") for gpu in ("5090", "pro6000", "h200")]
        assert side[0] == ["size", *(column for pair in gpus for column in pair)]
        published = [
            [str(size), *(f"`{v}`" if isinstance(v, str) else str(v) for v in row)]
            for size, row in ARTICLE_B8.items()
        ]
        assert side[1:] == published
    if name == "published_article_single_5090.md":
        efficiency = table_under(text, "### Efficiency (reference vs cuBLAS)")
        for size, eff in ARTICLE_SINGLE_5090_EFF.items():
            assert [row[5] for row in efficiency[1:] if row[1] == size] == [eff], size
    assert text == (GOLDEN / name).read_text()


def test_side_by_side_reproduces_the_article_table() -> None:
    text = _squeeze(_golden_text("published_article_b8.md"))
    assert "|size|5090 kernel|FMA %|pro6000 kernel|FMA %|h200 kernel|FMA %|" in text
    assert "|4096|`simt_128x32_8x5`|42|`simt_256x128_8x4`|73|`xmma_128x128x8`|82|" in text
    assert "|256|`simt_128x32_8x5`|33|`magma_Ex`|32|`xmma_32x32x8`|33|" in text


def test_efficiency_matches_the_article_eff_column() -> None:
    text = _squeeze(_golden_text("published_article_single_5090.md"))
    effs = re.findall(r"\|(\d+)\|—\|[\d.]+\|[\d.]+\|(\d+)%\|", text)
    assert effs == [
        ("1024", "96"),
        ("2048", "106"),
        ("4096", "100"),
        ("8192", "94"),
        ("16384", "89"),
    ]


def test_high_finding_gets_a_standalone_script() -> None:
    text = _golden_text("published_article_b8.md")
    assert "cublas.sgemmStridedBatched(h, 0, 0, m, n, k" in text
    assert "m, n, k, batch = 8192, 8192, 8192, 8" in text
    assert "ncu --metrics sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active" in text
    assert "cublas-audit sweep --batched --sizes 8192 --modes fp32 --api cublas --batches 8" in text


def test_full_kernel_names_appear_once_and_tables_use_short_names() -> None:
    text = _golden_text("h100-batched-cublas.md")
    full = "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)"
    assert text.count(full) == 1
    assert text.count("`simt_256x128_8x4`") == 10  # 9 table rows, 1 in the names table


def test_github_escaping() -> None:
    assert md_text("a::b<c|d>_e*") == r"a\:\:b\<c\|d\>\_e\*"
    assert md_code("k<x|y>") == r"`k<x\|y>`"
    assert md_code("k|y", in_table=False) == "`k|y`"
    assert shorten("x" * 50) == "x" * 39 + "…"


def test_a_template_is_compiled_once_per_process() -> None:
    """A fix renders the C template once per pin (23 of the random maps): compiled once."""
    assert template("lt_pin.c.j2") is template("lt_pin.c.j2")


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
    assert "### Stall breakdown" not in _golden_text("h100-batched-cublas.md")
    datasets = load_inputs([FIXTURES / "h100-batched-cublas"])
    # Judging the small calls too flags the 256 batch-4 call (18 % FMA): its warps wait on
    # memory (long scoreboard) where the best call of the run barely does.
    text = _squeeze(render_report(audit_all(datasets, Thresholds(fill_min_elements=0))))
    assert "#### low-utilization: xmma\\_32x32x8 at 256, batch 4" in text
    assert "|pipe utilization %|18|82|" in text
    assert "|long\\_scoreboard|111.0|0.3|" in text


def test_the_judge_chooses_the_stall_pairs_the_report_renders() -> None:
    """The healthy comparison case is the judge's choice (judge.stall_pairs, on the Audited):
    on the H100 k140 run, each padded-away call beside the best-utilized unflagged bf16 call;
    the report renders what it is handed and picks nothing of its own."""
    judged = audited_run(REPO / "reports/h100/checks/20261125-074637-k140")
    rows, chosen = judged.rows, judged.stalls
    assert [p.finding.rule for p in chosen.pairs] == ["unaligned-operand"] * 2 and not chosen.more
    flagged = rows.loc[[p.flagged for p in chosen.pairs], "shape"].tolist()
    assert flagged == ["1024x1024x140", "1024x1024x140 ldb144"]
    (healthy,) = {p.healthy for p in chosen.pairs}
    assert rows.loc[healthy, "shape"] == "1024x1024x144" and round(rows.loc[healthy, "util"]) == 38
    assert "### Stall breakdown" in render_report([judged])
    assert "### Stall breakdown" not in render_report([replace(judged, stalls=StallPairs())])


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
    text = render_report(audit_all(load_inputs([bare]), Thresholds()))
    assert "#### cublas · fp32 · batch 8" in text
    assert "Not measured: the table has no reference timings." in text
    assert "`no-escalation` · cublas fp32, batch 8" in text
