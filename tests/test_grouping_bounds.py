"""judge/grouping.py pinned on findings as the rules make them at one problem (the H100's bf16
2073^3 check: `unaligned-operand` through cuBLAS and cuBLASLt, the rules it explains, and one it
does not): which findings a cause takes in, which stay their own, the group's severity, and the
words and rows the report takes from it. The records are the rules' fields only; grouping reads
no measurement."""

from __future__ import annotations

from dataclasses import replace

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.grouping import by_cause, every_row, members, observed, problem_of, where
from cublas_audit.vocabulary import Severity

LT = ("cublasLt", "cublasLtMatmul")
CLASSIC = ("cublas", "cublasGemmEx")


def _finding(
    rule: str,
    severity: Severity,
    call: tuple[str, str] = CLASSIC,
    sizes: tuple[str, ...] = ("2073",),
    rows: tuple[int, ...] = (0,),
    effect: float = 0.0,
    message: str = "",
) -> Finding:
    api, routine = call
    return Finding(
        rule, severity, "h100", api, routine, "bf16", 1, list(sizes), "s1688gemm", message or rule,
        "pad", rows=list(rows), effect=effect,
    )  # fmt: skip


UNALIGNED = _finding("unaligned-operand", Severity.medium, rows=(0,), effect=0.85)
UNALIGNED_LT = _finding("unaligned-operand", Severity.medium, LT, rows=(1,), effect=0.84)
LOW = _finding("low-utilization", Severity.medium, rows=(0,))
CLIFF_LT = _finding("dispatch-cliff", Severity.high, LT, rows=(1, 5))
HEURISTIC = _finding("better-candidate", Severity.medium, LT, rows=(1,))  # another cause


def test_problem_of() -> None:
    assert problem_of(UNALIGNED) == ("h100", "bf16", 1, "2073")
    assert problem_of(_finding("low-utilization", Severity.medium, sizes=("2048", "2073"))) is None
    assert problem_of(_finding("x", Severity.info, sizes=())) is None


def test_one_finding_for_the_cause_both_apis_and_what_it_explains() -> None:
    (group, other) = by_cause([LOW, HEURISTIC, UNALIGNED_LT, CLIFF_LT, UNALIGNED])
    # the lead: the best-ranked unaligned-operand (effect 0.85 over 0.84), with the group's
    # highest severity (the cliff's high); better-candidate is another cause: its own
    assert other == HEURISTIC
    assert (group.rule, group.api, group.effect, group.rows) == (
        "unaligned-operand",
        "cublas",
        0.85,
        [0],
    )
    assert group.severity == Severity.high
    kept = [(o["rule"], o["api"]) for o in group.observations]
    # in `order`: the high cliff first, then the medium ones by effect (0.84, then 0)
    assert kept == [
        ("dispatch-cliff", "cublasLt"),
        ("unaligned-operand", "cublasLt"),
        ("low-utilization", "cublas"),
    ]
    assert all("observations" not in o for o in group.observations)
    assert members(group) == [replace(group, observations=[]), CLIFF_LT, UNALIGNED_LT, LOW]
    assert every_row(group) == [0, 1, 5]  # each row once, the lead's first


def test_a_cause_alone_comes_back_as_it_was() -> None:
    assert by_cause([UNALIGNED]) == [UNALIGNED]
    assert by_cause([UNALIGNED])[0].observations == []


def test_without_a_cause_nothing_is_grouped() -> None:
    # a rule EXPLAINS names as explained, at one problem, is no cause itself
    assert by_cause([LOW, HEURISTIC]) == [HEURISTIC, LOW]  # sorted by `order`: severity, rule
    # a cause over several sizes concerns no one problem: no cause of one
    wide = replace(UNALIGNED, sizes=["2073", "2080"])
    assert by_cause([wide, LOW]) == [wide, LOW]


def test_findings_of_another_problem_or_over_several_sizes_stay_their_own() -> None:
    elsewhere = replace(LOW, sizes=["2080"])
    several = replace(LOW, sizes=["2048", "2073"], rows=[3, 0])
    found = by_cause([UNALIGNED, elsewhere, several])
    assert found == [UNALIGNED, elsewhere, several]


def test_where_and_observed_name_every_call() -> None:
    (group, _) = by_cause([UNALIGNED, UNALIGNED_LT, LOW, HEURISTIC])
    assert where(group) == "cublas cublasGemmEx, cublasLt cublasLtMatmul bf16, batch 1"
    # the cuBLASLt cause repeats the lead's message word for word: said by the lead; the
    # low-utilization observation is listed with its call
    assert observed(group) == [("low-utilization", "cublas cublasGemmEx", "low-utilization")]


def test_observed_lists_each_observation_after_the_lead() -> None:
    # two observations of their own words: both listed (the lead itself never)
    said_lt = replace(UNALIGNED_LT, message="lt words")
    (group,) = by_cause([UNALIGNED, said_lt, LOW])
    assert observed(group) == [
        ("unaligned-operand", "cublasLt cublasLtMatmul", "lt words"),
        ("low-utilization", "cublas cublasGemmEx", "low-utilization"),
    ]
