"""`sweep --resume DIR` finishes the run DIR was, measuring the rest as the start measured it.

Every recorded setting that decides what is measured (the probe's interpreter, the --cublas-lib
directory, the --probe-env variables, ncu's clock control, profiling, the reference kernel, the
timed repetitions, the candidate audit) is restored from env.json when no option is given, and an
explicit option that contradicts the record is refused (exit 2, naming the option) while one equal
to it is accepted.

The recorded run is started the way sweep_setup.sweep starts one (checked -> _config ->
start_run) with the plan of a bundled H100 run and non-default settings. End to end, the real
sweep_setup.sweep resumes it: environment.collect is replaced by what it found on that H100 (a
stand-in for the machine, no GPU here), the probe child by the fake interpreter of
tests/fakeprobe.py, which records the argv and environment it was started with and replays the
H100's results. The Markdown report (seconds of plotting, not under test) is replaced by a stub.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.jobs import measure
from cublas_audit.observe import environment
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.resources import PROBE_MODULE, package_view
from cublas_audit.run import sweep_setup
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import checked, start_run
from cublas_audit.table import rundir
from tests.fakeprobe import (
    H100_RUN,
    call_records,
    cublas_dir,
    deadline,
    fake_ncu,
    fake_probe,
    h100_environment,
    seen,
)

runner = CliRunner()
DEADLINE_S = 30
CASES = read_plan(H100_RUN / rundir.PLAN_FILE)  # 54 batched cases, 36 of them profiled
TAG = "CUBLAS_AUDIT_TAG"
# every setting off its default (profile True, reference True, clock none, 20 reps, no audit)
RECORD: dict[str, Any] = {
    "profile": False,
    "reference": False,
    "clock_control": "base",
    "min_reps": 37,
    "candidate_limit": 8,
}


@dataclass
class StartedRun:
    """A started, unfinished run and what it was started with."""

    run_dir: Path
    python: str
    cublas_lib: Path


def start_recorded_run(tmp_path: Path, **settings: Any) -> StartedRun:
    """plan.json and env.json of a new run, as sweep_setup.sweep writes them, nothing measured."""
    probe, _calls = fake_probe(
        tmp_path,
        replay=H100_RUN,
        cublas_paths="preloaded",
        env_keys=("LD_PRELOAD", "PYTHONPATH", TAG),
        candidates=H100_RUN / rundir.CANDIDATES_FILE,
    )
    lib = cublas_dir(tmp_path / "cublas-13.1")
    options = checked(
        SweepOptions(
            cases=CASES,
            gpu_label="h100",
            out=tmp_path / "run",
            probe_python=probe.python,
            cublas_lib=lib,
            probe_env={TAG: "first-half"},
            command=["cublas-audit", "sweep", "--batched"],
            **{**RECORD, **settings},
        )
    )
    ncu = settings.get("ncu")
    machine = h100_environment(ncu)
    with package_view() as view:
        config = sweep_setup._config(options, machine, ncu if options.profile else None, view)
    start_run(config, machine, options)
    return StartedRun(config.run_dir, probe.python, lib)


def expected(recorded: StartedRun) -> dict[str, Any]:
    return {
        "probe_python": recorded.python,
        "cublas_lib": recorded.cublas_lib,
        "probe_env": {TAG: "first-half"},
        **RECORD,
        "cases": CASES,
        "gpu_label": "h100",
    }


def stand_in_machine(monkeypatch: pytest.MonkeyPatch, ncu: str | None = None) -> list[str | None]:
    """environment.collect finds the H100; the report is a stub. Returns collect's calls."""
    calls: list[str | None] = []

    def collect(
        ncu_option: str | None = None, device: int | None = None
    ) -> environment.Environment:
        calls.append(ncu_option)
        return h100_environment(ncu)

    monkeypatch.setattr(environment, "collect", collect)
    monkeypatch.setattr(measure, "write_run_report", lambda run_dir: run_dir / rundir.REPORT_FILE)
    return calls


