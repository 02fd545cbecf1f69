"""The `cublas-audit` command line: argument checks and calls into the pipeline, nothing else."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from enum import Enum
from typing import Any, ParamSpec, TypeVar

import typer

from cublas_audit.errors import AuditError

app = typer.Typer(
    name="cublas-audit",
    help="Catch cuBLAS dispatching the wrong GEMM kernel: profile, tabulate, report, diff.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

P = ParamSpec("P")
R = TypeVar("R")


class TextOrJson(str, Enum):
    text = "text"
    json = "json"


class MdOrJson(str, Enum):
    md = "md"
    json = "json"


def one_line_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turns an AuditError into `error: ...` on stderr and the error's exit code."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except AuditError as exc:
            typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@app.command("env")
@one_line_errors
def env_command(
    format: TextOrJson = typer.Option(TextOrJson.text, "--format", help="Output format."),
) -> None:
    """Show the GPU, driver, CUDA, cuBLAS and ncu here, and whether ncu may read counters."""
    from cublas_audit import environment

    info = environment.collect()
    if format is TextOrJson.json:
        print_json(info.to_json())
    else:
        typer.echo(environment.describe(info))
