"""Roofline bounds (judge.roofline) and the utilization rules judged against them.

The numbers are hand-computed from recorded facts: the H100's env.json of a bundled run (132 SMs,
1980 MHz max SM clock, cc 9.0), its data sheet (3.35 TB/s HBM3), a bundled run's measured times,
and the fp32 LM head measured on the H100 (../shared/DESIGN.md, 2026-11-25: cuBLAS
`gemmSN_TN_kernel`, a 32000x2048 matrix times 4 vectors, 262 MB moved in 0.114 ms, 13 % FMA pipe).
"""

from __future__ import annotations

import pandas as pd
import pytest

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.roofline import (
    Machine,
    bound_words,
    bytes_moved,
    machine_of,
    with_roofline,
)
from cublas_audit.judge.rules import audit, prepare
from cublas_audit.table.dispatch import from_records
from cublas_audit.table.inputs import load_run
from cublas_audit.table.rundir import read_env
from tests.conftest import REPORTS, audited_run

H100_RUN = REPORTS / "h100" / "20261123-145452-batched"


def test_the_h100s_figures_come_from_its_env_and_data_sheet() -> None:
    machine = machine_of(read_env(H100_RUN), pd.DataFrame())
    assert machine is not None
    assert machine.dram_gbps == 3350.0 and "data sheet" in machine.dram_source
    # FP32: 132 SMs x 128 lanes x 2 FLOP x 1.98 GHz = 66.9 TFLOP/s (DESIGN.md's figure)
    assert machine.peaks["fp32"] == pytest.approx(66.9, abs=0.05)
    # BF16 dense: 132 x 4096 FLOP/clock x 1.98 GHz = 1070.5; TF32 half of it
    assert machine.peaks["bf16"] == pytest.approx(1070.5, abs=0.1)
    assert machine.peaks["tf32"] == pytest.approx(535.3, abs=0.1)
    # the ridge: 66.9e12 / 3.35e12 = 19.97 FLOP/B for fp32
    assert machine.ridge("fp32") == pytest.approx(19.97, abs=0.01)


def test_an_unknown_gpu_has_no_figures() -> None:
    assert machine_of({"gpu_name": "Some Future GPU"}, pd.DataFrame()) is None


def lm_head() -> pd.DataFrame:
    """The recorded LM head as cuBLAS ran it: m = 32000, n = 4, k = 2048, fp32, 0.114 ms."""
    return from_records(
        [
            {"gpu_label": "h100", "api": "cublas", "routine": "aten::linear", "mode": "fp32",
             "m": 32000, "n": 4, "k": 2048, "batch": 1, "kernel": "gemmSN_TN_kernel",
             "fma_pct": 13.0, "time_ms": 0.114, "kernel_time_ms": 0.114, "status": "ok",
             "case_id": "trace.linear.0"}
        ]
    )  # fmt: skip


H100 = Machine("NVIDIA H100 80GB HBM3", 3350.0, "data sheet", {"fp32": 66.9}, "spec")


def test_the_lm_head_moves_262_mb_at_2_flop_per_byte_69_percent_of_dram() -> None:
    rows = with_roofline(prepare(lm_head()), H100)
    row = rows.iloc[0]
    # 4 B x (32000 x 2048 + 2048 x 4 + 32000 x 4) = 4 x 65,672,192 = 262,688,768 B
    assert int(bytes_moved(rows).iloc[0]) == 262_688_768
    # 2 x 32000 x 4 x 2048 / 262,688,768 = 524,288,000 / 262,688,768 = 1.99585 FLOP/B, under
    # the 19.97 ridge
    assert row["intensity"] == pytest.approx(1.99585, abs=1e-5)
    assert row["bound_side"] == "memory"
    # bound: 1.99585 x 3.35 TB/s = 6.6861 TFLOP/s; attained 524.288e6 / 0.114e-3 = 4.5990
    assert row["bound_tflops"] == pytest.approx(6.6861, abs=1e-4)
    assert row["roofline_pct"] == pytest.approx(68.78, abs=0.01)


def test_a_memory_bound_gemv_near_its_bound_is_no_finding_and_without_a_roofline_it_is() -> None:
    frame = lm_head()
    judged = audit(frame, prepared=with_roofline(prepare(frame), H100), machine=H100)
    assert judged == []
    # the same row with no figures for the GPU: judged as before, a legacy code path
    (legacy,) = audit(frame)
    assert legacy.rule == "legacy-kernel"
    assert "no roofline bound" in legacy.message


