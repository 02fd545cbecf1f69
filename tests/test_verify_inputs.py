"""Issue 38: what `verify` checks before any GPU work: where --out may go, the TunableOp file
beside the fix file (`--torch`), and the fix file whole, field by field.

Every input is the fix file the H100's random maps gave (reports/h100/fixes/20261125-092546, with
the tunableop0.csv `fix` wrote beside it), copied and broken the way a user's file can be. The GPU
is a stand-in (tests/fakeprobe.py's H100 environment) and the measuring is stubbed to fail the
test if it is reached: every refusal here must come first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from cublas_audit.cli import app
from cublas_audit.observe import environment
from cublas_audit.run import verify_rounds
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
    monkeypatch.setattr(verify_rounds, "verify", measured)


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


# ----- the fix file whole: every field in range ------------------------------------------------


def _edited(copied: Path, text: str) -> Path:
    copied.write_text(text)
    return copied


def _pin_edit(copied: Path, **changes: Any) -> Path:
    data = json.loads(copied.read_text())
    data["fixes"][3]["pin"].update(changes)
    return _edited(copied, json.dumps(data))


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        # cuBLASLt reports -1 and 0 itself for algorithms without split-K (below); -2 is no value
        # it has, and K cannot be cut into more parts than it has elements (this problem's k 896)
        ({"split_k": -2}, r"fixes\[3\]\.pin\.split_k -2 is not"),
        ({"split_k": 897}, r"fixes\[3\]\.pin\.split_k 897 is not"),
        ({"split_k": 10**12}, r"fixes\[3\]\.pin\.split_k 1000000000000 is not"),
        ({"algo_id": 2**31}, r"fixes\[3\]\.pin\.algo_id 2147483648 is not"),
        ({"cta_swizzling": -1}, r"fixes\[3\]\.pin\.cta_swizzling -1 is not"),
        ({"workspace_bytes": 2**64}, r"fixes\[3\]\.pin\.workspace_bytes 18446744073709551616"),
    ],
)
def test_a_pin_out_of_cublaslts_range_is_refused_before_the_gpu(
    stand_in_h100: None, copied: Path, changes: dict[str, int], words: str
) -> None:
    refused(runner.invoke(app, ["verify", str(_pin_edit(copied, **changes))]), words)


@pytest.mark.parametrize("key", ["ms", "confirm_ms", "beta", "speedup"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_literal_is_refused_before_the_gpu(
    stand_in_h100: None, copied: Path, key: str, literal: str
) -> None:
    """Python's json reads NaN and Infinity, which JSON has not: a hand-edited NaN time or beta
    got through to the GPU (even where the reader recomputes the field, as speedup)."""
    text = copied.read_text()
    edited = re.sub(rf'"{key}": [0-9.e-]+', f'"{key}": {literal}', text, count=1)
    assert edited != text
    result = runner.invoke(app, ["verify", str(_edited(copied, edited))])
    refused(result, rf"not valid JSON \({literal} is not a number JSON allows\)")


def test_a_confirmation_time_must_be_a_time(stand_in_h100: None, copied: Path) -> None:
    data = json.loads(copied.read_text())
    data["fixes"][0]["fixed"]["confirm_ms"] = -1.0
    result = runner.invoke(app, ["verify", str(_edited(copied, json.dumps(data)))])
    refused(result, r"fixes\[0\]\.fixed\.confirm_ms -1\.0 is not a positive time")


@pytest.mark.parametrize(
    ("torch", "words"),
    [
        ({"op": "aten::mm", "shape": "64x1600x896", "batch": 1, "share": 7}, r"share 7 is not"),
        ({"op": "aten::mm", "shape": "64x1600x896", "batch": 0, "share": 0.5}, r"batch 0 is not"),
        ({"op": "aten::mm", "shape": "64x1600x896", "share": 0.5}, r"missing field 'batch'"),
        ({"op": 3, "shape": "64x1600x896", "batch": 1, "share": 0.5}, r"op: 3 is not a str"),
    ],
)
def test_the_torch_op_of_a_fix_is_checked(
    stand_in_h100: None, copied: Path, torch: dict[str, Any], words: str
) -> None:
    """A fix's `torch` (the trace's op and its share of GEMM time, as judge.fixes writes it) was
    taken as any object: fix.md would render a share of 700 %."""
    data = json.loads(copied.read_text())
    data["fixes"][3]["torch"] = torch
    result = runner.invoke(app, ["verify", str(_edited(copied, json.dumps(data)))])
    refused(result, rf"fixes\[3\]\.torch.*{words}")


def test_the_recorded_gemv_pins_stay_valid(tmp_path: Path) -> None:
    """cuBLASLt itself reported split-K -1 (algo 11) and 0 (algo 10) for its GEMV algorithms on
    the Llama trace's fp32 LM head (reports/h100/traces/20261125-093616-llama-v2), and torch's
    TunableOp pinned `splitk_-1` in its own file: a fix of such a candidate must stay readable."""
    from cublas_audit.jobs.verify import checked_input
    from cublas_audit.judge.fixes import pin_of
    from cublas_audit.table.candidates_table import read_candidates

    frame = read_candidates(REPORTS / "h100" / "traces" / "20261125-093616-llama-v2")
    gemv = frame[frame["case_id"] == "cublasLt.fp32.32000x4x2048.b1.tn"]
    splits = {int(row["candidate"]): pin_of(row).split_k for _, row in gemv.iterrows()}
    assert (splits[2], splits[3]) == (-1, 0)
    data = json.loads((RECORDED / "fix.json").read_text())
    for split in (-1, 0):
        data["fixes"][3]["pin"]["split_k"] = split
        path = tmp_path / f"split-{split}.json"
        path.write_text(json.dumps(data))
        assert checked_input(path).fixes[3].pin == pin_with(split_k=split)


def pin_with(**changes: int) -> Any:
    import dataclasses

    from cublas_audit.table.fix_file import read_fix_file

    pin = read_fix_file(RECORDED / "fix.json").fixes[3].pin
    assert pin is not None
    return dataclasses.replace(pin, **changes)
