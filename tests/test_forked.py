"""forked.Forks: calls run in forked children give back their results in order and raise their
errors here; and a map report's findings JSON made in parts is json.dumps of the whole list."""

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
def test_findings_json_in_parts_is_the_whole_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded findings cut into 4 parts (the last shorter) in 4 forks: joined, the bytes
    write_findings writes of them all."""
    found = recorded_findings(REPORTS / "h100" / "maps" / "20261125-092546-bf16-random")
    assert found is not None and len(found) % 4
    monkeypatch.setattr(map_report.os, "cpu_count", lambda: 8)
    texts = map_report._findings_parts(found).results()
    assert len(texts) == 4
    joined = "[" + ",".join(map_report._joined([*texts, "[]"])) + "]"
    whole = json_ready([finding.to_json() for finding in found])
    assert joined == json.dumps(whole, separators=(",", ":"))


def test_compact_findings_text_written_as_write_findings_writes_it(tmp_path: Path) -> None:
    records = [{"rule": "size-inversion", "effect": 0.5}] * rundir.COMPACT_FINDINGS
    text = json.dumps(records, separators=(",", ":")) + "\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / rundir.FINDINGS_FILE).write_text("[]")  # an earlier report's
    written = rundir.write_compact_findings(tmp_path / "a", text)
    assert written.name == rundir.FINDINGS_COMPACT
    assert gzip.decompress(written.read_bytes()).decode() == text
    assert not (tmp_path / "a" / rundir.FINDINGS_FILE).exists()
    (tmp_path / "b").mkdir()
    assert rundir.write_findings(tmp_path / "b", records).read_bytes() == written.read_bytes()
