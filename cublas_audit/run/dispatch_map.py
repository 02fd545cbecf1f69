"""The dispatch map: dense grids of problems, observed cheaply, then the cases it flags observed
deeply.

Screen wide: every planned case runs once through the probe's `map` phase, in one long-lived
child process (a quick float64 check, then a few calls timed with CUDA events and traced with
CUPTI at once: kernel names, kernel-only times, launch geometry; no counter permission). Results
stream into the run directory's timing.jsonl as they finish, so an interrupted map resumes where
it stopped (`map --resume DIR`, the sweep's own resume). The table has the sweep's schema.

Confirm deep: `--follow-up` takes the cases the map's rules flag (size-inversion, dispatch-cliff),
and the faster neighbour each was compared with, through a normal sweep into `follow-up/` inside
the map's run directory: ncu counters and stalls where ncu may run, full-length timing with the
reference kernel, and cuBLASLt's candidates, so each finding arrives with its evidence.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from cublas_audit.forked import Forks
from cublas_audit.gc_pause import collector_paused
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.map_audit import map_findings
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.observe.environment import Gpu
from cublas_audit.observe.observer import Observer
from cublas_audit.planning.cases import Case, with_cause_removed_companions
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.run import multi_gpu
from cublas_audit.run.sweep import Progress
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import Measured, sweep
from cublas_audit.table import rundir
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.vocabulary import Phase

DEFAULT_REPS = 5  # timed and traced calls per case (kernel times vary ~1 % call to call)
DEFAULT_FOLLOW_UP = 8  # findings the follow-up takes deep, largest effect first
FOLLOW_UP_CANDIDATES = 32  # cuBLASLt candidates per followed-up problem
WRITE_FORK_ROWS = 20_000  # a merged table of this many rows is written in a fork (below: here)


@dataclass(frozen=True)
class MapResult:
    """A finished map: its directory and table (None for a replicated map: its units are
    compared), the follow-up's run directory, the map's findings (judged once, here) and the
    table as prepared for them (rules.prepare), and for a spread map its shards. The caller
    writes the reports (cublas_audit.jobs)."""

    run_dir: Path
    frame: pd.DataFrame | None
    follow_up: Path | None = None
    findings: list[Finding] = field(default_factory=list)
    shards: list[Path] = field(default_factory=list)
    rows: pd.DataFrame | None = None
    # seconds after the GPUs, before the report: merge (a spread map's), judge, fold_wait (the
    # probe records' folds still running once judged)
    after_gpu: dict[str, float] = field(default_factory=dict)


def run(
    options: SweepOptions,
    follow_up: int | None = None,
    thresholds: Thresholds | None = None,
    progress: Progress | None = None,
    spread: multi_gpu.Spread | None = None,
    progress_for: Callable[[Gpu], Progress] | None = None,
) -> MapResult:
    """The map (new or resumed; on one GPU, or spread over several), then with `follow_up` the
    deep tier for that many findings (on the first GPU)."""
    # the probe's records folded here, beside the merge and the judging, not before them
    options = replace(options, phase=Phase.map, fold=False)
    shards: list[Path] = []
    if spread is None:
        mapped = sweep(options, progress)
        folded = [mapped.run_dir] if len(mapped.frame) >= rundir.COLUMNAR_ROWS else []
    else:
        plan, shards = multi_gpu.on_devices(options, spread, progress_for)
        if plan.replicate:  # (each unit's report comes next: its records folded first)
            with rundir.folding(shards):
                return MapResult(plan.run_dir, None, shards=shards)
        folded = shards
    spent: dict[str, float] = {}
    clock = time.perf_counter()
    with rundir.folding(folded):
        written: Forks[Path] | None = None
        if spread is not None:
            mapped = Measured(plan.run_dir, multi_gpu.merged_frame(plan, shards), Phase.map)
            spent["merge"], clock = _lap(clock)
            # the merged table written in a fork while it is judged here (a full map's
            # dispatch.parquet: ~0.7 s of CPU here); done before anything reads it
            write = functools.partial(rundir.write_run_table, mapped.frame, plan.run_dir)
            written = Forks([write], enabled=len(mapped.frame) >= WRITE_FORK_ROWS)
        # judged once, here: the follow-up and the report share it (a full map's findings:
        # gc_pause)
        with collector_paused():
            rows = prepare(mapped.frame)  # (the report's too: judge.map_audit.audit_map)
            found = map_findings(mapped.frame, thresholds, rows)
        if written is not None:
            written.results()
        spent["judge"], clock = _lap(clock)
    spent["fold_wait"], clock = _lap(clock)
    deep = None
    if follow_up:
        deep = run_follow_up(mapped, options, found[:follow_up], progress)
    return MapResult(mapped.run_dir, mapped.frame, deep, found, shards, rows, spent)


def _lap(since: float) -> tuple[float, float]:
    """(seconds since `since`, rounded; now)."""
    now = time.perf_counter()
    return round(now - since, 2), now


def follow_up_cases(
    frame: pd.DataFrame, cases: Sequence[Case], followed: Sequence[Finding]
) -> list[Case]:
    """The cases of the findings followed up and of the rows they were compared with, in plan
    order."""
    rows = prepare(frame)
    wanted: set[str] = set()
    for finding in followed:
        labels = [*finding.rows, *finding.compared]
        wanted.update(str(rows.loc[label, "case_id"]) for label in labels)
    return [case for case in cases if case.case_id in wanted]


def run_follow_up(
    mapped: Measured,
    options: SweepOptions,
    followed: Sequence[Finding],
    progress: Progress | None,
) -> Path | None:
    """The flagged cases through a sweep into follow-up/ (resumed where it was started): ncu
    where it may run (else CUPTI), the reference, cuBLASLt's candidates."""
    out = mapped.run_dir / rundir.FOLLOW_UP_DIR
    cases = follow_up_cases(mapped.frame, read_plan(mapped.run_dir / rundir.PLAN_FILE), followed)
    # an unaligned case's cause removed (padded, the other layout), measured beside it
    cases = with_cause_removed_companions(cases)
    if not cases:
        (progress or Progress()).note("follow-up: the map flagged nothing")
        return None
    started = (out / rundir.PLAN_FILE).exists()
    record = EnvRecord.read(mapped.run_dir)  # the map's probe settings, also when resumed
    cublas_lib = record.cublas_lib
    deep = SweepOptions(
        cases=[] if started else cases,
        gpu_label=str(record.gpu_label or options.gpu_label or "") or None,
        out=None if started else out,
        resume=out if started else None,
        probe_python=None if started else record.probe_python,
        cublas_lib=None if started or not cublas_lib else Path(cublas_lib),
        probe_env={} if started else dict(record.probe_env),
        candidate_limit=None if started else FOLLOW_UP_CANDIDATES,
        command=[*options.command, f"(follow-up of {len(cases)} cases)"],
        phase=None if started else Phase.time,
        warm=None if started else options.warm,
        # ncu where it can run (the sweep's default); events where the map was told not to trace
        observer=Observer.events if record.observer == Observer.events and not started else None,
    )
    (progress or Progress()).note(f"follow-up: {len(cases)} cases to the deep tier")
    return sweep(deep, progress).run_dir
