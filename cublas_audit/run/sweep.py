"""The sweep: plan -> probe under ncu -> timing -> candidates -> dispatch table, resumable.

The run directory is the sweep's only state (table.rundir names its files). Profiling runs
in chunks, each an ncu report of its own (ncu/chunk-NNN.ncu-rep and its CSV export): a finished
chunk is never redone. Timing appends one JSON line per finished case to timing.jsonl. `--resume
DIR` reads both back and runs only what is missing, so an interrupted or crashed sweep loses at
most the case in flight. Every measurement (profiling, timing, the candidate audit) runs in the
probe's child process, under one interpreter, one cuBLAS and one probe environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cublas_audit.errors import AuditError, InterruptedSweepError
from cublas_audit.files import write_text_atomic
from cublas_audit.judge import candidates
from cublas_audit.observe import ncu_command
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case, candidate_problems
from cublas_audit.run.probe_process import (
    DONE_LINE,
    START_LINE,
    ProbeCommand,
    check_loaded_cublas,
    run_streaming,
)
from cublas_audit.run.run_table import (
    probe_versions,
    record_finish,
    unfinished_cases,
    write_run_table,
)
from cublas_audit.table import candidates_table, rundir
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.rundir import (
    CANDIDATE_RESULTS,
    CANDIDATES_FILE,
    NCU_DIR,
    PLAN_FILE,
    PROFILE_RESULTS,
    TIME_RESULTS,
)
from cublas_audit.vocabulary import Phase

# Cases per ncu process: each start costs seconds (interpreter, CUDA context, ncu attach), so
# the default batched grid (36 profiled cases) runs in one; resume redoes at most one chunk.
CHUNK_SIZE = 40
PARTIAL_TABLE_LIMIT = 20_000  # cases beyond which Ctrl-C counts what is saved, writes no table
PROBE_LOG_LINES = 3  # lines of probe.log quoted when the probe fails before any case
# A comparison left unsure is timed again with this many times the repetitions (its interval
# narrows by about the square root), the two sides interleaved.
RECHECK_REPS_FACTOR = 5
# A probe stopped by Ctrl-C (SIGINT: Python's exit status -2, or 130 through a shell). The
# terminal sends SIGINT to every process of the foreground group: a probe may stop before the
# sweep sees the signal, and its case in flight is then still to do, not an error.
INTERRUPTED_CODES = (-2, 130)


@dataclass
class SweepConfig:
    """Everything a started sweep needs; `run.sweep_setup.sweep` makes it (through `_config`) from
    the user's options, after checking them."""

    cases: list[Case]
    run_dir: Path
    gpu_label: str
    ncu: str | None
    clock_control: str = "none"
    probe: ProbeCommand = field(default_factory=ProbeCommand)
    reference: bool = True
    min_reps: int = 20
    candidate_limit: int | None = None
    candidate_threshold: float = candidates.DEFAULT_THRESHOLD
    candidate_min_reps: int = candidates_table.DEFAULT_MIN_REPS
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES
    cublas_lib: Path | None = None
    # time: the sweep's timing (full check, event timing, then CUPTI); map: the dispatch
    # map's fast pass (quick check, min_reps calls timed and traced at once, no recheck);
    # candidates: the cuBLASLt candidate audit of the plan's problems and nothing else.
    phase: Phase = Phase.time
    # The timed calls find their operands in L2 (--warm); else cold: L2 flushed before each
    warm: bool = False
    # A large run's probe records folded at its end (False: by the caller, SweepOptions.fold)
    fold: bool = True

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)  # a member however it was given (another word: ValueError)

    @property
    def measures_calls(self) -> bool:
        """Whether the run profiles and times the planned calls (every phase but candidates)."""
        return self.phase is not Phase.candidates