def test_a_memory_bound_call_far_below_its_bandwidth_is_low_utilization_stating_the_bound() -> None:
    frame = lm_head()
    frame["kernel_time_ms"] = 0.4  # as if it moved its 262.7 MB 3.5x slower: 19.6 % of DRAM
    frame["time_ms"] = 0.4
    found = audit(frame, prepared=with_roofline(prepare(frame), H100), machine=H100)
    # 524.288e6 FLOP / 0.4 ms = 1.3107 TFLOP/s of a 6.6861 bound: 19.6 %, under 50 %: slow on its
    # bandwidth, and the legacy GEMV kernel is a finding again
    assert sorted(f.rule for f in found) == ["legacy-kernel", "low-utilization"]
    words = "memory-bound at 2.0 FLOP/B: 20 % of the 3.35 TB/s this GPU moves"
    assert all(words in f.message for f in found)


def test_the_bundled_h100_run_gets_its_bounds_and_keeps_its_findings() -> None:
    judged = audited_run(H100_RUN)
    rows = judged.rows.set_index("case_id")
    big = rows.loc["cublas.fp32.8192x8192x8192.b8.nn"]
    # 8192^3 fp32: 2 x 8192 / (4 x 3) = 1365 FLOP/B, far past the ridge: the FP32 peak bounds it
    assert big["bound_side"] == "compute"
    assert big["intensity"] == pytest.approx(2 * 8192 / 12, abs=0.5)
    assert big["bound_tflops"] == pytest.approx(66.9, abs=0.05)
    flops = 2 * 8192**3 * 8
    attained = flops / (float(big["time_ms"]) / 1e3) / 1e12  # no CUPTI in that run: call time
    assert big["roofline_pct"] == pytest.approx(100 * attained / big["bound_tflops"], rel=1e-9)
    # every call of the default grid is compute-bound at fp32 (the smallest, 256^3: 42.7 FLOP/B)
    assert set(judged.rows["bound_side"].dropna()) == {"compute"}
    assert [f.rule for f in judged.findings] == ["better-candidate", "reference-faster"]


def test_bound_words_say_which_bound_applies() -> None:
    rows = with_roofline(prepare(lm_head()), H100)
    assert bound_words(rows, H100).startswith("memory-bound at 2.0 FLOP/B: 69 % of the 3.35 TB/s")
    assert bound_words(rows, None).startswith("no roofline bound")


def test_bytes_moved_reads_a_broadcast_operand_once_and_c_again_when_beta_is_not_zero() -> None:
    """Pure arithmetic on shapes: fp16 (2 B), m = 64, n = 32, k = 16, batch 4."""
    base = {"gpu_label": "x", "api": "cublas", "mode": "fp16", "m": 64, "n": 32, "k": 16,
            "batch": 4, "kernel": "k", "fma_pct": None, "time_ms": 1.0}  # fmt: skip
    rows = from_records(
        [
            base,  # A 64x16x4 + B 16x32x4 + C 64x32x4 = 4096 + 2048 + 8192 = 14336 el.
            {**base, "broadcast": "a"},  # A once: 1024 + 2048 + 8192 = 11264
            {**base, "beta": 0.5},  # C read too: 14336 + 8192 = 22528
            {**base, "api": "cublasLt", "bias": 1},  # + a bias of m: 14336 + 64 = 14400
        ]
    )
    assert list(bytes_moved(rows).astype(int)) == [2 * 14336, 2 * 11264, 2 * 22528, 2 * 14400]


LLAMA = REPORTS / "h100" / "traces" / "20261125-074414-llama"


def test_the_llama_traces_memory_bound_calls_near_their_bound_are_no_findings() -> None:
    """The Llama-style block recorded on the H100 (tests/fixtures/torch_traces/llama.json.gz),
    swept with ncu: the fp32 LM head (gemmSN_TN_kernel, 13 % FMA pipe) moves 67 % of DRAM
    bandwidth, the attention bmm (64 x 512x512x128, 25-33 % tensor pipe) 72-80 %: the
    utilization rules flagged all of them against the 93 % of the MLP's GEMMs before."""
    judged = audited_run(LLAMA)
    rows = judged.rows.set_index("case_id")
    head = rows.loc["cublas.fp32.32000x4x2048.b1.tn"]
    assert head["bound_side"] == "memory" and 60 < head["roofline_pct"] < 75
    bmm = rows.loc["cublas.bf16.128x512x512.b64.nn"]
    # 2 x 128 x 512 x 512 x 64 / (2 B x 64 x (128x512 + 512x512 + 128x512)) = 85.3 FLOP/B,
    # under the bf16 ridge (1070.5 / 3.35 = 319.6)
    assert bmm["intensity"] == pytest.approx(85.33, abs=0.01) and bmm["bound_side"] == "memory"
    assert judged.findings == []
    mlp = rows.loc["cublas.bf16.5632x2048x2048.b1.tn"]
    assert mlp["bound_side"] == "compute" and mlp["util"] > 90


K140 = REPORTS / "h100" / "checks" / "20261125-074637-k140"


def _k140_findings() -> tuple[Finding, ...]:
    """The k140 run's findings, judged once per process (conftest.audited_run)."""
    return tuple(audited_run(K140).findings)


