"""The probe's records (probes/probe_records.py): every phase but the map puts each record on disk
at once (a crash loses at most the case in flight, its start line naming it); the map a chunk at
a time, when the engine says a chunk's records are settled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cublas_audit.planning.cases import Case
from probes.probe_records import ProbeRecords

CASE = Case("cublas", "bf16", 64, 1280, 2816, 1)


def on_disk(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("phase", ["time", "profile", "recheck"])
def test_a_timed_phase_puts_each_record_on_disk_at_once(tmp_path: Path, phase: str) -> None:
    path = tmp_path / "timing.jsonl"
    with open(path, "a") as out:  # buffered, as the probe opens it
        records = ProbeRecords(out, phase)
        records.started(CASE)
        assert on_disk(path) == [{"event": "start", "case_id": CASE.case_id, "phase": phase}]
        records.finished(CASE, {"status": "ok"})
        assert on_disk(path)[-1]["status"] == "ok"


def test_the_map_puts_a_chunks_records_on_disk_when_they_are_settled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "timing.jsonl"
    with open(path, "a") as out:
        records = ProbeRecords(out, "map")
        records.started(CASE)
        records.started(CASE)
        assert not path.read_text()  # a chunk's start records go together
        records.settled()
        assert [r["event"] for r in on_disk(path)] == ["start", "start"]
        records.finished(CASE, {"status": "ok"})
        records.settled()
        assert on_disk(path)[-1] == {
            "event": "done", "case_id": CASE.case_id, "phase": "map", "status": "ok"
        }  # fmt: skip
        timeline = {"engine_start_s": 2.5, "engine_end_s": 9.0}
        records.spent({"queue": 1.0}, {"queue": "c thread"}, timeline)  # at once
        assert on_disk(path)[-1]["event"] == "engine"
        assert on_disk(path)[-1]["timeline"] == timeline
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"@@start {CASE.case_id}"] * 2 + [f"@@done {CASE.case_id}"]


def test_a_start_record_is_the_line_json_would_write_for_every_kind_of_case_id(
    tmp_path: Path,
) -> None:
    # written without json (a case id is plain words): the same bytes as json.dumps for ids
    # with every optional setting (lda, broadcast, beta, strided, bias, workspace, a loop)
    cases = [
        CASE,
        Case("cublasLt", "fp16", 100, 33, 7, 3, transa="t", bias=True, workspace_mib=0),
        Case("cublas", "fp32", 64, 64, 64, 4, lda=80, broadcast="b", beta=0.5, strided=True),
        Case("cublas", "fp32", 64, 64, 64, 4, loop=True),
    ]
    path = tmp_path / "timing.jsonl"
    with open(path, "a") as out:
        records = ProbeRecords(out, "map")
        for case in cases:
            records.started(case)
    want = [
        json.dumps({"event": "start", "case_id": case.case_id, "phase": "map"}) for case in cases
    ]
    assert path.read_text().splitlines() == want


def test_the_probes_start_up_imports_no_pandas() -> None:
    # every map shard's probe starts with these imports: pandas (~0.7 s) came in through the
    # candidate audit's defaults and the timing's column names
    import subprocess
    import sys

    code = (
        "import sys, probes.gemm_probe, cublas_audit.device.map_engine; "
        "print(sorted(m for m in ('pandas', 'scipy', 'matplotlib') if m in sys.modules))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"


def test_a_process_age_counts_from_the_process_start_not_from_the_call() -> None:
    # a child that sleeps 0.3 s before asking: its age includes the sleep and its start-up
    import subprocess
    import sys

    code = "import time; time.sleep(0.3); from probes.probe_records import process_age_s; " \
        "print(process_age_s())"  # fmt: skip
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    age = float(found.stdout)
    assert 0.3 <= age < 5.0, found.stderr
