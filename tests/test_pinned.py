"""PinnedGemm (device.pinned): a pinned cuBLASLt GEMM users call directly.

CPU: the row-major -> cuBLAS mapping (device.row_major) on hand-checked cases and on the problems
PyTorch 2.14.1's TunableOp recorded on the H100 (shared/data/tunableop_h100_torch2.14.1_models.csv,
an external fact: its parameters are cuBLAS's transa transb _ m _ n _ k (_B_ batch) _ld_ lda _
ldb _ ldc); what it refuses; the enum names of a pin as cuBLASLt's numbers; the workspace rule.

GPU (marked gpu): default and pinned results against float64, in cuBLAS's terms (CuPy) and as
torch.mm, F.linear, torch.bmm and a biased linear (PyTorch); refusals (too little workspace, an
unknown algorithm or tile, arrays that are not the ones the GEMM was built for), never a silent
return; a capture in torch.cuda.graph replays to the same result.
"""

from __future__ import annotations

import enum
import types
from dataclasses import replace
from typing import Any

import pytest

from cublas_audit.device.lt import LtCandidate
from cublas_audit.device.lt_pin import attribute_number, pin_of
from cublas_audit.device.pinned import workspace_for
from cublas_audit.device.pinned_arrays import mode_of_array
from cublas_audit.device.row_major import (
    ArraySpec,
    Strided,
    cublas_arrays,
    linear_arrays,
    matmul_arrays,
)
from cublas_audit.errors import AuditError, OperandMismatch, PinRefused
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.table.fix_file import Pin, Problem

# The pins DESIGN.md records as confirmed on the H100 (cuBLAS 13.1): names as the candidates
# table writes them, numbers as TunableOp's file does (tile 24 = 256x128, stages 35 = 64xAUTO,
# cluster 5 = 1x2x1 in cublasLt.h).
FP32_PIN = Pin(20, "128x64", "8x5", 2, "INPLACE", 0, 0, 0, "AUTO", 0)
FP32_PIN_NUMBERS = Pin(20, "18", "28", 2, "1", 0, 0, 0, "0", 0)
BF16_PIN = Pin(66, "24", "35", 1, "0", 0, 7, 0, "5", 0)


def contiguous(*shape: int) -> Strided:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return Strided(shape, tuple(reversed(strides)))


def tunableop_terms(problem: Problem) -> str:
    """A problem as TunableOp's parameter column writes it."""
    batch = f"_B_{problem.batch}" if problem.batched else ""
    return (
        f"{problem.layout}_{problem.m}_{problem.n}_{problem.k}{batch}"
        f"_ld_{problem.lda}_{problem.ldb}_{problem.ldc}"
    )


# ----- the mapping (CPU) ---------------------------------------------------------------------
def test_the_lm_head_as_f_linear_is_tunableops_tn_row() -> None:
    mapped = linear_arrays("fp32", contiguous(4, 2048), contiguous(32000, 2048))
    problem = mapped.problem
    assert (problem.transa, problem.transb) == ("t", "n")
    assert (problem.m, problem.n, problem.k) == (32000, 4, 2048)
    assert (problem.lda, problem.ldb, problem.ldc) == (2048, 2048, 32000)
    assert tunableop_terms(problem) == "tn_32000_4_2048_ld_2048_2048_32000"
    assert mapped.swapped and mapped.out.shape == (4, 32000)


def test_the_same_product_as_torch_mm_is_nn() -> None:
    # (4 x 2048) @ (2048 x 32000): W read as it is stored, lda = N
    problem = matmul_arrays("fp32", contiguous(4, 2048), contiguous(2048, 32000)).problem
    assert tunableop_terms(problem) == "nn_32000_4_2048_ld_32000_2048_32000"
    transposed = Strided((2048, 32000), (1, 2048))  # W.t() of a 32000 x 2048 weight: tn again
    problem = matmul_arrays("fp32", contiguous(4, 2048), transposed).problem
    assert tunableop_terms(problem) == "tn_32000_4_2048_ld_2048_2048_32000"


