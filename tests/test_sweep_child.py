"""The sweep and its probe child: a case that kills the child becomes an error row and the rest
is still measured, a child that finishes nothing is a clear error naming probe.log (never a
retry loop), and `--resume` never redoes an ncu chunk whose CSV export is on disk.

These tests drive the real cublas_audit.run.sweep.run. What they replace is the child process only:
ProbeCommand.python is a small fake interpreter written into tmp_path (tests/fakeprobe.py), which
receives the real argv (`-m cublas_audit.probes.gemm_probe --plan ... --phase ... --results ...
--only ...`) and speaks the real probe's protocol (probes/gemm_probe.py: a `probe` record, then per
case a `start` record and @@start line, the `done` record and @@done line). It replays the `done`
records the real probe wrote on an H100 (tests/fixtures/h100-*/timing.jsonl, profile.jsonl), or
dies inside a named case, or exits without a result. A fake ncu likewise stands in for the
profiler: it records each call, runs the probe command it wraps, and exports a recorded ncu CSV.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cublas_audit.errors import AuditError, InterruptedSweepError
from cublas_audit.planning import plan_file
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.run import sweep
from cublas_audit.run.probe_process import ProbeCommand
from cublas_audit.table import rundir
from cublas_audit.table.rundir import NCU_DIR, PLAN_FILE, PROFILE_RESULTS, TIME_RESULTS
from tests.fakeprobe import (
    BATCHED,
    SMOKE,
    Recorded,
    call_records,
    deadline,
    fake_ncu,
    fake_probe,
)

DEADLINE_S = 20  # sweep.run must end well before this; a retry loop would not

SMOKE_IDS = [case.case_id for case in read_plan(SMOKE / PLAN_FILE)]


def new_run_dir(tmp_path: Path, recorded: Path) -> Path:
    """A started run directory: the recorded run's plan and environment, nothing measured."""
    run_dir = tmp_path / "run"
    (run_dir / NCU_DIR).mkdir(parents=True)
    plan_file.write(read_plan(recorded / PLAN_FILE), run_dir / PLAN_FILE)
    rundir.write_env(run_dir, rundir.read_env(recorded))
    return run_dir


def config_for(run_dir: Path, probe: ProbeCommand, ncu: str | None = None) -> sweep.SweepConfig:
    return sweep.SweepConfig(
        cases=read_plan(run_dir / PLAN_FILE), run_dir=run_dir, gpu_label="h100", ncu=ncu,
        probe=probe,
    )  # fmt: skip


def run_sweep(config: sweep.SweepConfig, recorded: Recorded) -> pd.DataFrame:
    with deadline(DEADLINE_S):
        return sweep.run(config, recorded.progress())


def recorded_done(path: Path, case_id: str) -> dict[str, Any]:
    return rundir.read_results(path)[case_id]


# ----- a case that kills the probe -----------------------------------------------------------