def test_the_k140_problem_reads_as_its_cause_with_the_padded_variants_measured_gain() -> None:
    """bf16 1024x1024x140 batch 8 on the H100, packed, with ldb 144, and with K 144: K = 140
    (280 bytes) keeps the sm80 kernel whatever ldb is; K = 144 gets nvjet, its kernels 2.16x
    faster (0.0209915 / 0.009728 ms, CUPTI, as recorded in the run's dispatch.csv)."""
    found = _k140_findings()
    causes = [f for f in found if f.rule == "unaligned-operand"]
    assert [f.sizes for f in causes] == [["1024x1024x140"], ["1024x1024x140 ldb144"]]
    first = causes[0]
    assert first.severity == "high"  # measured beyond the noise model, >= high_ratio (1.25)
    assert "K = 140 is not a multiple of 8 bf16 elements (16 bytes)" in first.message
    assert "(an sm80 kernel)" in first.message and "2.16x faster" in first.message
    assert first.effect == pytest.approx(1 - 0.009728 / 0.0209915, abs=1e-4)
    assert not any("1024x1024x144" in f.sizes[0] for f in found)  # the aligned one is no finding


def test_proof_ranks_first_within_a_severity() -> None:
    """A finding with a measured alternative (its `effect`, the time given back) is listed before
    an observation of the same severity, the larger gain first; severity still leads."""
    from dataclasses import replace

    from cublas_audit.judge.finding import order

    found = _k140_findings()
    (cause,) = [f for f in found if f.rule == "unaligned-operand" and "ldb" not in f.sizes[0]]
    observed = replace(cause, rule="legacy-kernel", effect=0.0)
    smaller = replace(cause, effect=cause.effect / 2)
    info = replace(cause, severity="info")
    ranked = sorted([info, observed, smaller, cause], key=order)
    assert ranked == [cause, smaller, observed, info]


def test_the_roofline_thresholds_hold_at_their_boundaries() -> None:
    """`memory_bound_min_pct` is "at least": at the LM head's own 68.78 % it is near its bound (no
    finding), a hair above it is not; `memory_bound_min_bytes` too: at its 262,688,768 bytes it
    is judged on bandwidth, one byte more and it is not (then legacy-kernel only)."""
    import math

    from cublas_audit.judge.thresholds import Thresholds

    frame = lm_head()
    rows = with_roofline(prepare(frame), H100)
    pct, moved = float(rows["roofline_pct"].iloc[0]), float(rows["bytes_moved"].iloc[0])

    def rules(**limits: float) -> list[str]:
        found = audit(frame, Thresholds(**limits), prepared=rows, machine=H100)
        return sorted(f.rule for f in found)

    assert rules(memory_bound_min_pct=pct) == []
    above = math.nextafter(pct, math.inf)
    assert rules(memory_bound_min_pct=above) == ["legacy-kernel", "low-utilization"]
    assert rules(memory_bound_min_pct=above, memory_bound_min_bytes=moved) == [
        "legacy-kernel",
        "low-utilization",
    ]
    assert rules(memory_bound_min_pct=above, memory_bound_min_bytes=moved + 1) == ["legacy-kernel"]


def test_the_causes_a_table_shows_are_named_on_real_rows() -> None:
    """The H100's ops trace swept (reports/h100/traces/20261123-233621-ops): its recorded CTAs
    against 132 SMs, its split-K reductions, its unaligned tensor-core dimensions."""
    from cublas_audit.judge.rules.causes import named_causes

    # the rows as judge.audited prepares them (the causes are named on them; no rule is run)
    run = load_run(REPORTS / "h100" / "traces" / "20261123-233621-ops")
    rows = with_roofline(prepare(run.frame), machine_of(run.env, run.frame))
    rows = rows.set_index("case_id", drop=False)

    def causes(case_id: str) -> str:
        return named_causes(rows.loc[[case_id]])

    # 192 CTAs / 132 SMs = 1.45 waves: the second wave leaves 1 - 0.45 = 55 % idle
    assert causes("cublas.fp32.384x512x256.b1.nn") == (
        "its 192 CTAs are 1.45 waves on 132 SMs: the last wave leaves 55% of them idle"
    )
    # bf16 100x7x20000 nt: 4 CTAs (3 % of 132), a splitKreduce after the GEMM, M and N unaligned
    assert causes("cublas.bf16.100x7x20000.b1.nt") == (
        "M = 100 is not a multiple of 8 bf16 elements (16 bytes); N = 7 is not a multiple of 8 "
        "bf16 elements (16 bytes); its 4 CTAs fill 3% of the 132 SMs; cuBLAS split K (a "
        "reduction kernel follows the GEMM)"
    )
    # FP32 (the FMA pipe's simt kernels take any alignment): no alignment cause
    assert "16 bytes" not in causes("cublas.fp32.100x7x20000.b1.nt")
