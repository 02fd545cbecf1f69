"""rundir.records parses a probe's records once while the files stay as they are (a sweep reads
them several times over: a full map's 262,144 cost seconds each), and sees every change: a
record appended, the file replaced, its records folded into the .gz (compact_results)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cublas_audit.table import rundir


def write(path: Path, *records: dict[str, object]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_records_are_parsed_once_and_every_change_is_seen(tmp_path: Path) -> None:
    path = tmp_path / rundir.TIME_RESULTS
    write(path, {"event": "probe"}, {"event": "done", "case_id": "x", "time_ms": 1.0})
    first = list(rundir.records(path))
    again = list(rundir.records(path))
    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]  # not parsed again
    rundir.append_record(path, {"event": "done", "case_id": "y", "time_ms": 2.0})
    assert set(rundir.read_results(path)) == {"x", "y"}
    replaced = tmp_path / "new.jsonl"  # same size, another file put in its place
    write(replaced, {"event": "probe"}, {"event": "done", "case_id": "z", "time_ms": 1.0})
    write(
        replaced,
        *list(rundir.records(replaced))[:1],
        {"event": "done", "case_id": "w", "time_ms": 1.0},
    )
    os.replace(replaced, path)
    assert set(rundir.read_results(path)) == {"w"}
    rundir.forget_records()
    assert list(rundir.records(tmp_path / "missing.jsonl")) == []
