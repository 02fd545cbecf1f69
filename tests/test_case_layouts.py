"""How a case poses its problem (cases.Case): operand layouts in cuBLAS's column-major terms,
stable readable ids, one-line errors for impossible settings, and the plan's variants."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import Case, OperandLayout
from cublas_audit.planning.grid import Variants, build_plan


def test_default_case_keeps_the_ids_of_every_earlier_table() -> None:
    case = Case("cublas", "fp32", 256, 256, 256, 8)
    assert case.case_id == "cublas.fp32.256x256x256.b8.nn"
    assert case.variant == ""
    # packed, untransposed: lda = m, ldb = k, strides one matrix (the reference's layout)
    assert case.operand("a") == OperandLayout(256, 256, 256, 256 * 256, 8)


def test_transposed_and_padded_operands() -> None:
    # pytorch#106469: an i x 100000 A stored column-major with lda = i, here i = 7 in
    # cuBLAS terms op(A) = A^T with A stored k x m.
    case = Case("cublasLt", "bf16", 7, 100, 100000, 1, "t", "n", lda=100003)
    a, b = case.operand("a"), case.operand("b")
    assert (a.rows, a.cols, a.ld) == (100000, 7, 100003)
    assert (b.rows, b.cols, b.ld) == (100000, 100, 100000)
    assert case.case_id == "cublasLt.bf16.7x100x100000.b1.tn.lda100003"
    assert case.bytes_needed == 2 * (7 * 100003 + 100 * 100000 + 7 * 100)
    # the elements counted without the layouts (the map's pool sizing): the same numbers
    assert [case.elements(name) for name in "abc"] == [7 * 100003, 100 * 100000, 7 * 100]


def test_elements_without_a_layout_are_what_cublas_reads_in_every_variant() -> None:
    variants = Variants(layouts=("nn", "tn", "nt", "tt"), ld_pad=8)
    planned = [
        *variants.cases("cublas", "bf16", 64, 96, 160, 3),
        *(
            Case("cublas", "fp16", 48, 80, 112, 4, t, "t", broadcast=side)
            for t in "nt"
            for side in "ab"
        ),
    ]
    for case in planned:
        # cuBLAS's own storage rule (cublas<t>gemm): A is lda x k with transa n (lda >= m), lda
        # x m with t; B ldb x n with transb n (ldb >= k), ldb x k with t; C m x n; a strided
        # batch holds `batch` of each, a broadcast operand one
        lda = case.lda or (case.m if case.transa == "n" else case.k)
        ldb = case.ldb or (case.k if case.transb == "n" else case.n)
        a_cols = case.k if case.transa == "n" else case.m
        b_cols = case.n if case.transb == "n" else case.k
        held = {name: 1 if case.broadcast == name else case.batch for name in "ab"}
        read = [held["a"] * lda * a_cols, held["b"] * ldb * b_cols, case.batch * case.m * case.n]
        fresh = dataclasses.replace(case)  # (no cached layout: elements made on their own)
        assert [fresh.elements(name) for name in "abc"] == read, case.case_id
        assert [case.operand(name).elements for name in "abc"] == read, case.case_id


def test_broadcast_operand_has_stride_zero_and_one_stored_entry() -> None:
    # pytorch PR 161564: [4, 512, 8192] @ [8192, 8192] as a batched GEMM whose weight is shared;
    # the row-major weight is cuBLAS's A.
    case = Case("cublas", "fp16", 8192, 512, 8192, 4, broadcast="a")
    assert case.operand("a") == OperandLayout(8192, 8192, 8192, 0, 1)
    assert case.operand("b").stride == 8192 * 512
    assert case.routine == "cublasGemmStridedBatchedEx"
    assert case.case_id.endswith(".b4.nn.bcast-a")


def test_batch_one_strided_call_is_its_own_case() -> None:
    # pytorch#114911: bmm of batch 1 with M = N = 1, K = 131072
    strided = Case("cublas", "fp32", 1, 1, 131072, 1, strided=True)
    single = Case("cublas", "fp32", 1, 1, 131072, 1)
    assert strided.routine == "cublasSgemmStridedBatched" and single.routine == "cublasSgemm"
    assert strided.case_id != single.case_id


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"transa": "x"}, "transa"),
        ({"lda": 10}, "lda 10 is smaller than the 64 rows"),
        ({"ldb": 32, "transb": "t"}, "ldb 32 is smaller than the 64 rows"),
        ({"broadcast": "c"}, "broadcast"),
        ({"bias": True}, "cuBLASLt settings"),
        ({"beta": float("inf")}, "beta"),
    ],
)
def test_impossible_settings_are_one_line_errors(fields: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(AuditError, match=message):
        Case("cublas", "fp32", 64, 64, 64, 2, **fields)


def test_a_packed_case_is_checked_without_making_its_operand_layouts() -> None:
    # a full map makes 262,144 cases (its shards and probes again): the layouts, half of a case's
    # making, are made to check a given leading dimension, else only when first asked for
    case = Case("cublas", "bf16", 64, 128, 256, 1)
    assert "_layouts" not in vars(case)
    assert case.operand("a") == OperandLayout(64, 256, 64, 64 * 256, 1)


def test_each_planned_case_is_made_once_with_its_padded_leading_dimensions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Case] = []
    checks = Case.__post_init__
    monkeypatch.setattr(Case, "__post_init__", lambda case: made.append(case) or checks(case))
    planned = Variants(layouts=("nn", "tn", "nt", "tt"), ld_pad=8).cases(
        "cublas", "bf16", 64, 128, 256, 1
    )
    assert made == planned
    for case in planned:  # each operand's stored rows, padded by 8
        packed = Case("cublas", "bf16", 64, 128, 256, 1, case.transa, case.transb)
        assert (case.lda, case.ldb) == (
            packed.operand("a").rows + 8,
            packed.operand("b").rows + 8,
        )


def test_plan_poses_every_layout_with_its_loop_and_keeps_lt_settings_on_lt() -> None:
    variants = Variants(layouts=("nn", "tn"), ld_pad=8, bias=True, beta=0.5)
    plan = build_plan(
        sizes=[128], batches=[1, 4], modes=["fp32"], apis=["cublas", "cublasLt"],
        single=False, batched=True, variants=variants,
    )  # fmt: skip
    ids = [c.case_id for c in plan]
    assert "cublas.fp32.128x128x128.b1.tn.lda136.ldb136.beta0p5.strided" in ids
    assert "loop.fp32.128x128x128.b4.tn.lda136.ldb136.beta0p5" in ids
    assert "cublasLt.fp32.128x128x128.b4.nn.lda136.ldb136.beta0p5.bias" in ids
    assert not any(c.bias for c in plan if c.api == "cublas")
    assert len(ids) == len(set(ids)) == 2 * (2 + 3)  # per layout: b1 on both apis, b4 + loop
    assert [Case.from_json(c.to_json()) for c in plan] == plan


def test_a_shared_a_brings_its_folded_gemm_into_the_plan() -> None:
    plan = build_plan(
        sizes=[], shapes=[(8192, 512, 8192)], batches=[4], modes=["fp16"], apis=["cublas"],
        single=False, batched=True, variants=Variants(broadcast="a"),
    )  # fmt: skip
    assert [c.case_id for c in plan] == [
        "cublas.fp16.8192x512x8192.b4.nn.bcast-a",
        "cublas.fp16.8192x2048x8192.b1.nn",  # pytorch PR 161564's fold: [4*512, K] @ [K, N]
    ]


def test_size_ranges_for_dense_grids() -> None:
    from cublas_audit.planning.grid import parse_int_list

    assert parse_int_list("64:256:64,1000", "--sizes") == [64, 128, 192, 256, 1000]
    assert len(parse_int_list("64:4096:64", "--sizes")) == 64  # the committed H100 map
    for bad, message in [
        ("64:32:8", "ends before it starts"),
        ("1:2", "not FIRST:LAST:STEP"),
        ("1:10:0", "not a positive integer"),
        ("1:10000000:1", "more than"),
    ]:
        with pytest.raises(AuditError, match=message):
            parse_int_list(bad, "--sizes")


@pytest.mark.parametrize("field", ["m", "n", "k", "batch", "lda", "ldb"])
def test_terms_cublas_takes_as_int32_are_refused_beyond_it(field: str) -> None:
    """cuBLAS's m, n, k, batch count and leading dimensions are 32-bit ints: 2**31 - 1 is the
    largest a case holds (as --sizes and --shapes already say)."""
    fields = {"m": 64, "n": 64, "k": 64, "batch": 2, field: 2**31}
    with pytest.raises(AuditError, match=f"{field} 2147483648 is larger than cuBLAS's 32-bit"):
        Case("cublas", "fp32", **fields)


def test_a_shared_batch_too_wide_to_fold_has_no_folded_companion() -> None:
    """A batch of 2 of 64 x 2**30 x 64 with a shared A would fold into n = 2**31: no one call."""
    wide = Case("cublas", "fp32", 64, 2**30, 64, 2, broadcast="a")
    assert Variants.folded(wide) is None
    narrow = Case("cublas", "fp32", 64, 2**29, 64, 2, broadcast="a")
    assert Variants.folded(narrow) == Case("cublas", "fp32", 64, 2**30, 64, 1)


def test_an_unaligned_tensor_core_case_is_planned_beside_its_aligned_companion() -> None:
    """bf16 (2 B): K = 140 rounds up to 144, a multiple of 8 elements (16 bytes), and a padded
    ldb goes (the companion is packed); fp32 (the FMA pipe) and aligned cases get none."""
    from cublas_audit.planning.cases import with_cause_removed_companions

    k140 = Case("cublas", "bf16", 1024, 1024, 140, 8, ldb=144)
    fp32 = Case("cublas", "fp32", 1024, 1024, 140, 8)
    aligned = Case("cublas", "bf16", 1024, 1024, 144, 8)
    planned = with_cause_removed_companions([k140, fp32, aligned])
    assert [c.case_id for c in planned] == [
        "cublas.bf16.1024x1024x140.b8.nn.ldb144",
        "cublas.fp32.1024x1024x140.b8.nn",
        "cublas.bf16.1024x1024x144.b8.nn",  # the companion of the first is the third: once
    ]
    fp16 = with_cause_removed_companions([Case("cublas", "fp16", 100, 7, 20000, 1)])
    assert [c.case_id for c in fp16][1] == "cublas.fp16.104x8x20000.b1.nn"


def test_the_leading_dimensions_and_batch_strides_cublas_is_given_are_checked_in_bytes() -> None:
    """bf16 (2 B) 1020x1024x141, batch 2, nn: lda = m = 1020 (2040 B), ldb = k = 141 (282 B),
    ldc = m; A's batch stride 1020 x 141 = 143820 elements (287640 B, 17977.5 x 16); B's
    141 x 1024 (288768 B) and C's 1020 x 1024 (2088960 B) are 16-byte multiples. A single call
    has no batch stride to check."""
    from cublas_audit.planning.cases import misaligned_strides

    assert misaligned_strides(Case("cublas", "bf16", 1020, 1024, 141, 2)) == [
        "lda = 1020 (2040 bytes)",
        "stride_a = 143820 (287640 bytes)",
        "ldb = 141 (282 bytes)",
        "ldc = 1020 (2040 bytes)",
    ]
    assert misaligned_strides(Case("cublas", "bf16", 1020, 1024, 141, 1)) == [
        "lda = 1020 (2040 bytes)",
        "ldb = 141 (282 bytes)",
        "ldc = 1020 (2040 bytes)",
    ]
    # the recorded K = 140 problem: only ldb (= k, packed nn); with ldb 144 nothing
    assert misaligned_strides(Case("cublas", "bf16", 1024, 1024, 140, 8)) == [
        "ldb = 140 (280 bytes)"
    ]
    assert misaligned_strides(Case("cublas", "bf16", 1024, 1024, 140, 8, ldb=144)) == []


def companions(case: Case) -> list[str]:
    from cublas_audit.planning.cases import with_cause_removed_companions

    return [c.case_id for c in with_cause_removed_companions([case])[1:]]


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_an_unaligned_k_is_measured_padded_and_in_layout_nt(layout: str) -> None:
    """bf16 1024x1024x140: packed, lda is m (transa n) or k (t), ldb k (transb n) or n (t), ldc
    m; with K the only unaligned dimension, nt alone has every leading dimension aligned
    (lda = m = 1024, ldb = n = 1024)."""
    case = Case("cublas", "bf16", 1024, 1024, 140, 8, layout[0], layout[1])
    assert companions(case) == [
        f"cublas.bf16.1024x1024x144.b8.{layout}",  # padded, in the case's own layout
        "cublas.bf16.1024x1024x140.b8.nt",
    ]


def test_an_unaligned_n_is_measured_in_the_nearest_layout_with_ldb_k() -> None:
    """bf16 N = 1020 (2040 bytes): nt's ldb = n is unaligned; nn's ldb = k = 1024 is not
    (transb flipped, transa kept). nn itself has every leading dimension aligned (and its
    batch strides: 1024 x 1020 x 2 B = 130560 x 16): only the padded companion."""
    nt = Case("cublasLt", "bf16", 1024, 1020, 1024, 8, "n", "t")
    assert companions(nt) == [
        "cublasLt.bf16.1024x1024x1024.b8.nt",
        "cublasLt.bf16.1024x1020x1024.b8.nn",
    ]
    assert companions(Case("cublasLt", "bf16", 1024, 1020, 1024, 8)) == [
        "cublasLt.bf16.1024x1024x1024.b8.nn"
    ]


def test_no_layout_removes_an_unaligned_m_nor_k_and_n_together() -> None:
    """ldc = m in every layout; with K and N both unaligned ldb is one of them whatever transb.
    A given unaligned lda on aligned dimensions is the case's own layout packed: no other
    layout (nor padding) is planned for it."""
    assert companions(Case("cublas", "bf16", 1020, 1024, 1024, 8)) == [
        "cublas.bf16.1024x1024x1024.b8.nn"
    ]
    assert companions(Case("cublas", "bf16", 1024, 1020, 140, 8)) == [
        "cublas.bf16.1024x1024x144.b8.nn"
    ]
    assert companions(Case("cublas", "bf16", 1024, 1024, 1024, 8, lda=1028)) == []


def test_the_fma_pipe_and_an_aligned_tf32_k_get_no_layout_companion() -> None:
    """fp32 runs on the FMA pipe (simt kernels take any alignment): no companion at all. tf32
    is 4 B: K = 140 is 560 bytes (35 x 16), aligned; K = 142 (568 bytes) is not -> nt."""
    assert companions(Case("cublas", "fp32", 1024, 1024, 140, 8)) == []
    assert companions(Case("cublas", "tf32", 1024, 1024, 140, 8)) == []
    assert companions(Case("cublas", "tf32", 1024, 1024, 142, 8)) == [
        "cublas.tf32.1024x1024x144.b8.nn",
        "cublas.tf32.1024x1024x142.b8.nt",
    ]


def test_a_cases_id_is_made_once_and_is_no_field(monkeypatch: pytest.MonkeyPatch) -> None:
    # a shard's table asks each of its 65,536 cases for its id six times
    from cublas_audit.planning import cases

    made: list[tuple[object, ...]] = []
    make = cases.case_id_of
    monkeypatch.setattr(cases, "case_id_of", lambda *fields: made.append(fields) or make(*fields))
    case = Case("cublas", "bf16", 64, 128, 256, 1)
    assert case.case_id == case.case_id == "cublas.bf16.64x128x256.b1.nn" and len(made) == 1
    twin = Case("cublas", "bf16", 64, 128, 256, 1)
    assert twin == case and hash(twin) == hash(case)  # (the id kept is no field)
    assert dataclasses.replace(case, m=128).case_id == "cublas.bf16.128x128x256.b1.nn"
    assert pickle.loads(pickle.dumps(case)).case_id == case.case_id


def test_a_case_checked_before_is_the_case_made_and_checked() -> None:
    # the probe's copy of a recorded plan (the H100 map of 2026-11-25, varied layouts planned
    # beside it): made without the checks, equal to the checked cases in every respect
    from cublas_audit.planning.plan_file import read_plan

    plan = Path(__file__).resolve().parent.parent / "reports/h100/maps/20261125-092546-bf16-random"
    recorded = read_plan(plan / "plan.json")
    assert read_plan(plan / "plan.json", checked=True) == recorded
    varied = Variants(layouts=("nn", "tn", "nt", "tt"), ld_pad=8).cases(
        "cublas", "fp16", 8, 24, 40, 3
    )
    for case in [
        *recorded[:50],
        *varied,
        Case("cublasLt", "bf16", 64, 64, 64, 2, bias=True, beta=0.5),
    ]:
        again = Case.checked_before(case.fields())
        assert again == case and hash(again) == hash(case) and not again < case
        assert (again.case_id, again.routine, again.bytes_needed) == (
            case.case_id,
            case.routine,
            case.bytes_needed,
        )
        assert [again.operand(name) for name in "abc"] == [case.operand(name) for name in "abc"]