@dataclass
class Progress:
    """What the sweep reports as it goes; the CLI draws it (rich), tests can record it."""

    start: Callable[[int], None] = lambda total: None
    current: Callable[[str], None] = lambda case_id: None
    advance: Callable[[str], None] = lambda case_id: None
    note: Callable[[str], None] = lambda message: None


def run(config: SweepConfig, progress: Progress | None = None) -> pd.DataFrame:
    """Profiles and times every case not yet done, then writes the table (a candidates run:
    audits every problem not yet done, then writes candidates.csv). Ctrl-C keeps progress."""
    progress = progress or Progress()
    measured = config.cases if config.measures_calls else []
    profiled = [c for c in measured if c.profiled] if config.ncu else []
    chunks = _chunks(profiled)
    pending_chunks = [
        (i, chunk) for i, chunk in enumerate(chunks) if not _chunk_done(config.run_dir, i)
    ]
    done = rundir.read_results(config.run_dir / TIME_RESULTS)
    pending_time = [c for c in measured if c.case_id not in done]
    progress.start(sum(len(chunk) for _, chunk in pending_chunks) + len(pending_time))
    started = time.perf_counter()
    phase_seconds: dict[str, float] = {}
    try:
        with _timed(phase_seconds, "profile"):
            for index, chunk in pending_chunks:
                _profile_chunk(config, index, chunk, progress)
        with _timed(phase_seconds, "time"):
            _time_cases(config, pending_time, progress)
        if config.phase is Phase.time:
            with _timed(phase_seconds, "recheck"):
                _recheck_unsure(config, progress)
        if config.candidate_limit is not None:
            with _timed(phase_seconds, "candidates"):
                _audit_candidates(config, progress)
    except KeyboardInterrupt:
        rundir.add_interrupted_part(config.run_dir, time.perf_counter() - started, phase_seconds)
        command = config.phase.command
        finished, total = _saved_on_interrupt(config)
        raise InterruptedSweepError(
            f"interrupted: {finished} of {total} cases are saved in {config.run_dir}; "
            f"finish with: cublas-audit {command} --resume {config.run_dir}"
        ) from None
    frame = write_outputs(config)
    record_finish(config.run_dir, time.perf_counter() - started, phase_seconds)
    if config.fold and len(config.cases) >= rundir.COLUMNAR_ROWS:  # a large run (its table
        rundir.compact_results(config.run_dir)  # columnar too): the probe's records folded
    rundir.forget_records()
    return frame


def _saved_on_interrupt(config: SweepConfig) -> tuple[int, int]:
    """(cases finished, cases planned) of an interrupted run, with its table written as far as
    it goes; a plan over PARTIAL_TABLE_LIMIT cases only counts its finished ones (the table of a
    262,144-case map takes tens of seconds to assemble: its --resume writes it)."""
    if config.measures_calls and len(config.cases) > PARTIAL_TABLE_LIMIT:
        return len(rundir.read_results(config.run_dir / TIME_RESULTS)), len(config.cases)
    frame = write_outputs(config)
    if config.measures_calls:
        return int(frame["status"].ne("not-run").sum()), len(config.cases)
    return int(frame["case_id"].nunique()), len(candidate_problems(config.cases))


def write_outputs(config: SweepConfig) -> pd.DataFrame:
    """The run's table as its directory holds it now: dispatch.csv written, or a candidates run's
    candidates.csv (an interrupted audit's rows from its journal: candidates.csv is written only
    by a whole audit, which is how a resumed run knows it is done)."""
    if config.measures_calls:
        return write_table(config)
    path = config.run_dir / CANDIDATES_FILE
    if path.exists():
        return candidates_table.read_candidates(path)
    finished = candidates_table.read_journal(config.run_dir / CANDIDATE_RESULTS)
    problems = candidate_problems(config.cases)
    return candidates_table.from_records(
        row for p in problems for row in finished.get(p.case_id, [])
    )


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


