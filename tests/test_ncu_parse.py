"""ncu raw-page CSV exports recorded on the H100 -> launches attributed to their cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.observe import ncu_export
from cublas_audit.observe.ncu_export import STALL_REASONS
from cublas_audit.planning.plan_file import read_plan

from .conftest import FIXTURES

RUN = FIXTURES / "h100-batched-cublas"


@pytest.fixture(scope="module")
def launches() -> list[ncu_export.Launch]:
    out: list[ncu_export.Launch] = []
    for path in sorted((RUN / "ncu").glob("chunk-*.csv")):
        out.extend(ncu_export.parse_csv_file(path))
    return out


def test_every_profiled_case_has_launches_and_nothing_else(
    launches: list[ncu_export.Launch],
) -> None:
    profiled = {c.case_id for c in read_plan(RUN / "plan.json") if c.profiled and c.api == "cublas"}
    assert {launch.case_id for launch in launches} == profiled
    assert not any(launch.is_reference for launch in launches)


def test_h100_batch8_1024_dispatches_cutlass_simt(launches: list[ncu_export.Launch]) -> None:
    (launch,) = [x for x in launches if x.case_id == "cublas.fp32.1024x1024x1024.b8.nn"]
    assert "cutlass_80_simt_sgemm_256x128_8x4" in launch.kernel
    assert launch.metrics[ncu_export.FMA_PCT] == pytest.approx(78.5, abs=1.0)
    assert launch.block == "256x1x1"
    assert launch.duration_us is not None and 300 < launch.duration_us < 2000
    assert launch.smem_bytes is not None and launch.smem_bytes > 32_000


def test_stall_ratios_become_percentages(launches: list[ncu_export.Launch]) -> None:
    launch = next(x for x in launches if x.case_id == "cublas.fp32.8192x8192x8192.b8.nn")
    stalls = launch.stall_pct()
    ratio = launch.metrics[ncu_export.STALL_METRIC.format("long_scoreboard")]
    assert ratio is not None
    assert stalls["stall_long_scoreboard"] == pytest.approx(ratio * 100)
    assert set(stalls) == {f"stall_{r}" for r in STALL_REASONS}


def test_innermost_range_wins() -> None:
    cell = (
        '12  "<default domain>:outer:none:none" '
        '"<default domain>:audit.cublas.fp32.8x8x8.b1.nn:none" '
    )
    assert ncu_export.innermost_audit_range(cell) == "audit.cublas.fp32.8x8x8.b1.nn"
    assert ncu_export.innermost_audit_range('1 "<default domain>:other:none" ') is None


def test_numbers_with_thousands_separators() -> None:
    assert ncu_export.parse_number("1,980,000") == 1980000.0
    assert ncu_export.parse_number("n/a") is None


def test_not_an_ncu_export_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(AuditError, match="not an ncu raw-page CSV"):
        ncu_export.parse_csv_file(bad)
