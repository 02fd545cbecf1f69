"""Kernel-name normalization on names ncu printed on the H100, and on the article's short names."""

from __future__ import annotations

import pytest

from cublas_audit.observe.kernels import normalize
from cublas_audit.table.validation import read_table

from .conftest import FIXTURES


@pytest.mark.parametrize(
    ("name", "short", "family", "tile"),
    [
        (
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)",
            "simt_256x128_8x4",
            "simt",
            "256x128",
        ),
        (
            "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4"
            "_alignc4_execute_kernel__5x_cublas",
            "xmma_128x128x8",
            "xmma",
            "128x128x8",
        ),
        (
            "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4"
            "_alignc4_execute_split_k_kernel__5x_cublas",
            "splitKreduce",
            "splitk-reduce",
            "",
        ),
        ("simt_128x32_8x5", "simt_128x32_8x5", "simt", "128x32"),
        ("xmma_32x32x8", "xmma_32x32x8", "xmma", "32x32x8"),
        (
            "magma_sgemmEx_kernel<float, float, float, 0, 0, 6, 3, 5, 3, 4>",
            "magma_Ex",
            "magma",
            "",
        ),
        ("magma_Ex", "magma_Ex", "magma", ""),
        (
            "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(T1::Params)",
            "tensorop_s1688gemm_128x128_32x3",
            "tensorop",
            "128x128",
        ),
        ("maxwell_sgemm_128x64_nn", "maxwell_gemm_128x64", "legacy", "128x64"),
        (
            "void gemv2N_kernel<int, int, float, float, float, 128, 4>(T12)",
            "gemv2N_kernel",
            "gemv",
            "",
        ),
        ("cublas_audit_ref_tma_sgemm", "cublas_audit_ref_tma_sgemm", "reference", ""),
    ],
)
def test_normalize(name: str, short: str, family: str, tile: str) -> None:
    info = normalize(name)
    assert (info.short, info.family, info.tile) == (short, family, tile)


def test_short_names_normalize_to_themselves() -> None:
    for name in ("simt_256x128_8x4", "xmma_128x128x8", "magma_Ex"):
        assert normalize(normalize(name).short).short == normalize(name).short


def test_every_recorded_h100_kernel_gets_a_known_family() -> None:
    frame = read_table(FIXTURES / "h100-batched-cublas")
    kernels = frame["kernel"].dropna().unique()
    assert len(kernels) >= 4
    assert {normalize(k).family for k in kernels} <= {"simt", "xmma", "splitk-reduce"}


def test_names_the_new_problem_shapes_dispatch_on_the_h100() -> None:
    """Kernel names recorded on the H100 (reports/h100/layouts/): nvjet names of each layout and
    beta flag map to one short name with the layout kept apart; the dot and reduction kernels of
    the M = N = 1 problem (pytorch#114911) are the gemv family."""
    layouts = {
        normalize(f"nvjet_sm90_tst_64x24_64x16_2x4_h_{beta}_{layout}")
        for beta in ("bz", "bx")
        for layout in ("NNT", "TNT")
    }
    assert {(k.short, k.family, k.tile, k.arch) for k in layouts} == {
        ("nvjet_tst_64x24_64x16_2x4", "nvjet", "64x24", "sm90")
    }
    assert {k.layout for k in layouts} == {"NNT", "TNT"}
    coop = normalize("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT")
    assert (coop.short, coop.layout) == ("nvjet_hsh_256x128_64x4_1x2", "NNT")
    dot = normalize(
        "void dot_kernel<float, 128, 0, cublasDotParams<cublasGemvTensorStridedBatched<const "
        "float>, cublasGemvTensorStridedBatched<float>>>(T4)"
    )
    reduce = normalize("void reduce_1Block_kernel<float, 128, 7, cublasGemvTensorStridedBatched")
    assert (dot.family, dot.short) == ("gemv", "dot_kernel")
    assert (reduce.family, reduce.short) == ("gemv", "reduce_1Block_kernel")
    assert normalize("void gemvx::kernel<int, int, float, float>(T13)").short == "gemvx_kernel"
