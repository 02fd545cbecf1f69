"""The command line's surface: readable help, --version, one meaning of --threshold, and every
error exactly one line on stderr."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import cublas_audit
from cublas_audit.cli import app
from cublas_audit.errors import AuditError, ToolMissingError

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["env", "sweep", "candidates", "reference", "report", "diff", "shapes", "map"]
# typer's type tags (<list[Path]>, <path>, <int> ...), not the placeholders of a help text
# (reports/<label>/<timestamp>/, shards/gpu<i>/).
TYPE_TAG = re.compile(r"<(?:list\[[^\]]*\]|path|Path|int|float|str|bool|text)>")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_no_python_types(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert not TYPE_TAG.search(result.output), result.output


def test_list_arguments_read_as_repeatable_metavars() -> None:
    report = runner.invoke(app, ["report", "--help"]).output
    assert re.search(r"^  RUN_OR_TABLE\.\.\.  +Run directories", report, re.M), report
    diff = runner.invoke(app, ["diff", "--help"]).output
    assert re.search(r"^  RUN_A  +Baseline", diff, re.M), diff
    assert re.search(r"^  RUN_B  +Compared", diff, re.M), diff


def test_version_prints_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"cublas-audit {cublas_audit.__version__}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert cublas_audit.__version__ == project["version"]
    assert "--version" in runner.invoke(app, ["--help"]).output


def _raise(error: Exception) -> Any:
    def failing(*args: object, **kwargs: object) -> None:
        raise error

    return failing


# Each command that shows progress bars fails here before its first case: nothing but the error
# may reach stderr (the bars' display, never started, once printed a blank line before it).
@pytest.mark.parametrize(
    ("target", "argv"),
    [
        ("cublas_audit.run.sweep_setup.sweep", ["sweep", "--sizes", "256"]),
        ("cublas_audit.run.multi_gpu.sweep_on_devices", ["sweep", "--devices", "0"]),
        ("cublas_audit.run.dispatch_map.run", ["map", "--sizes", "256"]),
        ("cublas_audit.run.multi_gpu.candidates_on_devices", ["candidates", "--devices", "0"]),
    ],
)
def test_a_missing_tool_is_one_line_on_stderr(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, target: str, argv: list[str]
) -> None:
    monkeypatch.setattr(target, _raise(ToolMissingError("no ncu here")))
    result = runner.invoke(app, [*argv, "--out", str(tmp_path / "run")])
    assert result.exit_code == 3
    assert result.stderr == "error: no ncu here\n"


def test_a_message_of_several_lines_is_printed_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "cublas_audit.report.output.run", _raise(AuditError("first part:\n  second part\n"))
    )
    result = runner.invoke(app, ["report", "--format", "md"])
    assert result.exit_code == 2
    assert result.stderr == "error: first part: second part\n"