@pytest.mark.parametrize(
    ("x", "w", "recorded"),
    [
        ((2048, 2048), (5632, 2048), "tn_5632_2048_2048_ld_2048_2048_5632"),
        ((2048, 5632), (2048, 5632), "tn_2048_2048_5632_ld_5632_5632_2048"),
        ((8, 4096), (14336, 4096), "tn_14336_8_4096_ld_4096_4096_14336"),
        ((8, 14336), (4096, 14336), "tn_4096_8_14336_ld_14336_14336_4096"),
    ],
)
def test_linear_layers_of_the_model_traces(
    x: tuple[int, int], w: tuple[int, int], recorded: str
) -> None:
    problem = linear_arrays("bf16", contiguous(*x), contiguous(*w)).problem
    assert tunableop_terms(problem) == recorded


def test_a_linear_with_bias_is_the_bias_epilogue_of_the_same_call() -> None:
    # GemmAndBiasTunableOp_float_TN,tn_1024_2048_1024_ld_1024_1024_1024
    mapped = linear_arrays("fp32", contiguous(2048, 1024), contiguous(1024, 1024), bias=True)
    assert tunableop_terms(mapped.problem) == "tn_1024_2048_1024_ld_1024_1024_1024"
    assert mapped.problem.bias and mapped.problem.beta == 0.0
    assert mapped.bias == ArraySpec("bias", (1024,), (1,))


def test_attention_bmms_are_the_strided_batched_rows() -> None:
    # P[64, 512, 512] @ V[64, 512, 128] and Q[64, 512, 128] @ K^T (K's transposed view)
    pv = matmul_arrays("bf16", contiguous(64, 512, 512), contiguous(64, 512, 128)).problem
    assert tunableop_terms(pv) == "nn_128_512_512_B_64_ld_128_512_128"
    k_t = Strided((64, 128, 512), (512 * 128, 1, 128))
    qk = matmul_arrays("bf16", contiguous(64, 512, 128), k_t).problem
    assert tunableop_terms(qk) == "tn_512_512_128_B_64_ld_128_128_512"
    assert (qk.stride_a, qk.stride_b, qk.stride_c) == (512 * 128, 512 * 128, 512 * 512)


def test_a_bmm_with_a_shared_weight_has_batch_stride_zero() -> None:
    shared = Strided((4, 64, 32), (0, 32, 1))  # w.expand(4, 64, 32)
    mapped = matmul_arrays("fp32", contiguous(4, 16, 64), shared)
    assert mapped.problem.stride_a == 0 and mapped.problem.batch == 4


def test_a_linear_collapses_leading_dimensions_into_rows() -> None:
    mapped = linear_arrays("bf16", contiguous(2, 3, 2048), contiguous(5632, 2048))
    assert (mapped.problem.m, mapped.problem.n) == (5632, 6)
    assert mapped.first == ArraySpec("x", (2, 3, 2048), (6144, 2048, 1))
    assert mapped.out == ArraySpec("out", (2, 3, 5632), (3 * 5632, 5632, 1))


