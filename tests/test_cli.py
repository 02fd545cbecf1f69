"""The command line: help everywhere, one-line errors and exit codes scripts can use."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from tests.conftest import REPORTS

runner = CliRunner()
NO_GPU = shutil.which("nvidia-smi") is None


@pytest.mark.parametrize("command", [[], ["env"], ["sweep"]])
def test_help_works_without_a_gpu(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizes", "256,abc"], "--sizes: 'abc' is not a positive integer"),
        (["--batches", "0"], "--batches: '0' is not a positive integer"),
        (["--modes", "fp64"], "--modes: unknown value 'fp64'"),
        (["--gpu-label", "../../etc"], "is not a safe file name"),
        (["--probe-env", "NOEQUALS"], "--probe-env: 'NOEQUALS' is not KEY=VALUE"),
        (["--no-single", "--no-batched"], "nothing to run"),
        (["--clock-control", "boost"], "--clock-control: 'boost' is not one of"),
    ],
)
def test_bad_sweep_arguments_are_one_line_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sweep", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_resume_of_a_directory_that_is_no_run(tmp_path: Path) -> None:
    result = runner.invoke(app, ["sweep", "--resume", str(tmp_path)])
    assert result.exit_code == 2
    assert "is not a cublas-audit run directory" in result.output


def test_a_new_sweep_never_writes_into_an_earlier_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(REPORTS / "h100" / "20261123-094558-single", run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    result = runner.invoke(app, ["sweep", "--single", "--out", str(run)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: --out: {run} is not empty; finish an earlier sweep there with --resume {run}, "
        "or pick a new directory"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_sweep_without_a_gpu_says_so() -> None:
    result = runner.invoke(app, ["sweep", "--sizes", "256"])
    assert result.exit_code == 3
    assert result.output.strip() == "error: no NVIDIA GPU found here (nvidia-smi sees none)"


def test_env_json_has_every_field() -> None:
    result = runner.invoke(app, ["env", "--format", "json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert {
        "gpu_name",
        "driver_version",
        "cublas_version",
        "ncu_path",
        "counters_permitted",
    } <= set(data)
