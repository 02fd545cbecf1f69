"""The sweep and its probe child: a case that kills the child becomes an error row and the rest
is still measured, a child that finishes nothing is a clear error naming probe.log (never a
retry loop), and `--resume` never redoes an ncu chunk whose CSV export is on disk.

These tests drive the real cublas_audit.sweep.run. What they replace is the child process only:
ProbeCommand.python is a small fake interpreter written into tmp_path, which receives the real
argv (`-m cublas_audit.probes.gemm_probe --plan ... --phase ... --results ... --only ...`) and
speaks the real probe's protocol (probes/gemm_probe.py: a `probe` record, then per case a `start`
record and @@start line, the `done` record and @@done line). It replays the `done` records the
real probe wrote on an H100 (tests/fixtures/h100-*/timing.jsonl, profile.jsonl), or dies inside a
named case, or exits without a result. A fake ncu likewise stands in for the profiler: it records
each call, runs the probe command it wraps, and exports a recorded ncu CSV.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pandas as pd
import pytest

from cublas_audit import rundir, sweep
from cublas_audit.cases import read_plan, write_plan
from cublas_audit.errors import AuditError
from cublas_audit.probe_process import DONE_LINE, START_LINE, ProbeCommand
from cublas_audit.resources import PROBE_MODULE
from cublas_audit.rundir import NCU_DIR, PLAN_FILE, PROFILE_RESULTS, TIME_RESULTS

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "tests" / "fixtures" / "h100-smoke"
BATCHED = REPO / "tests" / "fixtures" / "h100-batched-cublas"
DEADLINE_S = 20  # sweep.run must end well before this; a retry loop would not

SMOKE_IDS = [case.case_id for case in read_plan(SMOKE / PLAN_FILE)]

FAKE_PROBE = '''\
#!{python}
"""A stand-in for `python -m cublas_audit.probes.gemm_probe`: replays recorded results."""
import argparse, json, os, sys

CONFIG = json.loads({config!r})
if sys.argv[1:3] != ["-m", CONFIG["module"]]:
    sys.exit("fake probe: unexpected argv " + repr(sys.argv))
parser = argparse.ArgumentParser()
for option in ("--plan", "--phase", "--results", "--only", "--min-reps", "--gpu-label", "--limit"):
    parser.add_argument(option)
parser.add_argument("--reference", action="store_true")
args = parser.parse_args(sys.argv[3:])
only = open(args.only).read().split() if args.only else None
with open(CONFIG["calls"], "a") as calls:
    calls.write(json.dumps({{"phase": args.phase, "only": only}}) + "\\n")
if CONFIG["behaviour"] == "exit-0-silently":
    print("fake probe: exiting 0 without writing a result")
    sys.exit(0)
if CONFIG["behaviour"] == "no-cupy":
    print("ModuleNotFoundError: No module named 'cupy'")
    sys.exit(1)
recorded = [json.loads(line) for line in open(CONFIG["replay"][args.phase])]
probe = next(r for r in recorded if r.get("event") == "probe")
done = {{r["case_id"]: r for r in recorded if r.get("event") == "done"}}
plan = [case["case_id"] for case in json.load(open(args.plan))]
with open(args.results, "a", buffering=1) as out:
    def emit(record):
        out.write(json.dumps(record) + "\\n")
        out.flush()

    emit(probe)
    for case_id in plan:
        if only is not None and case_id not in only:
            continue
        emit({{"event": "start", "case_id": case_id, "phase": args.phase}})
        print(CONFIG["start_line"] + case_id, flush=True)
        if case_id == CONFIG["crash_on"]:
            print("fake probe: Segmentation fault in " + case_id, flush=True)
            os._exit(139)
        emit(done[case_id])
        print(CONFIG["done_line"] + case_id, flush=True)
'''

FAKE_NCU = '''\
#!{python}
"""A stand-in for ncu: records its call; profiles by running the probe it wraps and writing a
report; `--import REPORT --csv` prints the recorded export of that chunk."""
import json, os, subprocess, sys

CONFIG = json.loads({config!r})
argv = sys.argv[1:]
with open(CONFIG["calls"], "a") as calls:
    calls.write(json.dumps(argv) + "\\n")
if CONFIG["fail"]:
    print("==ERROR== fake ncu: this call was not expected")
    sys.exit(1)
if argv[0] == "--import":
    name = os.path.basename(argv[1]).split(".")[0]
    sys.stdout.write(open(CONFIG["exports"][name]).read())
    sys.exit(0)
end = argv.index("--log-file") + 2
report, log = argv[argv.index("--export") + 1], argv[end - 1]
code = subprocess.call(argv[end:])
with open(log, "w") as out:
    out.write("==PROF== Report: " + report + "\\n")
with open(report, "w") as out:
    out.write("fake report\\n")
sys.exit(code)
'''


def executable(path: Path, template: str, config: dict[str, Any]) -> Path:
    path.write_text(template.format(python=sys.executable, config=json.dumps(config)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_probe(
    tmp_path: Path,
    *,
    replay: Path = SMOKE,
    crash_on: str | None = None,
    behaviour: str = "replay",
) -> tuple[ProbeCommand, Path]:
    """The fake probe interpreter and the file it records its calls in, one JSON line a call."""
    calls = tmp_path / "probe-calls.jsonl"
    config = {
        "module": PROBE_MODULE,
        "calls": str(calls),
        "behaviour": behaviour,
        "crash_on": crash_on,
        "replay": {"time": str(replay / TIME_RESULTS), "profile": str(replay / PROFILE_RESULTS)},
        "start_line": START_LINE,
        "done_line": DONE_LINE,
    }
    script = executable(tmp_path / "fake-python", FAKE_PROBE, config)
    return ProbeCommand(python=str(script), env=dict(os.environ)), calls


def fake_ncu(tmp_path: Path, *, fail: bool, exports: Path = BATCHED) -> tuple[str, Path]:
    calls = tmp_path / "ncu-calls.jsonl"
    config = {
        "calls": str(calls),
        "fail": fail,
        "exports": {p.stem: str(p) for p in (exports / NCU_DIR).glob("chunk-*.csv")},
    }
    return str(executable(tmp_path / "fake-ncu", FAKE_NCU, config)), calls


def call_records(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def new_run_dir(tmp_path: Path, recorded: Path) -> Path:
    """A started run directory: the recorded run's plan and environment, nothing measured."""
    run_dir = tmp_path / "run"
    (run_dir / NCU_DIR).mkdir(parents=True)
    write_plan(read_plan(recorded / PLAN_FILE), run_dir / PLAN_FILE)
    rundir.write_env(run_dir, rundir.read_env(recorded))
    return run_dir


def config_for(run_dir: Path, probe: ProbeCommand, ncu: str | None = None) -> sweep.SweepConfig:
    return sweep.SweepConfig(
        cases=read_plan(run_dir / PLAN_FILE), run_dir=run_dir, gpu_label="h100", ncu=ncu,
        probe=probe,
    )  # fmt: skip


@dataclass
class Recorded:
    """A Progress that remembers what the sweep reported."""

    totals: list[int] = field(default_factory=list)
    advanced: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def progress(self) -> sweep.Progress:
        return sweep.Progress(
            start=self.totals.append, advance=self.advanced.append, note=self.notes.append
        )


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fails the test (instead of hanging the suite) if the block runs past `seconds`."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"sweep.run still running after {seconds} s: a retry loop?")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


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
    assert runs[0] == {"phase": "time", "only": SMOKE_IDS}
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
