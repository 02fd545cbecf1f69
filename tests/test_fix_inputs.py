"""Issue 38: what `fix` checks before it writes anything: where --out may go (never an input,
always a directory) and the torch version the TunableOp file is for; and the one line it prints
when it cannot write that file.

The input is a copy of the H100 FP32 map with its follow-up
(reports/h100/maps/20261124-003639-fp32-64-8192: two confirmed pins, fp32 1856^3 and 2112^3 batch
8), so that a defect that wrote anyway would write into the copy.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cublas_audit.cli import app
from cublas_audit.report import tunableop
from cublas_audit.report.tunableop import pt_version
from tests.conftest import REPORTS

MAP = REPORTS / "h100" / "maps" / "20261124-003639-fp32-64-8192"
OUTPUTS = ("fix.json", "tunableop0.csv", "fix.md")
runner = CliRunner()


@pytest.fixture
def run(tmp_path: Path) -> Path:
    copy = tmp_path / "map"
    shutil.copytree(MAP, copy, ignore=shutil.ignore_patterns("plots", "ncu"))
    return copy


def contents(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def refused(result: Result, words: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    error = result.stderr.strip()
    assert error.startswith("error: ") and "\n" not in error, repr(result.stderr)
    assert re.search(words, error), error


def fix(*args: str) -> Result:
    return runner.invoke(app, ["fix", *args])


# ----- --out ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "words"),
    [
        ("dispatch.csv", r"--out: .*dispatch\.csv is an input of fix, not a directory"),
        ("follow-up/candidates.csv", r"--out: .*candidates\.csv is an input of fix, not a dir"),
        ("report.md", r"--out: .*report\.md is not a directory"),
        ("dispatch.csv/fixes", r"dispatch\.csv is not a directory"),
    ],
)
def test_an_out_that_is_a_file_is_refused_in_one_line(run: Path, out: str, words: str) -> None:
    """`fix RUN --out RUN/dispatch.csv` died with FileExistsError (exit 4)."""
    before = contents(run)
    refused(fix(str(run), "--torch-version", "2.14.1", "--out", str(run / out)), words)
    assert contents(run) == before


def test_an_output_that_is_an_input_under_another_name_is_refused_before_any_write(
    run: Path, tmp_path: Path
) -> None:
    """fix.md a symlink to the follow-up's candidates.csv (an input fix reads through the map):
    refused before fix.json or the TunableOp file is written."""
    out = tmp_path / "fixes"
    out.mkdir()
    (out / "fix.md").symlink_to(run / "follow-up" / "candidates.csv")
    before = contents(run)
    result = fix(str(run), "--torch-version", "2.14.1", "--out", str(out))
    refused(result, r"fix\.md: would overwrite an input")
    assert contents(run) == before
    assert sorted(p.name for p in out.iterdir()) == ["fix.md"]


# ----- --torch-version -----------------------------------------------------------------------


@pytest.mark.parametrize("version", ["banana", "", "2.14", "2", "2.14.1banana", "v2.14.1"])
def test_a_torch_version_that_is_none_is_refused_before_anything_is_written(
    run: Path, tmp_path: Path, version: str
) -> None:
    """`fix --torch-version banana` (or "") exited 0 and wrote no TunableOp file, silently."""
    out = tmp_path / "fixes"
    refused(fix(str(run), "--torch-version", version, "--out", str(out)), "--torch-version")
    assert not out.exists()


@pytest.mark.parametrize(
    ("version", "written"),
    [
        ("2.14.1", "2.14.1"),
        ("2.14.1+cu130", "2.14.1"),
        ("2.15.0a0+git5c48869", "2.15.0"),
        ("2.14.1rc2", "2.14.1"),
        ("2.14.1.post1", "2.14.1"),
    ],
)
def test_a_pep_440_torch_version_gives_its_three_numbers(version: str, written: str) -> None:
    """What `fix --torch-version` writes as PT_VERSION (the test below: once through the
    command; each `fix` of the map costs 0.7 s of CPU)."""
    assert pt_version(version) == written


def test_the_torch_version_given_is_the_tunableop_files_validator(
    run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fixes"
    result = fix(str(run), "--torch-version", "2.15.0a0+git5c48869", "--out", str(out))
    assert result.exit_code == 0, result.output
    first = (out / "tunableop0.csv").read_text().splitlines()[0]
    assert first == "Validator,PT_VERSION,2.15.0"


def test_without_a_torch_version_the_skipped_file_is_said_in_one_line(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no torch installed and no --torch-version, only fix.md said that no TunableOp file
    was written."""
    monkeypatch.setattr(tunableop, "_installed_torch", lambda: None)
    out = tmp_path / "fixes"
    result = fix(str(run), "--out", str(out))
    assert result.exit_code == 0, result.output
    said = [line for line in result.stdout.splitlines() if "tunableop0.csv" in line]
    assert len(said) == 1 and "skipped" in said[0] and "--torch-version" in said[0], said
    assert sorted(p.name for p in out.iterdir()) == ["fix.json", "fix.md"]
