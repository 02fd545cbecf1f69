"""The `report` job: inputs -> findings -> Markdown or JSON, to stdout, a file, or a terminal.

In a terminal (no --format, stdout a TTY) a person gets what reads well there: the findings first,
then each GPU's dispatch grid (report.terminal), and the full Markdown, plots beside it, is
written to a file whose path is printed. `--format md` or a pipe gives the Markdown on stdout.
An output path never names an input: a report cannot overwrite the table it reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cublas_audit.errors import AuditError
from cublas_audit.files import check_target, inode_keys, never_replacing, write_text_atomic
from cublas_audit.judge.thresholds import Thresholds, with_overrides
from cublas_audit.report.render import findings_json, render_report, write_report
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.inputs import Dataset, bundled_runs, load_inputs
from cublas_audit.table.rundir import (
    CANDIDATES_FILE,
    ENV_FILE,
    PLAN_FILE,
    PLOTS_DIR,
    REPORT_FILE,
    TABLE_FILE,
)

TERMINAL_REPORT = Path("cublas-audit-report") / REPORT_FILE


@dataclass(frozen=True)
class ReportJob:
    inputs: Sequence[Path] = ()
    out: Path | None = None
    format: str | None = None  # "md", "json", or None: by where the output goes
    thresholds: Sequence[str] = field(default_factory=list)


def run(job: ReportJob, terminal: bool, echo: Callable[..., None]) -> None:
    inputs = list(job.inputs) or bundled_runs()
    with never_replacing(input_files(inputs)):  # no file written, plots too, replaces an input
        _run(job, inputs, terminal, echo)


def _run(job: ReportJob, inputs: list[Path], terminal: bool, echo: Callable[..., None]) -> None:
    limits = with_overrides(job.thresholds)
    if job.out is not None:
        check_output(job.out, inputs, plots=job.format != "json")
    datasets = load_inputs(inputs)
    if job.format == "json":
        _json(datasets, limits, job.out, echo)
    elif job.out is not None:
        echo(f"report: {write_report(datasets, job.out, limits)}")
    elif job.format == "md" or not terminal:
        echo(render_report(datasets, limits), nl=False)
    else:
        from cublas_audit.report.terminal import show

        check_output(TERMINAL_REPORT, inputs, plots=True)
        show(datasets, limits)
        written = write_report(datasets, TERMINAL_REPORT, limits)
        echo(f"\nfull report (Markdown, plots beside it): {written}")


def _json(
    datasets: list[Dataset], limits: Thresholds, out: Path | None, echo: Callable[..., None]
) -> None:
    text = json.dumps(json_ready(findings_json(datasets, limits)), indent=2, allow_nan=False)
    if out is None:
        echo(text)
    else:
        echo(f"report: {write_text_atomic(out, text + chr(10))}")


def check_output(out: Path, inputs: Sequence[Path], plots: bool = False) -> None:
    """Refused before anything is read or written (one line, exit 2): an output that cannot be
    written (a name too long, under a file, a directory, a FIFO or a device, no permission), that
    is an input under any name (the same path, a symlink, a hard link), that lies inside an input
    run directory other than as its report; with `plots`, a plots/ beside it that is not a
    directory or that holds an input where a plot would go."""
    target = out.resolve()
    for given in inputs:
        source = Path(given).resolve()
        table = source / TABLE_FILE if source.is_dir() else source
        inside_run = source.is_dir() and source in target.parents and target.name != REPORT_FILE
        if target in (table, source) or inside_run:
            raise AuditError(f"--out: {out} would overwrite the input {given}")
    read = inode_keys(input_files(inputs))
    if inode_keys([out]) & read:
        raise AuditError(f"--out: {out} would overwrite an input (the same file, another name)")
    check_target(out)
    parent = next((p for p in target.parents if p.exists()), Path("/"))
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise AuditError(f"--out: {out} cannot be written here")
    if plots:
        _check_plots(out.parent / PLOTS_DIR, read)


def _check_plots(plots: Path, read: frozenset[tuple[int, int]]) -> None:
    """plots/ beside the report: a directory (or nothing yet), none of its pictures an input."""
    if plots.exists() and not plots.is_dir():
        raise AuditError(f"--out: {plots} is not a directory (the report's plots go there)")
    if plots.is_dir():
        for picture in sorted(plots.glob("*.png")):
            if inode_keys([picture]) & read:
                raise AuditError(f"--out: the plot {picture} would overwrite an input")


def input_files(inputs: Sequence[Path]) -> list[Path]:
    """The files a report reads: each table given, and each run directory's table, env.json,
    plan.json and candidates.csv."""
    files: list[Path] = []
    for given in map(Path, inputs):
        if given.is_dir():
            files += [given / name for name in (TABLE_FILE, ENV_FILE, PLAN_FILE, CANDIDATES_FILE)]
        else:
            files.append(given)
    return files
