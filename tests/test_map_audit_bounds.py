"""judge/map_audit.py pinned on the recorded BF16 map's follow-up
(reports/h100/maps/20261125-092546-bf16-random/follow-up: 23 cases measured at full length, with
its candidate audit), judged as a map of its own and followed up by itself: findings largest
effect first, every one holding where all its cases were measured and none where one was not;
and the findings.json a map run wrote read back (a file before verdicts, a broken one)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cublas_audit import forked
from cublas_audit.errors import AuditError
from cublas_audit.forked import Forks
from cublas_audit.judge import map_audit
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.map_audit import (
    MapAudit,
    _with_verdict,
    audit_map,
    finding_key,
    follow_up_verdict,
    map_findings,
    recorded_findings,
)
from cublas_audit.judge.rules import maps
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.inputs import load_run
from cublas_audit.vocabulary import FollowUp, Verdict
from tests.conftest import REPORTS

DEEP = REPORTS / "h100" / "maps" / "20261125-092546-bf16-random" / "follow-up"


@pytest.fixture(scope="module")
def judged() -> MapAudit:
    deep = load_run(DEEP)
    return audit_map(deep, None, map_findings(deep.frame), follow_up=deep)


def test_findings_largest_effect_first(judged: MapAudit) -> None:
    effects = [f.effect for f in judged.findings]
    # the recorded follow-up's 11: a cliff at 7424x704x7616 (0.4587) first, 0.1902 last
    assert len(effects) == 11 and effects == sorted(effects, reverse=True)
    assert (effects[0], effects[-1]) == (0.4587, 0.1902)


def test_audit_map_s_defaults_and_follow_up(judged: MapAudit) -> None:
    assert judged.thresholds == Thresholds()
    deep = judged.follow_up
    assert deep is not None
    assert deep.candidates is not None and deep.candidates.threshold == 0.1  # 10 % / 100
    assert deep.rows.index.name == "case_id" and "case_id" in deep.rows.columns
    # its own findings hold on itself, each of them
    assert judged.verdicts == (FollowUp.holds,) * 11
    assert deep.holds == frozenset(finding_key(f) for f in judged.findings)
    assert judged.with_verdicts()[0] == (judged.findings[0], FollowUp.holds)


def test_a_finding_holds_only_where_all_its_cases_were_measured(judged: MapAudit) -> None:
    deep = judged.follow_up
    assert deep is not None
    first = judged.findings[0]  # rows [22], compared [21]
    assert follow_up_verdict(judged.rows, first, None) is None
    assert follow_up_verdict(judged.rows, first, deep) is FollowUp.holds
    compared = str(judged.rows.at[first.compared[0], "case_id"])
    judged_case = str(judged.rows.at[first.rows[0], "case_id"])
    for missing in (compared, judged_case):
        less = replace(deep, rows=deep.rows.drop(index=missing))
        assert follow_up_verdict(judged.rows, first, less) is None
    # measured but not found there: not confirmed
    other = replace(deep, holds=frozenset())
    assert follow_up_verdict(judged.rows, first, other) is FollowUp.not_confirmed


def test_with_verdicts_needs_one_a_finding(judged: MapAudit) -> None:
    short = replace(judged, verdicts=judged.verdicts[:-1])
    with pytest.raises(ValueError):
        short.with_verdicts()


def test_a_follow_up_without_candidates(judged: MapAudit) -> None:
    deep = judged.follow_up
    assert deep is not None
    bare = replace(deep.dataset, candidates=deep.dataset.candidates.iloc[0:0])  # type: ignore[union-attr]
    found = audit_map(bare, Thresholds(candidate_gap_pct=20), judged.findings[:1], follow_up=bare)
    assert found.follow_up is not None and found.follow_up.candidates is None
    assert found.thresholds.candidate_gap_pct == 20
    alone = audit_map(bare, None, judged.findings[:1])
    assert alone.follow_up is None and alone.verdicts == (None,)


def test_recorded_findings(tmp_path: Path, judged: MapAudit) -> None:
    assert recorded_findings(tmp_path) is None  # a map written before findings.json
    records = [f.to_json() for f in judged.findings[:2]]
    (tmp_path / "findings.json").write_text(json.dumps(records))
    found = recorded_findings(tmp_path)
    assert found is not None and [f.effect for f in found] == [0.4587, 0.4049]
    assert all(isinstance(f, Finding) for f in found)
    (tmp_path / "findings.json").write_text(json.dumps({"rule": "size-inversion"}))
    with pytest.raises(
        AuditError, match="not the map's findings \\(expected a list of findings\\)"
    ):
        recorded_findings(tmp_path)


@pytest.mark.parametrize(
    ("item", "verdict"),
    [
        ({"rule": "size-inversion", "severity": "info"}, Verdict.unsure),
        ({"rule": "dispatch-cliff", "severity": "medium"}, Verdict.slower),
        ({"rule": "dispatch-cliff", "severity": "medium", "verdict": None}, None),  # kept
        ({"rule": "low-utilization", "severity": "info"}, "absent"),  # no map rule: as it was
    ],
)
def test_a_finding_before_verdicts_takes_its_tier_s(
    item: dict[str, object], verdict: object
) -> None:
    given = _with_verdict(item)
    assert given.get("verdict", "absent") == verdict
    assert {k: v for k, v in given.items() if k != "verdict"} == {
        k: v for k, v in item.items() if k != "verdict"
    }
    assert _with_verdict(["not", "a", "dict"]) == ["not", "a", "dict"]


def test_a_large_map_is_judged_at_once_in_forks_with_the_same_findings(
    judged: MapAudit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dispatch-cliff in a forked child while this process judges size-inversion, its pairs in
    three forked parts: the follow-up's findings of both rules and both tiers, as one process
    judged them, in its order."""
    kinds = {(f.rule, f.severity) for f in judged.findings}
    assert {("size-inversion", "medium"), ("size-inversion", "info")} <= kinds
    assert {f.rule for f in judged.findings} == {"size-inversion", "dispatch-cliff"}
    monkeypatch.setattr(map_audit, "FORK_ROWS", 1)
    started = forks_counted(monkeypatch, map_audit, maps)
    assert map_findings(judged.dataset.frame) == judged.findings
    assert started == [1, 3]  # the other rule's child, then size-inversion's parts


