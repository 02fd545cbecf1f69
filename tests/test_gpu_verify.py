"""`verify` on the GPU: the bundled fix file's pins re-measured, a pin cuBLASLt cannot build
refused, and a fixed call that computes nothing reported as a wrong result, never a pass.

The fix file is the one `fix` wrote from the H100's random FP32 and BF16 maps
(reports/h100/fixes/20261125-092546); on the H100 it was verified there (verify.json beside it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cublas_audit.jobs.verify import checked_input
from cublas_audit.run import verify_rounds
from cublas_audit.table.fix_file import FixSet, read_fix_file

pytestmark = pytest.mark.gpu

FIXES = Path(__file__).resolve().parents[1] / "reports/h100/fixes/20261125-092546/fix.json"


@pytest.fixture(scope="module")
def fixes() -> FixSet:
    return checked_input(FIXES)


def test_a_recorded_pin_is_rebuilt_and_its_result_checked(fixes: FixSet) -> None:
    """Its gain is re-measured (a number on another GPU, "holds" on the H100 it came from); its
    result is within the mode's tolerance of float64 whatever the speed."""
    fix = fixes.fixes[0]
    found = verify_rounds.verify_fix(fix)
    assert found.status in (verify_rounds.HOLDS, verify_rounds.DOES_NOT_HOLD), found.line()
    assert found.speedup is not None and found.speedup > 0
    assert found.fixed_error is not None and found.fixed_error < 1e-4  # fp32 against float64
    assert found.timing in ("kernel", "call")


def test_a_pin_this_cublas_cannot_build_is_refused(fixes: FixSet) -> None:
    fix = fixes.fixes[0]
    assert fix.pin is not None
    broken = dataclasses.replace(fix, pin=dataclasses.replace(fix.pin, algo_id=9999))
    found = verify_rounds.verify_fix(broken)
    assert found.status == verify_rounds.REFUSED, found.line()


def test_a_fixed_call_that_computes_nothing_is_a_wrong_result(fixes: FixSet) -> None:
    """The fixed side launches nothing: its output stays as poisoned (NaN), and verify says so."""
    fix = fixes.fixes[0]
    with verify_rounds._sides(fix) as (default, fixed):
        silent = dataclasses.replace(fixed, run=lambda: None)
        found = verify_rounds._measured(fix, default, silent, verify_rounds.DEFAULT_THRESHOLD)
    assert found.status == verify_rounds.WRONG, found.line()
    assert "differs from a float64 product" in found.reason


def test_a_bf16_pin_is_verified_too(fixes: FixSet) -> None:
    fix = next(f for f in fixes.fixes if f.problem.mode == "bf16")
    found = verify_rounds.verify_fix(fix)
    assert found.status in (verify_rounds.HOLDS, verify_rounds.DOES_NOT_HOLD), found.line()
    assert found.fixed_error is not None and found.fixed_error < 1e-2


def test_the_recorded_file_reads_whole() -> None:
    assert len(read_fix_file(FIXES).fixes) == 23
