"""judge.rules.causes' helpers pinned at their boundaries: which dimensions and leading dimensions
are unaligned, how each rounds up, which kernel is of an older architecture, the workaround's
words and the named causes (waves, split K).

The rows are the H100's recorded K = 140 check (reports/h100/checks/20261125-074637-k140: bf16
1024x1024x140 batch 8 on an sm80 cutlass kernel, 256 CTAs on 132 SMs; ldb padded to 144; K padded
to 144 on nvjet sm90, 132 CTAs); a test changes one dimension or count to sit at a boundary.
bf16 is 2 bytes: 16 bytes hold 8 elements.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pandas as pd
import pytest

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.causes import (
    _aligned,
    _older_kernel,
    _padding,
    _posed,
    _rounding,
    _Variant,
    _work,
    named_causes,
    unaligned,
    unaligned_operand,
)
from cublas_audit.judge.rules.frame import RuleContext, dispatched
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.dispatch import from_records
from tests.conftest import REPORTS

K140 = REPORTS / "h100" / "checks" / "20261125-074637-k140" / "dispatch.csv"


@cache
def _k140() -> pd.DataFrame:
    return dispatched(prepare(from_records(pd.read_csv(K140).to_dict("records"))))


def k140(i: int = 0, **changed: object) -> pd.Series:
    """Row i of the recorded check (0: K 140, 1: K 140 with ldb 144, 2: K 144), `changed` set."""
    row = _k140().iloc[i].copy()
    for name, value in changed.items():
        row[name] = value
    return row


def test_k_140_is_the_one_unaligned_dimension() -> None:
    assert unaligned(k140()) == ["K = 140 is not a multiple of 8 bf16 elements (16 bytes)"]
    assert unaligned(k140(2)) == []  # K = 144 = 18 x 8


def test_every_unaligned_dimension_in_k_m_n_order() -> None:
    # M 1001 and N 1002: 2002 and 2004 bytes, no multiple of 16; fp32 (4 B) holds 4 in 16 bytes
    assert unaligned(k140(m=1001, n=1002)) == [
        "K = 140 is not a multiple of 8 bf16 elements (16 bytes)",
        "M = 1001 is not a multiple of 8 bf16 elements (16 bytes)",
        "N = 1002 is not a multiple of 8 bf16 elements (16 bytes)",
    ]
    # in fp16 too (2 B); 1028 fp16 elements are 2056 bytes: 2056 % 16 = 8
    assert unaligned(k140(2, mode="fp16", n=1028)) == [
        "N = 1028 is not a multiple of 8 fp16 elements (16 bytes)"
    ]


@pytest.mark.parametrize(
    ("lda", "said"),
    [
        (140, ["lda = 140 is not a multiple of 8 elements"]),
        (144, []),  # 288 bytes
        (0, []),  # packed: no leading dimension given
        (float("nan"), []),
        (None, []),
    ],
)
def test_a_given_leading_dimension_unaligned(lda: object, said: list[str]) -> None:
    assert unaligned(k140(2, lda=lda)) == said


def test_ldb_is_checked_too() -> None:
    assert unaligned(k140(2, ldb=130)) == ["ldb = 130 is not a multiple of 8 elements"]
    assert unaligned(k140(1)) == ["K = 140 is not a multiple of 8 bf16 elements (16 bytes)"]


def test_aligned_rounds_up_to_the_next_multiple() -> None:
    assert [_aligned(v, 8) for v in (140, 144, 145, 1, 8)] == [144, 144, 152, 8, 8]


def test_padding_and_rounding_in_the_rows_own_figures() -> None:
    assert _padding(k140()) == ["K = 140 up to 144"]
    assert _rounding(k140()) == "round K = 140 up to 144"
    # M grows too: the result's own slice is taken; and lda 1001 % 8 = 1 is padded too
    row = k140(m=1001, lda=1001)
    assert _padding(row) == ["K = 140 up to 144", "M = 1001 up to 1008", "lda = 1001 up to 1008"]
    assert _rounding(row) == (
        "round K = 140 up to 144, M = 1001 up to 1008 and lda = 1001 up to 1008, "
        "then take the result's 1001x1024 slice"
    )
    assert _rounding(k140(2, n=1001)) == (
        "round N = 1001 up to 1008, then take the result's 1024x1001 slice"
    )
    # an aligned ldb (144), a zero lda and a NaN one pad nothing
    assert _padding(k140(1)) == ["K = 140 up to 144"]
    assert _padding(k140(lda=float("nan"))) == ["K = 140 up to 144"]


def test_the_workaround_pads_unless_a_layout_was_measured() -> None:
    pad = (
        "Pad to a multiple of 16 bytes with zeros: round K = 140 up to 144. Zeros add nothing "
        "to the product, and the Hopper kernels become eligible."
    )
    assert _work(None, k140()) == pad
    assert _work(_Variant(k140(2), "padded to 1024x1024x144", ""), k140()) == pad
    relaid = _Variant(k140(2), "in layout nt", "nt")
    assert _work(relaid, k140()) == (
        "Store the operands as layout nt expects (transpose once, outside the hot loop): every "
        "leading dimension is then a 16-byte multiple. Or pad to a multiple of 16 bytes with "
        "zeros: round K = 140 up to 144."
    )


def test_how_another_row_poses_the_problem() -> None:
    assert _posed(k140(1), k140()) == ("with ldb 144", "")
    assert _posed(k140(2), k140()) == ("packed", "")
    assert _posed(k140(2, transb="t", lda=1024), k140()) == ("in layout nt with lda 1024", "nt")


@pytest.mark.parametrize(
    ("i", "cc", "older"),
    [
        (0, "9.0", "sm80"),  # the recorded sm80 cutlass kernel on the H100
        (2, "9.0", None),  # nvjet sm90: the GPU's own
        (0, "8.0", None),  # sm80 on an A100 is its own
        (0, "8.6", "sm80"),  # 80 < 86
        (2, "8.0", None),  # newer than the GPU: none older
        (0, "", None),
        (0, None, None),
        (0, "9.0.1", None),  # no number: nothing judged
    ],
)
def test_an_older_architectures_kernel(i: int, cc: object, older: str | None) -> None:
    assert _older_kernel(k140(i, cc=cc)) == older


def test_a_kernel_without_an_architecture_is_not_older() -> None:
    assert _older_kernel(k140(kernel_name="gemv2T_kernel_val")) is None
    assert _older_kernel(k140(kernel_name=None)) is None


# ----- named causes ------------------------------------------------------------------------------


def group(*rows: pd.Series) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def test_the_recorded_k140_call_names_its_k_and_no_wave() -> None:
    # 256 CTAs on 132 SMs: 1.94 waves, the last 94 % full (idle 6 %): no wave cause
    assert named_causes(group(k140())) == "K = 140 is not a multiple of 8 bf16 elements (16 bytes)"


@pytest.mark.parametrize(
    ("ctas", "said"),
    [
        (66, "its 66 CTAs fill 50% of the 132 SMs"),
        (1, "its 1 CTA fill 1% of the 132 SMs"),
        (131, "its 131 CTAs fill 99% of the 132 SMs"),
        (132, ""),  # one full wave
        (264, ""),  # two
        # 198 / 132 = 1.5 waves: the last leaves exactly half idle, the boundary counts
        (198, "its 198 CTAs are 1.50 waves on 132 SMs: the last wave leaves 50% of them idle"),
        (199, ""),  # 1.51 waves: 49 % idle
        (133, "its 133 CTAs are 1.01 waves on 132 SMs: the last wave leaves 99% of them idle"),
        (0, ""),
    ],
)
def test_waves_of_ctas_on_the_sms(ctas: int, said: str) -> None:
    assert named_causes(group(k140(2, traced_ctas=ctas))) == said


def test_no_sm_count_names_no_wave() -> None:
    assert named_causes(group(k140(2, traced_ctas=66, sm_count=float("nan")))) == ""
    assert named_causes(group(k140(2, traced_ctas=66, sm_count=0))) == ""


def test_the_largest_case_of_the_group_is_named() -> None:
    # K 144 (the larger) is aligned: nothing named though K 140 is not; alone, K 140 is
    assert named_causes(group(k140(0), k140(2))) == ""
    assert named_causes(group(k140(2), k140(0, size=600.0))).startswith("K = 140")


def test_a_non_tensor_mode_names_no_alignment() -> None:
    # K 141 is unaligned in fp32 too (564 bytes), but the FMA pipe has no 16-byte rule
    assert named_causes(group(k140(mode="fp32", k=141))) == ""
    assert named_causes(group(k140(mode="int8", k=141))) == ""


def test_a_row_without_an_sm_count_names_no_wave() -> None:
    assert named_causes(group(k140(2, traced_ctas=66).drop("sm_count"))) == ""


def test_a_reduction_after_the_gemm_is_split_k() -> None:
    split = "cuBLAS split K (a reduction kernel follows the GEMM)"
    kernels = "nvjet_sm90_tst_256x128 + cublasLt::splitKreduce_kernel"
    assert named_causes(group(k140(2, traced_kernels=kernels))) == split
    # a reduction as the only (first) launch is the GEMM itself, not a split
    assert named_causes(group(k140(2, traced_kernels="splitKreduce_kernel"))) == ""
    assert named_causes(group(k140(2, traced_kernels=None))) == ""


# ----- the rule over the recorded three rows -------------------------------------------------


@cache
def _prepared() -> pd.DataFrame:
    return prepare(from_records(pd.read_csv(K140).to_dict("records")))


def judge(rows: pd.DataFrame, high_ratio: float = Thresholds().high_ratio) -> list[Finding]:
    return unaligned_operand(RuleContext(rows, replace(Thresholds(), high_ratio=high_ratio)))


# kernel times: K 140 0.020991 ms, ldb 144 0.020768 ms, K 144 0.009728 ms: 2.158 (2.16x)
PADDED = 0.020991 / 0.009728


def padded_ratio() -> float:
    times = _prepared()["kernel_time_ms"].astype(float)
    return float(times.iloc[0] / times.iloc[2])


def test_the_recorded_check_finds_both_k_140_rows() -> None:
    first, second = judge(_prepared())
    assert (first.rows, first.compared, first.severity) == ([0], [2], "high")
    assert first.effect == round(1 - 1 / PADDED, 4) == 0.5366
    assert first.message == (
        "K = 140 is not a multiple of 8 bf16 elements (16 bytes): cuBLAS dispatches "
        "tensorop_s16816gemm_256x128_64x3 (an sm80 kernel) at 1024x1024x140; padded to "
        "1024x1024x144 it runs 2.16x faster on nvjet_tst_256x128_64x4_1x2 (measured in this run, "
        "the kernels' time (CUPTI), beyond the noise floor); with ldb 144 (every leading "
        "dimension 16-byte aligned, K still 140) it is no faster measurably (1.01x)."
    )
    assert first.workaround.startswith("Pad to a multiple of 16 bytes with zeros: round K = 140")
    # 0.020768 / 0.009728 = 2.13x; its own aligned ldb is no variant of its own
    assert (second.rows, second.compared, second.effect) == ([1], [2], 0.5316)
    assert second.message.endswith("the kernels' time (CUPTI), beyond the noise floor).")


def test_high_from_the_high_ratio_up() -> None:
    ratio = padded_ratio()
    assert ratio == pytest.approx(PADDED, rel=1e-4)
    assert judge(_prepared(), ratio)[0].severity == "high"
    assert judge(_prepared(), ratio * (1 + 1e-12))[0].severity == "medium"


def test_on_the_calls_time_where_no_kernel_was_traced() -> None:
    # calls: 0.03536 / 0.026976 = 1.31x, launch included: within the calls' noise, no proof
    rows = _prepared().assign(kernel_time_ms=float("nan"))
    first = judge(rows)[0]
    assert "padded to 1024x1024x144 it is no faster measurably (1.31x)" in first.message
    assert first.severity == "info" and first.compared == [] and first.effect == 0.0


def test_without_the_padded_row_the_aligned_ldb_is_stated_in_the_k_140_finding() -> None:
    (finding,) = judge(_prepared().iloc[[0, 1]])  # the ldb 144 row is K 140's aligned variant
    assert finding.rows == [0] and finding.severity == "info" and finding.compared == []
    assert finding.message.endswith("with ldb 144 (every leading dimension 16-byte aligned, "
                                    "K still 140) it is no faster measurably (1.01x).")  # fmt: skip


def test_alone_with_an_older_kernel_says_what_to_measure() -> None:
    (finding,) = judge(_prepared().iloc[[0]])
    assert finding.severity == "info" and finding.message == (
        "K = 140 is not a multiple of 8 bf16 elements (16 bytes): cuBLAS dispatches "
        "tensorop_s16816gemm_256x128_64x3 (an sm80 kernel) at 1024x1024x140. Not measured with "
        "the cause removed: run the problem with the dimension rounded up (zero-padded) beside it."
    )
    # on its own architecture's GPU, with nothing measured, nothing to say
    assert judge(_prepared().iloc[[0]].assign(cc="8.0")) == []


def test_an_aligned_row_alone_on_an_older_kernel_is_its_own_finding() -> None:
    # the ldb 144 row alone: no other row of its dimensions to be the aligned variant of
    (finding,) = judge(_prepared().iloc[[1]])
    assert finding.rows == [1] and finding.severity == "info"


def test_a_padded_row_with_an_unaligned_leading_dimension_proves_nothing() -> None:
    rows = _prepared().copy()
    rows.loc[2, "ldb"] = 140  # K 144 given ldb 140: not the cause removed
    assert "padded to" not in judge(rows)[0].message


def test_only_tensor_core_modes_and_the_same_problem_count() -> None:
    assert judge(_prepared().assign(mode="fp32", k=141)) == []
    # the padded row of another batch is another problem: K 140 is then alone (info)
    other = _prepared().copy()
    other.loc[2, "batch"] = 4
    (alone,) = judge(other)  # the ldb 144 row is still K 140's aligned variant
    assert alone.severity == "info" and "padded to" not in alone.message
    # a padded row in another layout is no padded variant of the nn call
    relaid = _prepared().copy()
    relaid.loc[2, "transb"] = "t"
    assert "padded to" not in judge(relaid)[0].message
    # nor a row of another K
    grown = _prepared().copy()
    grown.loc[2, "k"] = 152
    assert "padded to" not in judge(grown)[0].message
