"""Issue 38: what `fix` says in words: its summary line counts in proper plurals, and fix.md says
plainly what the TunableOp file carries and what it does not (no "carries 0 of 1 fix" and no
"needs 0 bytes").

The fixes are the recorded ones: the 23 pins of the H100's random maps
(reports/h100/fixes/20261125-092546/fix.json) and the FP32 map follow-up's two pins and one pad
(tests/fix_examples.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cublas_audit.jobs.fix import summary_line
from cublas_audit.report.fix_report import render_fix_report
from cublas_audit.report.tunableop import tunableop_export
from cublas_audit.table.fix_file import FixSet, read_fix_file
from tests.conftest import REPORTS
from tests.fix_examples import fix_set, pad_fix

RECORDED = REPORTS / "h100" / "fixes" / "20261125-092546" / "fix.json"


def test_the_summary_counts_in_plurals() -> None:
    """ "23 fixes (23 pin)" read wrong."""
    assert summary_line(read_fix_file(RECORDED)).startswith("fix: 23 fixes (23 pins), ")
    assert summary_line(fix_set()).startswith("fix: 3 fixes (2 pins, 1 pad), ")
    one = replace(fix_set(), fixes=fix_set().fixes[:1])
    assert summary_line(one).startswith("fix: 1 fix (1 pin), ")
    pad = replace(fix_set(), fixes=(pad_fix(),))
    assert summary_line(pad).startswith("fix: 1 fix (1 pad), ")


def _tunable_section(fixes: FixSet, tmp_path: Path) -> str:
    text = render_fix_report(fixes, tunableop_export(fixes, "2.14.1"), tmp_path)
    return text.split("### PyTorch: the TunableOp file", 1)[1].split("### cuBLASLt", 1)[0]


def test_a_file_that_carries_nothing_says_so_plainly(tmp_path: Path) -> None:
    """A pad fix alone: fix.md said the file 'carries 0 of 1 fix' and that 'the largest carried
    pin needs 0 bytes', with the environment to run it as if it pinned anything."""
    section = _tunable_section(replace(fix_set(), fixes=(pad_fix(),)), tmp_path)
    assert "carries no fix: TunableOp cannot apply the one there is (below, why not)." in section
    assert "0 of 1" not in section and "0 bytes" not in section
    assert "PYTORCH_TUNABLEOP_ENABLED" not in section  # nothing to run it for
    assert "| pad-1856 |" in section  # the fix it does not carry, with why


def test_a_file_of_no_fix_says_so(tmp_path: Path) -> None:
    """The Llama trace's sweep --fix found no fix and its fix.md said the file 'carries 0 of 0
    fixes' (reports/h100/traces/20261125-093616-llama-v2/fix.md)."""
    section = _tunable_section(replace(fix_set(), fixes=()), tmp_path)
    assert "carries nothing: there is no fix." in section
    assert "0 of 0" not in section and "Not carried" not in section


@pytest.mark.parametrize(
    ("chosen", "words"),
    [
        (slice(0, 1), "carries the one fix"),
        (slice(0, 2), "carries both fixes"),
        (slice(0, 3), "carries 2 of the 3 fixes"),
    ],
)
def test_what_the_file_carries_in_words(tmp_path: Path, chosen: slice, words: str) -> None:
    fixes = replace(fix_set(), fixes=fix_set().fixes[chosen])
    section = _tunable_section(fixes, tmp_path)
    assert words in section
    # an empty table of what is not carried was printed under its heading
    assert ("Not carried by the file" in section) == (chosen.stop == 3)


def test_pins_without_workspace_are_said_to_need_none(tmp_path: Path) -> None:
    """The map follow-up's two pins need no workspace (candidates.csv: 0 bytes): torch's default
    stays, said as such, not as 'needs 0 bytes'."""
    section = _tunable_section(replace(fix_set(), fixes=fix_set().fixes[:2]), tmp_path)
    assert "0 bytes" not in section
    assert "CUBLASLT_WORKSPACE_SIZE=1024 KiB: torch's own default; the carried pins need no" in (
        section
    )
    recorded = read_fix_file(RECORDED)
    needs = max(f.pin.workspace_bytes for f in recorded.fixes if f.pin)
    assert f"the largest carried pin needs {needs} bytes" in _tunable_section(recorded, tmp_path)
