"""CA501 unaligned-operand: bf16 1024x1024x140 batch 8 on the H100
(reports/h100/checks/20261125-074637-k140) keeps an sm80 kernel, K = 144 runs 2.16x faster, ldb
144 no faster; a trace's fp16 100x7x20000 nt (reports/h100/traces/20261123-233621-ops) has no
cause-removed companion measured: info, saying what to measure."""

from __future__ import annotations

from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.causes import _older_kernel
from tests.rules.recorded import case_ids, dataset, judged, sliced

K140 = "h100/checks/20261125-074637-k140"
RULE = "unaligned-operand"


def test_the_padded_problem_measured_faster() -> None:
    data = dataset(K140)
    found = judged(data, RULE)
    assert sorted((f.sizes[0], f.severity) for f in found) == [
        ("1024x1024x140", "high"),
        ("1024x1024x140 ldb144", "high"),
    ]
    call = next(f for f in found if f.sizes == ["1024x1024x140"])
    assert "padded to 1024x1024x144 it runs 2.16x faster" in call.message
    assert "with ldb 144" in call.message and "no faster measurably (1.01x)" in call.message
    assert case_ids(data, call) == ["cublas.bf16.1024x1024x140.b8.nn"]
    assert round(call.effect, 3) == 0.537


def test_without_the_padded_companion_only_what_to_measure() -> None:
    alone = sliced(K140, ["cublas.bf16.1024x1024x140.b8.nn"])
    (finding,) = judged(alone, RULE)
    assert finding.severity == "info" and finding.compared == []


def test_a_trace_problem_with_nothing_measured_beside_it() -> None:
    ops = ["cublas.fp16.100x7x20000.b1.nt", "cublasLt.fp16.100x7x20000.b1.nt"]
    found = judged(sliced("h100/traces/20261123-233621-ops", ops), RULE)
    assert [(f.api, f.sizes, f.severity) for f in found] == [
        ("cublas", ["100x7x20000 nt"], "info"),
        ("cublasLt", ["100x7x20000 nt"], "info"),
    ]


def test_a_kernel_of_the_gpus_own_architecture_is_not_older() -> None:
    """bf16 1024x1024x140 batch 8 on the H100 (cc 9.0): nn dispatches an sm80 kernel, nt
    (reports/h100/checks/20261125-092057-k140-layouts) nvjet, an sm90 kernel: not older."""
    rows = prepare(dataset("h100/checks/20261125-092057-k140-layouts").frame).set_index("case_id")
    assert _older_kernel(rows.loc["cublas.bf16.1024x1024x140.b8.nn"]) == "sm80"
    nt = rows.loc["cublas.bf16.1024x1024x140.b8.nt"]
    assert str(nt["cc"]) == "9.0" and str(nt["kernel_name"]).startswith("nvjet")
    assert _older_kernel(nt) is None


def test_the_noise_model_the_audit_is_given_judges_the_padded_variant() -> None:
    """2.16x faster padded is beyond any plausible floor; under a model whose floor is 150 % at
    every time (a stand-in for a noisier machine's map) it is no faster measurably. The rule used
    the shipped model whatever it was given."""
    wide = NoiseModel((float("inf"),), (1.5,), {"device": "a floor of 150 % at every time"})
    (call,) = [f for f in judged(dataset(K140), RULE, wide) if f.sizes == ["1024x1024x140"]]
    assert "no faster measurably (2.16x)" in call.message
