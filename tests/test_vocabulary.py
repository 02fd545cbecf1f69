"""The vocabulary as enums (cublas_audit.vocabulary): the words on disk are the members' values,
an unknown word is refused, and a finding carries its verdict instead of a severity decoded back
by string."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.judge import noise, timed_rows
from cublas_audit.judge.finding import Finding, order
from cublas_audit.judge.fixes import shape_fixes
from cublas_audit.judge.grouping import members
from cublas_audit.judge.map_audit import recorded_findings
from cublas_audit.run.sweep_options import SweepOptions, resumed
from cublas_audit.table.json_records import record
from cublas_audit.vocabulary import FixKind, FloorKind, Gate, Phase, Severity, Verdict
from tests.conftest import REPORTS, audited_run

MAP_RUN = "reports/h100/maps/20261125-092546-bf16-random"


def test_members_are_the_recorded_words() -> None:
    assert [str(s) for s in Severity] == ["high", "medium", "info"]
    assert json.dumps([Severity.info, Verdict.unsure, Phase.map, Gate.kernel_change]) == (
        '["info", "unsure", "map", "kernel-change"]'
    )
    assert f"{FixKind.pad}" == "pad" and f"{FloorKind.kernel_tensor}" == "kernel_tensor"


def test_unknown_words_are_refused() -> None:
    for kind, word in ((Phase, "sweep"), (Gate, "anything"), (Severity, "low")):
        with pytest.raises(ValueError):
            kind(word)


def test_phase_of_a_run_without_one_is_a_sweep() -> None:
    assert Phase.of(None) is Phase.time and Phase.of("") is Phase.time
    assert Phase.of("map") is Phase.map and Phase.map.command == "map"
    assert Phase.time.command == "sweep" and Phase.candidates.command == "candidates"


def test_floor_kinds_are_named_not_concatenated() -> None:
    assert FloorKind.call.interleaved is FloorKind.call_ratio
    assert FloorKind.kernel.interleaved is FloorKind.kernel_ratio
    assert FloorKind.kernel_tensor.on_map is FloorKind.map_kernel_tensor
    assert FloorKind.map_kernel.base is FloorKind.kernel and FloorKind.call.base is FloorKind.call
    with pytest.raises(KeyError):  # a tensor kernel's ratio is no kind the model has
        FloorKind.kernel_tensor.interleaved  # noqa: B018


def test_recorded_findings_read_as_members() -> None:
    """findings.json of a recorded map: every severity a Severity, every verdict a Verdict (the
    file predates the field: its tier gives it), in the order severity ranks them."""
    found = recorded_findings(MAP_RUN) or []  # type: ignore[arg-type]
    assert found and all(type(f.severity) is Severity for f in found)
    assert {f.verdict for f in found} == {Verdict.slower}  # every one medium: beyond the noise
    assert sorted(found, key=order)[0].severity.rank == Severity.medium.rank


def test_a_recorded_finding_round_trips_byte_for_byte() -> None:
    """A finding of the recorded map written again: the same JSON values (the enums' text)."""
    with open(f"{MAP_RUN}/findings.json") as file:
        raw = json.load(file)[0]
    finding = record(Finding, {**raw, "verdict": "slower"}, "finding 1")
    written = finding.to_json()
    # the file predates `impact` and `observations` (both empty): every field it has, as it has it
    assert json.dumps({key: written[key] for key in raw}) == json.dumps(raw)
    assert json.dumps(written["verdict"]) == '"slower"'


def test_a_word_the_enum_lacks_is_one_clear_fault() -> None:
    with open(f"{MAP_RUN}/findings.json") as file:
        raw = json.load(file)[0]
    with pytest.raises(ValueError, match=r"finding 1\.severity: 'low' is not one of high"):
        record(Finding, {**raw, "severity": "low"}, "finding 1")


# ----- the words at work: phases, floor kinds, fix kinds --------------------------------------

K140_LAYOUTS = REPORTS / "h100/checks/20261125-092057-k140-layouts"
CANDIDATES_SHARD = REPORTS / "h100/checks/20261124-145242-candidates-devices/shards/gpu0"


@pytest.fixture(scope="module")
def k140_calls() -> tuple[pd.DataFrame, list[Finding]]:
    """The H100 k140 run's prepared rows and each call's finding (pad and layout, both APIs)."""
    audited = audited_run(K140_LAYOUTS)  # shared (tests/conftest.py)
    return audited.rows, [m for f in audited.findings for m in members(f)]


def test_an_info_finding_makes_no_shape_fix(k140_calls: tuple[pd.DataFrame, list[Finding]]) -> None:
    """A shape fix follows its rule's severity: info (within the noise) makes none. 12c8d54:
    `str(severity) is not Severity.info` held for every finding, an info one too."""
    rows, calls = k140_calls
    assert {f.kind for f in shape_fixes(rows, calls, {}, "run")} == {FixKind.pad, FixKind.layout}
    unsure = [replace(f, severity=Severity.info, impact={}) for f in calls]
    assert shape_fixes(rows, unsure, {}, "run") == []
    # a trace's small share makes a finding info, its rule's severity (impact's text) still high
    rule_said = [{"rule_severity": str(f.severity)} for f in calls]
    traced = [replace(u, impact=said) for u, said in zip(unsure, rule_said, strict=True)]
    assert len(shape_fixes(rows, traced, {}, "run")) == 2


def test_a_resumed_run_reads_its_phase_as_a_member(tmp_path: Path) -> None:
    """env.json's phase read back as a Phase (never compared as text), an unknown word refused
    in one line (before any GPU work)."""
    run = tmp_path / "run"
    shutil.copytree(CANDIDATES_SHARD, run)
    assert resumed(SweepOptions(resume=run)).phase is Phase.candidates
    env = json.loads((run / "env.json").read_text())
    (run / "env.json").write_text(json.dumps({**env, "phase": "sweep"}))
    with pytest.raises(
        AuditError, match=r"env\.json: phase 'sweep' is not one of time, map, candidates$"
    ):
        resumed(SweepOptions(resume=run))


def test_floor_kinds_come_from_the_vocabulary() -> None:
    """The noise model's kinds, the adapter's and the timing rules' are FloorKind members."""
    assert all(type(kind) is FloorKind for kind in (*noise.KINDS, *noise.FALLBACK.values()))
    assert timed_rows.floor_kind("kernel", "bf16") is FloorKind.kernel_tensor
    assert timed_rows.floor_kind("call", "fp32") is FloorKind.call
    kernels, interleaved = pd.Series([True, False, True]), pd.Series([True, True, False])
    assert list(timed_rows.floor_kinds(kernels, interleaved)) == [
        FloorKind.kernel_ratio,
        FloorKind.call_ratio,
        FloorKind.kernel,
    ]
    model = noise.load()
    assert all(type(kind) is FloorKind for kind in model.others)
    assert model.for_maps().floors_of("kernel_ratio") == model.floors_of(FloorKind.kernel_ratio)