def test_tf32_keeps_fp32_data() -> None:
    problem = linear_arrays("tf32", contiguous(4, 64), contiguous(32, 64)).problem
    assert problem.mode == "tf32" and (problem.m, problem.n, problem.k) == (32, 4, 64)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: matmul_arrays("fp32", contiguous(4, 8), contiguous(9, 16)), "shapes differ"),
        (lambda: matmul_arrays("fp32", contiguous(4, 8), contiguous(2, 8, 16)), "alike"),
        (lambda: linear_arrays("fp32", contiguous(4, 8), contiguous(8, 9)), "(N, K)"),
        (
            lambda: linear_arrays("fp32", Strided((2, 3, 8), (64, 16, 1)), contiguous(5, 8)),
            "do not collapse",
        ),
        (
            lambda: matmul_arrays("fp32", contiguous(4, 8), Strided((8, 16), (32, 2))),
            "reads in place",
        ),
        (
            lambda: linear_arrays("fp32", contiguous(1, 8), contiguous(5, 8), bias=True),
            "BIAS epilogue",
        ),
        (lambda: matmul_arrays("fp64", contiguous(4, 8), contiguous(8, 4)), "mode 'fp64'"),
    ],
)
def test_what_the_mapping_refuses(call: Any, message: str) -> None:
    with pytest.raises(AuditError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_cublas_terms_are_the_stored_matrices() -> None:
    case = Case("cublasLt", "fp16", 64, 96, 37, 3, "t", "n", lda=40, broadcast="b", bias=True)
    mapped = cublas_arrays(Problem.of_case(case))
    assert mapped.first == ArraySpec("a", (3, 64, 37), (64 * 40, 40, 1))  # A stored k x m
    assert mapped.second == ArraySpec("b", (3, 96, 37), (0, 37, 1))  # shared: stride 0
    assert mapped.out == ArraySpec("out", (3, 96, 64), (96 * 64, 64, 1))
    assert mapped.bias == ArraySpec("bias", (64,), (1,)) and not mapped.swapped
    single = cublas_arrays(Problem("fp32", 8, 4, 2, lda=8, ldb=2, ldc=8))
    assert single.first == ArraySpec("a", (2, 8), (8, 1))


def test_a_problem_whose_fields_disagree_is_refused() -> None:
    with pytest.raises(AuditError, match="do not describe one cuBLAS call"):
        cublas_arrays(Problem("fp32", 8, 4, 2, lda=8, ldb=2, ldc=9))


def test_strides_of_size_one_dimensions_do_not_matter() -> None:
    spec = ArraySpec("x", (1, 64), (64, 1))
    assert spec.accepts((1, 64), (1, 1)) and spec.accepts([1, 64], [64, 1])
    assert not spec.accepts((1, 64), (64, 2)) and not spec.accepts((2, 64), (64, 1))


def test_dtypes_name_the_modes() -> None:
    for dtype, mode in [("torch.bfloat16", "bf16"), ("float32", "fp32"), ("uint16", "bf16")]:
        assert mode_of_array(types.SimpleNamespace(dtype=dtype)) == mode
    with pytest.raises(AuditError, match="float64"):
        mode_of_array(types.SimpleNamespace(dtype="float64"))


# ----- the pin's numbers, the workspace (CPU) ---------------------------------------------------
class _Tile(enum.IntEnum):
    TILE_UNDEFINED = 0
    TILE_128x64 = 18


FAKE_LT = types.SimpleNamespace(MatmulTile=_Tile)


def test_enum_names_and_bare_numbers_become_cublaslts_numbers() -> None:
    assert attribute_number(FAKE_LT, FP32_PIN, "tile") == 18
    assert attribute_number(FAKE_LT, FP32_PIN_NUMBERS, "tile") == 18
    assert attribute_number(FAKE_LT, FP32_PIN, "split_k") == 2
    # an enum this binding lacks: a number still goes through, a name cannot
    assert attribute_number(FAKE_LT, BF16_PIN, "cluster_shape") == 5
    with pytest.raises(PinRefused, match=r"'AUTO' is not a number \(this nvmath has no Cluster"):
        attribute_number(FAKE_LT, FP32_PIN, "cluster_shape")


def test_an_unknown_tile_name_is_refused_in_one_line() -> None:
    with pytest.raises(PinRefused) as refused:
        pin = replace(FP32_PIN, tile="NOT_A_TILE")
        attribute_number(FAKE_LT, pin, "tile")
    assert "tile 'NOT_A_TILE' is not a name of nvmath's MatmulTile" in str(refused.value)
    assert "algo 20, tile NOT_A_TILE" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_candidate_is_its_pin() -> None:
    candidate = LtCandidate(
        3, None, 20, "128x64", "8x5", 2, "INPLACE", 0, "AUTO", 0, 0, 4 << 20, 1.5
    )
    assert pin_of(candidate) == replace(FP32_PIN, workspace_bytes=4 << 20)
    with pytest.raises(ValueError, match="lacks tile"):
        pin_of(replace(candidate, tile=None))


def test_the_workspace_is_the_larger_of_the_pins_and_the_requested() -> None:
    assert workspace_for(None, None) == DEFAULT_WORKSPACE_BYTES
    assert workspace_for(None, 0) == 0
    assert workspace_for(replace(FP32_PIN, workspace_bytes=4 << 20), None) == 4 << 20
    assert workspace_for(replace(FP32_PIN, workspace_bytes=4 << 20), 8 << 20) == 8 << 20
    with pytest.raises(AuditError, match="negative"):
        workspace_for(None, -1)


# ----- the call's routing, with cuBLASLt and the arrays faked (CPU) ---------------------------
class _FakeLt:
    """Stands in for device.lt.LtGemm: records the launches."""

    def __init__(self, case: Case, *_: int, workspace_bytes: int = 0) -> None:
        self.case, self.workspace_bytes = case, workspace_bytes
        self.alignments = {"A": 256, "B": 128, "C": 256, "D": 256}
        self.launched: list[tuple[int, ...]] = []
        self.biases: list[int] = []

    def default(self) -> LtCandidate:
        import numpy

        return LtCandidate(0, numpy.zeros(8, numpy.uint64), 1, *["0"] * 2, 1, "NONE", 0, "AUTO",
                           0, 0, 0, 1.0)  # fmt: skip

    def launch(self, *args: int) -> None:
        self.launched.append(args)

    def set_bias(self, ptr: int) -> None:
        self.biases.append(ptr)

    def close(self) -> None:
        pass


class _FakeArray:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class _FakeFramework:
    def __init__(self) -> None:
        self.checked: list[tuple[str, int]] = []

    def pointer(self, x: _FakeArray, spec: ArraySpec) -> int:
        self.checked.append((spec.name, spec.alignment))
        return x.ptr

    def stream(self) -> int:
        return 77

    def empty(self, spec: ArraySpec) -> _FakeArray:
        return _FakeArray(999)


@pytest.fixture
def faked(monkeypatch: pytest.MonkeyPatch) -> _FakeFramework:
    from cublas_audit.device import lt, pinned

    framework = _FakeFramework()
    monkeypatch.setattr(lt, "LtGemm", _FakeLt)
    monkeypatch.setattr(pinned.PinnedGemm, "_device", staticmethod(lambda: 0))
    monkeypatch.setattr(pinned, "arrays_for", lambda *_: framework)
    return framework


def test_a_row_major_call_hands_cublas_w_as_a_and_x_as_b(faked: _FakeFramework) -> None:
    from cublas_audit.device.pinned import PinnedGemm

    mapped = linear_arrays("fp32", contiguous(4, 64), contiguous(32, 64), bias=True)
    gemm = PinnedGemm(mapped.problem, arrays=mapped)
    x, w, bias, y = _FakeArray(1), _FakeArray(2), _FakeArray(3), _FakeArray(4)
    assert gemm(x, w, bias=bias, out=y) is y
    gemm(x, w, bias=bias, out=y)
    launches = gemm.gemm.launched  # type: ignore[attr-defined]
    assert [call[1:] for call in launches] == [(2, 1, 4, 4, 77)] * 2  # A = w, B = x, C = D = y
    assert gemm.gemm.biases == [3]  # type: ignore[attr-defined]  # set once: it did not change
    # x is cuBLAS's B and w its A: each checked against the alignment cuBLASLt was told
    assert faked.checked[:4] == [("x", 128), ("w", 256), ("out", 256), ("bias", 16)]
    with pytest.raises(OperandMismatch, match="called without a bias"):
        gemm(x, w, out=y)


def test_cublas_terms_keep_their_order_and_a_missing_out_is_made(faked: _FakeFramework) -> None:
    from cublas_audit.device.pinned import PinnedGemm

    gemm = PinnedGemm(Problem("fp32", 8, 4, 2, lda=8, ldb=2, ldc=8))
    made = gemm(_FakeArray(1), _FakeArray(2))
    assert made.ptr == 999
    assert gemm.gemm.launched[0][1:] == (1, 2, 999, 999, 77)  # type: ignore[attr-defined]
    c = _FakeArray(5)
    assert gemm(_FakeArray(1), _FakeArray(2), c=c) is c  # in place: out is C


# ----- on the GPU ------------------------------------------------------------------------------
def _tolerance(mode: str) -> float:
    from cublas_audit.device import operands

    return operands.tolerance(mode)


def _other_pin(default: Any) -> Pin:
    """A pin of the heuristic's list for the same descriptors: the second candidate where there
    is one (a real pin, not the default), else the default itself."""
    listed = default.gemm.heuristics(8)
    chosen = listed[1] if len(listed) > 1 else listed[0]
    return pin_of(chosen)


def _stored_view(array: Any, layout: Any, batched: bool, batch: int) -> Any:
    """device.operands' (stored, cols, ld) array as the call takes it: (batch, cols, rows)."""
    import cupy

    view = array[:, :, : layout.rows]
    if not batched:
        return view[0]
    return cupy.broadcast_to(view, (batch, *view.shape[1:])) if view.shape[0] < batch else view


CUBLAS_CASES = [
    Case("cublasLt", "fp32", 256, 192, 320, 1),
    Case("cublasLt", "bf16", 200, 136, 264, 1, "t", "n", lda=272),
    Case("cublasLt", "fp16", 128, 96, 64, 4, "n", "t", broadcast="b"),
    Case("cublasLt", "fp32", 128, 64, 96, 3, beta=0.5),
    Case("cublasLt", "bf16", 136, 72, 200, 1, "t", "n", bias=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CUBLAS_CASES, ids=lambda c: c.case_id)
def test_default_and_pinned_in_cublas_terms_match_float64(case: Case) -> None:
    from cublas_audit.device import operands
    from cublas_audit.device.pinned import PinnedGemm

    problem = Problem.of_case(case)
    ops = operands.make_for(case, seed=3)
    batched = problem.batched
    a = _stored_view(ops.a, case.operand("a"), batched, case.batch)
    b = _stored_view(ops.b, case.operand("b"), batched, case.batch)
    out = ops.c if batched else ops.c[0]
    with PinnedGemm(problem) as default, PinnedGemm(problem, _other_pin(default)) as pinned:
        for gemm in (default, pinned):
            error = operands.checked(lambda g=gemm: g(a, b, bias=ops.bias, out=out), ops)
            assert error <= _tolerance(case.mode), (case.case_id, gemm.algorithm.attributes())


def _torch() -> Any:
    return pytest.importorskip("torch")


def _relative_error(got: Any, exact: Any) -> float:
    return float((got.double() - exact).norm() / exact.norm())


def _check_both(build: Any, run: Any, exact: Any, mode: str) -> None:
    """The heuristic's default and a pin of its list each compute `exact`, output poisoned."""
    default = build(None)
    with default, build(_other_pin(default)) as pinned:
        for gemm in (default, pinned):
            got = run(gemm)
            assert bool(got.isfinite().all()), gemm.algorithm.attributes()
            assert _relative_error(got, exact) <= _tolerance(mode), gemm.algorithm.attributes()


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "dtype"), [("fp32", "float32"), ("bf16", "bfloat16")])
def test_torch_mm_linear_bmm_and_bias_match_float64(mode: str, dtype: str) -> None:
    from cublas_audit.device.pinned import PinnedGemm

    torch = _torch()
    kind = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(5)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, device="cuda").to(kind)

    def poisoned(*shape: int) -> Any:
        return torch.full(shape, float("nan"), device="cuda", dtype=kind)

    x, w, w_lin, bias = randn(96, 320), randn(320, 200), randn(200, 320), randn(200)
    xb, wb = randn(4, 64, 160), randn(4, 160, 72)
    checks = [  # (build, run, float64 product)
        (lambda pin: PinnedGemm.for_matmul(x, w, pin),
         lambda gm: gm(x, w, out=poisoned(96, 200)), x.double() @ w.double()),
        (lambda pin: PinnedGemm.for_linear(x, w_lin, pin),
         lambda gm: gm(x, w_lin, out=poisoned(96, 200)), x.double() @ w_lin.double().T),
        (lambda pin: PinnedGemm.for_matmul(xb, wb, pin),
         lambda gm: gm(xb, wb, out=poisoned(4, 64, 72)), xb.double() @ wb.double()),
        (lambda pin: PinnedGemm.for_linear(x, w_lin, pin, bias=True),
         lambda gm: gm(x, w_lin, bias=bias, out=poisoned(96, 200)),
         x.double() @ w_lin.double().T + bias.double()),
    ]  # fmt: skip
    for build, run, exact in checks:
        _check_both(build, run, exact, mode)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_without_out_a_new_output_is_returned() -> None:
    from cublas_audit.device.pinned import PinnedGemm

    torch = _torch()
    x, w = torch.randn(8, 64, device="cuda"), torch.randn(32, 64, device="cuda")
    with PinnedGemm.for_linear(x, w) as gemm:
        got = gemm(x, w)
    assert got.shape == (8, 32) and _relative_error(got, x.double() @ w.double().T) < 3e-5


