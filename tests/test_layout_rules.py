"""The rules over how a problem is posed, on the H100 runs of reports/h100/layouts/ (kernel-only
times from CUPTI, ncu counters): layout-penalty, broadcast-slower-than-folded, underfilled-grid.

Hand-checked from the tables: FP32 256^3 batch 8, cublasSgemmStridedBatched, layout tn ran its
kernel (xmma_32x32x8) in 0.016480 ms, layout nt (the same kernel) in 0.012160 ms: 1.355x; for
cuBLASLt 0.016129 / 0.011872 = 1.359x. Every other layout of the run is within 1.3x of its best.
The FP16 8192x512x8192 batch-4 call with a shared A took 0.361575 ms of kernel time, the folded
8192x2048x8192 GEMM 0.363031 ms: no penalty on cuBLAS 13.1. The M = N = 1, K = 131072 dot ran on
496 CTAs of the 132-SM H100 (pytorch#114911's single-CTA gemv is fixed there).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.judge.rules import audit
from cublas_audit.table.inputs import load_one_gpu

RUNS = Path(__file__).resolve().parents[1] / "reports/h100/layouts"


def run(name: str) -> pd.DataFrame:
    return load_one_gpu(RUNS / f"20261123-225609-{name}").frame


def found(frame: pd.DataFrame, rule: str) -> list[tuple[str, str, int, list[str]]]:
    return [(f.api, f.severity, f.batch, f.sizes) for f in audit(frame, rules=(rule,))]


def test_layout_penalty_names_the_slow_layout_and_the_fast_one() -> None:
    findings = audit(run("layouts"), rules=("layout-penalty",))
    assert {(f.api, f.batch, tuple(f.sizes), f.severity) for f in findings} == {
        ("cublas", 8, ("256 tn",), "medium"),
        ("cublasLt", 8, ("256 tn",), "medium"),
    }
    cublas = next(f for f in findings if f.api == "cublas")
    assert cublas.message.startswith("In layout tn the call takes 1.36x the time of layout nt")


def test_broadcast_batched_call_against_the_folded_gemm() -> None:
    both = pd.concat([run("broadcast"), run("folded")], ignore_index=True)
    assert found(both, "broadcast-slower-than-folded") == []
    # The same run with the shared-A call's kernels made 1.5x slower (PR 161564's old cuBLAS
    # was 32x): the rule names it, against the folded GEMM the sweep timed.
    slowed = both.copy()
    shared = (slowed["broadcast"] == "a") & (slowed["api"] == "cublas") & (slowed["m"] == 8192)
    columns = [c for c in slowed.columns if c.startswith("kernel_time") and c.endswith("_ms")]
    slowed.loc[shared, columns] = slowed.loc[shared, columns].astype(float) * 1.5
    (finding,) = audit(slowed, rules=("broadcast-slower-than-folded",))
    assert (finding.api, finding.batch, finding.severity) == ("cublas", 4, "high")
    assert "1.49x the time of the one 8192x2048x8192 GEMM" in finding.message


def test_underfilled_grid_on_the_dot_of_pytorch_114911() -> None:
    frame = run("gemv")
    assert found(frame, "underfilled-grid") == []
    assert found(frame, "legacy-kernel") == []  # a dot is the right kernel for M = N = 1
    # As the cuBLAS 12.1 ran it: the main kernel on one CTA, 412 us.
    single_cta = frame.copy()
    dot = single_cta["kernel"].fillna("").str.contains("dot_kernel")
    single_cta.loc[dot, "grid"] = "1x1x1"
    single_cta.loc[dot, "traced_ctas"] = 1
    single_cta.loc[dot, ["time_ms", "kernel_time_ms"]] = 0.412
    findings = found(single_cta, "underfilled-grid")
    assert sorted(findings) == [
        ("cublas", "high", 1, ["1x1x131072"]),  # cublasSgemm
        ("cublas", "high", 1, ["1x1x131072 strided"]),  # cublasSgemmStridedBatched, batch 1
    ]


@pytest.mark.parametrize("name", ["layouts", "gemv", "broadcast", "folded"])
def test_every_case_of_the_new_shapes_ran_and_passed_its_check(name: str) -> None:
    frame = run(name)
    assert (frame["status"] == "ok").all()
    profiled = frame[frame["routine"] != "sgemm-loop"]  # loops are timed only
    assert profiled["kernel"].notna().all()
