"""The probe interpreter's imports are checked before a run directory exists.

A `--probe-python` (or this interpreter) that cannot import CuPy is one clear error, exit 3
(ToolMissingError), quoting the real cause the interpreter printed (`No module named 'cupy'`),
never a half-made run directory whose cause sits in probe.log.

The interpreter here is the real one: sys.executable, which has no CuPy on this CPU machine (the
tests skip where it has). The CLI test replaces environment.collect with what it found on an H100
(a stand-in for the machine) so that the sweep gets past require_gpu to the check.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import ToolMissingError
from cublas_audit.observe import environment
from cublas_audit.resources import package_view
from cublas_audit.run.probe_process import ProbeCommand, check_probe_imports, probe_environment
from tests.fakeprobe import deadline, h100_environment

runner = CliRunner()
DEADLINE_S = 30
no_cupy_here = pytest.mark.skipif(
    importlib.util.find_spec("cupy") is not None, reason="this interpreter can import CuPy"
)


@no_cupy_here
def test_an_interpreter_without_cupy_is_tool_missing_quoting_the_cause() -> None:
    with package_view() as view, deadline(DEADLINE_S):
        probe = ProbeCommand(sys.executable, probe_environment(os.environ, {}, None, view))
        with pytest.raises(ToolMissingError) as raised:
            check_probe_imports(probe)
    assert str(raised.value) == (
        f"the probe interpreter {sys.executable} cannot load the probe "
        "(ModuleNotFoundError: No module named 'cupy'); "
        "install CuPy there: pip install 'cublas-audit[gpu]'"
    )


def test_an_interpreter_that_cannot_start_is_tool_missing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    with deadline(DEADLINE_S), pytest.raises(ToolMissingError) as raised:
        check_probe_imports(ProbeCommand(str(missing), {}))
    assert str(raised.value).startswith(f"cannot run the probe interpreter {missing}: ")


@no_cupy_here
def test_the_sweep_stops_with_exit_3_and_no_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "collect", lambda ncu=None, device=None: h100_environment())
    views = tmp_path / "tmp"  # where package_view makes its temporary directory
    views.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(views))
    out = tmp_path / "reports" / "h100" / "run"
    args = ["sweep", "--no-batched", "--sizes", "256", "--no-profile"]
    args += ["--probe-python", sys.executable, "--out", str(out)]
    with deadline(DEADLINE_S):
        result = runner.invoke(app, args)

    assert result.exit_code == 3, result.output
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert error == [
        f"error: the probe interpreter {sys.executable} cannot load the probe "
        "(ModuleNotFoundError: No module named 'cupy'); "
        "install CuPy there: pip install 'cublas-audit[gpu]'"
    ]
    assert not out.exists()
    assert not (tmp_path / "reports").exists()
    assert list(views.iterdir()) == []  # and the package view is gone


def test_the_import_check_runs_while_the_machine_is_surveyed_and_speaks_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe interpreter's import check (a child importing CuPy: seconds) is begun before
    the survey of the machine (nvidia-smi, CuPy, ncu: seconds too) and runs beside it; a survey
    that finds no GPU is still the error said, as before."""
    from cublas_audit.planning.cases import Case
    from cublas_audit.run.sweep_options import SweepOptions
    from cublas_audit.run.sweep_setup import sweep
    from tests.fakeprobe import fake_probe, seen

    probe, _calls = fake_probe(tmp_path, behaviour="no-cupy")
    options = SweepOptions(
        cases=[Case("cublas", "fp32", 64, 64, 64, 1)],
        out=tmp_path / "run",
        probe_python=probe.python,
    )
    during: list[bool] = []

    def collect(ncu: str | None = None, device: int | None = None) -> environment.Environment:
        for _ in range(500):  # (10 s at most: the check's child records its start)
            if any(s["argv"][1:2] == ["-c"] for s in seen(tmp_path)):
                break
            time.sleep(0.02)
        during.append(any(s["argv"][1:2] == ["-c"] for s in seen(tmp_path)))
        return h100_environment(ncu) if during[-1] else environment.Environment()

    monkeypatch.setattr(environment, "collect", collect)
    with deadline(DEADLINE_S), pytest.raises(ToolMissingError, match="No module named 'cupy'"):
        sweep(options)
    assert during == [True] and not (tmp_path / "run").exists()
    monkeypatch.setattr(environment, "collect", lambda *a: environment.Environment())
    with deadline(DEADLINE_S), pytest.raises(ToolMissingError, match="no NVIDIA GPU"):
        sweep(options)  # (no GPU, and no CuPy in the probe: the GPU is what is missing first)
