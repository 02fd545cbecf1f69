"""The map follow-up's verdicts are keyed by a finding's whole identity (mode, api, routine,
batch, rule, sizes), judged in judge.map_audit and only rendered by the reports.

The recorded BF16 map (3,000 random problems, follow-up of 12 findings) has one size-inversion
its follow-up did not confirm: cublas bf16 b1 at 704x2944x5376 against 704x3200x5568. A
`--modes fp32,bf16` map's follow-up measures both modes' cases; here its fp32 part is those two
problems as the map measured them (the recorded rows, numbers untouched, under the other mode's
label), where the inversion is found again. Keyed by (rule, sizes) alone, the bf16 finding read
"holds on the full-length measurement" because the fp32 one held.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cublas_audit.judge.map_audit import MapAudit, audit_map, finding_key, recorded_findings
from cublas_audit.report import map_plots, map_report
from cublas_audit.table import rundir
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.inputs import Dataset, load_run
from cublas_audit.vocabulary import FollowUp

RUN = Path("reports/h100/maps/20261125-092546-bf16-random")
UNCONFIRMED = ["cublas.bf16.704x2944x5376.b1.nn", "cublas.bf16.704x3200x5568.b1.nn"]


def _as_fp32(frame: pd.DataFrame) -> pd.DataFrame:
    ids = frame["case_id"].str.replace(".bf16.", ".fp32.", regex=False)
    return frame.assign(mode="fp32", case_id=ids)


@pytest.fixture(scope="module")
def judged() -> MapAudit:
    """The recorded map judged with a two-mode follow-up (its own, and the fp32 twin)."""
    mapped, deep = load_run(RUN), load_run(RUN / "follow-up")
    twin = _as_fp32(mapped.frame[mapped.frame["case_id"].isin(UNCONFIRMED)])
    both: Dataset = replace(deep, frame=pd.concat([deep.frame, twin], ignore_index=True))
    return audit_map(mapped, found=recorded_findings(RUN), follow_up=both)


def test_a_bf16_finding_does_not_hold_because_fp32_held(judged: MapAudit) -> None:
    assert judged.follow_up is not None
    said = {f.sizes[0]: verdict for f, verdict in judged.with_verdicts() if verdict is not None}
    assert said["704x2944x5376"] is FollowUp.not_confirmed
    # the follow-up did find it, in fp32: what the old key (rule, sizes) read as holding
    held = {
        key for key in judged.follow_up.holds if key[4:] == ("size-inversion", ("704x2944x5376",))
    }
    assert [key[0] for key in held] == ["fp32"]
    # the other 11 it measured hold
    assert sum(v is FollowUp.holds for v in judged.verdicts) == 11


def test_the_report_renders_the_judged_verdict(judged: MapAudit) -> None:
    text = map_report.render(judged, None)
    assert "### size-inversion: 704x2944x5376, not confirmed there" in text
    assert text.count(", holds on the full-length measurement") == 11


def test_the_key_is_the_whole_identity(judged: MapAudit) -> None:
    finding = judged.findings[0]
    key = finding_key(finding)
    for change in ({"mode": "fp32"}, {"api": "cublasLt"}, {"batch": 8}, {"routine": "x"}):
        assert finding_key(replace(finding, **change)) != key  # type: ignore[arg-type]


def test_a_large_maps_report_forks_once_every_finding_and_row_is_read(
    judged: MapAudit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large map's pictures (their rows and the findings' flagged rows made first), then its
    findings' JSON members, then its text start in forks, in that order: what this process
    reads of every finding after a fork shares its memory is copied page by page (a full map's
    flagged rows took ~1 s of CPU so); the same report and findings file as made in turn."""
    started: list[str] = []
    real = map_report.Forks

    def recorded(calls: list[Any], enabled: bool = True) -> Any:
        started.append(calls[0].func.__name__ if calls else "none")
        return real(calls, enabled=False)  # (here, in turn)

    monkeypatch.setattr(map_report, "COMPACT_FINDINGS", 1)
    monkeypatch.setattr(map_report, "Forks", recorded)
    monkeypatch.setattr(map_plots, "Forks", recorded)
    monkeypatch.setattr(map_plots, "_size_axis", lambda *args: map_plots.Picture("a", "a.png"))
    monkeypatch.setattr(map_plots, "_plane", lambda *args: map_plots.Picture("p", "p.png"))
    (tmp_path / "a").mkdir()
    report = map_report.write_map_report(tmp_path / "a", judged)
    assert started == ["<lambda>", "_members", "_text"]
    assert "![p](p.png)" in report.read_text()  # (a random map: its plane picture)
    assert rundir.read_findings(tmp_path / "a" / rundir.FINDINGS_COMPACT) == json_ready(
        [finding.to_json() for finding in judged.findings]
    )
