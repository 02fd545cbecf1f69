"""The GPU's DRAM bandwidth, measured once per run: the roofline's memory slope (judge.roofline).

A device-to-device copy of `MIB` MiB, read once and written once (2 x its bytes moved), timed with
CUDA events after a warm-up; the median of `REPEATS` copies. 512 MiB is ten times an H100's 50 MB
L2, so the copy streams from and to DRAM. What a copy reaches is what a memory-bound GEMM can
reach: a fairer slope than the data sheet's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

MIB = 512
REPEATS = 10


def measure_dram(device: int = 0) -> dict[str, Any]:
    """env.json's `roofline` record: the bandwidth, how it was measured, and how long it took."""
    import cupy

    started = time.perf_counter()
    # nvidia-smi's index, as CUDA numbers the devices this process sees (a probe environment that
    # pins CUDA_VISIBLE_DEVICES leaves this process's numbering alone; two shards of one GPU)
    if device >= cupy.cuda.runtime.getDeviceCount():
        device = 0
    with cupy.cuda.Device(device):
        source = cupy.ones(MIB * 2**20 // 4, dtype=cupy.float32)
        target = cupy.empty_like(source)
        cupy.copyto(target, source)  # warm-up: the allocation and the copy's first launch
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        times_ms = []
        for _ in range(REPEATS):
            start.record()
            cupy.copyto(target, source)
            stop.record()
            stop.synchronize()
            times_ms.append(cupy.cuda.get_elapsed_time(start, stop))
        moved = 2 * source.nbytes
        del source, target
        cupy.get_default_memory_pool().free_all_blocks()
    median_ms = statistics.median(times_ms)
    return {
        "dram_gbps": round(moved / (median_ms / 1e3) / 1e9, 1),
        "dram_source": f"measured: a device-to-device copy of {MIB} MiB, median of {REPEATS}",
        "measure_seconds": round(time.perf_counter() - started, 3),
    }
