"""The option parser's errors keep the exit-code contract (issue 38, item 2): an unknown option or
command, a bad value, a missing argument is one line on stderr and exit 2, for every command; the
help still shows as before."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from cublas_audit.cli import app

runner = CliRunner()
COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Usage:" not in lines[0]
    return lines[0]


def test_every_command_is_covered() -> None:
    assert {"sweep", "report", "diff", "atlas", "merge", "fix", "verify", "env"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_option_is_one_line(command: str) -> None:
    line = one_line_error([command, "--no-such-option"])
    assert f"cublas-audit {command}: No such option: --no-such-option" in line
    assert line.endswith(f"see 'cublas-audit {command} --help'")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_still_works(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: cublas-audit {command} [OPTIONS]")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["diff"], "cublas-audit diff: Missing argument 'RUN_A'"),
        (["diff", "a"], "cublas-audit diff: Missing argument 'RUN_B'"),
        (["diff", "a", "b", "c"], "cublas-audit diff: Got unexpected extra argument(s) (c)"),
        (["merge"], "cublas-audit merge: Missing argument"),
        (["atlas"], "cublas-audit atlas: Missing argument"),
        (["fix"], "cublas-audit fix: Missing argument"),
        (["verify"], "cublas-audit verify: Missing argument"),
        (["shapes"], "cublas-audit shapes: Missing option '--torch-trace'"),
        (["report", "--format", "xml"], "Invalid value for '--format'"),
        (["diff", "a", "b", "--fail-on", "sometimes"], "Invalid value for '--fail-on'"),
        (["sweep", "--min-reps", "many"], "Invalid value for '--min-reps'"),
        (["map", "--sizes"], "cublas-audit map: Option '--sizes' requires an argument"),
        (["no-such-command"], "cublas-audit: No such command 'no-such-command'"),
        (["--no-such-option"], "cublas-audit: No such option: --no-such-option"),
    ],
)
def test_parser_errors_are_one_line(args: list[str], message: str) -> None:
    assert message in one_line_error(args)


def test_no_arguments_still_show_the_help() -> None:
    result = runner.invoke(app, [])
    assert "Usage: cublas-audit [OPTIONS] COMMAND" in result.output
    assert "error:" not in result.output


def test_the_installed_entry_point_prints_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cublas_audit", "sweep", "--no-such-option"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("error: cublas-audit sweep: No such option")