def errors(output: str) -> list[str]:
    """The CLI's error lines (the progress bar on stderr starts before the checks)."""
    return [line for line in output.splitlines() if line.startswith("error:")]


def option_after(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


# ----- restored ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "probe_python",
        "cublas_lib",
        "probe_env",
        "clock_control",
        "profile",
        "reference",
        "min_reps",
        "candidate_limit",
        "cases",
        "gpu_label",
    ],
)
def test_resume_with_no_option_restores_the_recorded_setting(tmp_path: Path, name: str) -> None:
    recorded = start_recorded_run(tmp_path)
    want = expected(recorded)[name]
    fresh = checked(SweepOptions(cases=CASES[:1]))
    assert getattr(fresh, name) != want  # the record is not the default: restoring it shows

    options = checked(SweepOptions(resume=recorded.run_dir))

    assert getattr(options, name) == want


def test_a_resumed_sweep_starts_the_probe_as_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = start_recorded_run(tmp_path)
    stand_in_machine(monkeypatch)  # no ncu: a resume that forgot --no-profile would stop here
    with deadline(DEADLINE_S):
        result = sweep_setup.sweep(SweepOptions(resume=recorded.run_dir))

    starts = seen(tmp_path)
    # the import check, then timing, the recheck of the comparisons the H100's recorded times
    # leave unsure, and the candidate audit; no profiling (recorded: not profiled)
    assert [start["argv"][1:3] for start in starts] == [
        ["-c", f"import cupy, cupy_backends.cuda.libs.cublas, {PROBE_MODULE}"],
        ["-m", PROBE_MODULE],
        ["-m", PROBE_MODULE],
        ["-m", PROBE_MODULE],
    ]
    lib = recorded.cublas_lib.resolve()
    preload = [str(lib / "libcublasLt.so.13"), str(lib / "libcublas.so.13")]
    for start in starts:
        assert start["argv"][0] == recorded.python  # the recorded interpreter
        assert start["env"]["LD_PRELOAD"].split(os.pathsep)[:2] == preload  # the recorded cuBLAS
        assert start["env"][TAG] == "first-half"  # the recorded --probe-env
        view = Path(start["env"]["PYTHONPATH"].split(os.pathsep)[0])
        assert view.name.startswith("cublas-audit-view-")
        assert not view.exists()  # the package view is gone with the sweep
    timing, recheck, audit = (start["argv"] for start in starts[1:])
    assert option_after(recheck, "--phase") == "recheck"
    assert option_after(recheck, "--min-reps") == str(37 * 5)  # five times the recorded reps
    assert option_after(timing, "--phase") == "time"
    assert option_after(timing, "--plan") == str(recorded.run_dir / rundir.PLAN_FILE)
    assert option_after(timing, "--min-reps") == "37"
    assert option_after(timing, "--gpu-label") == "h100"
    assert "--reference" not in timing
    assert option_after(audit, "--phase") == "candidates"
    assert option_after(audit, "--limit") == "8"

    # the H100's results are the table's; the run still says what it was started with
    rows = result.frame.set_index("case_id")
    assert len(rows) == len(CASES)
    assert rows.loc["cublas.fp32.256x256x256.b4.nn", "time_ms"] == pytest.approx(
        0.020255999639630318
    )
    assert (recorded.run_dir / rundir.CANDIDATES_FILE).is_file()
    record = rundir.read_env(recorded.run_dir)
    assert record["probe"]["cublas_paths"] == preload
    assert (record["min_reps"], record["candidate_limit"], record["cublas_lib"]) == (
        37,
        8,
        str(recorded.cublas_lib),
    )