def _probe_args(config: SweepConfig, phase: str, only: Path | None) -> list[str]:
    results = {"profile": PROFILE_RESULTS}.get(phase, TIME_RESULTS)
    args = ["--plan", str(config.run_dir / PLAN_FILE), "--phase", phase]
    args += ["--results", str(config.run_dir / results), "--min-reps", str(config.min_reps)]
    args += ["--gpu-label", config.gpu_label]
    if only is not None:
        args += ["--only", str(only)]
    if config.candidate_limit is not None:
        args += ["--limit", str(config.candidate_limit)]
        args += ["--threshold", str(config.candidate_threshold)]
        args += ["--candidate-min-reps", str(config.candidate_min_reps)]
        args += ["--workspace-bytes", str(config.workspace_bytes)]
    return (
        args + (["--reference"] if config.reference else []) + (["--warm"] if config.warm else [])
    )


def _write_only(config: SweepConfig, name: str, cases: Sequence[Case]) -> Path:
    return write_text_atomic(
        config.run_dir / NCU_DIR / name, "".join(c.case_id + "\n" for c in cases)
    )


def _run_probe(
    config: SweepConfig, argv: list[str], progress: Progress, results: Path | None = None
) -> int:
    """The probe run to its end (its `results` parsed while it writes them, rundir.following:
    what the sweep reads next, at once), then what it loaded checked."""
    on_line = _on_probe_line(progress, config.run_dir)
    with rundir.following(results) if results is not None else nullcontext():
        code = run_streaming(argv, config.probe.env, on_line, config.probe.cwd)
    check_loaded_cublas(probe_versions(config.run_dir), config.cublas_lib)
    return code


def _profile_chunk(config: SweepConfig, index: int, chunk: list[Case], progress: Progress) -> None:
    assert config.ncu is not None
    report, csv_path, log = _chunk_paths(config.run_dir, index)
    only = _write_only(config, f"chunk-{index:03d}.cases", chunk)
    argv = ncu_command.ncu_argv(config.ncu, report, log, config.clock_control)
    argv += config.probe.argv(_probe_args(config, "profile", only))
    code = _run_probe(config, argv, progress)
    ncu_command.check_ncu_log(log, code)
    if not report.exists():
        raise AuditError(
            f"ncu wrote no report for chunk {index} (exit code {code}; log: {log})"
            + _probe_log_tail(config.run_dir)
        )
    ncu_command.export_csv(config.ncu, report, csv_path)


def _time_cases(config: SweepConfig, cases: list[Case], progress: Progress) -> None:
    """Runs the probe until every case has a result; a case that kills it is an error row. A probe
    that finishes no case and names no culprit is an error, never a retry."""
    results_path = config.run_dir / TIME_RESULTS
    remaining = cases
    careful = 0  # the map's first cases one at a time: after a crash with several in flight
    # the whole plan in its order, at first: no list of ids (a full map's 262,144 written here,
    # then looked up in the probe: ~1 s of its start-up on the H100 host, with the GPU idle)
    whole = len(cases) == len(config.cases)
    while remaining:
        only = None if whole else _write_only(config, "timing.cases", remaining)
        whole = False
        args = _probe_args(config, config.phase, only)
        args += ["--careful", str(careful)] if careful else []
        code = _run_probe(config, config.probe.argv(args), progress, results_path)
        if code in INTERRUPTED_CODES:  # Ctrl-C reached the probe first: stop, never an error row
            raise KeyboardInterrupt
        done = rundir.read_results(results_path)
        if all(c.case_id in done for c in remaining):  # (a map's 262,144 records not walked again)
            return
        in_flight = unfinished_cases(results_path, done)
        if not in_flight and not any(c.case_id in done for c in remaining):
            raise AuditError(
                f"the probe finished no case (exit code {code}; log: "
                f"{config.run_dir / rundir.PROBE_LOG})" + _probe_log_tail(config.run_dir)
            )
        careful = len(in_flight) if len(in_flight) > 1 else 0
        if careful:  # the map queues many cases at once: which one killed it is not known yet
            progress.note(f"probe died with {careful} cases in flight; retrying them one by one")
        culprit = in_flight[0] if len(in_flight) == 1 else None
        if culprit is not None:
            detail = f"the probe died during this case (exit code {code})"
            rundir.append_record(
                results_path,
                {"event": "done", "case_id": culprit, "phase": config.phase, "status": "error",
                 "detail": detail},
            )  # fmt: skip
            progress.note(f"probe died during {culprit} (exit code {code}); continuing")
        done = rundir.read_results(results_path)
        # the cases in flight first: --careful runs the first ones of the list one by one
        first = set(in_flight) - set(done)
        remaining = sorted(
            (c for c in remaining if c.case_id not in done), key=lambda c: c.case_id not in first
        )


