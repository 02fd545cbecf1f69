"""The plan: argument parsing, the grid, stable case ids."""

from __future__ import annotations

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning import cases, grid


def test_default_batched_grid_has_calls_lt_and_loops() -> None:
    plan = grid.build_plan(
        sizes=grid.DEFAULT_SIZES,
        batches=grid.DEFAULT_BATCHES,
        modes=["fp32"],
        apis=["cublas", "cublasLt"],
        single=False,
        batched=True,
    )
    assert len(plan) == 6 * 3 * 3
    assert {c.routine for c in plan} == {
        "cublasSgemmStridedBatched",
        "cublasLtMatmul",
        "sgemm-loop",
    }
    assert [c.m for c in plan] == sorted(c.m for c in plan), "smallest problems run first"
    assert sum(c.profiled for c in plan) == 36


def test_single_tensor_modes_use_gemm_ex() -> None:
    plan = grid.build_plan(
        sizes=[512],
        batches=[8],
        modes=["fp32", "tf32"],
        apis=["cublas"],
        single=True,
        batched=False,
    )
    assert [(c.mode, c.batch, c.routine) for c in plan] == [
        ("fp32", 1, "cublasSgemm"),
        ("tf32", 1, "cublasGemmEx"),
    ]


@pytest.mark.parametrize(
    ("single", "batched", "expected"),
    [
        (None, None, (True, True)),
        (None, True, (False, True)),
        (True, None, (True, False)),
        (None, False, (True, False)),
        (True, True, (True, True)),
    ],
)
def test_call_kinds(single: bool | None, batched: bool | None, expected: tuple[bool, bool]) -> None:
    assert grid.call_kinds(single, batched) == expected


def test_case_id_is_stable_and_round_trips() -> None:
    case = cases.Case("cublasLt", "bf16x", 4096, 1024, 512, 8)
    assert case.case_id == "cublasLt.bf16x.4096x1024x512.b8.nn"
    assert cases.Case.from_json(case.to_json()) == case


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("256,abc", "'abc' is not a positive integer"),
        ("0", "'0' is not a positive integer"),
        ("-5", "'-5' is not a positive integer"),
        (" , ", "empty list"),
    ],
)
def test_bad_sizes_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(AuditError, match=message):
        grid.parse_int_list(text, "--sizes")


def test_shapes_and_modes_parse() -> None:
    assert grid.parse_shapes("4096x1024x512, 8X8X8") == [(4096, 1024, 512), (8, 8, 8)]
    assert grid.parse_modes("FP32,tf32") == ["fp32", "tf32"]
    with pytest.raises(AuditError, match="unknown value 'fp64'"):
        grid.parse_modes("fp64")
    with pytest.raises(AuditError, match="not MxNxK"):
        grid.parse_shapes("4096x1024")


@pytest.mark.parametrize("label", ["../etc", "a b", "", "x" * 65, "-x"])
def test_unsafe_labels_are_refused(label: str) -> None:
    with pytest.raises(AuditError, match="not a safe file name"):
        grid.check_label(label)


def test_label_from_gpu_name() -> None:
    assert grid.label_from_gpu_name("NVIDIA H100 80GB HBM3") == "h100"
    assert grid.label_from_gpu_name("NVIDIA GeForce RTX 5090") == "5090"
    assert grid.label_from_gpu_name("NVIDIA RTX PRO 6000 Blackwell Max-Q") == "pro"


def test_a_cases_operand_layouts_are_made_once_and_never_shared_with_a_replaced_case() -> None:
    import dataclasses

    case = cases.Case("cublas", "bf16", 128, 64, 96, 1, transa="t")
    assert case.operand("a") is case.operand("a")  # the map's engine asks ~20 times a problem
    wider = dataclasses.replace(case, lda=160)
    assert wider.operand("a").ld == 160 and case.operand("a").ld == 96
    assert wider == dataclasses.replace(case, lda=160)  # the cache is no field