@pytest.mark.parametrize(
    ("culprit", "reruns"),
    [
        ("cublas.fp32.256x256x256.b1.nn", 1),  # the first case: the child dies before any result
        ("cublas.fp32.256x256x256.b8.nn", 1),  # in the middle: two cases done before it
        ("loop.fp32.1024x1024x1024.b8.nn", 0),  # the last case: nothing left to rerun
    ],
)
def test_a_case_that_kills_the_probe_is_an_error_row_and_the_rest_is_timed(
    tmp_path: Path, culprit: str, reruns: int
) -> None:
    run_dir = new_run_dir(tmp_path, SMOKE)
    probe, calls = fake_probe(tmp_path, crash_on=culprit)
    recorded = Recorded()
    frame = run_sweep(config_for(run_dir, probe), recorded)

    # the culprit is named, once, with the child's exit code; the sweep goes on without it
    results = rundir.read_results(run_dir / TIME_RESULTS)
    assert results[culprit]["status"] == "error"
    assert results[culprit]["detail"] == "the probe died during this case (exit code 139)"
    assert recorded.notes == [f"probe died during {culprit} (exit code 139); continuing"]
    runs = call_records(calls)
    assert len(runs) == 1 + reruns
    assert runs[0] == {"phase": "time", "only": None}  # the whole plan: no list of its ids
    after = SMOKE_IDS[SMOKE_IDS.index(culprit) + 1 :]
    assert [run["only"] for run in runs[1:]] == ([after] if after else [])

    # every other case has the result the H100 recorded for it
    assert sorted(recorded.advanced) == sorted(i for i in SMOKE_IDS if i != culprit)
    rows = frame.set_index("case_id")
    assert rows.loc[culprit, "status"] == "error"
    assert "exit code 139" in str(rows.loc[culprit, "status_detail"])
    for case_id in SMOKE_IDS:
        if case_id != culprit:
            want = recorded_done(SMOKE / TIME_RESULTS, case_id)
            assert rows.loc[case_id, "status"] == want["status"], case_id
    # e.g. the 1024^3 batch-8 SGEMM, timed at 0.3544960021972656 ms on the H100
    if culprit != "cublas.fp32.1024x1024x1024.b8.nn":
        assert rows.loc["cublas.fp32.1024x1024x1024.b8.nn", "time_ms"] == pytest.approx(
            0.3544960021972656
        )
    # what the child printed besides its progress lines is kept in probe.log
    assert f"fake probe: Segmentation fault in {culprit}" in (run_dir / "probe.log").read_text()


# ----- a probe that finishes nothing ---------------------------------------------------------


@pytest.mark.parametrize(
    ("behaviour", "code", "said"),
    [
        ("exit-0-silently", 0, "fake probe: exiting 0 without writing a result"),
        ("no-cupy", 1, "ModuleNotFoundError: No module named 'cupy'"),
    ],
)
def test_a_probe_that_writes_no_result_is_an_error_naming_probe_log(
    tmp_path: Path, behaviour: str, code: int, said: str
) -> None:
    run_dir = new_run_dir(tmp_path, SMOKE)
    probe, calls = fake_probe(tmp_path, behaviour=behaviour)
    with pytest.raises(AuditError) as raised:
        run_sweep(config_for(run_dir, probe), Recorded())
    message = str(raised.value)
    assert "the probe finished no case" in message
    assert f"exit code {code}" in message
    assert str(run_dir / "probe.log") in message
    assert said in message  # the last lines of probe.log: the real cause
    assert len(call_records(calls)) == 1  # an error at once, not a retry
    assert rundir.read_results(run_dir / TIME_RESULTS) == {}


# ----- resume --------------------------------------------------------------------------------


def test_resume_never_reruns_a_chunk_whose_csv_is_on_disk(tmp_path: Path) -> None:
    # h100-smoke's 8 profiled cases fit one chunk; its export is on disk, half the timing is done
    run_dir = new_run_dir(tmp_path, SMOKE)
    shutil.copy(SMOKE / NCU_DIR / "chunk-000.csv", run_dir / NCU_DIR / "chunk-000.csv")
    shutil.copy(SMOKE / PROFILE_RESULTS, run_dir / PROFILE_RESULTS)
    timed, untimed = SMOKE_IDS[:5], SMOKE_IDS[5:]
    with (run_dir / TIME_RESULTS).open("w") as out:
        for line in (SMOKE / TIME_RESULTS).read_text().splitlines():
            if json.loads(line).get("case_id") in (*timed, None):
                out.write(line + "\n")
    ncu, ncu_calls = fake_ncu(tmp_path, fail=True)
    probe, probe_calls = fake_probe(tmp_path)
    recorded = Recorded()
    frame = run_sweep(config_for(run_dir, probe, ncu), recorded)

    assert call_records(ncu_calls) == []  # ncu never started
    assert call_records(probe_calls) == [{"phase": "time", "only": untimed}]
    assert recorded.totals == [len(untimed)]
    # the table still carries the chunk's kernels, from the CSV on disk:
    # ID 0 xmma 32x32x8 6.528 us + ID 1 its split-K reduction 5.472 us ...
    split = frame[frame["case_id"] == "cublas.fp32.256x256x256.b1.nn"].sort_values("launch")
    assert list(split["kernel_short"]) == ["xmma_32x32x8", "splitKreduce"]
    assert list(split["duration_us"]) == pytest.approx([6.528, 5.472])
    # ... ID 4 cutlass simt 256x128, FMA pipe 78.522015 %, timed 0.3544960021972656 ms now
    row = frame.set_index("case_id").loc["cublas.fp32.1024x1024x1024.b8.nn"]
    assert row["kernel_short"] == "simt_256x128_8x4"
    assert row["fma_pct"] == pytest.approx(78.522015)
    assert row["time_ms"] == pytest.approx(0.3544960021972656)
    assert frame["kernel"].notna().sum() == 5  # all 5 launches of the export


