"""Every way a problem can be posed (cases.Case), launched through the real cuBLAS and cuBLASLt and
checked against float64: transposes, padded leading dimensions, broadcast operands, beta, batch-1
strided calls, the bias epilogue and a workspace limit. The check itself is shown to catch a
launcher that ignores a transpose."""

from __future__ import annotations

import dataclasses

import pytest

from cublas_audit.planning.cases import Case

pytestmark = pytest.mark.gpu

VARIANTS = [
    {"transa": "t"},
    {"transb": "t"},
    {"transa": "t", "transb": "t"},
    {"lda": 37 + 64, "ldb": 96 + 3},
    {"transa": "t", "lda": 96 + 5},
    {"beta": 0.5},
    {"broadcast": "a"},
    {"broadcast": "b", "transb": "t"},
]


def launch_and_check(case: Case) -> float:
    from cublas_audit.device import launchers, operands

    ops = operands.make_for(case, seed=1)
    if case.api == "cublasLt":
        with launchers.lt(case, ops) as gemm:
            return operands.checked(gemm.run, ops)
    launch = launchers.loop(case, ops) if case.loop else launchers.classic(case, ops)
    return operands.checked(launch, ops)


@pytest.mark.parametrize("api", ["cublas", "cublasLt"])
@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}{v[k]}" for k in v))
def test_every_variant_computes_what_it_describes(api: str, mode: str, variant: dict) -> None:  # type: ignore[type-arg]
    from cublas_audit.device import operands

    case = Case(api, mode, 64, 96, 37, 3, **variant)
    assert launch_and_check(case) <= operands.tolerance(mode), case.case_id


def test_loop_batch_one_strided_bias_and_workspace() -> None:
    from cublas_audit.device import operands

    checks = [
        Case("cublas", "fp32", 64, 96, 37, 3, "t", "n", loop=True, broadcast="b", beta=1.0),
        Case("cublas", "fp32", 1, 1, 4096, 1, strided=True),
        Case("cublasLt", "bf16", 7, 100, 2000, 1, "t", "n", bias=True, workspace_mib=1),
        Case("cublasLt", "fp32", 64, 96, 37, 4, bias=True, workspace_mib=0, beta=0.0),
    ]
    for case in checks:
        assert launch_and_check(case) <= operands.tolerance(case.mode), case.case_id


def test_the_check_catches_a_launcher_that_ignores_a_transpose() -> None:
    from cublas_audit.device import launchers, operands

    case = Case("cublas", "fp32", 64, 64, 64, 2, transa="t")
    ops = operands.make_for(case, seed=2)
    wrong = launchers.classic(dataclasses.replace(case, transa="n"), ops)
    assert operands.checked(wrong, ops) > 0.5


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_check_finds_an_output_that_is_not_finite(bad: float) -> None:
    """No finiteness pass of its own: a NaN or an infinity anywhere in one entry makes that
    entry's error, and the case's, infinite; likewise between two outputs."""
    import math

    from cublas_audit.device import launchers, operands

    case = Case("cublas", "fp32", 64, 64, 64, 3)
    ops = operands.make_for(case, seed=4)
    launch = launchers.classic(case, ops)
    assert operands.checked(launch, ops) <= operands.tolerance("fp32")
    good = ops.c.copy()
    ops.c[1, 17, 5] = bad
    assert operands.error_vs_exact(ops) == math.inf
    assert operands.relative_error(ops.c, good) == math.inf
    assert operands.relative_error(good, good) == 0.0
    nothing = operands.checked(lambda: None, ops)  # C stays the NaN it was poisoned with
    assert nothing == math.inf


def test_a_classic_launcher_keeps_beta_zero_for_all_its_calls() -> None:
    """The scalars cuBLAS reads through a host pointer outlive the launcher's creation: after
    other allocations, the timed calls still dispatch the beta = 0 kernel ("_bz_") ncu saw."""
    import gc

    from cublas_audit.device import kernel_trace, launchers, operands

    if kernel_trace.available():
        pytest.skip(f"CUPTI cannot trace here: {kernel_trace.available()}")
    case = Case("cublas", "bf16", 1024, 1024, 1024, 1)
    ops = operands.make_for(case, seed=3)
    launch = launchers.classic(case, ops)
    gc.collect()
    churn = [bytearray(16) for _ in range(10000)]  # reuse whatever small blocks were freed
    traced = kernel_trace.trace_calls({"call": launch}, 5)["call"]
    del churn
    names = {kernel.name for call in traced.calls for kernel in call}
    assert names and all("_bz_" in name for name in names if name.startswith("nvjet")), names
    assert operands.checked(launch, ops) <= operands.tolerance("bf16")