def _recheck_unsure(config: SweepConfig, progress: Progress) -> None:
    """Times again, longer and interleaved, the cases of every timing comparison the first pass
    left unsure (rules.unsure_case_ids), so that the report's verdict rests on the longer
    measurement; the new results supersede the first ones. Once per run: a resumed sweep that
    finds the record of a recheck does not repeat it."""
    from cublas_audit.judge.rules import unsure_case_ids

    record = config.run_dir / rundir.RECHECKED
    if record.exists():
        return
    wanted = set(unsure_case_ids(write_table(config)))
    cases = [c for c in config.cases if c.case_id in wanted]
    if cases:
        progress.note(f"re-measuring {len(cases)} cases of unsure comparisons, interleaved")
        only = _write_only(config, "recheck.cases", cases)
        args = _probe_args(config, "recheck", only)
        reps = args.index("--min-reps") + 1
        args[reps] = str(config.min_reps * RECHECK_REPS_FACTOR)
        _run_probe(config, config.probe.argv(args), progress)
    write_text_atomic(record, "".join(c.case_id + "\n" for c in cases))


def _probe_log_tail(run_dir: Path) -> str:
    """': <last lines of probe.log>' (the real cause: a missing module, a CUDA error), or ''."""
    path = run_dir / rundir.PROBE_LOG
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return (": " + " | ".join(lines[-PROBE_LOG_LINES:])) if lines else ""


def _audit_candidates(config: SweepConfig, progress: Progress) -> None:
    """cuBLASLt's alternative algorithms for every problem, in the probe's child; once per run.
    The problems an interrupted audit finished (its journal) are not measured again."""
    path = config.run_dir / CANDIDATES_FILE
    if path.exists():
        return
    finished = candidates_table.read_journal(config.run_dir / CANDIDATE_RESULTS)
    progress.start(sum(p.case_id not in finished for p in candidate_problems(config.cases)))
    code = _run_probe(config, config.probe.argv(_probe_args(config, "candidates", None)), progress)
    if code in INTERRUPTED_CODES:
        raise KeyboardInterrupt
    if code != 0 or not path.exists():
        raise AuditError(
            f"the candidate audit failed (exit code {code}; log: "
            f"{config.run_dir / rundir.CANDIDATES_LOG})"
        )
    env = EnvRecord.read(config.run_dir)
    candidates_table.write_candidates(
        candidates_table.measured_on(candidates_table.read_candidates(path), env), path
    )


def _on_probe_line(progress: Progress, run_dir: Path) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        if line.startswith(START_LINE):
            progress.current(line.removeprefix(START_LINE))
        elif line.startswith(DONE_LINE):
            progress.advance(line.removeprefix(DONE_LINE))
        else:
            with (run_dir / rundir.PROBE_LOG).open("a") as log:
                log.write(line + "\n")

    return on_line


def write_table(config: SweepConfig) -> pd.DataFrame:
    """The dispatch table of what the run directory holds now, written to dispatch.csv."""
    return write_run_table(config.run_dir, config.cases, config.gpu_label)
