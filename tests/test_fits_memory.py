"""A plan none of whose cases fits the GPU's memory is refused before any GPU work
(run.sweep_setup.check_fits_memory), naming its smallest case; one that fits lets the run go on,
found without working out every case's bytes (a full map's shard: 65,536 of them)."""

from __future__ import annotations

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import Case
from cublas_audit.run.sweep_setup import check_fits_memory

HUGE = [
    Case("cublas", "fp32", 65536, 65536, 65536, 1),
    Case("cublas", "fp32", 32768, 32768, 32768, 1),
]


def test_a_plan_of_no_case_that_fits_is_refused_naming_its_smallest() -> None:
    # 3 x 32768^2 FP32 values: 12.9 GB, the smaller of the two
    with pytest.raises(AuditError, match=r"32768x32768x32768\.b1\.nn needs 12\.9 GB .* has 10 GB"):
        check_fits_memory(HUGE, 10)
    check_fits_memory([*HUGE, Case("cublas", "fp32", 64, 64, 64, 1)], 10)  # one fits: it runs
    check_fits_memory(HUGE, None)  # (no memory reported: nothing to check)


def test_the_search_ends_at_the_first_case_that_fits() -> None:
    cases = [Case("cublas", "bf16", 64, 64, k, 1) for k in range(64, 64 * 1001, 64)]
    check_fits_memory(cases, 80)
    # (Case.bytes_needed keeps what it counted: only the first case was counted)
    assert [case for case in cases if "_bytes_needed" in vars(case)] == cases[:1]
