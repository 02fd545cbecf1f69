"""Kernel-only times and launch geometry of each call, through the CUPTI activity API.

A call's event time holds the host's share (launch, cuBLAS's heuristic, the loop of launches) and
moves by 15-25 % between runs at 20 us; the durations of the kernels it dispatched move by about
1 % (measured on the H100 and H200). "Did the dispatch get worse" is judged on these, "did the
call get slower" on the event time (cublas_audit.judge.verdicts).

CUPTI's activity tracing needs no counter permission (it works where ncu gets ERR_NVGPUCTRPERM)
and no profiler process: the records come from cupti-python (with the nvidia-cuda-cupti wheel's
libcupti). A one-thread marker kernel is launched on the stream before each call, so the kernels
between two markers, in GPU order, are one call's: no reliance on how many kernels a call
launches (split-K adds a reduction kernel, a loop launches `batch`) nor on aligning host and GPU
clocks (CUPTI's host timestamps and kernel timestamps can differ by microseconds, more than a
4 us call lasts: bracketing calls by host time lost them).

CUPTI is imported inside the functions: this module imports on machines without it, and a probe
without it records why and times with events alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cublas_audit.device.timing import Timing

BUFFER_BYTES = 8 * 1024 * 1024
# Traced calls per contender: at least this many, else about as many as the event timing made.
MIN_REPS = 10


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel a call launched, as CUPTI recorded it."""

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


@dataclass(frozen=True)
class TracedCalls:
    """The kernels of each traced call of one contender, in call order."""

    calls: tuple[tuple[KernelLaunch, ...], ...]

    def timing(self) -> Timing:
        """Kernel-only time per call: the sum of its kernels' durations (gaps between them are
        the host's share, which the event time already measures)."""
        return Timing(tuple(sum(k.duration_ms for k in call) for call in self.calls if call))

    def columns(self, prefix: str) -> dict[str, Any]:
        """The table's columns for this contender: `<prefix>_ms` and its distribution, and (for
        the call itself) the kernels it ran and the geometry of its longest one."""
        found: dict[str, Any] = {}
        if any(self.calls):
            found.update(self.timing().summary(prefix))
        return found

    @property
    def first_call(self) -> tuple[KernelLaunch, ...]:
        """The kernels of the first call that launched any (every call of one launcher runs the
        same ones)."""
        return next((call for call in self.calls if call), ())

    @property
    def kernel_names(self) -> str:
        """The distinct kernels of one call, in launch order, ' + '-joined ('' where none)."""
        return " + ".join(dict.fromkeys(k.name for k in self.first_call))

    def launch_columns(self) -> dict[str, Any]:
        first = self.first_call
        if not first:
            return {}
        longest = max(first, key=lambda k: k.end_ns - k.start_ns)
        return {
            "traced_kernels": self.kernel_names,
            "traced_launches": len(first),
            "traced_ctas": longest.ctas,
            "traced_block": "x".join(str(v) for v in longest.block),
            "traced_registers": longest.registers,
        }


def available() -> str | None:
    """None where CUPTI tracing can start in this process, else why not (one line)."""
    try:
        _tracer()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


MARKER = "cublas_audit_call_marker"
MARKERS = (MARKER, "cublas_audit_call_marker_b")  # the map engine's chunks alternate them


def trace_calls(contenders: Mapping[str, Callable[[], None]], reps: int) -> dict[str, TracedCalls]:
    """Runs each contender `reps` times, round-robin like the event timing, a marker kernel before
    each call; returns their kernels per call."""
    import cupy

    tracer = _tracer()
    marker = _marker()
    order: list[str] = []
    with tracer.recording():
        for _ in range(reps):
            for name, launch in contenders.items():
                marker()
                launch()
                order.append(name)
        cupy.cuda.get_current_stream().synchronize()
    calls = split_at_markers(tracer.take())
    if len(calls) != len(order):
        raise RuntimeError(f"CUPTI saw {len(calls)} of {len(order)} marked calls")
    grouped: dict[str, list[tuple[KernelLaunch, ...]]] = {name: [] for name in contenders}
    for name, kernels in zip(order, calls, strict=True):
        grouped[name].append(kernels)
    return {name: TracedCalls(tuple(found)) for name, found in grouped.items()}


