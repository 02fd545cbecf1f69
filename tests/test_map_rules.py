"""Rules over a dense series, on a real map: FP32 cuBLAS on the H100, M = N = K from 64 to 4096 in
steps of 64, single, batch-1 strided and batch 8 (with loops), observed with CUPTI
(reports/h100/maps/20261123-235543-fp32-64-4096).

Hand-checked from its table: at batch 8, 2112^3 ran its kernel (xmma_64x64x8) in 3.611980 ms and
the larger 2176^3 (xmma_128x128x8) in 3.126550 ms: 1.155x, a size inversion. Single, 2048^3 took
0.339303 ms (simt_256x128_8x4) and 2112^3 0.461387 ms (xmma_64x64x8): throughput falls by
1 - (2112/2048)^3 * 0.339303 / 0.461387 = 19.3 %, a dispatch cliff. The sweep re-measured the one
unsure batched-vs-loop pair (3392^3 batch 8) interleaved, 100 calls each: the batched call's
kernels 13.17 ms against the loop's 13.58 ms.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cublas_audit.findings import audit
from cublas_audit.inputs import load_one_gpu
from cublas_audit.rundir import RECHECKED

MAP = Path(__file__).resolve().parents[1] / "reports/h100/maps/20261123-235543-fp32-64-4096"


@pytest.fixture(scope="module")
def findings():  # type: ignore[no-untyped-def]
    return audit(load_one_gpu(MAP).frame)


def test_size_inversion_names_the_larger_size_that_runs_sooner(findings) -> None:  # type: ignore[no-untyped-def]
    found = {(f.batch, f.sizes[0]): f for f in findings if f.rule == "size-inversion"}
    inversion = found[(8, "2112")]
    assert "2112 takes 1.16x the time of the larger 2176" in inversion.message
    assert "Pad the problem to 2176x2176x2176" in inversion.workaround
    assert all(f.api == "cublas" and f.batch == 8 for f in found.values())


def test_dispatch_cliff_at_2048_to_2112(findings) -> None:  # type: ignore[no-untyped-def]
    cliffs = {(f.routine, f.batch, f.sizes[0]) for f in findings if f.rule == "dispatch-cliff"}
    assert ("cublasSgemm", 1, "2112") in cliffs
    message = next(
        f.message for f in findings if f.rule == "dispatch-cliff" and f.routine == "cublasSgemm"
    )
    assert "simt_256x128_8x4 to xmma_64x64x8 and throughput drops by 19 %" in message


def test_the_unsure_pair_was_measured_again_interleaved(findings) -> None:  # type: ignore[no-untyped-def]
    rechecked = (MAP / RECHECKED).read_text().split()
    assert rechecked == ["cublas.fp32.3392x3392x3392.b8.nn", "loop.fp32.3392x3392x3392.b8.nn"]
    frame = load_one_gpu(MAP).frame.set_index("case_id")
    loop = frame.loc["loop.fp32.3392x3392x3392.b8.nn"]
    assert loop["time_n"] == 100  # five times the sweep's 20
    assert loop["batched_kernel_time_ms"] < loop["kernel_time_ms"]
    assert not [f for f in findings if f.rule == "batched-slower-than-loop" and "3392" in f.sizes]
