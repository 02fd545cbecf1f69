"""forked.Forks: calls run in forked children give back their results in order and raise their
errors here; and a map report's findings.json.gz made in forks is write_findings' bytes."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from cublas_audit.errors import ToolMissingError
from cublas_audit.forked import ForkedCallError, Forks, can_fork
from cublas_audit.judge.map_audit import recorded_findings
from cublas_audit.report import map_report
from cublas_audit.table import rundir
from cublas_audit.table.dispatch import json_ready
from tests.conftest import REPORTS

forks_only = pytest.mark.skipif(not can_fork(), reason="no fork here, or one CPU")


@forks_only
def test_results_in_order_each_from_a_child() -> None:
    here = os.getpid()
    found = Forks([lambda: (1, os.getpid()), lambda: (2, os.getpid())]).results()
    assert [n for n, _ in found] == [1, 2]
    assert here not in {pid for _, pid in found}
    assert len({pid for _, pid in found}) == 2


@forks_only
def test_a_forked_call_forks_calls_of_its_own() -> None:
    """(a map rule judged in a child, its parts in children of that child)"""

    def inner() -> list[int]:
        return Forks([lambda: 1, lambda: 2]).results()

    assert Forks([inner]).results() == [[1, 2]]


def test_not_enabled_runs_here_when_asked() -> None:
    ran: list[int] = []
    held = Forks([lambda: ran.append(os.getpid()) or "a"], enabled=False)
    assert ran == []  # nothing before the results are asked for
    assert held.results() == ["a"]
    assert ran == [os.getpid()]


@forks_only
def test_a_childs_error_raised_here_with_its_class() -> None:
    def fails() -> None:
        raise ToolMissingError("no such GPU")

    with pytest.raises(ToolMissingError, match="no such GPU") as raised:
        Forks([lambda: 1, fails]).results()
    assert raised.value.exit_code == 3


@forks_only
def test_an_error_that_does_not_pickle_comes_back_as_text() -> None:
    class Local(Exception):  # (a local class: pickle cannot name it)
        pass

    def fails() -> None:
        raise Local("inside")

    with pytest.raises(ForkedCallError, match="Local: inside"):
        Forks([fails]).results()


@forks_only
def test_a_child_that_dies_is_an_error_not_a_hang() -> None:
    with pytest.raises(ForkedCallError, match="exit code 7"):
        Forks([lambda: os._exit(7)]).results()


@forks_only
def test_findings_members_made_in_forks_are_write_findings_bytes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Recorded findings as gzip members of 4 findings each (the last shorter), made in forks
    (each a run of members) and only joined here: the bytes write_findings writes of them all,
    whatever the number of forks."""
    found = recorded_findings(REPORTS / "h100" / "maps" / "20261125-092546-bf16-random")
    assert found is not None and len(found) % 4
    monkeypatch.setattr(rundir, "FINDINGS_MEMBER", 4)
    monkeypatch.setattr(map_report, "FINDINGS_MEMBER", 4)
    monkeypatch.setattr(rundir, "COMPACT_FINDINGS", 1)
    records = json_ready([finding.to_json() for finding in found])
    whole = rundir.write_findings(tmp_path, records).read_bytes()
    assert rundir.read_findings(tmp_path / rundir.FINDINGS_COMPACT) == records
    for cpus in (3, 8, 64):
        monkeypatch.setattr(map_report.os, "cpu_count", lambda cpus=cpus: cpus)
        made = map_report._findings_members(found)
        runs = made.results()
        members = [member for run in runs for member in run]
        assert len(members) == -(-len(found) // 4)
        forks = min(cpus - 2, map_report.FINDINGS_FORKS)  # at most, each no more than it must
        assert len(runs) <= forks and max(map(len, runs)) == -(-len(members) // forks)
        assert b"".join(members) == whole


def test_compact_findings_members_written_as_write_findings_writes_them(tmp_path: Path) -> None:
    records = [{"rule": "size-inversion", "effect": 0.5}] * rundir.COMPACT_FINDINGS
    step = rundir.FINDINGS_MEMBER
    members = [
        rundir.findings_member(records[start : start + step], start, len(records))
        for start in range(0, len(records), step)
    ]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / rundir.FINDINGS_FILE).write_text("[]")  # an earlier report's
    written = rundir.write_compact_findings(tmp_path / "a", members)
    assert written.name == rundir.FINDINGS_COMPACT
    text = json.dumps(records, separators=(",", ":")) + "\n"
    assert gzip.decompress(written.read_bytes()).decode() == text
    assert not (tmp_path / "a" / rundir.FINDINGS_FILE).exists()
    (tmp_path / "b").mkdir()
    assert rundir.write_findings(tmp_path / "b", records).read_bytes() == written.read_bytes()
