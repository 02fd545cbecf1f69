"""device.cupti_records on the GPU: the rows the C side takes from CUPTI's buffers are the records
cupti-python gives for the same kernels (names, grids, blocks, registers, times in order), and
cupti-python's callbacks take CUPTI's buffers again afterwards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
NAMES = ("cupti_rows_first", "cupti_rows_second")


def launches() -> Callable[[], None]:
    import cupy

    source = 'extern "C" __global__ void {0}(float *x) {{ x[threadIdx.x] += 1.0f; }}'
    kernels = [cupy.RawKernel(source.format(name), name) for name in NAMES]
    x = cupy.zeros(1024, cupy.float32)

    def run() -> None:
        for i, kernel in enumerate(kernels):
            kernel((i + 1, 2, 1), (64 * (i + 1), 1, 1), (x,))

    return run


def traced(run: Callable[[], None]) -> list[Any]:
    import cupy

    from cublas_audit.device import cupti_tracer

    tracer = cupti_tracer.tracer()
    tracer.enable()
    run()
    cupy.cuda.Device().synchronize()
    found = tracer.flushed()
    tracer.disable()
    return [k for k in found if k.name in NAMES]


def test_the_rows_taken_in_c_are_cupti_pythons_records() -> None:
    from cublas_audit.device import cupti_records, cupti_tracer

    run = launches()
    through_python = traced(run)
    tracer = cupti_tracer.tracer()
    assert cupti_records.take_over(tracer) == ""
    try:
        in_c = traced(run)
    finally:
        cupti_records.hand_back(tracer)
    assert tracer.native is None
    again = traced(run)  # through cupti-python's callbacks again

    def fields(records: list[Any]) -> list[tuple[Any, ...]]:
        return [(k.name, k.grid, k.block, k.registers) for k in records]

    assert fields(in_c) == fields(through_python) == fields(again)
    assert [k.grid for k in in_c] == [(1, 2, 1), (2, 2, 1)]
    assert [k.block for k in in_c] == [(64, 1, 1), (128, 1, 1)]
    first, second = in_c
    assert 0 < first.start_ns < first.end_ns <= second.start_ns < second.end_ns