def test_a_resumed_profiled_sweep_keeps_the_recorded_clock_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ncu, ncu_calls = fake_ncu(tmp_path, fail=False, exports=H100_RUN)
    recorded = start_recorded_run(tmp_path, profile=True, candidate_limit=None, ncu=ncu)
    assert rundir.read_env(recorded.run_dir)["profiled"] is True
    stand_in_machine(monkeypatch, ncu)
    with deadline(DEADLINE_S):
        sweep_setup.sweep(SweepOptions(resume=recorded.run_dir))

    profiling = call_records(ncu_calls)[0]
    assert option_after(profiling, "--clock-control") == "base"
    probe_argv = profiling[profiling.index("--log-file") + 2 :]
    assert probe_argv[:3] == [recorded.python, "-m", PROBE_MODULE]
    assert option_after(probe_argv, "--phase") == "profile"
    assert [option_after(s["argv"], "--phase") for s in seen(tmp_path)[1:]] == [
        "profile",
        "time",
        "recheck",  # the recorded times leave a comparison unsure
    ]


# ----- refused or accepted -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--probe-python", sys.executable], "recorded with probe-python"),
        (["--cublas-lib", "{other_lib}"], "recorded with cublas-lib"),
        (["--probe-env", f"{TAG}=second-half"], f"recorded with another --probe-env for {TAG}"),
        (["--clock-control", "none"], "recorded with clock-control 'base'"),
        (["--profile"], "recorded with profile False"),
        (["--reference"], "recorded with reference False"),
        (["--min-reps", "20"], "recorded with min-reps 37"),
        (["--candidates", "--limit", "9"], "recorded with candidate-limit 8"),
    ],
)
def test_resume_refuses_an_option_that_contradicts_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    recorded = start_recorded_run(tmp_path)
    other_lib = cublas_dir(tmp_path / "cublas-12.9")
    before = (recorded.run_dir / rundir.ENV_FILE).read_bytes()
    collected = stand_in_machine(monkeypatch)
    args = [arg.format(other_lib=other_lib) for arg in args]
    with deadline(DEADLINE_S):
        result = runner.invoke(app, ["sweep", "--resume", str(recorded.run_dir), *args])

    assert result.exit_code == 2, result.output
    [error] = errors(result.output)
    assert error.startswith(f"error: --resume: {recorded.run_dir} was {said}")
    assert collected == []  # refused before the machine is looked at
    assert (recorded.run_dir / rundir.ENV_FILE).read_bytes() == before


def test_resume_accepts_options_equal_to_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = start_recorded_run(tmp_path)
    given = {k: v for k, v in expected(recorded).items() if k not in ("cases", "gpu_label")}
    resume = SweepOptions(resume=recorded.run_dir)
    assert checked(SweepOptions(resume=recorded.run_dir, **given)) == checked(resume)

    # through the CLI: every option given, equal to the record, gets past the checks to the GPU
    monkeypatch.setattr(
        environment, "collect", lambda ncu=None, device=None: environment.Environment()
    )
    args = ["--probe-python", recorded.python, "--cublas-lib", str(recorded.cublas_lib)]
    args += ["--probe-env", f"{TAG}=first-half", "--clock-control", "base", "--no-profile"]
    args += ["--no-reference", "--min-reps", "37", "--candidates", "--limit", "8"]
    with deadline(DEADLINE_S):
        result = runner.invoke(app, ["sweep", "--resume", str(recorded.run_dir), *args])
    assert result.exit_code == 3, result.output
    assert errors(result.output) == ["error: no NVIDIA GPU found here (nvidia-smi sees none)"]


def test_resume_refuses_a_cublas_lib_the_run_was_not_started_with(tmp_path: Path) -> None:
    recorded = start_recorded_run(tmp_path)
    record = rundir.read_env(recorded.run_dir)
    rundir.write_env(recorded.run_dir, {**record, "cublas_lib": None})
    with pytest.raises(AuditError, match="cublas-lib"):
        checked(SweepOptions(resume=recorded.run_dir, cublas_lib=recorded.cublas_lib))
