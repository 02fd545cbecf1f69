"""The documented 'at least' thresholds of the rules (docs/report.md), each on both sides of its
boundary, on real recorded tables; and the rule, validation, kernel-name and trace-mapping
decisions the mutation audit (benchmarks/results/mutation_cpu.json) found untested.

A boundary is hit exactly by setting the threshold (`--threshold`) to the recorded value itself:
"at" fires, the next float past it does not (or the converse for a "below" threshold).

Recorded values used (tests/fixtures/h100-batched-cublas, FP32 cublasSgemmStridedBatched):
  batch 4 dispatches simt_256x128_8x4 at 1024, 2048, 4096, 8192 (8192 / 1024 = 8.0 in linear
  size) at 78.3727, 79.5228, 80.1277, 81.9489 % FMA; 256^3 runs xmma_32x32x8 at 18.2718 %
  (batch 4: 256 * 256 * 4 = 262144 output elements) and 33.3562 % (batch 8: 524288); the best
  FP32 utilization of the table is 82.1128 % (8192^3 batch 8). Batch 16 at 2048^3: the batched
  call 5.45432 ms, its loop 5.41789 ms.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.judge import noise
from cublas_audit.judge.rules import audit
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.observe.kernels import LEGACY_FAMILIES, normalize
from cublas_audit.observe.torch_trace import GemmProblem
from cublas_audit.table.dispatch import TableSource
from cublas_audit.table.inputs import load_one_gpu
from cublas_audit.table.validation import (
    DIMENSION,
    PERCENT,
    TIME,
    Range,
    check_against_plan,
    check_unique,
    read_table,
)
from tests.conftest import FIXTURES, ZERO_NOISE

ROOT = Path(__file__).resolve().parents[1]
BATCHED = FIXTURES / "h100-batched-cublas"
SLICE = FIXTURES / "h100-map-10k-n192"
LAYOUTS = ROOT / "reports/h100/layouts"
after = math.inf  # math.nextafter(x, after): the next float above x


@pytest.fixture(scope="module")
def batched() -> pd.DataFrame:
    return read_table(BATCHED)


@pytest.fixture(scope="module")
def layouts() -> pd.DataFrame:
    return load_one_gpu(LAYOUTS / "20261123-225609-layouts").frame


@pytest.fixture(scope="module")
def gemv() -> pd.DataFrame:
    return load_one_gpu(LAYOUTS / "20261123-225609-gemv").frame


def _found(table: pd.DataFrame, rule: str, **thresholds: float) -> list[tuple[int, str, str]]:
    return [
        (f.batch, f.sizes[0], f.severity)
        for f in audit(table, Thresholds(**thresholds), rules=(rule,))
    ]


# ----- no-escalation ----------------------------------------------------------------------------


def test_escalation_range_is_at_least(batched: pd.DataFrame) -> None:
    # the batch-4 run spans 8192 / 1024 = 8.0: at escalation_min_range 8 it is judged
    loose = {"escalation_max_pct": 85.0}
    assert _found(batched, "no-escalation", **loose) == [(4, "1024", "high")]
    wider = math.nextafter(8.0, after)
    assert _found(batched, "no-escalation", escalation_min_range=wider, **loose) == []


def test_escalation_min_size_is_at_least(batched: pd.DataFrame) -> None:
    loose = {"escalation_max_pct": 85.0}
    assert _found(batched, "no-escalation", escalation_min_size=8192, **loose)
    beyond = math.nextafter(8192.0, after)
    assert _found(batched, "no-escalation", escalation_min_size=beyond, **loose) == []


def test_escalation_utilization_must_be_below_the_maximum(batched: pd.DataFrame) -> None:
    # large sizes from 4096: 80.1277 and 81.9489 %. A maximum of 81.9489 is reached (no
    # finding); one float above it, both are below (a finding).
    assert _found(batched, "no-escalation", escalation_max_pct=81.9489) == []
    above = math.nextafter(81.9489, after)
    assert _found(batched, "no-escalation", escalation_max_pct=above) == [(4, "1024", "high")]
    # from escalation_min_size = 8192 only 8192 is a large size, and 8192 itself counts: its
    # 81.9489 % reaches the maximum, so no finding
    at_8192 = {"escalation_min_size": 8192.0, "escalation_max_pct": 81.9489}
    assert _found(batched, "no-escalation", **at_8192) == []


# ----- low-utilization --------------------------------------------------------------------------


def test_fill_min_elements_is_at_least(batched: pd.DataFrame) -> None:
    # 256^3 batch 4 fills 262144 output elements, batch 8 524288
    assert _found(batched, "low-utilization", fill_min_elements=262144) == [
        (4, "256", "medium"),
        (8, "256", "medium"),
    ]
    assert _found(batched, "low-utilization", fill_min_elements=262145) == [(8, "256", "medium")]


def test_low_utilization_is_below_the_fraction(batched: pd.DataFrame) -> None:
    # 33.3562 % against the best 82.1128 %: at the fraction 33.3562 / 82.1128 = 0.406223 it is
    # not below (exactly that share), one float above it, it is
    fraction = 33.3562 / 82.1128
    assert fraction * 82.1128 == 33.3562  # the boundary is exact in binary
    fill = {"fill_min_elements": 262145.0}  # batch 8 only
    assert _found(batched, "low-utilization", low_util_fraction=fraction, **fill) == []
    above = math.nextafter(fraction, after)
    assert _found(batched, "low-utilization", low_util_fraction=above, **fill) == [
        (8, "256", "medium")
    ]


# ----- high_ratio: reference-faster, batched-slower-than-loop, layout-penalty ----------------


def test_high_ratio_is_at_least_for_the_loop_rule(
    batched: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(noise, "load", lambda path=None: ZERO_NOISE)
    ratio = 5.45432 / 5.41789  # 1.006724, batch 16 at 2048^3
    base = {"loop_margin_pct": 0.0}
    found = _found(batched, "batched-slower-than-loop", high_ratio=ratio, **base)
    assert (16, "2048", "high") in found
    found = _found(
        batched, "batched-slower-than-loop", high_ratio=math.nextafter(ratio, after), **base
    )
    assert (16, "2048", "medium") in found


def test_high_ratio_is_at_least_for_reference_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(noise, "load", lambda path=None: ZERO_NOISE)
    table = read_table(FIXTURES / "published_article_single_5090.csv")
    ratio = 0.248 / 0.234  # 2048: cuBLAS 0.248 ms, the article's kernel 0.234 ms: 1.059829
    assert _found(table, "reference-faster", high_ratio=ratio) == [(1, "2048", "high")]
    above = math.nextafter(ratio, after)
    assert _found(table, "reference-faster", high_ratio=above) == [(1, "2048", "medium")]


def test_layout_penalty_ratio_and_its_high_severity_are_at_least(layouts: pd.DataFrame) -> None:
    # cublas 256^3 batch 8: tn / nt = 0.016480 / 0.012160 = 1.355263 (cuBLASLt's 1.359 is above).
    # With layout_penalty_ratio exactly that and high_ratio 1, the finding is at both
    # boundaries: it fires (ratio >= penalty) and is high (ratio >= 1 x penalty).
    ratio = 0.016480 / 0.012160

    def flagged(**thresholds: float) -> dict[str, str]:
        found = audit(layouts, Thresholds(**thresholds), rules=("layout-penalty",))
        return {f.api: f.severity for f in found}

    assert flagged(layout_penalty_ratio=ratio, high_ratio=1.0) == {
        "cublas": "high",
        "cublasLt": "high",
    }
    # just past each boundary: not flagged; flagged, but medium
    assert "cublas" not in flagged(layout_penalty_ratio=math.nextafter(ratio, after))
    bumped = flagged(layout_penalty_ratio=ratio, high_ratio=math.nextafter(1.0, after))
    assert bumped["cublas"] == "medium"


# ----- dispatch-cliff ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def map_slice() -> pd.DataFrame:
    return read_table(SLICE / "dispatch.csv")


def _cliffs(table: pd.DataFrame, pct: float) -> set[str]:
    found = audit(table, Thresholds(cliff_drop_pct=pct), rules=("dispatch-cliff",))
    return {f.sizes[0] for f in found}


def test_cliff_drop_is_at_least(map_slice: pd.DataFrame) -> None:
    # the slice's largest cliff: 2112x192x1792 (xmma_64x128x8, 0.039968 ms) -> 2368x192x1792
    # (simt_128x64_8x5, 0.116738 ms): 1 - (2368 / 2112) * 0.039968 / 0.116738 = 61.6127 %,
    # computed as the rule does (TFLOP/s of each: 2 m n k / time)
    rate_before = 2.0 * float(2112 * 192 * 1792) * 1.0 / 0.039968
    rate_after = 2.0 * float(2368 * 192 * 1792) * 1.0 / 0.116738
    drop_pct = (1 - rate_after / rate_before) * 100
    assert drop_pct == pytest.approx(61.6127, abs=1e-4)
    assert _cliffs(map_slice, drop_pct) == {"2368x192x1792"}
    assert _cliffs(map_slice, math.nextafter(drop_pct, after)) == set()


def test_no_cliff_without_a_kernel_change(map_slice: pd.DataFrame) -> None:
    # simt_128x64_8x5 runs both 256x192x2688 (0.013376 ms) and 256x192x2752 (0.015840 ms):
    # throughput drops 1 - (2752 / 2688) * 0.013376 / 0.015840 = 13.545 %, on the same kernel.
    # At a 13.5 % threshold that is no cliff; the kernel changes at 13.5 % and more are.
    cliffs = _cliffs(map_slice, 13.5)
    assert "256x192x2752" not in cliffs
    assert {"2368x192x1792", "896x192x3200", "768x192x3328"} <= cliffs


# ----- underfilled-grid -------------------------------------------------------------------------


def test_underfilled_grid_boundaries(gemv: pd.DataFrame) -> None:
    # The FP32 dot of pytorch#114911, M = N = 1, K = 131072, on the 132-SM H100: 496 CTAs,
    # operands (131072 + 131072 + 1) * 4 = 1048580 bytes, 0.00392 ms (cublasSgemm) and
    # 0.00416 ms (the strided call). Thresholds put exactly at those values:
    frame = gemv
    fraction, per_sm = 496 / 132, 1048580 / 132
    assert fraction * 132 == 496 and per_sm * 132 == 1048580  # exact in binary
    at = {
        "underfill_sm_fraction": math.nextafter(fraction, after),  # 496 CTAs are below it
        "underfill_bytes_per_sm": per_sm,  # the operands reach it
        "underfill_min_ms": 0.00392,  # the call takes it
    }

    def sizes(**changed: float) -> list[str]:
        t = Thresholds(**{**at, **changed})
        return sorted(f.sizes[0] for f in audit(frame, t, rules=("underfilled-grid",)))

    assert sizes() == ["1x1x131072", "1x1x131072 strided"]
    assert sizes(underfill_sm_fraction=fraction) == []  # 496 is not below 496
    assert sizes(underfill_bytes_per_sm=math.nextafter(per_sm, after)) == []
    assert sizes(underfill_min_ms=math.nextafter(0.00392, after)) == ["1x1x131072 strided"]


# ----- legacy-kernel: gemv kernels ---------------------------------------------------------------


def test_gemv_kernels_are_legacy_on_a_gemm(gemv: pd.DataFrame) -> None:
    assert frozenset({"magma", "legacy", "gemv"}) == LEGACY_FAMILIES
    # the kernels the H100 ran for the M = N = 1 problems are gemv-family: legacy on a GEMM,
    # exempt only because the problem is a vector one
    frame = gemv
    names = set(frame["kernel"].dropna())
    vector_kernels = {n for n in names if normalize(n).family == "gemv"}
    assert vector_kernels and all(normalize(n).family in LEGACY_FAMILIES for n in vector_kernels)
    assert audit(frame, rules=("legacy-kernel",)) == []
    assert normalize("gemvx_kernel<int, int, float>").short == "gemvx_kernel"


# ----- validation -------------------------------------------------------------------------------


def test_a_dispatch_row_missing_from_the_plan_is_refused() -> None:
    frame = read_table(FIXTURES / "h100-smoke" / "dispatch.csv")
    plan = [case["case_id"] for case in json.loads((FIXTURES / "h100-smoke/plan.json").read_text())]
    source = TableSource(FIXTURES / "h100-smoke" / "dispatch.csv")
    check_against_plan(frame, plan, source)  # the recorded run agrees with its plan
    with pytest.raises(AuditError, match=r"'cublas.fp32.256x256x256.b8.nn' is not in plan.json"):
        check_against_plan(frame, [c for c in plan if c != "cublas.fp32.256x256x256.b8.nn"], source)
    with pytest.raises(AuditError, match=r"1 case\(s\) of plan.json have no row \(first: x\)"):
        check_against_plan(frame, [*plan, "x"], source)


def test_ranges_on_both_sides() -> None:
    def bad(r: Range, *values: float) -> list[bool]:
        return [bool(v) for v in r.bad(pd.Series(values, dtype=float))]

    tiny = math.nextafter(0.0, 1.0)
    assert bad(TIME, 0.0, tiny, math.inf) == [True, False, True]  # a time is above 0
    assert bad(PERCENT, 0.0, math.nextafter(0.0, -1.0), 100.0, math.nextafter(100.0, 200)) == [
        False,
        True,
        False,
        True,
    ]
    assert bad(DIMENSION, 0, 1, 2**31 - 1, 2**31) == [True, False, False, True]
    assert bad(Range(0.0, infinite_ok=True), math.inf, -1.0) == [False, True]
    assert bad(TIME, math.nan) == [False]  # missing: not judged here


# ----- torch trace: PyTorch's call in cuBLAS's terms -------------------------------------------


def test_a_batched_operand_with_a_padded_batch_stride_keeps_it() -> None:
    # bmm of [4, 256, 128] @ [4, 128, 192], B's batch stride padded to 128 * 192 + 64: cuBLAS's A
    # (torch's B) is read in place, ld 192, stride 24640; torch's A is packed (stride 32768).
    problem = GemmProblem(
        "aten::bmm", "fp32", 256, 192, 128, 4, (256 * 128, 128, 1), (128 * 192 + 64, 192, 1)
    )
    terms = problem.cublas_terms()
    assert (terms["m"], terms["n"], terms["k"], terms["batch"]) == (192, 256, 128, 4)
    assert (terms["transa"], terms["lda"], terms["stride_a"]) == ("n", 192, 24640)
    assert (terms["transb"], terms["ldb"], terms["stride_b"]) == ("n", 128, 32768)


def test_the_bias_epilogue_needs_every_dimension_above_one() -> None:
    def addmm(m: int, n: int, k: int) -> GemmProblem:
        return GemmProblem("aten::addmm", "fp32", m, n, k, 1, (k, 1), (n, 1), True, 1.0, (n,), (1,))

    assert addmm(2, 2, 2).bias_epilogue  # 2 is above 1
    assert not addmm(1, 2, 2).bias_epilogue and not addmm(2, 2, 1).bias_epilogue
    terms = addmm(2, 2, 2).cublas_terms()
    assert terms["bias"] and terms["beta"] == 0.0  # the epilogue adds the bias, beta 0
    assert addmm(1, 2, 2).cublas_terms()["beta"] == 1.0


def _mm(a_strides: tuple[int, int], b_strides: tuple[int, int]) -> dict[str, object]:
    # mm of A (4 x 3) @ B (3 x 2): cuBLAS computes C^T = B^T A^T, so its A is torch's B
    return GemmProblem("aten::mm", "fp32", 4, 2, 3, 1, a_strides, b_strides).cublas_terms()


def test_strided_matrix_operands_off_the_dense_path() -> None:
    # B (3 x 2) column-major in a padded buffer, strides (1, 6): its columns are contiguous, 6 >= 3
    # rows -> "t", ld 6. A (4 x 3) row-major with padded rows, strides (5, 1): 5 >= 3 columns ->
    # "n", ld 5.
    terms = _mm((5, 1), (1, 6))
    assert (terms["transa"], terms["lda"], terms["transb"], terms["ldb"]) == ("t", 6, "n", 5)
    # neither stride 1 (a view taking every other row and column): copied contiguous first,
    # "n" with ld = its row length (A: 3, B: 2), whatever its strides
    terms = _mm((2, 10), (14, 2))
    assert (terms["transa"], terms["lda"], terms["transb"], terms["ldb"]) == ("n", 2, "n", 3)


def _bmm_a(b_strides: tuple[int, int, int]) -> tuple[object, object, object]:
    # bmm of [2, 4, 3] @ [2, 3, 5]: N = 5 != 1, so the operands swap: cuBLAS's A is torch's B
    terms = GemmProblem("aten::bmm", "fp32", 4, 5, 3, 2, (12, 3, 1), b_strides).cublas_terms()
    return terms["transa"], terms["lda"], terms["stride_a"]


def test_strided_batched_operands_off_the_contiguous_path() -> None:
    # torch's B stored transposed per batch with K padded to 4: strides (20, 1, 4) -> "t", ld 4,
    # batch stride 20 (read in place)
    assert _bmm_a((20, 1, 4)) == ("t", 4, 20)
    # unpadded (w.transpose(1, 2) of a contiguous [2, 5, 3]): strides (15, 1, 3), ld 3 = K exactly
    assert _bmm_a((15, 1, 3)) == ("t", 3, 15)
    # no unit stride (a step-3 view): copied contiguous, "n", ld 5, batch stride 3 * 5 = 15
    assert _bmm_a((90, 3, 9)) == ("n", 5, 15)


def test_a_bias_scaled_by_beta_is_not_the_epilogue() -> None:
    # addmm(bias, x, w, beta=0.5): cuBLASLt's BIAS epilogue adds the bias unscaled, so PyTorch
    # keeps beta and the plain call
    problem = GemmProblem("aten::addmm", "fp32", 2, 2, 2, 1, (2, 1), (2, 1), True, 0.5, (2,), (1,))
    assert not problem.bias_epilogue
    assert problem.cublas_terms()["beta"] == 0.5 and not problem.cublas_terms()["bias"]


def test_uniqueness_is_judged_on_main_launches_without_a_launch_column() -> None:
    frame = read_table(FIXTURES / "h100-smoke" / "dispatch.csv").drop(columns=["launch"])
    source = TableSource(FIXTURES / "h100-smoke" / "dispatch.csv")
    # the split-K reduction (role aux) shares its case's key: not a second record of it
    assert (frame["role"] == "aux").any()
    check_unique(frame, source)
    main = frame[frame["role"] == "main"]
    with pytest.raises(AuditError, match="appears again"):
        check_unique(pd.concat([frame, main.iloc[[0]]], ignore_index=True), source)
