"""env.json as a typed record (table.env_record.EnvRecord): every committed env.json reads, and a
key it lacks (an older run) reads as the tool read it before the key existed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.inputs import Dataset
from cublas_audit.vocabulary import Phase
from tests.conftest import REPO

RECORDED = sorted(
    [*(REPO / "reports").rglob("env.json"), *(REPO / "tests/fixtures").rglob("env.json")]
)


def test_every_committed_env_json_reads_as_the_dicts_did() -> None:
    """The record's fields are what `env.get(...)` gave the readers it replaced, for all 80-odd
    committed records (some before `phase`, `warm`, `observer`, `parts`, `roofline` existed)."""
    assert len(RECORDED) > 80
    phases = set()
    for path in RECORDED:
        data = json.loads(path.read_text())
        env = EnvRecord.read(path.parent)
        assert env.raw == data and env.recorded
        assert env.phase is Phase(data.get("phase") or "time")
        phases.add(env.phase)
        for key in ("gpu_name", "cc", "sm_count", "gpu_uuid", "observer", "roofline"):
            assert getattr(env, key) == data.get(key), (path, key)
        assert env.command == tuple(data["command"])
        assert env.parts == int(data.get("parts") or 1)
        assert env.allow_mixed is bool(data.get("allow_mixed"))
        assert env.time_seconds == ((data.get("phase_seconds") or {}).get("time") or None)
        warm = "warm (a map's fast pass)" if data.get("phase") == "map" else None
        if "warm" not in data:  # how every timing left L2 before cold timing
            warm = warm or "warm (recorded before cold timing)"
        assert env.operands == (warm or ("warm" if data["warm"] else "cold")), path
    assert phases == set(Phase)


def test_no_env_json_is_the_empty_record(tmp_path: Path) -> None:
    env = EnvRecord.read(tmp_path)
    assert not env.recorded and env.phase is Phase.time and env.command is None
    assert env.operands == "warm (recorded before cold timing)" and env.parts == 1


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"command": "sweep"}, "command must be a list, got 'sweep'"),
        ({"sm_count": True}, "sm_count must be an integer, got True"),
        ({"probe_env": ["A=1"]}, "probe_env must be a dict"),
        ({"phase": "sweep"}, "phase 'sweep' is not one of time, map, candidates"),
    ],
)
def test_a_key_of_the_wrong_type_is_one_line(tmp_path: Path, data: dict, said: str) -> None:
    (tmp_path / "env.json").write_text(json.dumps({"gpu_label": "h100", **data}))
    with pytest.raises(AuditError, match=f"^{tmp_path / 'env.json'}: {said}"):
        EnvRecord.read(tmp_path)


def test_a_dataset_holds_the_record() -> None:
    """A Dataset given env.json's object (a library caller) holds its record."""
    import pandas as pd

    dataset = Dataset("h100", "h100", Path("."), pd.DataFrame(), {"phase": "map"})  # type: ignore[arg-type]
    assert dataset.env.phase is Phase.map and dataset.env.operands == "warm (a map's fast pass)"
