"""The command line's surface: readable help, --version, one meaning of --threshold, and every
error exactly one line on stderr."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

import cublas_audit
from cublas_audit.cli import app
from cublas_audit.errors import AuditError, ToolMissingError

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["env", "sweep", "candidates", "reference", "report", "diff", "shapes", "map", "atlas"]
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
    # pyproject.toml reads the version from the one module that holds it
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["dynamic"]["version"] == {"attr": "cublas_audit.version.__version__"}
    assert cublas_audit.__version__ == importlib.metadata.version("cublas-audit")
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
        ("cublas_audit.jobs.measure.sweep", ["sweep", "--sizes", "256"]),
        ("cublas_audit.jobs.measure.sweep_on_devices", ["sweep", "--devices", "0"]),
        ("cublas_audit.jobs.measure.dispatch_map_run", ["map", "--sizes", "256"]),
        ("cublas_audit.jobs.measure.candidates_on_devices", ["candidates", "--devices", "0"]),
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
        "cublas_audit.jobs.report.run", _raise(AuditError("first part:\n  second part\n"))
    )
    result = runner.invoke(app, ["report", "--format", "md"])
    assert result.exit_code == 2
    assert result.stderr == "error: first part: second part\n"


# --threshold NAME=VALUE everywhere; `candidates` judges by candidate_gap_pct alone, and still
# takes the bare fraction it took before (no `=`, so never mistaken for a name).
@pytest.mark.parametrize(
    ("given", "fraction"),
    [
        ([], 0.10),
        (["--threshold", "candidate_gap_pct=20"], 0.20),
        (["--threshold", "candidate-gap-pct=15"], 0.15),
        (["--threshold", "0.2"], 0.20),
        (["--threshold", "0.3", "--threshold", "candidate_gap_pct=5"], 0.05),
    ],
)
def test_candidates_threshold_is_name_equals_value(
    monkeypatch: pytest.MonkeyPatch, given: list[str], fraction: float
) -> None:
    seen: dict[str, Any] = {}

    def audit(case_list: Any, out: Any, settings: dict[str, Any]) -> pd.DataFrame:
        seen.update(settings)
        raise AuditError("stopped before the GPU")

    monkeypatch.setattr("cublas_audit.cli.candidates_command._here", audit)
    result = runner.invoke(app, ["candidates", "--batched", "--sizes", "256", *given])
    assert result.exit_code == 2 and "stopped before the GPU" in result.stderr, result.output
    assert seen["candidate_threshold"] == pytest.approx(fraction)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nope=1", "--threshold: unknown name 'nope'"),
        ("layout_penalty_ratio=1.5", "--threshold layout_penalty_ratio: candidates judges"),
        ("candidate_gap_pct=150", "--threshold candidate_gap_pct: must be a number from 0 to 100"),
        ("1.5", "--threshold 1.5: a bare number is a fraction from 0 to 1"),
        ("ten", "--threshold 'ten': expected NAME=VALUE"),
    ],
)
def test_bad_candidates_thresholds_are_one_line_errors(value: str, message: str) -> None:
    result = runner.invoke(app, ["candidates", "--threshold", value])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert result.stderr.count("\n") == 1


def test_candidates_help_names_the_threshold_as_everywhere() -> None:
    text = runner.invoke(app, ["candidates", "--help"]).output
    assert "--threshold NAME=VALUE" in text and "FRACTION" not in text
