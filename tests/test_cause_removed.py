"""`unaligned-operand` states each cause-removed variant measured beside the flagged call: padded
(M, N, K rounded up, in the call's own layout) and with every leading dimension aligned (the
other layout the sweep plans, or padded leading dimensions), on the H100's recorded k140 runs.

reports/h100/checks/20261125-074637-k140 (bf16 1024x1024x140 batch 8, cuBLAS, kernel times from
CUPTI in its dispatch.csv): nn 0.0209915 ms (sm80 tensorop), nn ldb144 0.020768 ms (the same
kernel), 1024x1024x144 nn 0.009728 ms (nvjet): 0.0209915 / 0.009728 = 2.158, 0.0209915 /
0.020768 = 1.011.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cublas_audit.judge.audited import audit_dataset
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.grouping import members
from cublas_audit.judge.timed_rows import judged_time, pair_verdict
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.table.inputs import load_run
from tests.conftest import REPORTS, audited_run

K140 = REPORTS / "h100" / "checks" / "20261125-074637-k140"
# The sweep of docs/report.md's command, recorded on the H100: nn, the padded companion and the
# nt companion, for cuBLAS and cuBLASLt.
K140_LAYOUTS = REPORTS / "h100" / "checks" / "20261125-092057-k140-layouts"

LDB144 = "with ldb 144 (every leading dimension 16-byte aligned, K still 140)"
IN_NT = "in layout nt (every leading dimension 16-byte aligned, K still 140)"


def causes(found: list[Finding]) -> list[Finding]:
    """Every call's unaligned-operand finding, the ones kept inside a grouped finding too (one
    finding per cause and problem: judge.grouping)."""
    return [m for f in found for m in members(f) if m.rule == "unaligned-operand"]


def test_the_k140_finding_states_the_padded_gain_and_that_ldb_144_gives_none() -> None:
    """The packed nn call: padded to 144 it runs 2.16x faster (beyond the noise model: high); its
    ldb 140 aligned to 144, K still 140, runs 1.01x: no gain measurably. The padded variant
    decides severity and the time given back, and its workaround is padding."""
    first = causes(audited_run(K140).findings)[0]
    assert first.sizes == ["1024x1024x140"]
    assert "padded to 1024x1024x144 it runs 2.16x faster on nvjet_tst" in first.message
    assert f"; {LDB144} it is no faster measurably (1.01x)." in first.message
    assert first.severity == "high"
    assert first.effect == pytest.approx(1 - 0.009728 / 0.0209915, abs=1e-4)
    assert first.workaround.startswith(
        "Pad to a multiple of 16 bytes with zeros: round K = 140 up to 144."
    )


def test_an_aligned_variant_with_no_padded_problem_of_its_own_is_stated_not_flagged() -> None:
    """The k140 run without its padded row: the nn call's one measured variant is ldb 144, no
    faster (info, its sm80 kernel named); the ldb 144 row, the same problem with every leading
    dimension aligned, is that statement and no finding of its own (it has no padded problem
    measured: an 'unmeasured' info on it would repeat the nn row's)."""
    run = load_run(K140)
    frame = run.frame[run.frame["k"] != 144]
    found = causes(audit_dataset(replace(run, frame=frame)).findings)
    assert [f.sizes for f in found] == [["1024x1024x140"]]
    (only,) = found
    assert only.severity == "info" and only.effect == 0.0
    assert "(an sm80 kernel)" in only.message
    assert only.message.endswith(f"; {LDB144} it is no faster measurably (1.01x).")


def test_the_layouts_are_planned_as_the_sweep_plans_them() -> None:
    """The sweep of docs/report.md's command: for each api the nn call, padded 144 nn and nt."""
    from cublas_audit.planning.cases import Case, with_cause_removed_companions

    planned = with_cause_removed_companions(
        [Case(api, "bf16", 1024, 1024, 140, 8) for api in ("cublas", "cublasLt")]
    )
    assert [c.case_id for c in planned] == [
        "cublas.bf16.1024x1024x140.b8.nn",
        "cublasLt.bf16.1024x1024x140.b8.nn",
        "cublas.bf16.1024x1024x144.b8.nn",
        "cublas.bf16.1024x1024x140.b8.nt",
        "cublasLt.bf16.1024x1024x144.b8.nn",
        "cublasLt.bf16.1024x1024x140.b8.nt",
    ]


@pytest.mark.skipif(
    not K140_LAYOUTS.is_dir(),
    reason=f"{K140_LAYOUTS.relative_to(REPORTS.parent)} not recorded yet: the GPU sweep of "
    "bf16 1024x1024x140 batch 8 nn beside its padded and nt companions (docs/report.md)",
)
@pytest.mark.parametrize("api", ["cublas", "cublasLt"])
def test_the_k140_finding_states_what_layout_nt_measured(api: str) -> None:
    """Per api: one unaligned-operand finding, on the nn call (the nt companion, K still 140,
    has no padded nt problem of its own: no second finding claiming the padded gain); it states
    the padded variant and nt with the ratio and verdict the recorded times give; severity and
    effect from the best variant faster beyond the noise model. layout-penalty, where it fires on
    this problem, says the same of nt as the finding does."""
    judged = audited_run(K140_LAYOUTS)  # once per process: each api's test reads it
    rows = judged.rows.set_index("case_id", drop=False)
    nn, nt = (
        rows.loc[f"{api}.bf16.1024x1024x140.b8.nn"],
        rows.loc[f"{api}.bf16.1024x1024x140.b8.nt"],
    )
    padded = rows.loc[f"{api}.bf16.1024x1024x144.b8.nn"]
    found = [f for f in causes(judged.findings) if f.api == api]
    assert [f.sizes for f in found] == [["1024x1024x140"]]
    (finding,) = found
    assert "padded to 1024x1024x144 it " in finding.message
    ratios, faster = {}, {}
    for name, variant in (("padded", padded), ("nt", nt)):
        on = judged_time(rows.loc[[variant["case_id"], nn["case_id"]]])
        took = "kernel_time_ms" if on == "kernel" else "time_ms"
        ratios[name] = float(nn[took]) / float(variant[took])
        faster[name] = pair_verdict(variant, nn, on, 0.0) is Verdict.slower
    stated = "runs {:.2f}x faster on" if faster["nt"] else "is no faster measurably ({:.2f}x)"
    assert f"{IN_NT} it {stated.format(ratios['nt'])}" in finding.message
    best = max((r for name, r in ratios.items() if faster[name]), default=None)
    if best is None:
        assert finding.severity == "info"
    else:
        assert finding.severity == ("high" if best >= judged.thresholds.high_ratio else "medium")
        assert finding.effect == pytest.approx(1 - 1 / best, abs=1e-4)
    penalties = [
        f
        for f in (m for grouped in judged.findings for m in members(grouped))
        if f.rule == "layout-penalty" and f.api == api and f.sizes[0].startswith("1024x1024x140")
    ]
    for penalty in penalties:  # nn slower than nt: nt is faster; nt slower: nt is no faster
        assert faster["nt"] == (penalty.sizes == ["1024x1024x140"])
