"""`cublas-audit merge RUN... --out DIR`: shard run directories (`--shard I/N`) joined into one
run directory, then its report as the phase's measuring job writes it (jobs.run_reports).

    DIR/plan.json       the whole plan
    DIR/dispatch.csv    the shards' tables as one, in plan order (where the shards have them;
                        dispatch.parquet from rundir.COLUMNAR_ROWS rows)
    DIR/candidates.csv  the shards' candidate audits as one (where the shards have them)
    DIR/env.json        the first shard's record of what was measured, each shard listed (its
                        host, GPU, times), the versions and settings merged with --allow-mixed
    DIR/report.md       the run's, the map's or the candidate audit's report
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.forked import Forks
from cublas_audit.gc_pause import collector_paused
from cublas_audit.jobs.measure import SweepResult
from cublas_audit.jobs.run_reports import (
    write_candidates_report,
    write_map_report,
    write_run_report,
)
from cublas_audit.judge.map_audit import map_findings
from cublas_audit.judge.rules import prepare
from cublas_audit.planning import plan_file
from cublas_audit.run.dispatch_map import WRITE_FORK_ROWS
from cublas_audit.run.sweep_options import check_new_run_dir
from cublas_audit.table import candidates_table, rundir, shard_merge
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.trace_record import read_trace_record, write_trace_record
from cublas_audit.vocabulary import Phase


@dataclass(frozen=True)
class MergeJob:
    """What `merge` was asked: the shard run directories, where the merged run goes, whether
    versions, settings and GPU models may differ, and the command line (recorded)."""

    runs: list[Path]
    out: Path
    allow_mixed: bool = False
    command: list[str] = field(default_factory=list)


def run(job: MergeJob) -> SweepResult:
    """Every check first (nothing is written on a refusal), then the merged run and its report."""
    shard_merge.check_out(job.out, job.runs)
    check_new_run_dir(job.out)
    _check_given_once(job.runs)
    shards = [shard_merge.read_shard(path) for path in job.runs]
    return write_merged(shards, job.out, job.allow_mixed, job.command)


def write_merged(
    shards: list[shard_merge.ShardRun],
    out: Path,
    allow_mixed: bool,
    command: list[str],
    record: dict[str, Any] | None = None,
    timings: dict[str, float] | None = None,
) -> SweepResult:
    """The shards checked, then merged into `out` and reported (`merge`, and a Ray run into its
    own directory, whose `record` of the engine joins the merged env.json; `timings`: merge_s,
    and a map's judge_s and report_s, added)."""
    began = time.perf_counter()
    shard_merge.check_shards(shards, allow_mixed)
    with collector_paused():  # (its tables' millions of cells, as judging's findings)
        merged = shard_merge.merge(shards, command)
    merged = replace(merged, env={**merged.env, **(record or {})})
    out.mkdir(parents=True, exist_ok=True)
    plan_file.write(merged.plan, out / rundir.PLAN_FILE)
    phase = EnvRecord.of(merged.env, out / rundir.ENV_FILE).phase
    table = merged.table
    # a large map's merged table written in a fork while it is judged here (a full map's
    # dispatch.parquet: ~0.7 s of CPU here), as a --devices map's is (run.dispatch_map)
    forked = False
    written: Forks[Path] = Forks([])
    if table is not None:
        forked = phase is Phase.map and len(table) >= WRITE_FORK_ROWS
        written = Forks([functools.partial(rundir.write_run_table, table, out)], enabled=forked)
        if not forked:
            written.results()
    if merged.candidates is not None:
        candidates_table.write_candidates(merged.candidates, out / rundir.CANDIDATES_FILE)
    traced = read_trace_record(shards[0].path)  # every shard holds the whole plan's record
    if traced is not None:
        write_trace_record(traced, out)
    rundir.write_env(out, merged.env)
    if timings is not None:
        timings["merge_s"] = round(time.perf_counter() - began, 2)
    if forked:
        assert table is not None
        report = _map_report(out, table, written, timings)
    else:
        report = _report(out, merged, timings)
    return SweepResult(out, merged.table, report, [s.path for s in shards])


def _map_report(
    out: Path, table: pd.DataFrame, written: Forks[Path], timings: dict[str, float] | None
) -> Path:
    """A large merged map judged here while its table is written (`written`), then, the table
    on disk, its report with the findings and the table as prepared for them."""
    began = time.perf_counter()
    with collector_paused():
        rows = prepare(table)
        found = map_findings(table, None, rows)
    written.results()
    judged = time.perf_counter() - began
    spent: dict[str, float] = {}
    report = write_map_report(out, None, found, table, spent, rows)
    if timings is not None:
        timings["judge_s"] = round(judged + spent["judge_s"], 2)
        timings["report_s"] = spent["report_s"]
    return report


def _check_given_once(runs: list[Path]) -> None:
    seen: set[Path] = set()
    for run in runs:
        if run.resolve() in seen:
            raise AuditError(f"merge: {run} is given twice")
        seen.add(run.resolve())


def _report(out: Path, merged: shard_merge.Merged, timings: dict[str, float] | None) -> Path:
    phase = EnvRecord.of(merged.env, out / rundir.ENV_FILE).phase
    if phase is Phase.map:  # (the table in memory: not read again)
        return write_map_report(out, frame=merged.table, timings=timings)
    if phase is Phase.candidates:
        assert merged.candidates is not None  # check_shards: every candidates shard has one
        return write_candidates_report(out, merged.candidates)
    return write_run_report(out)
