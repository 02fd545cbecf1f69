"""One finding per cause (judge.grouping), on the H100's recorded runs.

reports/h100/checks/20261127-100356-2073: bf16 2073^3 (M, N and K no multiple of 8 bf16
elements) through cuBLAS and cuBLASLt dispatches the sm75 `tensorop_s1688gemm_128x128`; its
padded companion 2080^3 runs `nvjet_tst_192x192_64x3_1x2`. The rules find, per api,
`unaligned-operand` (padded 6.61x / 6.73x faster), `size-inversion` (the larger 2080 sooner),
`dispatch-cliff` (2048 -> 2073, throughput -87 %) and `low-utilization` (25 % tensor pipe): eight
findings of one cause, which the report now gives as one.
reports/h100/checks/20261125-092057-k140-layouts: bf16 1024x1024x140 batch 8 (K unaligned), its
padded 1024x1024x144 and its nt companion, both apis.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from rich.console import Console

from cublas_audit.judge.audited import Audited
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.fixes import shape_fixes
from cublas_audit.judge.grouping import by_cause, every_row, members, observed, problem_of, where
from cublas_audit.judge.rules import audit
from cublas_audit.report.render import findings_json, render_report
from cublas_audit.report.terminal import show
from tests.conftest import REPORTS, audited_run

CHECKS = REPORTS / "h100" / "checks"
ODD = CHECKS / "20261127-100356-2073"
K140 = CHECKS / "20261125-074637-k140"
K140_LAYOUTS = CHECKS / "20261125-092057-k140-layouts"
BATCHED = REPORTS / "h100" / "20261123-094558-batched"  # fp32: no unaligned-operand
AT_2073 = ("h100", "bf16", 1, "2073")


@pytest.fixture(scope="module")
def odd() -> Audited:
    return audited_run(ODD)


@pytest.fixture(scope="module")
def odd_ungrouped(odd: Audited) -> tuple[Finding, ...]:
    """The 2073 run's findings before grouping (judged once for the module: a test that
    changes them works on a list of its own)."""
    return tuple(ungrouped(odd))


@pytest.fixture(scope="module")
def layouts() -> Audited:
    return audited_run(K140_LAYOUTS)


def ungrouped(judged: Audited) -> list[Finding]:
    """The rules' findings of a judged run before grouping, as judge.audited runs them."""
    return audit(
        judged.dataset.frame,
        judged.thresholds,
        judged.candidates,
        prepared=judged.rows,
        machine=judged.machine,
    )


def said(found: list[Finding]) -> list[tuple[str, str, list[int], list[int], str]]:
    """What each finding observed: its rule, call, rows, compared rows and message's opening
    (judge.audited may append what the finding is worth after it)."""
    return sorted((f.rule, f.api, f.rows, f.compared, f.message[:60]) for f in found)


def test_2073_is_one_finding_with_the_other_rules_as_its_evidence(
    odd: Audited, odd_ungrouped: tuple[Finding, ...]
) -> None:
    """The eight findings of 2073^3 are one: unaligned-operand (the cause), high (the highest of
    the eight), naming both calls; the seven others kept whole inside it, none lost."""
    before = [f for f in odd_ungrouped if problem_of(f) == AT_2073]
    assert len(before) == 8
    assert {(f.rule, f.api) for f in before} == {
        (rule, api)
        for rule in ("unaligned-operand", "size-inversion", "dispatch-cliff", "low-utilization")
        for api in ("cublas", "cublasLt")
    }
    (finding,) = [f for f in odd.findings if problem_of(f) == AT_2073]
    assert odd.findings == [finding]
    assert finding.rule == "unaligned-operand" and finding.severity == "high"
    assert len(finding.observations) == 7
    assert said(members(finding)) == said(before)
    assert where(finding) == "cublasLt cublasLtMatmul, cublas cublasGemmEx bf16, batch 1"
    # the cause's own call is the one its fix gives most back (6.73x on cuBLASLt, 6.61x cuBLAS)
    assert finding.api == "cublasLt" and "runs 6.73x faster" in finding.message
    rows = odd.rows
    assert sorted(rows.loc[every_row(finding), "api"]) == ["cublas", "cublasLt"]
    assert set(rows.loc[every_row(finding), "shape"]) == {"2073"}


def test_the_workaround_names_the_problems_own_dimensions_and_values(
    odd: Audited, layouts: Audited
) -> None:
    """2073 rounds up to 2080 (8 bf16 elements), the padded companion the run measured; K = 140
    rounds up to 144. No fixed example ('round K up to 144') on a 2073 problem."""
    (finding,) = odd.findings
    padded = odd.rows.loc[finding.compared[0]]
    assert (padded["m"], padded["n"], padded["k"]) == (2080, 2080, 2080)
    assert finding.workaround == (
        "Pad to a multiple of 16 bytes with zeros: round K = 2073 up to 2080, M = 2073 up to "
        "2080 and N = 2073 up to 2080, then take the result's 2073x2073 slice. Zeros add "
        "nothing to the product, and the Hopper kernels become eligible."
    )
    for member in members(finding):
        assert "144" not in member.workaround
    (k140,) = layouts.findings
    assert k140.workaround == (
        "Pad to a multiple of 16 bytes with zeros: round K = 140 up to 144. Zeros add nothing "
        "to the product, and the Hopper kernels become eligible."
    )


