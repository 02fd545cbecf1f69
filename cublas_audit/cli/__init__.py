"""The `cublas-audit` command line: parses arguments, calls the library, prints. Nothing else.

One module per command group (measure: sweep, map, reference; candidates; read: report, diff,
shapes; machine: env), what they share in options, the exit codes (README) in exit_codes.
"""

from __future__ import annotations

import typer

from cublas_audit.cli import candidates, machine, measure, read
from cublas_audit.cli.exit_codes import INTERNAL_ERROR, INTERRUPTED, exit_codes

__all__ = ["INTERNAL_ERROR", "INTERRUPTED", "app", "exit_codes"]

app = typer.Typer(
    name="cublas-audit",
    help="Catch cuBLAS dispatching the wrong GEMM kernel: profile, tabulate, report, diff.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: real metavars, no <bool> or <list[Path]> type column
    add_completion=False,
)

# In the order `cublas-audit --help` lists them.
app.command("env")(machine.env_command)
app.command("sweep")(measure.sweep_command)
app.command("candidates")(candidates.candidates_command)
app.command("reference")(measure.reference_command)
app.command("report")(read.report_command)
app.command("diff")(read.diff_command)
app.command("shapes")(read.shapes_command)
app.command("map")(measure.map_command)
