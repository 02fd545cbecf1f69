"""judge.rules.layout pinned at its boundaries on recorded H100 runs, judged without run-to-run
noise (ZERO_NOISE: a pair is slower exactly where its ratio reaches 1 + the threshold).

layout-penalty: the K = 140 layouts check (reports/h100/checks/20261125-092057-k140-layouts: bf16
1024x1024x140 batch 8 in nn and nt through cuBLAS and cuBLASLt, K = 144 in nn alone). Kernel
times: cuBLAS nn 0.020832 against nt 0.009888 ms (2.1068x), cuBLASLt nn 0.020832 against nt
0.009920 ms (2.1000x).

broadcast-slower-than-folded: FP16 8192x512x8192 batch 4 with a shared A against the one
8192x2048x8192 GEMM it folds into (reports/h100/layouts/20261123-225609-broadcast and -folded):
cuBLASLt 0.411976 against 0.396312 ms of kernel time (1.03952x), cuBLAS 0.361575 against 0.363031
(faster).
"""

from __future__ import annotations

from functools import cache

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.frame import RuleContext
from cublas_audit.judge.rules.layout import broadcast_slower_than_folded, layout_penalty
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.dispatch import from_records
from tests.conftest import REPORTS, ZERO_NOISE

K140 = REPORTS / "h100" / "checks" / "20261125-092057-k140-layouts" / "dispatch.csv"
LAYOUTS = REPORTS / "h100" / "layouts"
NN, NT = 0.020832, 0.009888  # cuBLAS's kernel times, ms
NN_LT, NT_LT = 0.020832, 0.009920  # cuBLASLt's
SHARED, FOLDED = 0.411976, 0.396312  # cuBLASLt's batched call with a shared A, the folded GEMM


@cache
def _k140() -> pd.DataFrame:
    return prepare(from_records(pd.read_csv(K140).to_dict("records")))


@cache
def _broadcast() -> pd.DataFrame:
    frames = [pd.read_csv(LAYOUTS / f"20261123-225609-{run}" / "dispatch.csv") for run in
              ("broadcast", "folded")]  # fmt: skip
    # without the extremes (min, max) of each kernel time: they overlap (0.360 ms is cuBLASLt's
    # fastest shared-A call, under the folded GEMM's slowest 0.419), which leaves every pair
    # unsure; without them the interval alone judges (verdicts._apart)
    extremes = ["kernel_time_min_ms", "kernel_time_max_ms", "time_min_ms", "time_max_ms"]
    frame = pd.concat(frames, ignore_index=True)
    kept = frame.drop(columns=[c for c in extremes if c in frame.columns])
    return prepare(from_records(kept.to_dict("records")))


def penalties(rows: pd.DataFrame | None = None, **thresholds: float) -> list[Finding]:
    ctx = RuleContext(_k140() if rows is None else rows, Thresholds(**thresholds), model=ZERO_NOISE)  # type: ignore[arg-type]
    return layout_penalty(ctx)


def folds(**thresholds: float) -> list[Finding]:
    ctx = RuleContext(_broadcast(), Thresholds(**thresholds), model=ZERO_NOISE)  # type: ignore[arg-type]
    return broadcast_slower_than_folded(ctx)


def test_nn_against_nt_in_each_api_and_the_effect() -> None:
    found = penalties()
    # K = 144 is posed in nn alone (one layout: nothing to compare); broadcast is empty (NaN)
    # in every row, and those rows still group
    assert [(f.api, f.rows, f.compared) for f in found] == [("cublas", [0], [3]),
                                                            ("cublasLt", [1], [5])]  # fmt: skip
    assert found[0].message.startswith(
        "In layout nn the call takes 2.11x the time of layout nt"  # 0.020832 / 0.009888 = 2.1068
    )
    assert "comparing the kernels' time (CUPTI)" in found[0].message
    # the time given back: 1 - 1 / 2.1068 = 1 - 0.009888 / 0.020832 = 0.52534
    assert found[0].effect == round(1 - NT / NN, 4) == 0.5253
    assert found[1].effect == round(1 - NT_LT / NN_LT, 4) == 0.5238
    # default high_ratio 1.25 x penalty 1.3 = 1.625 <= 2.1: high
    assert [f.severity for f in found] == ["high", "high"]


def test_groups_in_the_order_the_table_gives_them() -> None:
    flipped = _k140().iloc[::-1]  # cuBLASLt's rows first: its finding comes first, unsorted
    assert [f.api for f in penalties(flipped)] == ["cublasLt", "cublas"]


def test_the_penalty_ratio_at_the_pairs_ratio() -> None:
    # at exactly cuBLAS's 2.1068 (as the rule divides): slower, and medium (1.25 x 2.1068 above it)
    at = penalties(layout_penalty_ratio=NN / NT)
    assert [(f.api, f.severity, f.effect) for f in at] == [("cublas", "medium", 0.5253)]
    # just above cuBLAS's 2.1068 (and cuBLASLt's 2.1000): nothing; just below both: both
    assert penalties(layout_penalty_ratio=2.107) == []
    assert [f.api for f in penalties(layout_penalty_ratio=2.09)] == ["cublas", "cublasLt"]
    assert [f.api for f in penalties(layout_penalty_ratio=2.104)] == ["cublas"]


def test_high_from_high_ratio_times_the_penalty_ratio() -> None:
    # 1.6 x 1.3 = 2.08 <= 2.1: high; 1.7 x 1.3 = 2.21 > 2.1068: medium (1.7 / 1.3 = 1.31 would not)
    assert [f.severity for f in penalties(high_ratio=1.6)] == ["high", "high"]
    assert [f.severity for f in penalties(high_ratio=1.7)] == ["medium", "medium"]
    # at exactly the ratio (penalty 1: the product is high_ratio itself): high
    at = penalties(layout_penalty_ratio=1.0, high_ratio=NN / NT)
    assert [(f.api, f.severity) for f in at] == [("cublas", "high"), ("cublasLt", "medium")]


def test_the_shared_a_against_its_folded_gemm() -> None:
    # 0.411976 / 0.396312 = 1.03952: slower beyond a 3.9 % margin, not beyond 3.96 % (and 3.96
    # read as a fraction of 101 would be 3.92 %: slower)
    (found,) = folds(fold_margin_pct=3.9)
    assert found.api == "cublasLt"
    assert found.message.startswith(
        "The batched call with a shared A (batch stride 0) takes 1.04x the time of the one "
        "8192x2048x8192 GEMM it folds into"
    )
    assert _broadcast().at[found.rows[0], "case_id"] == "cublasLt.fp16.8192x512x8192.b4.nn.bcast-a"
    assert folds(fold_margin_pct=3.96) == []
    assert folds() == []  # the default 10 %


def test_a_fold_is_high_from_high_ratio() -> None:
    ratio = SHARED / FOLDED
    assert [f.severity for f in folds(fold_margin_pct=3.9, high_ratio=ratio)] == ["high"]
    above = folds(fold_margin_pct=3.9, high_ratio=ratio + 1e-9)
    assert [f.severity for f in above] == ["medium"]
