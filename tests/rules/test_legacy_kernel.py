"""CA102 legacy-kernel: the RTX PRO 6000 of the article (published) dispatches magma_Ex at 256
and 512; the H100's dot kernel for M = N = 1 (reports/h100/layouts/...-gemv) is the right
kernel for a dot and is not called legacy."""

from __future__ import annotations

from tests.rules.recorded import dataset, judged


def test_magma_on_the_pro_6000() -> None:
    (finding,) = judged(dataset("fixtures:published_article_b8.csv", "pro6000"), "legacy-kernel")
    assert (finding.severity, finding.kernel, finding.sizes) == (
        "medium",
        "magma_Ex",
        ["256", "512"],
    )
    assert finding.message.startswith("magma_Ex (family magma) is dispatched at sizes 256, 512")


def test_a_dot_on_a_matrix_vector_problem_is_no_legacy_kernel() -> None:
    assert judged(dataset("h100/layouts/20261123-225609-gemv"), "legacy-kernel") == []
    assert judged(dataset("fixtures:published_article_b8.csv", "5090"), "legacy-kernel") == []
