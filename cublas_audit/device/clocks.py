"""The GPU's state around a measurement, through NVML (nvidia-ml-py): SM clock, board power and
the clock event reasons (power cap, thermal slowdown, ...) NVML reports as a bitmask.

A timing verdict between two runs is only as good as the clocks behind it: the diff shows these
beside a verdict when the two sides differ. NVML missing or failing gives an empty state, never an
error: the measurement itself does not depend on it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
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


# NVML's clock event reasons that hold the SM clock below its unloaded speed: the software power
# cap, a hardware slowdown, software and hardware thermal slowdown, the hardware power brake.
SLOWDOWN_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
COOL_STEP_S = 0.002
COOL_MAX_S = 0.5


def slowed_down() -> bool:
    """Whether NVML says the clock is held down by power or heat now (False where it cannot say)."""
    return bool(int(state().get("clock_reasons", 0)) & SLOWDOWN_REASONS)


def cool_down(sleep: Callable[[float], None] = time.sleep) -> float:
    """Idles (the caller has synchronised) until the power cap and thermal slowdowns let go, at
    most COOL_MAX_S; the seconds waited.

    Why: back-to-back rounds of heavy GEMMs hold an H100 at its power cap. The candidate audit of
    the ViT-B/16 MLP GEMM (fp16 3072x12608x768) ran its rounds at 1485-1830 MHz (reason 0x4) and
    timed cuBLAS's default at 0.103 ms, where PyTorch's own call and the same launch alone took
    0.089 ms; and a cap slows the kernels that draw the most power the most, so it also reorders
    them. Every round of a timing starts with the clocks free, as a model's call finds them."""
    waited = 0.0
    while waited < COOL_MAX_S and slowed_down():
        sleep(COOL_STEP_S)
        waited += COOL_STEP_S
    return waited
