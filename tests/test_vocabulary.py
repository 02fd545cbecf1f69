"""The vocabulary as enums (cublas_audit.vocabulary): the words on disk are the members' values,
an unknown word is refused, and a finding carries its verdict instead of a severity decoded back
by string."""

from __future__ import annotations

import json

import pytest

from cublas_audit.judge.finding import Finding, order
from cublas_audit.judge.map_audit import recorded_findings
from cublas_audit.table.json_records import record
from cublas_audit.vocabulary import FixKind, FloorKind, Gate, Phase, Severity, Verdict

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