def test_resume_profiles_only_the_missing_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # h100-batched-cublas was profiled in three chunks of 12 cases (cuBLAS and cuBLASLt of two
    # sizes each); chunks 0 and 2 are on disk, chunk 1 (1024 and 2048) is not
    monkeypatch.setattr(sweep, "CHUNK_SIZE", 12)
    run_dir = new_run_dir(tmp_path, BATCHED)
    for name in ("chunk-000.csv", "chunk-002.csv"):
        shutil.copy(BATCHED / NCU_DIR / name, run_dir / NCU_DIR / name)
    chunk_1 = [
        c.case_id
        for c in read_plan(BATCHED / PLAN_FILE)
        if c.profiled and c.m in (1024, 2048)
    ]  # fmt: skip
    assert len(chunk_1) == 12
    with (run_dir / PROFILE_RESULTS).open("w") as out:
        for line in (BATCHED / PROFILE_RESULTS).read_text().splitlines():
            if json.loads(line).get("case_id") not in chunk_1:
                out.write(line + "\n")
    shutil.copy(BATCHED / TIME_RESULTS, run_dir / TIME_RESULTS)  # timing finished
    ncu, ncu_calls = fake_ncu(tmp_path, fail=False, exports=BATCHED)
    probe, probe_calls = fake_probe(tmp_path, replay=BATCHED)
    recorded = Recorded()
    frame = run_sweep(config_for(run_dir, probe, ncu), recorded)

    ncu_runs = call_records(ncu_calls)
    assert len(ncu_runs) == 2  # chunk 1 profiled, then exported; chunks 0 and 2 untouched
    assert ncu_runs[0][ncu_runs[0].index("--export") + 1] == str(
        run_dir / NCU_DIR / "chunk-001.ncu-rep"
    )
    assert ncu_runs[1][:2] == ["--import", str(run_dir / NCU_DIR / "chunk-001.ncu-rep")]
    assert call_records(probe_calls) == [{"phase": "profile", "only": chunk_1}]
    assert (run_dir / NCU_DIR / "chunk-001.cases").read_text().split() == chunk_1
    assert recorded.totals == [12]
    # all 18 recorded cuBLAS launches are in the table, one per case, e.g. chunk 1's
    # 2048^3 batch-16 xmma 64x256x8 (ID 5, 5453.44 us) and chunk 2's 8192^3 batch-16 (ID 5)
    launches = frame[frame["kernel"].notna()].set_index("case_id")
    assert len(launches) == 18
    assert launches.loc["cublas.fp32.2048x2048x2048.b16.nn", "kernel_short"] == "xmma_64x256x8"
    assert launches.loc["cublas.fp32.2048x2048x2048.b16.nn", "duration_us"] == pytest.approx(
        5453.44
    )
    assert launches.loc["cublas.fp32.8192x8192x8192.b16.nn", "fma_pct"] == pytest.approx(82.103251)


