"""table/env_record.py pinned (issue 39 item 6): the H100 smoke run's env.json as its record, what
a missing key means (one part, not mixed, warm unknown), each wrong type named (a bool is no
count), the operands' words for each phase and `warm`, and the measuring seconds."""

from __future__ import annotations

import json

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table.env_record import EnvRecord, as_record
from tests.conftest import FIXTURES

SMOKE = FIXTURES / "h100-smoke"
RECORDED = json.loads((SMOKE / "env.json").read_text())


def test_the_recorded_env_json() -> None:
    record = EnvRecord.read(SMOKE)
    assert record.recorded and record.raw == RECORDED
    assert (record.gpu_label, record.sm_count, record.cc) == ("h100", 132, "9.0")
    assert record.command == tuple(str(word) for word in RECORDED["command"])
    assert record.probe_env == {} and str(record.phase) == "time"
    assert as_record(record) is record and as_record(RECORDED) == record


def test_what_a_missing_key_means() -> None:
    empty = EnvRecord.of({})
    assert not empty.recorded and empty == EnvRecord()
    assert (empty.parts, empty.allow_mixed, empty.replicate, empty.warm) == (1, False, False, None)
    assert (empty.command, empty.devices, empty.cublas_lib) == (None, None, None)
    assert empty.phase_seconds == {} and empty.earlier == {} and empty.time_seconds is None


def test_recorded_values() -> None:
    record = EnvRecord.of({
        "parts": 3, "allow_mixed": True, "replicate": True, "warm": False, "devices": [0, 1],
        "probe_env": {"A": 1}, "phase_seconds": {"time": 12.5}, "earlier": {"parts": 2},
        "command": ["cublas-audit", 3], "cublas_lib": "/opt/lib", "candidate_threshold": 1,
    })  # fmt: skip
    assert (record.parts, record.allow_mixed, record.replicate, record.warm) == (
        3,
        True,
        True,
        False,
    )
    assert record.devices == (0, 1) and record.probe_env == {"A": "1"}
    assert record.command == ("cublas-audit", "3") and record.cublas_lib == "/opt/lib"
    assert record.time_seconds == 12.5 and record.earlier == {"parts": 2}
    assert EnvRecord.of({"phase_seconds": {"time": 0}}).time_seconds is None
    assert EnvRecord.of({"parts": None, "warm": True}).parts == 1


def test_operands_by_phase_and_warm() -> None:
    assert EnvRecord.of({"phase": "map", "warm": False}).operands == "warm (a map's fast pass)"
    assert EnvRecord.of({}).operands == "warm (recorded before cold timing)"
    assert EnvRecord.of({"warm": True}).operands == "warm"
    assert EnvRecord.of({"warm": False}).operands == "cold"


def test_wrong_types_are_one_line() -> None:
    for data, words in (
        ({"sm_count": True}, "sm_count must be an integer, got True"),
        ({"sm_count": 1.5}, "sm_count must be an integer, got 1.5"),
        ({"sm_clock_max_mhz": "x"}, "sm_clock_max_mhz must be an integer or a number, got 'x'"),
        ({"allow_mixed": 1}, "allow_mixed must be true or false, got 1"),
        ({"command": "run"}, "command must be a list, got 'run'"),
        ({"roofline": []}, "roofline must be a dict, got []"),
        ({"gpu_name": 5}, "gpu_name must be text, got 5"),
    ):
        with pytest.raises(AuditError) as caught:
            EnvRecord.of(data, "run/env.json")
        assert str(caught.value) == f"run/env.json: {words}"
    assert EnvRecord.of({"allow_mixed": False, "sm_count": None}).sm_count is None
    with pytest.raises(AuditError, match=r"^env\.json: phase 'x' is not one of "):
        EnvRecord.of({"phase": "x"})
