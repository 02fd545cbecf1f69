"""table/rundir.py pinned at its boundaries: the row and finding counts where a file changes form,
the arithmetic of an interrupted run's kept times, the gzip members' headers, and which records
a results stream yields. Each test is a pure call or a few tiny files (issue 39 item 6)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table import rundir

SMOKE = Path(__file__).parent / "fixtures" / "h100-smoke"


def test_the_table_is_columnar_from_exactly_columnar_rows_with_pyarrow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = importlib.util.find_spec
    present = lambda name, *a: object() if name == "pyarrow" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", present)
    assert rundir.COLUMNAR_ROWS == 20_000
    assert rundir.table_target(tmp_path, 20_000) == tmp_path / "dispatch.parquet"
    assert rundir.table_target(tmp_path, 19_999) == tmp_path / "dispatch.csv"
    absent = lambda name, *a: None if name == "pyarrow" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", absent)
    # without pyarrow even a large table stays CSV (and a small one too: `and`, not `or`)
    assert rundir.table_target(tmp_path, 20_000) == tmp_path / "dispatch.csv"
    assert rundir.table_target(tmp_path, 5) == tmp_path / "dispatch.csv"


def test_table_file_prefers_the_parquet_the_run_wrote(tmp_path: Path) -> None:
    assert rundir.table_file(tmp_path) == tmp_path / "dispatch.csv"
    assert not rundir.has_table(tmp_path)
    (tmp_path / "dispatch.parquet").write_bytes(b"PAR1")
    assert rundir.table_file(tmp_path) == tmp_path / "dispatch.parquet"
    assert rundir.has_table(tmp_path)


def test_a_csv_table_replaces_an_earlier_parquet_and_stays(tmp_path: Path) -> None:
    frame = pd.read_csv(SMOKE / "dispatch.csv").head(2)
    (tmp_path / "dispatch.parquet").write_bytes(b"PAR1")  # an earlier, larger write's
    written = rundir.write_run_table(frame, tmp_path)
    assert written == tmp_path / "dispatch.csv"
    assert written.is_file() and not (tmp_path / "dispatch.parquet").exists()
    assert len(pd.read_csv(written)) == 2


def test_findings_are_compact_from_exactly_compact_findings() -> None:
    assert rundir.COMPACT_FINDINGS == 10_000
    assert rundir.findings_name(10_000) == "findings.json.gz"
    assert rundir.findings_name(9_999) == "findings.json"


def test_few_findings_are_indented_json_and_remove_an_earlier_gz(tmp_path: Path) -> None:
    (tmp_path / "findings.json.gz").write_bytes(b"old")
    written = rundir.write_findings(tmp_path, [{"rule": "a"}])
    assert written == tmp_path / "findings.json" == rundir.findings_file(tmp_path)
    assert written.read_text() == '[\n {\n  "rule": "a"\n }\n]\n'  # indent=1, one newline
    assert not (tmp_path / "findings.json.gz").exists()
    assert rundir.read_findings(written) == [{"rule": "a"}]


def gzip_members(raw: bytes) -> list[bytes]:
    """Each gzip member's text, in order (a reader of the whole file sees them joined)."""
    texts = []
    while raw:
        member = zlib.decompressobj(wbits=31)
        texts.append(member.decompress(raw))
        raw = member.unused_data
    return texts


def test_many_findings_are_fast_gzip_members_without_a_time(tmp_path: Path) -> None:
    """findings.json.gz is members of FINDINGS_MEMBER findings each (a map report makes them in
    forks), read back as one list."""
    (tmp_path / "findings.json").write_text("[]\n")
    records = [{"n": i} for i in range(2 * rundir.FINDINGS_MEMBER + 1)]
    written = rundir.write_findings(tmp_path, records)
    assert written == tmp_path / "findings.json.gz" == rundir.findings_file(tmp_path)
    assert not (tmp_path / "findings.json").exists()
    raw = written.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # the header's mtime: 0, so the same findings, the same bytes
    assert raw[8] == 4  # XFL 4: compresslevel 1, the fastest
    members = gzip_members(raw)
    assert len(members) == 3
    second, last = rundir.FINDINGS_MEMBER, 2 * rundir.FINDINGS_MEMBER
    assert members[0].startswith(b'[{"n":0},{"n":1}')
    assert members[1].startswith(b',{"n":%d}' % second)
    assert members[2] == b',{"n":%d}]\n' % last  # no spaces, a newline at the end of the list
    text = gzip.decompress(raw).decode()
    assert text.startswith('[{"n":0},{"n":1}') and text.endswith("}]\n")
    assert rundir.read_findings(written) == records


