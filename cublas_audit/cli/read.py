"""The commands that read what runs wrote (or a PyTorch trace): report, diff and shapes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from cublas_audit.cli import options
from cublas_audit.cli.exit_codes import exit_codes
from cublas_audit.cli.options import Thresholds
from cublas_audit.errors import AuditError
from cublas_audit.vocabulary import Gate


@exit_codes
def report_command(
    inputs: list[Path] | None = typer.Argument(
        None,
        metavar="RUN_OR_TABLE",
        help="Run directories or dispatch tables (CSV/Parquet) (default: the bundled audits, "
        "each GPU's newest batched run).",
        show_default=False,
    ),
    out: Path | None = typer.Option(
        None, metavar="FILE", help="Write the Markdown here, plots/ beside it."
    ),
    format: options.Format | None = typer.Option(
        None,
        "--format",
        metavar="md|json",
        help="md or json on stdout (default: a summary in a terminal, Markdown in a pipe).",
        show_default=False,
    ),
    threshold: Thresholds = None,
    torch_trace: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Alone: audit the GEMMs of a PyTorch profiler trace (kernels and durations as "
        "recorded). With runs: weigh their findings by the trace they were planned from (a "
        "trace sweep keeps it as trace.json). Either way the report opens with the verdict.",
    ),
) -> None:
    """Findings, dispatch and efficiency tables, stalls and reproduce scripts, per GPU."""
    from cublas_audit.jobs import report

    chosen = format.value if format else None
    job = report.ReportJob(inputs or [], out, chosen, threshold or [], torch_trace)
    report.run(job, terminal=sys.stdout.isatty(), echo=typer.echo)


@exit_codes
def diff_command(
    a: Path = typer.Argument(..., metavar="RUN_A", help="Baseline: a run directory or a table."),
    b: Path = typer.Argument(..., metavar="RUN_B", help="Compared: a run directory or a table."),
    format: options.FormatOption = options.Format.md,
    fail_on: Gate | None = typer.Option(
        None,
        "--fail-on",
        metavar="regression|kernel-change|host|any",
        help="Exit 1 when B has, against A: a confident regression (the dispatched kernels "
        "slower beyond their noise floor, or the call where kernels were not traced, or a call "
        "that broke), a kernel change, a call slower over unchanged kernels (host), or any of "
        "them (for CI).",
    ),
    threshold: Thresholds = None,
) -> None:
    """Kernel changes, FMA % and time deltas, regressions and one-side-only cases of two runs."""
    from cublas_audit.judge import diff
    from cublas_audit.judge.thresholds import with_overrides
    from cublas_audit.report import diff_report
    from cublas_audit.table.inputs import load_one_gpu

    limits = with_overrides(threshold or [])
    result = diff.compare(load_one_gpu(a), load_one_gpu(b), limits)
    if format is options.Format.json:
        options.print_json(diff_report.to_json(result))
    else:
        typer.echo(diff_report.to_markdown(result), nl=False)
    if fail_on is not None and result.matched.empty:
        raise AuditError(
            f"--fail-on {fail_on.value}: {a} and {b} share no case (api, routine, mode, shape, "
            "batch), so nothing was compared"
        )
    if fail_on is not None and result.fails(fail_on):
        raise typer.Exit(1)


@exit_codes
def shapes_command(
    torch_trace: Path = typer.Option(
        ...,
        metavar="FILE",
        help="A PyTorch profiler trace (Chrome JSON, plain or gzipped, record_shapes=True).",
    ),
    format: options.FormatOption = options.Format.md,
    out: Path | None = typer.Option(
        None, metavar="FILE", help="Write the output here instead of stdout."
    ),
) -> None:
    """The distinct GEMMs of a PyTorch trace: shapes in PyTorch's and cuBLAS's terms, calls, GPU
    time and share, the kernels they ran (through correlation ids), the copies around them."""
    from cublas_audit.files import never_replacing, write_text_atomic
    from cublas_audit.observe.torch_trace import problems, read_trace
    from cublas_audit.report.output import check_output
    from cublas_audit.report.torch_trace_report import problems_markdown
    from cublas_audit.table.dispatch import frame_records, json_ready

    if out is not None:
        check_output(out, [torch_trace])
    trace = read_trace(torch_trace)
    table = problems(trace)
    if format is options.Format.json:
        text = json.dumps(json_ready(frame_records(table)), indent=2, allow_nan=False) + "\n"
    else:
        text = problems_markdown(trace, table)
    if out is None:
        typer.echo(text, nl=False)
    else:
        with never_replacing([torch_trace]):
            typer.echo(f"shapes: {write_text_atomic(out, text)}")
