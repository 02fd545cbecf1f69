"""Timing findings on a CUPTI-traced run (reports/h100/noise/kernel-a/run-00, default batched
grid with the reference, H100): the kernels' time is compared where both sides were traced.

At 256^3 batch 8 the call took 0.030336 ms and the reference 0.030048 ms (1.01x: nothing to
report on call time), but cuBLAS's kernel (xmma_32x32x8) took 0.013216 ms against the reference's
0.011968 ms: 1.104x, beyond the interleaved kernel-ratio floor of the shipped noise model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cublas_audit.judge.rules import audit
from cublas_audit.table.inputs import load_one_gpu

RUN = Path(__file__).resolve().parents[1] / "reports/h100/noise/kernel-a/run-00"


@pytest.fixture(scope="module")
def frame():  # type: ignore[no-untyped-def]
    return load_one_gpu(RUN).frame


def test_reference_faster_on_kernel_times(frame) -> None:  # type: ignore[no-untyped-def]
    found = audit(frame, rules=("reference-faster",))
    assert {(f.api, f.batch, tuple(f.sizes), f.severity) for f in found} == {
        ("cublas", 8, ("256",), "medium"),
        ("cublasLt", 8, ("256",), "medium"),
    }
    cublas = next(f for f in found if f.api == "cublas")
    assert "1.10x faster than cuBLAS (xmma_32x32x8)" in cublas.message  # 0.013216 / 0.011968
    assert "comparing the kernels' time (CUPTI)" in cublas.message


def test_the_same_run_on_call_times_alone_finds_nothing(frame) -> None:  # type: ignore[no-untyped-def]
    untraced = frame.drop(columns=[c for c in frame.columns if "kernel_time" in c])
    found = audit(untraced, rules=("reference-faster",))
    # no confident finding; at most "unsure" notes (the cuBLASLt row at 512 b4: 1.08x on calls
    # of 0.05 ms, whose between-run floor is 51 %)
    assert found and {f.severity for f in found} == {"info"}
    assert all((f.batch, f.sizes) != (8, ["256"]) for f in found)
