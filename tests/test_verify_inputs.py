"""Issue 38: what `verify` checks before any GPU work: where --out may go, the TunableOp file
beside the fix file (`--torch`), and the fix file whole, field by field.

Every input is the fix file the H100's random maps gave (reports/h100/fixes/20261125-092546, with
the tunableop0.csv `fix` wrote beside it), copied and broken the way a user's file can be. The GPU
is a stand-in (tests/fakeprobe.py's H100 environment) and the measuring is stubbed to fail the
test if it is reached: every refusal here must come first.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from cublas_audit.cli import app
from cublas_audit.observe import environment
from cublas_audit.run import verify as run_verify
from tests.conftest import REPORTS
from tests.fakeprobe import h100_environment

RECORDED = REPORTS / "h100" / "fixes" / "20261125-092546"
runner = CliRunner()


@pytest.fixture
def stand_in_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled run's H100 as this machine; measuring anything fails the test."""

    def measured(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("verify reached the GPU before refusing its input")

    monkeypatch.setattr(environment, "collect", lambda ncu=None, device=None: h100_environment())
    monkeypatch.setattr(run_verify, "verify", measured)


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """The recorded fix file and its TunableOp file, in a directory of their own."""
    shutil.copy(RECORDED / "fix.json", tmp_path / "fix.json")
    shutil.copy(RECORDED / "tunableop0.csv", tmp_path / "tunableop0.csv")
    return tmp_path / "fix.json"


def refused(result: Result, words: str) -> str:
    """Exit 2 and the contract's one line on stderr, matching `words`."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    error = result.stderr.strip()
    assert error.startswith("error: ") and "\n" not in error, repr(result.stderr)
    assert re.search(words, error), error
    return error


# ----- --out: never an input, never a directory, checked first ---------------------------------


@pytest.mark.parametrize("out", ["same", "symlink", "hardlink", "directory", "tunableop"])
def test_an_out_that_is_an_input_or_a_directory_is_refused_first(
    stand_in_h100: None, copied: Path, out: str
) -> None:
    """`verify FIX --out FIX` replaced the fix file with its verdicts once the GPU calls were
    stubbed; a directory, or another name for the fix file (or the TunableOp file --torch reads),
    must be refused as report's --out is, before the GPU is asked."""
    before = {p.name: p.read_bytes() for p in copied.parent.iterdir()}
    target = {
        "same": copied,
        "symlink": copied.parent / "link.json",
        "hardlink": copied.parent / "hard.json",
        "directory": copied.parent,
        "tunableop": copied.parent / "tunableop0.csv",
    }[out]
    if out == "symlink":
        target.symlink_to(copied.name)
    if out == "hardlink":
        os.link(copied, target)
    result = runner.invoke(app, ["verify", str(copied), "--torch", "--out", str(target)])
    refused(result, "would overwrite|is a directory")
    for name, content in before.items():
        assert (copied.parent / name).read_bytes() == content, name


# ----- --torch: the TunableOp file through its one reader ---------------------------------------


def test_a_binary_tunableop_file_is_one_line(stand_in_h100: None, copied: Path) -> None:
    """`verify --torch` read tunableop0.csv with read_text and died with UnicodeDecodeError
    (exit 4) on a binary file."""
    (copied.parent / "tunableop0.csv").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
    result = runner.invoke(app, ["verify", str(copied), "--torch"])
    refused(result, r"tunableop0\.csv: .*not UTF-8 text")


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ("PT_VERSION", "PT_VERSON", r"tunableop0\.csv:1: unknown validator 'PT_VERSON'"),
        ("Validator,PT_VERSION,2.14.1\n", "", r"no PT_VERSION validator"),
        ("PT_VERSION,2.14.1", "PT_VERSION,banana", r"PT_VERSION 'banana' is not"),
    ],
)
def test_the_tunableop_validators_are_checked_before_the_gpu(
    stand_in_h100: None, copied: Path, old: str, new: str, words: str
) -> None:
    """A misspelt validator key got past the check and on to the GPU (exit 3 on a CPU
    machine): TunableOp would ignore the file's pins with no word."""
    tunable = copied.parent / "tunableop0.csv"
    text = tunable.read_text()
    assert old in text
    tunable.write_text(text.replace(old, new, 1))
    refused(runner.invoke(app, ["verify", str(copied), "--torch"]), words)


def test_a_validator_given_twice_is_refused() -> None:
    from cublas_audit.errors import AuditError
    from cublas_audit.table.tunableop_file import parse_tunableop

    text = (RECORDED / "tunableop0.csv").read_text()
    twice = "Validator,PT_VERSION,2.15.0\n" + text
    with pytest.raises(AuditError, match=r"^t\.csv:2: validator PT_VERSION is already on line 1"):
        parse_tunableop(twice, "t.csv")