def _on_the_h100() -> bool:
    import cupy

    return bool(cupy.cuda.Device().compute_capability == "90")


@pytest.mark.gpu
def test_the_recorded_h100_pins_by_name_and_by_number_are_one_algorithm() -> None:
    from cublas_audit.device.lt_pin import pin_of
    from cublas_audit.device.pinned import PinnedGemm

    if not _on_the_h100():
        pytest.skip("the pins were recorded on an H100 (sm90)")
    torch = _torch()
    x, w = torch.randn(128, 1600, device="cuda"), torch.randn(1600, 2496, device="cuda")
    with (
        PinnedGemm.for_matmul(x, w, FP32_PIN, workspace_bytes=DEFAULT_WORKSPACE_BYTES) as named,
        PinnedGemm.for_matmul(
            x, w, FP32_PIN_NUMBERS, workspace_bytes=DEFAULT_WORKSPACE_BYTES
        ) as numbered,
    ):
        assert named.algorithm.algo.tobytes() == numbered.algorithm.algo.tobytes()
        assert pin_of(named.algorithm) == replace(
            FP32_PIN, workspace_bytes=named.algorithm.workspace_bytes
        )
        got = named(x, w)
    assert _relative_error(got, x.double() @ w.double()) <= _tolerance("fp32")
    xb, wb = (torch.randn(448, 1664, device="cuda").bfloat16(),
              torch.randn(1664, 7744, device="cuda").bfloat16())  # fmt: skip
    with PinnedGemm.for_matmul(xb, wb, BF16_PIN, workspace_bytes=DEFAULT_WORKSPACE_BYTES) as bf16:
        got = bf16(xb, wb)
    assert _relative_error(got, xb.double() @ wb.double()) <= _tolerance("bf16")


