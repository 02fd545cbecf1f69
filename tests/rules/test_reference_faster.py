"""CA301 reference-faster: the H100 rerun reports/h100/checks/20261127-102606-rerun-a confirms the
bundled reference 1.11x (cuBLAS) and 1.09x (cuBLASLt) faster at FP32 256^3 batch 8 on kernel
time; the earlier run 20261123-094558-batched measured gaps the noise model leaves unsure, and
`unsure_case_ids` names exactly those cases for the sweep to re-measure."""

from __future__ import annotations

from cublas_audit.judge.rules import unsure_case_ids
from tests.rules.recorded import dataset, judged, sliced

CONFIRMED = "h100/checks/20261127-102606-rerun-a"
UNSURE = "h100/20261123-094558-batched"


def test_a_confirmed_gap_on_kernel_time() -> None:
    found = judged(dataset(CONFIRMED), "reference-faster")
    assert [(f.api, f.batch, f.sizes, f.severity) for f in found] == [
        ("cublas", 8, ["256"], "medium"),
        ("cublasLt", 8, ["256"], "medium"),
    ]
    assert found[0].message.startswith("The bundled reference kernel is 1.11x faster than cuBLAS")
    assert "comparing the kernels' time (CUPTI)" in found[0].message
    # high from high_ratio: 1.11x is high once the bar is 1.1
    assert [f.severity for f in judged(dataset(CONFIRMED), "reference-faster", high_ratio=1.1)] == [
        "high",
        "medium",
    ]


UNSURE_CASES = [
    "cublas.fp32.256x256x256.b8.nn",
    "cublasLt.fp32.256x256x256.b4.nn",
    "cublasLt.fp32.256x256x256.b8.nn",
    "cublasLt.fp32.256x256x256.b16.nn",
]


def test_unsure_gaps_are_info_and_are_what_the_sweep_measures_again() -> None:
    found = judged(dataset(UNSURE), "reference-faster")
    assert {f.severity for f in found} == {"info"}
    assert all(f.message.startswith("Unsure:") for f in found)
    # the four cases, and one whose reference was no faster: only the four, in table order
    table = sliced(UNSURE, [*UNSURE_CASES, "cublas.fp32.256x256x256.b4.nn"]).frame
    assert unsure_case_ids(table) == UNSURE_CASES
    # a confirmed gap is not measured again
    confirmed = sliced(CONFIRMED, ["cublas.fp32.256x256x256.b8.nn"])
    assert [f.severity for f in judged(confirmed, "reference-faster")] == ["medium"]
    assert unsure_case_ids(confirmed.frame) == []