def test_a_map_chunk_that_kills_the_probe_is_retried_one_case_at_a_time(tmp_path: Path) -> None:
    # The map engine starts a chunk of cases before it measures them: a crash leaves several
    # started and unfinished. None of them is blamed yet; they run again one at a time
    # (--careful), so only the case that really kills the probe becomes an error row.
    # The fake runs its chunks of three last first, as the engine runs them out of plan order.
    culprit = SMOKE_IDS[4]  # the second case of the second chunk of three: run third
    run_dir = new_run_dir(tmp_path, SMOKE)
    probe, calls = fake_probe(tmp_path, crash_on=culprit, behaviour="chunked")
    recorded = Recorded()
    config = config_for(run_dir, probe)
    config.phase = "map"
    run_sweep(config, recorded)

    results = rundir.read_results(run_dir / TIME_RESULTS)
    assert results[culprit]["detail"] == "the probe died during this case (exit code 139)"
    assert [c for c in SMOKE_IDS if results[c]["status"] == "error"] == [culprit]
    runs = call_records(calls)
    assert [run.get("careful", 0) for run in runs] == [0, 3, 0]
    # the chunk in flight first, one by one, then the chunk never started
    assert runs[1]["only"] == SMOKE_IDS[3:6] + SMOKE_IDS[:3]
    assert runs[2]["only"] == SMOKE_IDS[5:6] + SMOKE_IDS[:3]
    assert recorded.notes[0] == "probe died with 3 cases in flight; retrying them one by one"


@pytest.mark.parametrize("limit", [0, sweep.PARTIAL_TABLE_LIMIT])
def test_an_interrupted_run_counts_what_is_saved_and_a_large_one_writes_no_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    # Three cases recorded on the H100 are done (and a torn last line); Ctrl-C arrives. A run
    # over the limit counts them from timing.jsonl and leaves the table to --resume (the table
    # of a 262,144-case map took over 20 s to assemble after Ctrl-C); a smaller run writes its
    # partial table, as before.
    run_dir = new_run_dir(tmp_path, SMOKE)
    recorded = (SMOKE / TIME_RESULTS).read_text().splitlines()
    done = [line for line in recorded if '"event": "done"' in line][:3]
    (run_dir / TIME_RESULTS).write_text("\n".join(done) + '\n{"event": "done", "case_')

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "_time_cases", interrupted)
    monkeypatch.setattr(sweep, "PARTIAL_TABLE_LIMIT", limit)
    config = config_for(run_dir, fake_probe(tmp_path)[0])
    with pytest.raises(InterruptedSweepError, match=f"interrupted: 3 of {len(SMOKE_IDS)} "):
        sweep.run(config)
    assert (run_dir / rundir.TABLE_FILE).exists() == (limit > 0)


def test_a_resumed_run_reports_the_time_of_every_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The FP32 atlas map ran 420 s, was stopped, and finished on --resume in 215 s: its report
    # said "map time 250 s", the last part's. The interrupted part's time is kept and added.
    run_dir = new_run_dir(tmp_path, SMOKE)
    ticks = itertools.count(0.0, 10.0)  # every reading of the clock is 10 s after the last
    monkeypatch.setattr(sweep.time, "perf_counter", lambda: next(ticks))

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    config = config_for(run_dir, fake_probe(tmp_path)[0])
    with monkeypatch.context() as patched:
        patched.setattr(sweep, "_time_cases", interrupted)
        with pytest.raises(InterruptedSweepError):
            sweep.run(config)
    # read at 0 (start), 10 and 20 (profiling), 30 and 40 (timing, interrupted), 50 (stop)
    assert rundir.read_env(run_dir)["earlier"] == {
        "parts": 1, "sweep_seconds": 50.0, "phase_seconds": {"profile": 10.0, "time": 10.0}
    }  # fmt: skip
    monkeypatch.setattr(sweep, "_time_cases", lambda *args: None)
    monkeypatch.setattr(sweep, "_recheck_unsure", lambda *args: None)
    monkeypatch.setattr(sweep, "write_outputs", lambda config: None)
    sweep.run(config)
    env = rundir.read_env(run_dir)
    # the resumed part: 10 s profiling, 10 s timing, 10 s rechecking, 70 s in all
    assert env["phase_seconds"] == {"profile": 20.0, "time": 20.0, "recheck": 10.0}
    assert env["sweep_seconds"] == 50.0 + 70.0
    assert env["parts"] == 2 and "earlier" not in env
