"""The exit-code contract of every command (README): 0 done, 1 a gate failed (only the --fail-on
of diff and verify), 2 bad input, 3 a tool or permission missing, 4 an internal error (the
traceback goes to a log file), 130 interrupted. Each error is one line on stderr."""

from __future__ import annotations

import functools
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, cast

import typer

from cublas_audit.errors import AuditError

P = ParamSpec("P")
R = TypeVar("R")
BAD_INPUT = 2
INTERNAL_ERROR = 4
INTERRUPTED = 130


def exit_codes(command: Callable[P, R]) -> Callable[P, R]:
    """The exit-code contract: an AuditError is its one-line message and code, Ctrl-C is 130, and
    anything else is an internal error (4) whose traceback goes to a log file, never a 1."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except AuditError as exc:
            error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            error("interrupted")
            raise typer.Exit(INTERRUPTED) from None
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as exc:
            log = _write_traceback(exc)
            error(
                f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
                + f" (traceback: {log})"
            )
            raise typer.Exit(INTERNAL_ERROR) from None

    return wrapper


def error(message: str) -> None:
    """The message on one line of stderr: its lines, stripped, joined by a space."""
    one_line = " ".join(line.strip() for line in message.splitlines() if line.strip())
    typer.secho(f"error: {one_line}", err=True, fg=typer.colors.RED)


# The option parser's error class: typer vendors click since 0.2x (typer._click) and used click
# itself before, and only BadParameter, its subclass, is public in both.
_USAGE_ERROR = cast(
    "type[Exception]",
    next(kind for kind in typer.BadParameter.__mro__ if kind.__name__ == "UsageError"),
)


@contextmanager
def one_line_usage_errors(ctx: Any) -> Iterator[None]:
    """The option parser's errors (unknown option or command, bad value, missing argument) as the
    contract has them: one line on stderr naming the command, exit 2 (click shows three: Usage,
    Try, Error). No arguments at all still shows the help (NoArgsIsHelpError, by name as typer
    judges it)."""
    try:
        yield
    except _USAGE_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            raise
        path = (getattr(exc, "ctx", None) or ctx).command_path
        message = cast(Any, exc).format_message().rstrip(".")  # e.g. "Missing argument 'RUN_A'"
        error(f"{path}: {message}; see '{path} --help'")
        raise typer.Exit(BAD_INPUT) from None


def _write_traceback(exc: BaseException) -> str:
    with tempfile.NamedTemporaryFile(
        "w", prefix="cublas-audit-error-", suffix=".log", delete=False
    ) as log:
        log.write("".join(traceback.format_exception(exc)))
        return log.name
