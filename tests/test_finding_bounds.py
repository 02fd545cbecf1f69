"""judge/finding.py pinned on the recorded K=140 check (reports/h100/checks/20261125-074637-k140:
bf16 1024x1024x140 batch 8, its ldb144 form and its padded 1024x1024x144, one cuBLAS row each):
which row names a finding's call, evidence rounded to 4 decimals, `effect` rounded to 4, the order
findings are listed in, and the words of sizes, utilization and ratio ranges."""

from __future__ import annotations

import pandas as pd
import pytest

from cublas_audit.judge.finding import (
    Finding,
    kernel_of,
    of_group,
    of_rows,
    order,
    pct_range,
    ratio_range,
    size_list,
    with_compared,
)
from cublas_audit.judge.rules import prepare
from cublas_audit.vocabulary import Severity, Verdict
from tests.rules.recorded import dataset

K140 = "h100/checks/20261125-074637-k140"
TST = "nvjet_tst_256x128_64x4_1x2"  # row 2's kernel (1024x1024x144)
S16816 = "tensorop_s16816gemm_256x128_64x3"  # rows 0 and 1's (K = 140)


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return prepare(dataset(K140).frame)


def test_the_recorded_rows(rows: pd.DataFrame) -> None:
    assert list(rows["kernel_short"]) == [S16816, S16816, TST]
    assert list(rows["time_ms"]) == [0.03536, 0.034656, 0.026976]


def test_of_group_names_the_call_of_its_first_row(rows: pd.DataFrame) -> None:
    group = rows.loc[[2, 0]]
    found = of_group("r", Severity.medium, group, "msg", "work", Verdict.slower)
    assert found.kernel == TST and kernel_of(group) == TST  # row 2's, not row 0's
    assert found.kernel_name == str(rows.at[2, "kernel"])
    assert found.kernel_name != str(rows.at[0, "kernel"])
    assert found.sizes == ["1024x1024x144", "1024x1024x140"]
    assert found.rows == [2, 0]
    assert (found.api, found.routine, found.mode, found.batch) == (
        "cublas",
        "cublasGemmStridedBatchedEx",
        "bf16",
        8,
    )
    assert found.verdict is Verdict.slower
    assert found.effect == 0.0 and found.compared == []  # a finding ranks by 0 until compared


def test_a_one_row_group(rows: pd.DataFrame) -> None:
    found = of_group("r", Severity.info, rows.loc[[1]], "m", "w")
    assert found.kernel == S16816 and found.rows == [1]
    assert found.verdict is None


def test_evidence_is_rounded_to_4_decimals(rows: pd.DataFrame) -> None:
    (proof,) = of_group("r", Severity.info, rows.loc[[1]], "m", "w").evidence
    assert proof["time_ms"] == 0.0347  # 0.034656 to 4 decimals (5 would keep 0.03466)
    assert proof["util"] == 25.6353
    assert (proof["m"], proof["n"], proof["k"], proof["batch"]) == (1024, 1024, 140, 8)


def test_of_rows_one_finding_a_row_with_its_effect_rounded(rows: pd.DataFrame) -> None:
    # the two K = 140 rows, each against the padded row 2: 1 - 0.026976 / 0.03536 = 0.237104
    effects = [1 - 0.026976 / 0.03536, 1 - 0.026976 / 0.034656]  # 0.237104, 0.221607
    found = of_rows("r", Severity.high, rows.loc[[0, 1]], ["a", "b"], ["wa", "wb"], [2, 2], effects)
    assert [f.effect for f in found] == [0.2371, 0.2216]  # 4 decimals, not 5 (0.23710, 0.22161)
    assert [f.rows for f in found] == [[0], [1]]
    assert [f.compared for f in found] == [[2], [2]]
    assert [f.message for f in found] == ["a", "b"]
    assert [f.sizes for f in found] == [["1024x1024x140"], ["1024x1024x140 ldb144"]]
    assert [f.evidence[0]["time_ms"] for f in found] == [0.0354, 0.0347]
    # each the same finding with_compared(of_group(...)) makes
    alone = of_group("r", Severity.high, rows.loc[[1]], "b", "wb")
    assert found[1] == with_compared(alone, 2, effects[1])


def test_of_rows_refuses_lists_of_other_lengths(rows: pd.DataFrame) -> None:
    with pytest.raises(ValueError):
        of_rows("r", Severity.high, rows.loc[[0, 1]], ["a"], ["wa"], [2], [0.1])


def test_with_compared_rounds_the_effect_to_4_decimals(rows: pd.DataFrame) -> None:
    found = with_compared(of_group("r", Severity.info, rows.loc[[0]], "m", "w"), 2, 0.123456)
    assert found.effect == 0.1235 and found.compared == [2]


def _at(severity: Severity | str, effect: float, gpu: str = "h100") -> Finding:
    return Finding(
        "r", severity, gpu, "cublas", "x", "bf16", 1, ["64"], "k", "m", "w", effect=effect
    )  # type: ignore[arg-type]


def test_order_most_severe_then_largest_effect_first() -> None:
    small, large = _at(Severity.medium, 0.1), _at(Severity.medium, 0.3)
    assert sorted([small, large], key=order) == [large, small]
    high = _at("high", 0.0)  # as its text, a severity ranks as its member
    assert sorted([small, large, high], key=order)[0] is high
    assert order(small)[1] == -0.1


def test_size_list() -> None:
    assert size_list(pd.DataFrame({"shape": ["1024x1024x140"]})) == "size 1024x1024x140"
    two = pd.DataFrame({"shape": ["64", "128"]})
    assert size_list(two) == "sizes 64, 128"


def test_pct_range(rows: pd.DataFrame) -> None:
    # 25.4493 and 25.6353 round to 25 and 26: a range; each alone is one number
    assert pct_range(rows["util"].loc[[0, 1]]) == "25-26 %"
    assert pct_range(rows["util"].loc[[0]]) == "25 %"
    assert pct_range(pd.Series([25.4493, 25.3, float("nan")])) == "25 %"
    assert pct_range(pd.Series([float("nan")])) == "unmeasured (no counters)"


def test_ratio_range() -> None:
    # 1.311 and 1.314 are both 1.31 at 2 decimals: one ratio; 1.28 .. 1.31 a range
    assert ratio_range(pd.Series([1.311, 1.314])) == "1.31x"
    assert ratio_range(pd.Series([1.31079, 1.28470])) == "1.28-1.31x"
    assert ratio_range(pd.Series([1.5])) == "1.50x"
