"""The cuBLASLt candidate audit on the real GPU, of a problem posed as a model poses it: F.linear
with a bias (cuBLAS tn) and a padded leading dimension. Every row is that problem, the default's
output is checked against float64 in that layout, and each timed candidate has its kernel time
and kernel names from CUPTI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cublas_audit.device import candidate_audit
from cublas_audit.judge import candidates
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.planning.modes import mode as mode_of
from cublas_audit.table import candidates_table

pytestmark = pytest.mark.gpu

# op(A) = A^T with A stored k x m in 300-element columns (k = 256 rows: 44 elements of padding),
# plus the BIAS epilogue: the layout of the trace's addmm on a transposed weight, padded.
POSED = Case("cublasLt", "fp32", 384, 512, 256, 1, "t", "n", lda=300, bias=True)


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    pytest.importorskip("nvmath")
    pytest.importorskip("cupti")
    out = tmp_path_factory.mktemp("candidates")
    lines: list[str] = []
    # the classic-API twin of a problem is not one here: it has no bias, so it is its own problem
    twin = replace(POSED, api="cublas", bias=False)
    candidate_audit.run_candidates(
        [POSED, POSED, twin],
        out,
        8,
        gpu_label="gpu-test",
        progress=lines.append,
        screen=candidates.ScreenJudge(),
    )
    return out, lines


def test_every_row_is_the_posed_problem(audited: tuple[Path, list[str]]) -> None:
    out, lines = audited
    frame = candidates_table.read_candidates(out)
    assert list(dict.fromkeys(frame["case_id"])) == [
        POSED.case_id,
        replace(POSED, bias=False).case_id,
    ]
    rows = frame[frame["case_id"] == POSED.case_id]
    assert candidates_table.layout_known(frame).all()
    assert {candidates_table.problem_case(row) for _, row in rows.iterrows()} == {POSED}
    assert set(rows["transa"]) == {"t"} and set(rows["lda"]) == {300} and set(rows["bias"]) == {1}
    assert set(rows["workspace_limit_bytes"]) == {DEFAULT_WORKSPACE_BYTES}
    assert len(lines) == 2 and "(tn lda300 bias)" in lines[0]


def test_the_default_is_checked_against_float64_in_its_layout(
    audited: tuple[Path, list[str]],
) -> None:
    frame = candidates_table.read_candidates(audited[0])
    default = frame[(frame["case_id"] == POSED.case_id) & (frame["is_default"] == 1)].iloc[0]
    assert default["status"] == "ok"
    assert default["rel_err"] <= mode_of("fp32").tolerance


def test_timed_candidates_have_kernel_times_and_the_case_is_judged_on_them(
    audited: tuple[Path, list[str]],
) -> None:
    out, lines = audited
    frame = candidates_table.read_candidates(out)
    timed = frame[(frame["status"] == "ok") & frame["time_ms"].notna()]
    assert len(timed) >= 2
    assert timed["kernel_ms"].notna().all() and timed["kernels"].notna().all()
    # a kernel never lasts longer than the call around it (medians of one round each)
    assert (timed["kernel_ms"] <= timed["time_ms"] * 1.05).all()
    assert (frame["timing_basis"] == "kernel").all()
    summary = candidates.case_summary(frame).set_index("case_id").loc[POSED.case_id]
    default = timed[(timed["case_id"] == POSED.case_id) & (timed["is_default"] == 1)].iloc[0]
    assert summary["default_ms"] == default["kernel_ms"]
    assert "on kernel time" in lines[0]


def test_events_alone_where_tracing_is_off(tmp_path: Path) -> None:
    pytest.importorskip("nvmath")
    frame = candidate_audit.run_candidates(
        [POSED], tmp_path, 4, trace=False, screen=candidates.ScreenJudge()
    )
    timed = frame[frame["time_ms"].notna()]
    assert len(timed) and timed["kernel_ms"].isna().all()
    assert (timed["timing_basis"] == "call").all()
