"""The sweep: plan -> probe under ncu -> timing -> dispatch table -> report, resumable.

The run directory is the sweep's only state. Profiling runs in chunks, each an ncu report of its
own (ncu/chunk-NNN.ncu-rep and its CSV export): a finished chunk is never redone. Timing appends
one JSON line per finished case to timing.jsonl. `--resume DIR` reads both back and runs only what
is missing, so an interrupted or crashed sweep loses at most the case in flight.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit import __version__, assemble, ncu_parse, profile, table
from cublas_audit.cases import PLAN_FILE, Case, read_plan, write_plan
from cublas_audit.environment import Environment, format_cublas_version
from cublas_audit.errors import AuditError, InterruptedSweepError

ENV_FILE = "env.json"
PROFILE_RESULTS = "profile.jsonl"
TIME_RESULTS = "timing.jsonl"
NCU_DIR = "ncu"
# Cases per ncu process: each start costs seconds (interpreter, CUDA context, ncu attach), so
# the default batched grid (36 profiled cases) runs in one; resume redoes at most one chunk.
CHUNK_SIZE = 40
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class SweepConfig:
    cases: list[Case]
    run_dir: Path
    gpu_label: str
    command: list[str]
    ncu: str | None
    clock_control: str = "none"
    probe: profile.ProbeCommand = field(default_factory=profile.ProbeCommand)
    reference: bool = True
    min_reps: int = 20
    candidate_limit: int | None = None


@dataclass
class Progress:
    """What the sweep reports as it goes; the CLI draws it (rich), tests can record it."""

    start: Callable[[int], None] = lambda total: None
    current: Callable[[str], None] = lambda case_id: None
    advance: Callable[[str], None] = lambda case_id: None
    note: Callable[[str], None] = lambda message: None


def parse_probe_env(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise AuditError(f"--probe-env: {item!r} is not KEY=VALUE with a valid variable name")
        env[key] = value
    return env


def probe_environment(extra: Mapping[str, str], cublas_lib: Path | None) -> dict[str, str]:
    """The child's environment: ours, the user's additions, and a cuBLAS directory first."""
    env = dict(os.environ)
    env.update(extra)
    if cublas_lib is not None:
        if not cublas_lib.is_dir():
            raise AuditError(f"--cublas-lib: {cublas_lib} is not a directory")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(cublas_lib), env.get("LD_LIBRARY_PATH", "")) if p
        )
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(profile.PROBE.parent.parent), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_run(config: SweepConfig, environment: Environment, probe_env: Mapping[str, str]) -> None:
    config.run_dir.mkdir(parents=True, exist_ok=True)
    (config.run_dir / NCU_DIR).mkdir(exist_ok=True)
    write_plan(config.cases, config.run_dir / PLAN_FILE)
    write_env(
        config.run_dir,
        {
            "gpu_label": config.gpu_label,
            **environment.to_json(),
            "probe_env": dict(probe_env),
            "probe_python": config.probe.python,
            "ncu_clock_control": config.clock_control,
            "profiled": config.ncu is not None,
            "reference": config.reference,
            "candidate_limit": config.candidate_limit,
            "command": config.command,
            "tool_version": __version__,
            "started": _now(),
        },
    )


def check_new_run_dir(run_dir: Path) -> None:
    """A new sweep starts in an empty or absent directory: one holding an earlier run would have
    its plan and env.json overwritten and its finished cases counted as this sweep's."""
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise AuditError(
            f"--out: {run_dir} is not empty; finish an earlier sweep there with "
            f"--resume {run_dir}, or pick a new directory"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise AuditError(f"--out: {run_dir} is a file, not a directory")


def resume_cases(run_dir: Path) -> tuple[list[Case], dict[str, Any]]:
    if not (run_dir / PLAN_FILE).exists() or not (run_dir / ENV_FILE).exists():
        raise AuditError(
            f"--resume: {run_dir} is not a cublas-audit run directory (no plan.json/env.json)"
        )
    return read_plan(run_dir / PLAN_FILE), read_env(run_dir)


def read_env(run_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((run_dir / ENV_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise AuditError(f"{run_dir / ENV_FILE}: unreadable ({exc})") from exc
    return data


def write_env(run_dir: Path, data: Mapping[str, Any]) -> None:
    tmp = run_dir / (ENV_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(run_dir / ENV_FILE)


def run(config: SweepConfig, progress: Progress) -> pd.DataFrame:
    """Profiles and times every case not yet done, then writes the table. Ctrl-C keeps progress."""
    env = dict(config.probe.env)
    profiled = [c for c in config.cases if c.profiled] if config.ncu else []
    chunks = _chunks(profiled)
    pending_chunks = [
        (i, chunk) for i, chunk in enumerate(chunks) if not _chunk_done(config.run_dir, i)
    ]
    pending_time = [
        c for c in config.cases if c.case_id not in read_results(config.run_dir / TIME_RESULTS)
    ]
    progress.start(sum(len(chunk) for _, chunk in pending_chunks) + len(pending_time))
    started = time.perf_counter()
    phase_seconds: dict[str, float] = {}
    try:
        with _timed(phase_seconds, "profile"):
            for index, chunk in pending_chunks:
                _profile_chunk(config, env, index, chunk, progress)
        with _timed(phase_seconds, "time"):
            _time_cases(config, env, pending_time, progress)
        if config.candidate_limit is not None:
            with _timed(phase_seconds, "candidates"):
                _audit_candidates(config, progress)
    except KeyboardInterrupt:
        frame = write_table(config)
        finished = frame["status"].ne("not-run").sum() if "status" in frame else 0
        raise InterruptedSweepError(
            f"interrupted: {finished} of {len(config.cases)} cases are saved in {config.run_dir}; "
            f"finish with: cublas-audit sweep --resume {config.run_dir}"
        ) from None
    frame = write_table(config)
    _record_finish(config.run_dir, time.perf_counter() - started, phase_seconds)
    return frame


@contextmanager
def _timed(seconds: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = round(time.perf_counter() - start, 2)


def _chunks(cases: Sequence[Case]) -> list[list[Case]]:
    return [list(cases[i : i + CHUNK_SIZE]) for i in range(0, len(cases), CHUNK_SIZE)]


def _chunk_paths(run_dir: Path, index: int) -> tuple[Path, Path, Path]:
    stem = run_dir / NCU_DIR / f"chunk-{index:03d}"
    return stem.with_suffix(".ncu-rep"), stem.with_suffix(".csv"), stem.with_suffix(".log")


def _chunk_done(run_dir: Path, index: int) -> bool:
    return _chunk_paths(run_dir, index)[1].exists()


def _probe_args(config: SweepConfig, phase: str, only: Path) -> list[str]:
    args = ["--plan", str(config.run_dir / PLAN_FILE), "--phase", phase, "--only", str(only)]
    args += [
        "--results",
        str(config.run_dir / (PROFILE_RESULTS if phase == "profile" else TIME_RESULTS)),
    ]
    args += ["--min-reps", str(config.min_reps)]
    return args + (["--reference"] if config.reference else [])


def _write_only(config: SweepConfig, name: str, cases: Sequence[Case]) -> Path:
    path = config.run_dir / NCU_DIR / name
    path.write_text("".join(c.case_id + "\n" for c in cases))
    return path


def _profile_chunk(
    config: SweepConfig, env: Mapping[str, str], index: int, chunk: list[Case], progress: Progress
) -> None:
    assert config.ncu is not None
    report, csv_path, log = _chunk_paths(config.run_dir, index)
    only = _write_only(config, f"chunk-{index:03d}.cases", chunk)
    argv = profile.ncu_argv(config.ncu, report, log, config.clock_control)
    argv += config.probe.argv(_probe_args(config, "profile", only))
    code = profile.run_streaming(argv, env, _on_probe_line(progress, config.run_dir))
    profile.check_ncu_log(log, code)
    if not report.exists():
        raise AuditError(f"ncu wrote no report for chunk {index} (exit code {code}; log: {log})")
    profile.export_csv(config.ncu, report, csv_path)


def _time_cases(
    config: SweepConfig, env: Mapping[str, str], cases: list[Case], progress: Progress
) -> None:
    """Runs the probe until every case has a result; a case that kills it is an error row."""
    results_path = config.run_dir / TIME_RESULTS
    remaining = cases
    while remaining:
        only = _write_only(config, "timing.cases", remaining)
        argv = config.probe.argv(_probe_args(config, "time", only))
        code = profile.run_streaming(argv, env, _on_probe_line(progress, config.run_dir))
        done = read_results(results_path)
        culprit = _crashed_case(results_path, done)
        if code != 0 and culprit is None and not [c for c in remaining if c.case_id in done]:
            raise AuditError(f"the probe failed before running any case (exit code {code})")
        if culprit is not None:
            _append(
                results_path,
                {
                    "event": "done",
                    "case_id": culprit,
                    "phase": "time",
                    "status": "error",
                    "detail": f"the probe died during this case (exit code {code})",
                },
            )
            progress.note(f"probe died during {culprit} (exit code {code}); continuing")
        remaining = [c for c in remaining if c.case_id not in read_results(results_path)]


def _audit_candidates(config: SweepConfig, progress: Progress) -> None:
    """cuBLASLt's alternative algorithms for every problem (issue 5); done once per run dir."""
    from cublas_audit import candidates

    if (config.run_dir / candidates.CANDIDATES_FILE).exists():
        return
    candidates.run_candidates(
        config.cases,
        config.run_dir,
        config.candidate_limit or candidates.DEFAULT_LIMIT,
        gpu_label=config.gpu_label,
        progress=progress.note,
    )


def _on_probe_line(progress: Progress, run_dir: Path) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        if line.startswith("@@start "):
            progress.current(line.split(" ", 1)[1])
        elif line.startswith("@@done "):
            progress.advance(line.split(" ", 1)[1])
        else:
            with (run_dir / "probe.log").open("a") as log:
                log.write(line + "\n")

    return on_line


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """case_id -> its `done` record; a torn last line (crash mid-write) is ignored."""
    results: dict[str, dict[str, Any]] = {}
    for record in _records(path):
        if record.get("event") == "done":
            results[record["case_id"]] = record
    return results


def probe_versions(run_dir: Path) -> dict[str, Any]:
    versions: dict[str, Any] = {}
    for name in (PROFILE_RESULTS, TIME_RESULTS):
        for record in _records(run_dir / name):
            if record.get("event") == "probe":
                versions = record
    return versions


def _records(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


def _crashed_case(path: Path, done: Mapping[str, Any]) -> str | None:
    started = [r["case_id"] for r in _records(path) if r.get("event") == "start"]
    return next((c for c in reversed(started) if c not in done), None)


def _append(path: Path, record: Mapping[str, Any]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")


def collect_launches(run_dir: Path) -> list[ncu_parse.Launch]:
    launches: list[ncu_parse.Launch] = []
    for csv_path in sorted((run_dir / NCU_DIR).glob("chunk-*.csv")):
        launches.extend(ncu_parse.parse_csv_file(csv_path))
    return launches


def write_table(config: SweepConfig) -> pd.DataFrame:
    run_dir = config.run_dir
    env = read_env(run_dir)
    versions = probe_versions(run_dir)
    cublas = versions.get("cublas_version_int")
    context = {
        "gpu_label": config.gpu_label,
        "gpu_name": env.get("gpu_name"),
        "cc": env.get("cc"),
        "driver_version": env.get("driver_version"),
        "cublas_version": format_cublas_version(cublas) if cublas else env.get("cublas_version"),
    }
    frame = assemble.build_table(
        config.cases,
        collect_launches(run_dir),
        read_results(run_dir / PROFILE_RESULTS),
        read_results(run_dir / TIME_RESULTS),
        context,
    )
    table.write_table(frame, run_dir / table.TABLE_FILE)
    return frame


def _record_finish(run_dir: Path, seconds: float, phases: Mapping[str, float]) -> None:
    env = read_env(run_dir)
    versions = probe_versions(run_dir)
    if versions.get("cublas_version_int"):
        env["cublas_version"] = format_cublas_version(versions["cublas_version_int"])
    env.update(
        finished=_now(), sweep_seconds=round(seconds, 2), phase_seconds=dict(phases), probe=versions
    )
    write_env(run_dir, env)


def default_run_dir(label: str) -> Path:
    return Path("reports") / label / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def argv_for_record() -> list[str]:
    return ["cublas-audit", *sys.argv[1:]]
