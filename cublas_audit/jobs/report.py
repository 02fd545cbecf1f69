"""The `report` job: inputs -> judged once -> Markdown or JSON, to stdout, a file, or a terminal.

In a terminal (no --format, stdout a TTY) a person gets what reads well there: the findings first,
then each GPU's dispatch grid (report.terminal), and the full Markdown, plots beside it, is
written to a file whose path is printed. `--format md` or a pipe gives the Markdown on stdout.
A run of `candidates --devices` (candidates.csv, no dispatch table) is reported as its candidate
audit. `--torch-trace` alone audits a profiler trace's GEMMs instead, with the same outputs; with
run directories it weighs their findings by the trace (the model's calls, their share of its GEMM
time), as a run's own trace.json does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cublas_audit.files import never_replacing, write_text_atomic
from cublas_audit.jobs.run_reports import recorded_verdicts, with_trace
from cublas_audit.judge.audited import audit_all
from cublas_audit.judge.candidates import CandidateVerdicts
from cublas_audit.judge.grouping import by_cause
from cublas_audit.judge.impact import trace_verdict, weigh
from cublas_audit.judge.rules import audit
from cublas_audit.judge.thresholds import Thresholds, with_overrides
from cublas_audit.observe.torch_trace import problems, read_trace
from cublas_audit.report import candidates_report, torch_trace_report
from cublas_audit.report.output import TERMINAL_REPORT, check_output, input_files
from cublas_audit.report.render import findings_json, render_report, write_report
from cublas_audit.table import rundir
from cublas_audit.table.candidates_table import read_candidates
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.inputs import bundled_runs, load_inputs
from cublas_audit.table.trace_record import table_record

Echo = Callable[..., None]


@dataclass(frozen=True)
class ReportJob:
    inputs: Sequence[Path] = ()
    out: Path | None = None
    format: str | None = None  # "md", "json", or None: by where the output goes
    thresholds: Sequence[str] = field(default_factory=list)
    torch_trace: Path | None = None


def run(job: ReportJob, terminal: bool, echo: Echo) -> None:
    if job.torch_trace is not None and not job.inputs:  # the trace's GEMMs audited alone
        with never_replacing(input_files([job.torch_trace])):
            _trace_report(job, echo)
        return
    inputs = list(job.inputs) or bundled_runs()
    read = [*inputs, *([job.torch_trace] if job.torch_trace is not None else [])]
    with never_replacing(input_files(read)):  # no file written, plots too, replaces an input
        _report(job, inputs, terminal, echo)


def _report(job: ReportJob, inputs: list[Path], terminal: bool, echo: Echo) -> None:
    limits = with_overrides(job.thresholds)
    trace = [job.torch_trace] if job.torch_trace is not None else []
    if job.out is not None:
        check_output(job.out, [*inputs, *trace], plots=job.format != "json")
    runs = [path for path in inputs if not rundir.is_candidates_run(path)]
    audits = [_candidates_of(path, limits) for path in inputs if rundir.is_candidates_run(path)]
    datasets = load_inputs(runs)
    if job.torch_trace is not None:  # the runs' findings weighed by the model's time
        datasets = with_trace(datasets, job.torch_trace)
    audited = audit_all(datasets, limits)
    if job.format == "json":
        found = findings_json(audited) + [item.to_json() for a in audits for item in a.flagged]
        _emit(json.dumps(json_ready(found), indent=2, allow_nan=False) + "\n", job.out, echo)
        return
    extra = "".join("\n" + candidates_report.render_markdown(a) for a in audits)
    if not audited:  # candidate audits alone
        _emit(extra.lstrip("\n"), job.out, echo)
    elif job.out is not None:
        echo(f"report: {write_report(audited, job.out, extra)}")
    elif job.format == "md" or not terminal:
        echo(render_report(audited) + extra, nl=False)
    else:
        from cublas_audit.report.terminal import show

        shown = [*inputs, *trace]
        check_output(TERMINAL_REPORT, shown, plots=True, option=None)  # nobody gave --out
        show(audited)
        written = write_report(audited, TERMINAL_REPORT, extra)
        echo(f"\nfull report (Markdown, plots beside it): {written}")


def _candidates_of(run_dir: Path, limits: Thresholds) -> CandidateVerdicts:
    """A candidates run judged at the threshold it confirmed its gaps at (its recorded one)."""
    fallback = limits.candidate_gap_pct / 100
    return recorded_verdicts(Path(run_dir), read_candidates(run_dir), fallback)


def _emit(text: str, out: Path | None, echo: Echo) -> None:
    if out is None:
        echo(text, nl=False)
    else:
        echo(f"report: {write_text_atomic(out, text)}")


def _trace_report(job: ReportJob, echo: Echo) -> None:
    """A PyTorch trace's GEMMs audited with the same rules (kernels and durations as the
    profiler recorded them), each finding weighted by its problems' share of GEMM time."""
    assert job.torch_trace is not None
    limits = with_overrides(job.thresholds)
    if job.out is not None:
        check_output(job.out, [job.torch_trace])
    trace = read_trace(job.torch_trace)
    table = problems(trace)
    frame = torch_trace_report.dispatch_table(trace, table)
    record = table_record(trace, table, [str(case_id) for case_id in frame["case_id"]])
    found = weigh(audit(frame, limits), frame, record, limits)  # what each is worth, as in a run
    found = by_cause(found)  # one finding per cause, as judge.audited
    verdict = trace_verdict(record, None, found, limits)
    if job.format == "json":
        data: dict[str, Any] = {
            "verdict": asdict(verdict) if verdict is not None else None,
            "findings": [
                {**f.to_json(), "share": torch_trace_report.share(frame, f)} for f in found
            ],
            "problems": table.to_dict("records"),
        }
        _emit(json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n", job.out, echo)
        return
    text = torch_trace_report.report_markdown(trace, table, frame, found, verdict)
    _emit(text + "\n", job.out, echo)
