"""The GPU's state around a measurement, through NVML (nvidia-ml-py): SM clock, board power and
the clock event reasons (power cap, thermal slowdown, ...) NVML reports as a bitmask.

A timing verdict between two runs is only as good as the clocks behind it: the diff shows these
beside a verdict when the two sides differ. NVML missing or failing gives an empty state, never an
error: the measurement itself does not depend on it.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def _device() -> Any:
    """The NVML handle of the current CUDA device (matched by PCI bus id), or None."""
    try:
        import cupy
        import pynvml

        pynvml.nvmlInit()
        bus = cupy.cuda.Device().pci_bus_id
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
    except Exception:
        return None


def state() -> dict[str, float | int]:
    """{'sm_clock_mhz', 'power_w', 'clock_reasons'} now; {} where NVML cannot say."""
    handle = _device()
    if handle is None:
        return {}
    import pynvml

    found: dict[str, float | int] = {}
    try:
        found["sm_clock_mhz"] = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        found["power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        found["clock_reasons"] = int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except Exception:
        pass  # an older driver lacks a query: keep what was read
    return found