def time_and_trace(launch: Callable[[], None], reps: int) -> tuple[Timing, TracedCalls]:
    """The map's observation: `reps` calls, each timed with CUDA events (as timing does) and its
    kernels traced at once, so that one pass gives both times. The marker runs before the start
    event, outside the timed call."""
    import cupy

    from cublas_audit.device.timing import one_call_ms

    tracer = _tracer()
    marker = _marker()
    stream = cupy.cuda.get_current_stream()
    samples = []
    with tracer.recording():
        for _ in range(reps):
            marker()
            samples.append(one_call_ms(launch, stream))
    calls = split_at_markers(tracer.take())
    if len(calls) != reps:
        raise RuntimeError(f"CUPTI saw {len(calls)} of {reps} marked calls")
    return Timing(tuple(samples)), TracedCalls(tuple(calls))


def split_at_markers(records: Sequence[KernelLaunch]) -> list[tuple[KernelLaunch, ...]]:
    """The kernels after each marker kernel up to the next, in GPU start order (one stream)."""
    calls: list[list[KernelLaunch]] = []
    for record in sorted(records, key=lambda k: k.start_ns):
        if record.name == MARKER:
            calls.append([])
        elif calls:  # a kernel before the first marker belongs to no traced call
            calls[-1].append(record)
    return [tuple(call) for call in calls]


def split_chunk(
    records: Sequence[KernelLaunch], opener: str, closers: Collection[str]
) -> tuple[list[tuple[KernelLaunch, ...]], list[KernelLaunch]]:
    """One queued chunk's calls out of the records CUPTI has delivered so far (device.map_engine):
    a call opens at an `opener` marker and ends at the next marker or `closers` kernel (the
    chunk's check kernels). Chunks alternate between two marker kernels, so a marker of the other
    name seen after this chunk's calls began is the next chunk, queued already: it and every
    record after it are returned as the leftover for the next split. Markers of the other name
    before this chunk's are a late record of the previous chunk, and dropped."""
    ordered = sorted(records, key=lambda k: k.start_ns)
    calls: list[list[KernelLaunch]] = []
    open_call: list[KernelLaunch] | None = None
    for index, record in enumerate(ordered):
        if record.name == opener:
            open_call = []
            calls.append(open_call)
        elif record.name in MARKERS:
            if calls:
                return [tuple(c) for c in calls], list(ordered[index:])
            open_call = None
        elif record.name in closers:
            open_call = None
        elif open_call is not None:
            open_call.append(record)
    return [tuple(c) for c in calls], []


@functools.lru_cache(maxsize=2)
def marker(name: str = MARKER) -> Callable[[], None]:
    """A launcher of the empty one-thread kernel `name` (one of MARKERS) on the current stream."""
    import cupy

    kernel = cupy.RawKernel(f'extern "C" __global__ void {name}() {{}}', name)
    return lambda: kernel((1,), (1,), ())


def _marker() -> Callable[[], None]:
    return marker(MARKER)


class _Tracer:
    """CUPTI's activity buffers for kernel records, registered once per process."""

    def __init__(self) -> None:
        from cupti import cupti

        self.cupti = cupti
        self.records: list[KernelLaunch] = []
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)

    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        kernel = self.cupti.ActivityKind.CONCURRENT_KERNEL
        self.records.extend(
            KernelLaunch(
                name=str(a.name),
                start_ns=int(a.start),
                end_ns=int(a.end),
                grid=(int(a.grid_x), int(a.grid_y), int(a.grid_z)),
                block=(int(a.block_x), int(a.block_y), int(a.block_z)),
                registers=int(a.registers_per_thread),
            )
            for a in activities
            if a.kind == kernel
        )

    def recording(self) -> _Recording:
        return _Recording(self)

    def take(self) -> list[KernelLaunch]:
        taken, self.records = self.records, []
        return taken

    def enable(self) -> None:
        """Drops what was recorded before and records kernels from now on."""
        self.take()
        self.cupti.activity_enable(self.cupti.ActivityKind.CONCURRENT_KERNEL)

    def flushed(self) -> list[KernelLaunch]:
        """The records of every kernel finished so far (forced flush), taken."""
        self.cupti.activity_flush_all(1)
        return self.take()

    def disable(self) -> None:
        self.cupti.activity_flush_all(1)  # every record of the calls made, before disabling
        self.cupti.activity_disable(self.cupti.ActivityKind.CONCURRENT_KERNEL)


class _Recording:
    def __init__(self, tracer: _Tracer) -> None:
        self.tracer = tracer

    def __enter__(self) -> None:
        self.tracer.enable()

    def __exit__(self, *exc: object) -> None:
        self.tracer.disable()


@functools.lru_cache(maxsize=1)
def _tracer() -> _Tracer:
    return _Tracer()


def tracer() -> _Tracer:
    """This process's CUPTI kernel recorder (registered on first use)."""
    return _tracer()
