"""Each measuring command's whole job: measure (cublas_audit.run returns data), then judge and
write the reports of what it measured (jobs.run_reports). The CLI and the Python API call these; the
run stage never picks or imports a report writer.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cublas_audit.jobs.run_reports import (
    write_candidates_report,
    write_map_report,
    write_run_report,
    write_units_report,
)
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.observe.environment import Gpu
from cublas_audit.run import dispatch_map, multi_gpu
from cublas_audit.run.sweep import Progress
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import Measured
from cublas_audit.run.sweep_setup import sweep as measure
from cublas_audit.table import rundir
from cublas_audit.vocabulary import Phase

ProgressFor = Callable[[Gpu], Progress]


@dataclass(frozen=True)
class SweepResult:
    """A finished run: its directory, its table, and the report written for it (units.md for a
    replicated run, whose table is None)."""

    run_dir: Path
    frame: pd.DataFrame | None
    report: Path
    shards: list[Path] = field(default_factory=list)
    follow_up: Path | None = None
    findings: list[Finding] = field(default_factory=list)


# What a map's report imports only when it draws (matplotlib's pyplot: ~0.7 s of CPU here, and
# each picture's fork imported it again): imported while the map is measured, in a thread (the
# measuring waits on its probes and shards), by the fork of each picture then inherited.
REPORT_IMPORTS = ("matplotlib.pyplot",)


def import_ahead(names: tuple[str, ...]) -> None:
    """`names` imported, pictures drawn to files (Agg: no display); one that fails is left to
    the report, which imports it again and says why."""
    for name in names:
        try:
            if name.startswith("matplotlib"):
                importlib.import_module("matplotlib").use("Agg")  # (as report.map_plots does)
            importlib.import_module(name)
        except Exception:  # (the report meets it again, in its own words)
            continue


def sweep(options: SweepOptions, progress: Progress | None = None) -> SweepResult:
    """A sweep (or a map pass, or a candidates run) on this machine's GPU and its report."""
    measured = measure(options, progress)
    return SweepResult(measured.run_dir, measured.frame, _report_of(measured))


def _report_of(measured: Measured, thresholds: Thresholds | None = None) -> Path:
    if measured.phase is Phase.map:
        return write_map_report(measured.run_dir, thresholds)
    if measured.phase is Phase.candidates:
        return write_candidates_report(measured.run_dir, measured.frame)
    return write_run_report(measured.run_dir)


def sweep_on_devices(
    options: SweepOptions, spread: multi_gpu.Spread, progress_for: ProgressFor | None = None
) -> SweepResult:
    """`sweep --devices`: the merged table's report, or (replicated) each unit's report and
    their comparison."""
    multi = multi_gpu.sweep_on_devices(options, spread, progress_for)
    if multi.frame is None:
        for shard in multi.shards:
            write_run_report(shard)
        units = write_units_report(multi.run_dir, multi.shards)
        return SweepResult(multi.run_dir, None, units, multi.shards)
    return SweepResult(multi.run_dir, multi.frame, write_run_report(multi.run_dir), multi.shards)


def candidates_on_devices(
    options: SweepOptions, spread: multi_gpu.Spread, progress_for: ProgressFor | None = None
) -> SweepResult:
    """`candidates --devices`: the merged candidates.csv and its report."""
    multi = multi_gpu.candidates_on_devices(options, spread, progress_for)
    assert multi.frame is not None  # a sharded run's merged table
    report = write_candidates_report(multi.run_dir, multi.frame)
    return SweepResult(multi.run_dir, multi.frame, report, multi.shards)


def dispatch_map_run(
    options: SweepOptions,
    follow_up: int | None = None,
    thresholds: Thresholds | None = None,
    progress: Progress | None = None,
    spread: multi_gpu.Spread | None = None,
    progress_for: ProgressFor | None = None,
) -> SweepResult:
    """`map`: the map (and its follow-up), then the follow-up's run report and the map's report
    with the map's findings as judged once; a replicated map: each unit's map report and their
    comparison."""
    ahead = threading.Thread(target=import_ahead, args=(REPORT_IMPORTS,), daemon=True)
    ahead.start()
    mapped = dispatch_map.run(options, follow_up, thresholds, progress, spread, progress_for)
    ahead.join()  # (before the report forks its pictures, which import what it imports)
    if mapped.frame is None:
        for shard in mapped.shards:
            write_map_report(shard, thresholds)
        units = write_units_report(mapped.run_dir, mapped.shards, thresholds)
        return SweepResult(mapped.run_dir, None, units, mapped.shards)
    if mapped.follow_up is not None:
        write_run_report(mapped.follow_up)
    # a spread map's merged table, as multi_gpu wrote it, not read back (a full map's: 2 s), and
    # as it was prepared for its findings
    merged = mapped.frame if mapped.shards else None
    rows = mapped.rows if mapped.shards else None
    spent: dict[str, float] = {}
    report = write_map_report(mapped.run_dir, thresholds, mapped.findings, merged, spent, rows)
    # where the time after the GPUs went, in env.json (benchmarks/fleet_scaling.py reads it)
    record = rundir.read_env(mapped.run_dir)
    after = {"report_load": spent["judge_s"], "report": spent["report_s"]}
    record["after_gpu_seconds"] = {**mapped.after_gpu, **after}
    rundir.write_env(mapped.run_dir, record)
    return SweepResult(
        mapped.run_dir, mapped.frame, report, mapped.shards, mapped.follow_up, mapped.findings
    )