def test_a_truncated_gz_is_not_findings(tmp_path: Path) -> None:
    path = tmp_path / "findings.json.gz"
    path.write_bytes(gzip.compress(b"[]")[:-6])
    with pytest.raises(ValueError, match="not gzip data"):
        rundir.read_findings(path)
    plain = tmp_path / "findings.json"
    plain.write_bytes(gzip.compress(b"[]"))  # gzip bytes under a plain name: read as JSON
    with pytest.raises(ValueError):
        rundir.read_findings(plain)


def test_read_env_none_a_recorded_one_and_broken_ones(tmp_path: Path) -> None:
    assert rundir.read_env(tmp_path) == {}
    assert rundir.read_env(SMOKE)["gpu_label"] == "h100"
    (tmp_path / "env.json").write_text("[1]")
    with pytest.raises(AuditError, match="expected a JSON object, got list"):
        rundir.read_env(tmp_path)
    (tmp_path / "env.json").write_text("{")
    with pytest.raises(AuditError, match="not readable JSON"):
        rundir.read_env(tmp_path)


def test_write_env_is_two_space_json(tmp_path: Path) -> None:
    rundir.write_env(tmp_path, {"a": 1, "b": Path("x")})
    assert (tmp_path / "env.json").read_text() == '{\n  "a": 1,\n  "b": "x"\n}\n'


def test_interrupted_parts_add_up_to_two_decimals(tmp_path: Path) -> None:
    rundir.write_env(tmp_path, {"gpu_label": "h100"})
    rundir.add_interrupted_part(tmp_path, 1.234, {"time": 0.004, "profile": 2.0})
    first = rundir.read_env(tmp_path)
    assert first["gpu_label"] == "h100"
    # round(0 + 1.234, 2) = 1.23; round(0 + 0.004, 2) = 0.0
    assert first["earlier"] == {
        "parts": 1,
        "sweep_seconds": 1.23,
        "phase_seconds": {"time": 0.0, "profile": 2.0},
    }
    rundir.add_interrupted_part(tmp_path, 2.5, {"time": 1.0, "ncu": 0.5})
    # parts 1 + 1 = 2; 1.23 + 2.5 = 3.73; time 0.0 + 1.0; profile kept; ncu 0 + 0.5
    assert rundir.read_env(tmp_path)["earlier"] == {
        "parts": 2,
        "sweep_seconds": 3.73,
        "phase_seconds": {"time": 1.0, "profile": 2.0, "ncu": 0.5},
    }


def test_the_finished_run_adds_its_earlier_parts() -> None:
    env: dict[str, Any] = {
        "gpu_label": "h100",
        "earlier": {"parts": 2, "sweep_seconds": 3.73, "phase_seconds": {"time": 1.0}},
    }
    total = rundir.with_earlier_parts(env, 10.004, {"time": 2.257, "profile": 4.0})
    # 10.004 + 3.73 = 13.734 -> 13.73; time 2.257 + 1.0 = 3.257 -> 3.26; profile 4.0 + 0; 2 + 1
    assert total == {
        "gpu_label": "h100",
        "sweep_seconds": 13.73,
        "phase_seconds": {"time": 3.26, "profile": 4.0},
        "parts": 3,
    }
    # a run never interrupted: one part, its own times rounded
    alone = rundir.with_earlier_parts({"x": 1}, 1.006, {"time": 0.004})
    assert alone == {"x": 1, "sweep_seconds": 1.01, "phase_seconds": {"time": 0.0}, "parts": 1}


def test_records_read_the_folded_member_first_and_skip_a_torn_line(tmp_path: Path) -> None:
    lines = (SMOKE / "timing.jsonl").read_text().splitlines()
    stream = tmp_path / "timing.jsonl"
    stream.write_text("\n".join(lines[:3]) + "\n")
    rundir.compact_results(tmp_path)
    assert not stream.exists()
    rundir.append_record(stream, json.loads(lines[3]))
    with stream.open("a") as out:
        out.write('[1]\n{"event": "done", "case_id": "torn')  # a list, then a crash mid-line
    got = list(rundir.records(stream))
    assert got == [json.loads(line) for line in lines[:4]]
    assert rundir.read_results(stream) == {got[2]["case_id"]: got[2]}  # lines[2]: the one done


