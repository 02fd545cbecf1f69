"""A finished run's reports: its inputs loaded, judged once (judge.audited, judge.map_audit,
judge.candidates, judge.units), then rendered and written (report). What every measuring job
and `report` of a run directory call."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from cublas_audit.gc_pause import collector_paused
from cublas_audit.judge.audited import audit_all
from cublas_audit.judge.candidates import DEFAULT_THRESHOLD, CandidateVerdicts, judge_candidates
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.map_audit import audit_map
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.judge.units import compare_units
from cublas_audit.report import candidates_report, map_report, render, units_report
from cublas_audit.table import rundir
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.inputs import Dataset, load_inputs, load_run
from cublas_audit.table.trace_record import run_record


def with_trace(datasets: Sequence[Dataset], trace: Path) -> list[Dataset]:
    """The runs weighed by the PyTorch trace they were planned from (`report`/`fix --torch-trace`
    with runs: a run made before sweeps kept trace.json, or another trace of the same model):
    each run's record of it built from its plan.json, in place of its own."""
    from cublas_audit.observe.torch_trace import read_trace

    read = read_trace(trace)
    return [replace(dataset, trace=run_record(dataset.path, read)) for dataset in datasets]


def write_run_report(run_dir: Path, thresholds: Thresholds | None = None) -> Path:
    """run_dir/report.md and run_dir/plots/ of a sweep's run."""
    audited = audit_all(load_inputs([Path(run_dir)]), thresholds)
    return render.write_report(audited, Path(run_dir) / rundir.REPORT_FILE)


def write_map_report(
    run_dir: Path,
    thresholds: Thresholds | None = None,
    found: list[Finding] | None = None,
    frame: pd.DataFrame | None = None,
    timings: dict[str, float] | None = None,
    rows: pd.DataFrame | None = None,
) -> Path:
    """A map run's report.md, pictures and findings.json, with its follow-up where it has one
    (the map's findings as its run judged them, where given; its table as the caller just wrote
    it, where given: table.inputs.load_run, and as prepared for the findings: `rows`).
    `timings`: judge_s and report_s added (a --ray run's record of where its time went)."""
    deep = Path(run_dir) / rundir.FOLLOW_UP_DIR
    began = time.perf_counter()
    with collector_paused():
        follow_up = load_run(deep) if rundir.has_table(deep) else None
        dataset = load_run(Path(run_dir), frame)
        kept = dataset.frame is frame  # (`rows` stand for the table only as it was given)
        judged = audit_map(dataset, thresholds, found, follow_up, rows if kept else None)
        judging = time.perf_counter()
        report = map_report.write_map_report(Path(run_dir), judged)
    if timings is not None:
        timings["judge_s"] = round(judging - began, 2)
        timings["report_s"] = round(time.perf_counter() - judging, 2)
    return report


def write_candidates_report(run_dir: Path, frame: pd.DataFrame) -> Path:
    """A candidates run's report.md, judged at the threshold the run confirmed its gaps at."""
    verdicts = recorded_verdicts(run_dir, frame, DEFAULT_THRESHOLD)
    return candidates_report.write_candidates_run_report(run_dir, verdicts)


def recorded_verdicts(run_dir: Path, frame: pd.DataFrame, fallback: float) -> CandidateVerdicts:
    """A candidates run's audit judged at the threshold its env.json recorded (it confirmed its
    gaps at that one), else at `fallback`."""
    recorded = EnvRecord.read(run_dir).candidate_threshold
    return judge_candidates(frame, float(recorded) if recorded is not None else fallback)


def write_units_report(
    run_dir: Path, shards: Sequence[Path], thresholds: Thresholds | None = None
) -> Path:
    """units.md and units.json of a replicated run: its units compared with the first."""
    units = [load_run(path) for path in shards]
    found, spread = compare_units(units, thresholds)
    return units_report.write_units_report(run_dir, units, found, spread)
