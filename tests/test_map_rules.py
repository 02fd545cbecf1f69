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

from cublas_audit.judge.rules import audit
from cublas_audit.table.inputs import load_one_gpu
from cublas_audit.table.rundir import RECHECKED

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


# ----- off the diagonal: a slice of the 10,000-case map ------------------------------------------

# The problems with N = 192 of the 10,000-case FP32 map of the H100 (M, N, K sampled from 64..4096
# step 64; benchmarks/results/map-10k-h100). Hand-checked from its table: 2112x192x1792 ran
# xmma_64x128x8 (with a second xmma kernel) in 0.039968 ms, 2 * 2112 * 192 * 1792 / 0.039968 ms =
# 36.4 TFLOP/s; 2368x192x1792 ran simt_128x64_8x5 with cuBLASLt's splitKreduce in 0.116738 ms,
# 14.0 TFLOP/s: 1 - 14.0 / 36.4 = 62 % lost between neighbours along M. 2432x192x2432 (simt,
# 0.147874 ms) takes 0.147874 / 0.067712 = 2.18x the time of the larger 2496x192x2752 (xmma,
# 0.067712 ms).
SLICE = Path(__file__).resolve().parent / "fixtures/h100-map-10k-n192/dispatch.csv"


@pytest.fixture(scope="module")
def slice_findings():  # type: ignore[no-untyped-def]
    return audit(load_one_gpu(SLICE).frame, rules=("dispatch-cliff", "size-inversion"))


def test_a_cliff_between_neighbours_along_one_dimension(slice_findings) -> None:  # type: ignore[no-untyped-def]
    cliffs = {f.sizes[0]: f for f in slice_findings if f.rule == "dispatch-cliff"}
    cliff = cliffs["2368x192x1792"]
    assert "From 2112x192x1792 to 2368x192x1792" in cliff.message
    assert "xmma_64x128x8 to simt_128x64_8x5 and throughput drops by 62 %" in cliff.message
    assert cliff.effect == pytest.approx(1 - (2368 / 2112) * 0.039968 / 0.116738, abs=1e-3)


def test_an_off_diagonal_inversion_names_the_padded_shape(slice_findings) -> None:  # type: ignore[no-untyped-def]
    found = {f.sizes[0]: f for f in slice_findings if f.rule == "size-inversion"}
    inversion = found["2432x192x2432"]
    assert "takes 2.18x the time of the larger 2496x192x2752" in inversion.message
    assert inversion.effect == pytest.approx(1 - 0.067712 / 0.147874, abs=1e-3)
    # the comparison is a real row of the table: the larger problem, faster
    assert inversion.compared and inversion.compared != inversion.rows


def test_cliffs_are_only_between_problems_that_differ_in_one_dimension(slice_findings) -> None:  # type: ignore[no-untyped-def]
    from cublas_audit.judge.rules import prepare

    rows = prepare(load_one_gpu(SLICE).frame)
    cliffs = [f for f in slice_findings if f.rule == "dispatch-cliff"]
    assert cliffs
    for cliff in cliffs:
        (after,), (before,) = cliff.rows, cliff.compared
        changed = [d for d in ("m", "n", "k") if rows.at[after, d] != rows.at[before, d]]
        assert len(changed) == 1, cliff.message
        # and consecutive along it: no observed problem of the same line lies between them
        axis = changed[0]
        line = rows
        for d in ("m", "n", "k"):
            if d != axis:
                line = line[line[d] == rows.at[after, d]]
        lo, hi = sorted((rows.at[before, axis], rows.at[after, axis]))
        assert not ((line[axis] > lo) & (line[axis] < hi)).any(), cliff.message