def test_the_k140_layouts_are_one_finding_and_keep_every_fix(layouts: Audited) -> None:
    """1024x1024x140: unaligned-operand, layout-penalty (nt, every leading dimension aligned,
    faster) and size-inversion (144 sooner), each per api, are one finding; the problem's shape
    fixes (pad, layout: one each, the cuBLASLt call's measurement, judge.fixes) are still made
    from the observations it holds."""
    judged = layouts
    raw = ungrouped(judged)
    (finding,) = judged.findings
    assert finding.rule == "unaligned-operand" and finding.sizes == ["1024x1024x140"]
    assert sorted({f.rule for f in members(finding)}) == [
        "layout-penalty",
        "size-inversion",
        "unaligned-operand",
    ]
    assert said(members(finding)) == said(raw)
    source = str(judged.dataset.path)
    fixes = shape_fixes(judged.rows, judged.findings, {}, source)
    before = shape_fixes(judged.rows, raw, {}, source)
    assert sorted(f.id for f in fixes) == sorted(f.id for f in before)
    assert sorted(f.kind for f in fixes) == ["layout", "pad"]


def test_findings_of_other_problems_or_causes_stay_their_own(
    odd_ungrouped: tuple[Finding, ...],
) -> None:
    """The k140 run's two problems (packed, and with ldb 144) stay two findings, each with its
    own size-inversion. A finding over several sizes, or of another cause (a candidate the
    heuristic ranked lower), is no observation of the one problem's unaligned dimension; nor is
    any finding of another run's problems."""
    judged = audited_run(K140)
    assert [f.sizes for f in judged.findings] == [["1024x1024x140"], ["1024x1024x140 ldb144"]]
    for finding in judged.findings:
        assert [m.rule for m in members(finding)] == ["unaligned-operand", "size-inversion"]
        assert {tuple(m.sizes) for m in members(finding)} == {tuple(finding.sizes)}
    found = list(odd_ungrouped)
    low = next(i for i, f in enumerate(found) if f.rule == "low-utilization")
    cliff = next(i for i, f in enumerate(found) if f.rule == "dispatch-cliff")
    found[low] = replace(found[low], sizes=["2073", "4096"])
    found[cliff] = replace(found[cliff], rule="better-candidate")
    others = ungrouped(audited_run(BATCHED))
    assert others
    grouped = by_cause([*found, *others])
    assert len(grouped) == 1 + 2 + len(others)
    assert found[low] in grouped and found[cliff] in grouped
    assert all(f in grouped for f in others)


def test_json_keeps_every_observation_and_markdown_lists_them(odd: Audited) -> None:
    """JSON: the one finding with its seven observations, each its rule, call and message.
    Markdown: one finding line, the observations as sub-points (a message both calls share said
    once), the 2073 rows of both calls flagged with the cause alone."""
    (record,) = json.loads(json.dumps(findings_json([odd])))
    assert record["rule"] == "unaligned-operand"
    assert sorted((o["rule"], o["api"]) for o in record["observations"]) == sorted(
        (f.rule, f.api) for f in members(odd.findings[0])[1:]
    )
    assert all(o["message"] and o["rows"] for o in record["observations"])
    text = render_report([odd])
    assert "Findings: 1 high, 0 medium, 0 info." in text
    assert text.count("- **high** · `unaligned-operand`") == 1
    assert (
        "  - also `size-inversion` · cublasLt cublasLtMatmul: 2073 takes 6.73x the time of the "
        "larger 2080" in text
    )
    shared = [o for o in observed(odd.findings[0]) if o[0] == "dispatch-cliff"]
    assert [calls for _, calls, _ in shared] == ["cublasLt cublasLtMatmul, cublas cublasGemmEx"]
    assert text.count("| 2073 ") == 2
    assert all(
        line.rstrip(" |").endswith("| unaligned-operand")
        for line in text.splitlines()
        if line.startswith("| 2073 ")
    )


def test_the_terminal_shows_the_observations_under_the_finding(odd: Audited) -> None:
    out = io.StringIO()
    show([odd], Console(file=out, width=90, color_system=None))
    text = out.getvalue()
    assert "Findings: 1 high, 0 medium, 0 info" in text
    assert "+ also size-inversion · cublasLt cublasLtMatmul: 2073 takes 6.73x" in text
