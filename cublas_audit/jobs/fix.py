"""The `fix` job: runs (sweeps with candidates, maps with follow-up, candidate audits, candidates
tables) -> judged once -> the fixes of their confirmed findings -> fix.json, the PyTorch TunableOp
results file and fix.md, written together into one directory.

A map's own findings compare neighbours; the measured alternatives live in its follow-up, so a
map directory is read through its follow-up/. Nothing is written when an input is bad, and no
output replaces an input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.files import never_replacing, os_error, write_text_atomic
from cublas_audit.jobs.run_reports import recorded_verdicts
from cublas_audit.judge.audited import audit_dataset
from cublas_audit.judge.candidates import judge_candidates
from cublas_audit.judge.fixes import fix_set, fixes_of, pin_fixes, stamp_of, with_torch_ops
from cublas_audit.judge.impact import NotProposed, model_fixes
from cublas_audit.judge.thresholds import Thresholds, with_overrides
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.report.output import check_output_dir, input_files
from cublas_audit.table import rundir
from cublas_audit.table.candidates_table import read_candidates
from cublas_audit.table.env_record import EnvRecord, as_record
from cublas_audit.table.fix_file import FIX_FILE, KINDS, Fix, FixSet, Stamp, write_fix_file
from cublas_audit.table.inputs import load_run
from cublas_audit.table.trace_record import TraceRecord, read_trace_record, run_record

Echo = Callable[..., None]
Stamped = tuple[Stamp, Sequence[Fix], str]


@dataclass(frozen=True)
class FixJob:
    inputs: Sequence[Path]
    out: Path | None = None  # a directory; default: the one input run directory
    torch_version: str | None = None
    thresholds: Sequence[str] = field(default_factory=list)
    env: Mapping[str, Any] | None = None  # the machine, for a run that wrote no env.json
    torch_trace: Path | None = None  # the trace the problems came from: each fix's op and share


def collect(
    inputs: Sequence[Path],
    thresholds: Thresholds | None = None,
    env: Mapping[str, Any] | None = None,
) -> FixSet:
    """The fixes of every input, under the one machine they were all measured on (`env`: that
    machine, where an input has no env.json)."""
    if not inputs:
        raise AuditError("name at least one run directory or candidates table")
    limits = thresholds or Thresholds()
    return fix_set([_fixes_of_input(Path(path), limits, env or {}) for path in inputs])


def _fixes_of_input(path: Path, limits: Thresholds, given: Mapping[str, Any]) -> Stamped:
    if not path.exists():
        raise AuditError(f"{path}: no such file or directory")
    if path.is_file():  # a bare candidates table: no machine recorded beside it
        verdicts = judge_candidates(read_candidates(path), limits.candidate_gap_pct / 100)
        return stamp_of(given, verdicts.frame), pin_fixes(verdicts, str(path)), str(path)
    deep = path / rundir.FOLLOW_UP_DIR
    if rundir.has_table(deep):
        return _fixes_of_input(deep, limits, given)
    recorded = EnvRecord.read(path)
    env = recorded if recorded.recorded else as_record(given)
    if rundir.is_candidates_run(path):
        verdicts = recorded_verdicts(path, read_candidates(path), limits.candidate_gap_pct / 100)
        return stamp_of(env, verdicts.frame), pin_fixes(verdicts, str(path)), str(path)
    if not rundir.has_table(path):
        raise AuditError(
            f"{path}: neither a dispatch table nor a candidate audit (a map needs --follow-up "
            "to measure alternatives)"
        )
    audited = audit_dataset(load_run(path), limits)
    plan_file = path / rundir.PLAN_FILE
    plan = {case.case_id: case for case in read_plan(plan_file)} if plan_file.exists() else {}
    stamp = stamp_of(env, audited.dataset.frame, audited.dataset.gpu_label)
    return stamp, fixes_of(audited, plan), str(path)


def out_dir(job: FixJob) -> Path:
    """--out, else the one input run directory (its fixes beside its report)."""
    if job.out is not None:
        return job.out
    if len(job.inputs) == 1 and Path(job.inputs[0]).is_dir():
        return Path(job.inputs[0])
    raise AuditError("--out DIR: where to write the fixes of several inputs (or of a table)")


FIX_REPORT = "fix.md"


def read_files(job: FixJob) -> list[Path]:
    """What `fix` reads: each input (a map's follow-up too) and the trace."""
    inputs = [Path(path) for path in job.inputs]
    follow_ups = [path / rundir.FOLLOW_UP_DIR for path in inputs if path.is_dir()]
    trace = [job.torch_trace] if job.torch_trace is not None else []
    return [*inputs, *(path for path in follow_ups if path.is_dir()), *trace]


def write_fix_files(
    fixes: FixSet,
    target: Path,
    torch_version: str | None,
    left_out: Sequence[NotProposed] = (),
) -> tuple[list[Path], str]:
    """fix.json, the TunableOp file (where a torch version is known: TunableOp reads only a file
    of its own version) and fix.md into `target` (with the measured fixes a trace's model has no
    use for, `left_out`); returns their paths, and why no TunableOp file was written ('' where it
    was)."""
    from cublas_audit.report.fix_report import render_fix_report
    from cublas_audit.report.tunableop import tunableop_export, write_tunableop

    written = [write_fix_file(fixes, target / FIX_FILE)]
    export, why_not = None, ""
    try:
        export = tunableop_export(fixes, torch_version)
    except AuditError as exc:  # no torch known: the pins still hold, fix.json and C carry them
        why_not = str(exc)
    if export is not None:
        written.append(write_tunableop(export, target))
    report = render_fix_report(fixes, export, target, why_not, left_out)
    written.append(write_text_atomic(target / FIX_REPORT, report))
    return written, why_not


def summary_line(fixes: FixSet) -> str:
    kinds = {kind: sum(fix.kind == kind for fix in fixes.fixes) for kind in KINDS}
    counted = ", ".join(_counted(count, kind) for kind, count in kinds.items() if count)
    if not fixes.fixes:
        return "fix: no confirmed finding with a measured faster alternative, so no fix"
    best = max(fixes.fixes, key=lambda fix: fix.claimed)
    return (
        f"fix: {_counted(len(fixes.fixes), 'fix')} ({counted}), the largest {best.claimed:.2f}x on "
        f"{best.problem.name}; proven on {fixes.stamp.words()}"
    )


def _counted(count: int, noun: str) -> str:
    """'1 pin', '23 pins', '2 fixes'."""
    plural = noun + ("es" if noun.endswith("x") else "s")
    return f"{count} {noun if count == 1 else plural}"


def run(job: FixJob, echo: Echo) -> FixSet:
    from cublas_audit.report.tunableop import DEVICE_FILE_NAME, pt_version

    target = out_dir(job)
    if job.torch_version is not None:
        try:  # a malformed one: exit 2 before anything is read
            pt_version(job.torch_version)
        except AuditError as exc:
            raise AuditError(f"--torch-version: {exc}") from None
    read = read_files(job)
    check_output_dir(target, (FIX_FILE, DEVICE_FILE_NAME, FIX_REPORT), read)
    fixes = collect(job.inputs, with_overrides(job.thresholds), job.env)
    fixes, left_out = model_fixes(fixes, trace_records(job))  # a trace's: the model's calls
    if job.torch_trace is not None and not all(Path(path).is_dir() for path in job.inputs):
        from cublas_audit.observe.torch_trace import problems, read_trace

        # a bare candidates table has no plan: its fixes are named by their exact problem
        fixes = with_torch_ops(fixes, problems(read_trace(job.torch_trace)))
    with never_replacing(input_files(read)):
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(target, exc) from exc
        written, why_not = write_fix_files(fixes, target, job.torch_version, left_out)
        for path in written:
            echo(f"fix: {path}")
    if why_not:
        echo(f"fix: {DEVICE_FILE_NAME} skipped: {why_not}")
    echo(summary_line(fixes))
    if left_out:
        echo(
            f"fix: {_counted(len(left_out), 'measured fix')} not proposed: not a call the traced "
            f"model makes ({FIX_REPORT} says why)"
        )
    return fixes


def trace_records(job: FixJob) -> dict[str, TraceRecord]:
    """Each input run's record of its PyTorch trace, by the run its fixes name: built from
    --torch-trace where given (a run made before sweeps kept trace.json, or another trace of the
    same model), else the run's own trace.json; none for a bare table."""
    from cublas_audit.observe.torch_trace import read_trace

    trace = read_trace(job.torch_trace) if job.torch_trace is not None else None
    found = {}
    for path in map(Path, job.inputs):
        deep = path / rundir.FOLLOW_UP_DIR
        run = deep if rundir.has_table(deep) else path  # as _fixes_of_input reads
        if not run.is_dir():
            continue
        record = run_record(run, trace) if trace is not None else read_trace_record(run)
        if record is not None:
            found[str(run)] = record
    return found
