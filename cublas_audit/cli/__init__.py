"""The `cublas-audit` command line: parses arguments, calls the library, prints. Nothing else.

One module per command group (measure: sweep, map, reference; candidates; read: report, diff,
shapes; fix: fix, verify; merge; atlas; machine: env), what they share in options, the exit codes
(README) in exit_codes.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from cublas_audit.cli import (
    atlas_command,
    candidates_command,
    fix_commands,
    machine,
    measure_commands,
    merge_command,
    read,
)
from cublas_audit.cli.exit_codes import (
    INTERNAL_ERROR,
    INTERRUPTED,
    exit_codes,
    one_line_usage_errors,
)
from cublas_audit.fast_exit import run_and_end

__all__ = ["INTERNAL_ERROR", "INTERRUPTED", "app", "exit_codes", "main"]


class _Group(TyperGroup):
    """The app: its own parser errors (`--bogus`, no such command) as one line, exit 2."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        with one_line_usage_errors(ctx):
            return super().parse_args(ctx, args)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        with one_line_usage_errors(ctx):
            return super().resolve_command(ctx, args)


app = typer.Typer(
    name="cublas-audit",
    cls=_Group,
    help="Catch cuBLAS dispatching the wrong GEMM kernel: profile, tabulate, report, diff, fix.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: options show their metavars, no <bool> type column
    add_completion=False,
)


def _print_version(given: bool) -> None:
    if given:
        from cublas_audit import __version__

        typer.echo(f"cublas-audit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Options before the command: --version."""


class _Argument(TyperArgument):
    """An argument as its help lists it: its metavar, `...` after one that repeats (RUN_A,
    RUN_OR_TABLE...), never typer's Python type beside it (<path>, <list[Path]>)."""

    def get_help_record(self, ctx: Any) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None:
            return None
        return self.display_name_raw + ("..." if self.nargs != 1 else ""), record[1]


class _Command(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:  # typer builds them; only their help changes
                param.__class__ = _Argument

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Every parser error (unknown option, bad value, missing argument) as one line, exit 2:
        the values are parsed and converted here, before the command runs."""
        with one_line_usage_errors(ctx):
            return super().parse_args(ctx, args)


# In the order `cublas-audit --help` lists them.
_COMMANDS = (
    ("env", machine.env_command),
    ("sweep", measure_commands.sweep_command),
    ("candidates", candidates_command.candidates_command),
    ("reference", measure_commands.reference_command),
    ("report", read.report_command),
    ("diff", read.diff_command),
    ("shapes", read.shapes_command),
    ("map", measure_commands.map_command),
    ("merge", merge_command.merge_command),
    ("atlas", atlas_command.atlas_command),
    ("fix", fix_commands.fix_command),
    ("verify", fix_commands.verify_command),
)
for _name, _command in _COMMANDS:
    app.command(_name, cls=_Command)(_command)


def main() -> None:
    """The console script and `python -m cublas_audit`: the app, then the process ends without
    Python's teardown of its objects (fast_exit: seconds after a full map's report)."""
    run_and_end(lambda: app(prog_name="cublas-audit"))