@pytest.mark.gpu
def test_a_pin_needing_more_workspace_than_given_is_refused() -> None:
    from cublas_audit.device.pinned import PinnedGemm

    torch = _torch()
    x, w = torch.randn(64, 8192, device="cuda"), torch.randn(8192, 64, device="cuda")
    with PinnedGemm.for_matmul(x, w) as default:
        needing = [c for c in default.gemm.heuristics(16) if c.workspace_bytes > 0]
    if not needing:
        pytest.skip("no candidate of this problem needs workspace on this GPU")
    pin = replace(pin_of(needing[0]), workspace_bytes=0)  # a record that understates it
    with PinnedGemm.for_matmul(x, w, pin, workspace_bytes=DEFAULT_WORKSPACE_BYTES) as ample:
        needed = ample.algorithm.workspace_bytes  # what cublasLtMatmulAlgoCheck says
    given = needed // 2
    with pytest.raises(PinRefused, match=f"it needs {needed} B of workspace, {given} B given"):
        PinnedGemm.for_matmul(x, w, pin, workspace_bytes=given)
    with PinnedGemm.for_matmul(x, w, pin, workspace_bytes=needed) as enough:
        got = enough(x, w)
    assert _relative_error(got, x.double() @ w.double()) <= _tolerance("fp32")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("change", "said"),
    [({"algo_id": 9999}, r"the pin \(algo 9999, "), ({"tile": "NOT_A_TILE"}, "NOT_A_TILE")],
)
def test_an_invalid_pin_is_refused(change: dict[str, Any], said: str) -> None:
    from cublas_audit.device.pinned import PinnedGemm

    torch = _torch()
    x, w = torch.randn(64, 256, device="cuda"), torch.randn(256, 128, device="cuda")
    with PinnedGemm.for_matmul(x, w) as default:
        pin = replace(_other_pin(default), **change)
    with pytest.raises(PinRefused, match=said) as refused:
        PinnedGemm.for_matmul(x, w, pin)
    assert "\n" not in str(refused.value)


