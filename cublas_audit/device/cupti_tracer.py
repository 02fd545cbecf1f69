"""CUPTI's activity records of kernels, through cupti-python: one tracer a process, its buffers
registered once (device.kernel_trace's recordings and the map's engine take its records; the map
hands its buffers to C while it traces: device.cupti_records).

CUPTI is imported inside the tracer: this module imports on machines without it, and a probe
without it records why (`available`) and times with events alone.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

BUFFER_BYTES = 8 * 1024 * 1024
# A device memset a call makes (cuBLASLt zeroes the output of some split-K and stream-K pins
# first): recorded with the call's kernels, its time the call's, no kernel of its own. PyTorch's
# profiler counts it; the tool's kernel time left it out and so over-stated those pins by 5-13 %
# against torch (reports/h100/fixes/20261127-105300-torch2.14.1).
MEMSET = "Memset"


class KernelLaunch(NamedTuple):
    """One kernel a call launched, as CUPTI recorded it (a named tuple: CUPTI's thread makes
    some two million of them a full map while holding the interpreter lock, and a frozen
    dataclass took ~5x as long to make)."""

    name: str
    start_ns: int
    end_ns: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def ctas(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def available() -> str | None:
    """None where CUPTI tracing can start in this process, else why not (one line)."""
    try:
        _tracer()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


class Tracer:
    """CUPTI's activity buffers for kernel records, registered once per process."""

    def __init__(self) -> None:
        from cupti import cupti

        self.cupti = cupti
        self.records: list[KernelLaunch] = []
        self.memsets = False
        self.buffer_bytes = BUFFER_BYTES  # the map engine asks for its own (map_records)
        # CUPTI may hand over a buffer from its own thread while this one takes the records
        self.lock = threading.Lock()
        # the records CUPTI hands to C instead, while the map traces (device.cupti_records)
        self.native: Callable[[], list[KernelLaunch]] | None = None
        self.register()

    def register(self) -> None:
        """This tracer's callbacks take CUPTI's buffers (again, after device.cupti_records)."""
        self.cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)

    def _buffer_requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        kernel = self.cupti.ActivityKind.CONCURRENT_KERNEL
        memset = self.cupti.ActivityKind.MEMSET
        parsed = [
            KernelLaunch(
                name=str(a.name),
                start_ns=int(a.start),
                end_ns=int(a.end),
                grid=(int(a.grid_x), int(a.grid_y), int(a.grid_z)),
                block=(int(a.block_x), int(a.block_y), int(a.block_z)),
                registers=int(a.registers_per_thread),
            )
            if a.kind == kernel
            else KernelLaunch(MEMSET, int(a.start), int(a.end), (0, 0, 0), (0, 0, 0), 0)
            for a in activities
            if a.kind in (kernel, memset)
        ]
        with self.lock:
            self.records.extend(parsed)

    def recording(self) -> Recording:
        return Recording(self)

    def take(self) -> list[KernelLaunch]:
        with self.lock:
            taken, self.records = self.records, []
        return taken if self.native is None else taken + self.native()

    def enable(self, *, memsets: bool = False) -> None:
        """Drops what was recorded before and records kernels from now on, and device memsets
        with `memsets` (a judging timing; never the map's engine, whose checks poison outputs
        with memsets between its calls)."""
        self.take()
        self.cupti.activity_enable(self.cupti.ActivityKind.CONCURRENT_KERNEL)
        self.memsets = memsets
        if memsets:
            self.cupti.activity_enable(self.cupti.ActivityKind.MEMSET)

    def flushed(self) -> list[KernelLaunch]:
        """The records of every kernel finished so far (forced flush), taken."""
        self.cupti.activity_flush_all(1)
        return self.take()

    def delivered(self) -> list[KernelLaunch]:
        """The records of the buffers CUPTI holds complete (a non-forced flush: kernels may be
        running), taken: never a record whose kernel has not finished."""
        self.cupti.activity_flush_all(0)
        return self.take()

    def arrived(self) -> list[KernelLaunch]:
        """The records handed over so far, taken: where CUPTI's buffers go to C, its worker
        thread hands each one over once full and complete, and no flush is asked for (each cost
        the map's thread ~5 ms on the H100); otherwise those of a non-forced flush."""
        return self.take() if self.native is not None else self.delivered()

    def disable(self) -> None:
        self.cupti.activity_flush_all(1)  # every record of the calls made, before disabling
        self.cupti.activity_disable(self.cupti.ActivityKind.CONCURRENT_KERNEL)
        if self.memsets:
            self.cupti.activity_disable(self.cupti.ActivityKind.MEMSET)
            self.memsets = False


class Recording:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def __enter__(self) -> None:
        self.tracer.enable(memsets=True)  # a judging recording: a call's memsets are its time

    def __exit__(self, *exc: object) -> None:
        self.tracer.disable()


@functools.lru_cache(maxsize=1)
def _tracer() -> Tracer:
    return Tracer()


def tracer() -> Tracer:
    """This process's CUPTI kernel recorder (registered on first use)."""
    return _tracer()