def test_dispatch_cliffs_are_judged_in_forked_parts_with_the_same_findings(
    judged: MapAudit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dispatch-cliff's cliffs in three forked parts, as size-inversion's pairs (a full grid's
    ~30,000 cliffs were one process's, longer than size-inversion's parts): the same findings,
    in one process's order."""
    assert sum(f.rule == "dispatch-cliff" for f in judged.findings) == 2  # (a part of none too)
    monkeypatch.setattr(map_audit, "FORK_ROWS", 10**9)  # (both rules here: their parts counted)
    started = forks_counted(monkeypatch, maps)
    assert map_findings(judged.dataset.frame) == judged.findings
    assert started == [3, 3]  # size-inversion's parts, then dispatch-cliff's


def test_a_map_judged_from_its_table_is_prepared_once(
    judged: MapAudit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """audit_map without the run's findings (a merge's, a Ray run's report) judges them over the
    table it prepares for its rows (a full map's: ~0.5 s of CPU each time)."""
    calls: list[int] = []
    real = map_audit.prepare
    monkeypatch.setattr(map_audit, "prepare", lambda frame: calls.append(len(frame)) or real(frame))
    again = audit_map(judged.dataset)
    assert calls == [len(judged.dataset.frame)] and again.findings == judged.findings


def forks_counted(monkeypatch: pytest.MonkeyPatch, *modules: Any) -> list[int]:
    """The rules' forked parts in three (any series large enough), forking allowed, and each
    Forks the `modules` start counted: the list of their sizes (0: run here, not forked)."""
    monkeypatch.setattr(maps, "FORK_PAIRS", 1)
    monkeypatch.setattr(maps, "FORK_PARTS", 3)
    monkeypatch.setattr(forked, "can_fork", lambda: True)
    started: list[int] = []

    def counted(calls: list[Any], enabled: bool = True) -> Forks[Any]:
        started.append(len(calls) if enabled else 0)
        return Forks(calls, enabled)

    for module in modules:
        monkeypatch.setattr(module, "Forks", counted)
    return started