@pytest.mark.gpu
def test_arrays_that_are_not_the_built_ones_are_refused_before_launch() -> None:
    import cupy

    from cublas_audit.device.pinned import PinnedGemm

    torch = _torch()
    x, w = torch.randn(16, 64, device="cuda"), torch.randn(32, 64, device="cuda")
    y = torch.full((16, 32), float("nan"), device="cuda")
    offset = torch.empty(16 * 64 + 1, device="cuda")[1:].view(16, 64)  # 4-byte aligned
    wrong = [
        ((torch.randn(16, 65, device="cuda"), w), {"out": y}, "shape \\[16, 65\\]"),
        ((x.double(), w), {"out": y}, "dtype torch.float64"),
        ((x.cpu(), w), {"out": y}, "on cpu"),
        ((offset, w), {"out": y}, "-byte aligned"),
        ((x, cupy.zeros((32, 64), dtype=cupy.float32)), {"out": y}, "cupy"),
        ((x, w), {"out": y, "bias": torch.zeros(32, device="cuda")}, "without a bias"),
        ((x, w), {"out": y.T}, "strides"),
    ]
    with PinnedGemm.for_linear(x, w) as gemm:
        for args, kwargs, said in wrong:
            with pytest.raises(OperandMismatch, match=said):
                gemm(*args, **kwargs)
    torch.cuda.synchronize()
    assert bool(y.isnan().all())  # nothing ran


@pytest.mark.gpu
def test_a_capture_in_a_cuda_graph_replays_the_same_result() -> None:
    from cublas_audit.device.pinned import PinnedGemm

    torch = _torch()
    x, w = torch.randn(96, 320, device="cuda"), torch.randn(200, 320, device="cuda")
    y = torch.empty(96, 200, device="cuda")
    with (
        PinnedGemm.for_linear(x, w) as default,
        PinnedGemm.for_linear(x, w, _other_pin(default)) as gemm,
    ):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as torch asks
            gemm(x, w, out=y)
        torch.cuda.current_stream().wait_stream(side)
        eager = gemm(x, w).clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gemm(x, w, out=y)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _relative_error(y, eager.double()) <= _tolerance("fp32") / 10  # same algorithm
        x.copy_(torch.randn_like(x))  # new inputs, same addresses: the graph computes them
        graph.replay()
        torch.cuda.synchronize()
        assert _relative_error(y, x.double() @ w.double().T) <= _tolerance("fp32")