def test_compact_results_appends_a_member_per_fold_and_removes_case_lists(tmp_path: Path) -> None:
    shutil.copy(SMOKE / "timing.jsonl", tmp_path / "timing.jsonl")
    (tmp_path / "profile.jsonl").write_text('{"event": "done", "case_id": "a"}\n')
    (tmp_path / "chunk-001.cases").write_text("a\n")
    rundir.compact_results(tmp_path)
    folded = tmp_path / "timing.jsonl.gz"
    raw = folded.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # no time in the header: the same results, the same bytes
    # zlib's default level (6), not a slower one: a full map's 285 MB are folded at the end of
    # its run; the recorded stream's bytes differ at levels 6 and 7
    plain = (SMOKE / "timing.jsonl").read_bytes()
    assert raw == gzip.compress(plain, zlib.Z_DEFAULT_COMPRESSION, mtime=0)
    assert gzip.decompress(raw) == plain
    assert not (tmp_path / "chunk-001.cases").exists()
    assert list(rundir.read_results(tmp_path / "profile.jsonl")) == ["a"]
    (tmp_path / "timing.jsonl").write_text('{"event": "done", "case_id": "b"}\n')
    rundir.compact_results(tmp_path)
    assert folded.read_bytes().startswith(raw)  # the first member kept, a second appended
    assert list(rundir.read_results(tmp_path / "timing.jsonl"))[-1] == "b"
    assert len(rundir.read_results(tmp_path / "timing.jsonl")) == 11  # 10 done in the fixture


def test_folding_folds_each_run_beside_the_block_and_raises_a_folds_error_after_it(
    tmp_path: Path,
) -> None:
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        run.mkdir()
        shutil.copy(SMOKE / "timing.jsonl", run / "timing.jsonl")
    ran = []
    with rundir.folding(runs):
        ran.append("block")  # (the folds go on in threads meanwhile)
    assert ran == ["block"]
    for run in runs:  # each folded whole by the block's end
        assert not (run / "timing.jsonl").exists()
        assert (
            gzip.decompress((run / "timing.jsonl.gz").read_bytes())
            == (SMOKE / "timing.jsonl").read_bytes()
        )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "timing.jsonl").write_text("{}\n")
    (broken / "timing.jsonl.gz").mkdir()  # no regular file to fold onto
    with pytest.raises(AuditError, match=r"timing\.jsonl\.gz"), rundir.folding([runs[0], broken]):
        ran.append("second block")
    assert ran == ["block", "second block"] and (broken / "timing.jsonl").exists()


def test_following_parses_the_records_as_they_are_written_as_records_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe's records parsed while it writes them (in pieces, a line cut anywhere, a member
    folded before, a torn last line): afterwards `records` has them without reading the files
    again, exactly as it would have read them; once the file changes after, it reads again."""
    lines = (SMOKE / "timing.jsonl").read_text().splitlines(keepends=True)
    stream = tmp_path / "timing.jsonl"
    stream.write_text("".join(lines[:2]))
    rundir.compact_results(tmp_path)  # (a resumed run's first part, folded)
    stream.write_text(lines[2] + lines[3][:20])  # (its second part, torn mid-line)
    written = "".join(lines[4:]).encode() + b'[1]\n{"event": "done", "case_id": "torn'
    monkeypatch.setattr(rundir, "FOLLOW_S", 0.01)
    with rundir.following(stream):
        for start in range(0, len(written), 97):  # (the probe appending, cut anywhere)
            with stream.open("ab") as out:
                out.write(written[start : start + 97])
            time.sleep(0.002)
    kept = list(rundir.records(stream))
    rundir.forget_records()
    assert kept == list(rundir.records(stream))  # as a fresh reading has them
    assert len(kept) == len(lines) - 2  # (line 3, torn, joined line 4: both skipped)
    monkeypatch.setattr(rundir, "_parsed", lambda path, folded: pytest.fail("read again"))
    rundir.forget_records()
    with rundir.following(stream):
        pass
    assert list(rundir.records(stream)) == kept
    monkeypatch.undo()
    with stream.open("a") as out:  # (after the torn line)
        out.write('\n{"event": "done", "case_id": "after"}\n')
    assert list(rundir.records(stream))[-1] == {"event": "done", "case_id": "after"}


def test_read_results_wants_done_and_a_case_id(tmp_path: Path) -> None:
    path = tmp_path / "timing.jsonl"
    for record in (
        {"event": "start", "case_id": "a"},
        {"event": "done"},
        {"event": "done", "case_id": "b", "n": 1},
    ):
        rundir.append_record(path, record)
    assert path.read_text().count("\n") == 3
    assert rundir.read_results(path) == {"b": {"event": "done", "case_id": "b", "n": 1}}


def test_env_value_lines() -> None:
    assert rundir.env_value({"b": 2, "a": 1}) == "a=1, b=2"
    assert rundir.env_value({}) == "none"
    assert rundir.env_value(3.5) == "3.5"


def test_a_candidates_run_has_candidates_and_no_table(tmp_path: Path) -> None:
    assert not rundir.is_candidates_run(tmp_path / "missing")
    assert not rundir.is_candidates_run(tmp_path)  # neither file
    (tmp_path / "candidates.csv").write_text("x\n")
    assert rundir.is_candidates_run(tmp_path)
    (tmp_path / "dispatch.csv").write_text("x\n")
    assert not rundir.is_candidates_run(tmp_path)
    (tmp_path / "file").write_text("")
    assert not rundir.is_candidates_run(tmp_path / "file")
