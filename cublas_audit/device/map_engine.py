"""The map's engine: many problems queued per synchronisation, on operands made once.

A map problem's 5 calls take tens of microseconds of GPU time where it is small; made one at a
time (fresh operands, a synchronised check, a synchronisation after every call) the host's ~9 ms
a problem was the map's speed. Here:

- Operands come from a pool (OperandPool): per mode, one random A, B and bias and one C, sized to
  the largest pooled problem of the plan and filled once; a problem's operands are views of
  their first elements, laid out as device.operands describes.
- A chunk of problems is queued without waiting: for each, C is poisoned (a memset), then its
  calls run, each between a marker kernel and CUDA events (kernel_trace's markers split CUPTI's
  records into calls, as for one problem), then the quick float64 check of the last call's
  output (device.quick_check) adds its sums into the chunk's slots. The first call warms up and
  is timed too: a median of 5 ignores it, and the check reads the output all 5 calls wrote
  alike (beta = 0).
- One synchronisation a chunk. When chunk i's GPU work is done its CUPTI records are taken at
  once (a forced flush: it must find no kernel running, or it hands over their records
  unfinished), then chunk i + 1 is queued, and the host reads chunk i's events, records and
  sums while the GPU runs chunk i + 1 (chunks are dealt to like work, their largest problem
  first: planning.chunks). Chunks alternate between two marker kernels, so a late
  record of one chunk is never taken for the next one's.

A problem with beta != 0 (its calls accumulate into C) or operands beyond POOLED_BYTES
(planning.chunks) runs on its own through the caller's `single` path, as before. `careful` runs
the first problems one chunk each, synchronised: after a crash the problem in flight is then
known exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cublas_audit.device import clocks, kernel_trace, operands, quick_check
from cublas_audit.device.operands import Operands
from cublas_audit.device.timing import Timing
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import chunk_groups, pooled
from cublas_audit.planning.modes import mode as mode_of

CHECK_KERNELS = ("cublas_audit_check_partial", "cublas_audit_check_final")

Launch = Callable[[], None]
Finished = Callable[[Case, dict[str, Any]], None]
# (launch, closers) for a case on its operands: the closers run once its calls have finished
Prepare = Callable[[Case, Operands], tuple[Launch, list[Callable[[], None]]]]


class OperandPool:
    """One mode's operands at a time, sized to the largest pooled case of that mode."""

    def __init__(self, cases: Sequence[Case]) -> None:
        self.sizes: dict[str, dict[str, int]] = {}
        for case in cases:
            if pooled(case):
                wanted = self.sizes.setdefault(case.mode, {})
                for name in "abc":
                    elements = case.operand(name).elements
                    wanted[name] = max(wanted.get(name, 0), elements)
                wanted["bias"] = max(wanted.get("bias", 0), case.m if case.bias else 0)
        self.mode: str | None = None
        self.buffers: dict[str, Any] = {}

    def operands(self, case: Case) -> Operands:
        """Views of the pool in the case's layout (C is not poisoned here)."""
        if case.mode != self.mode:
            self._fill(case.mode)
        views = {name: self._view(name, case.operand(name)) for name in "abc"}
        ops = Operands(case, views["a"], views["b"], views["c"])
        if case.bias:
            ops.bias = self.buffers["bias"][: case.m]
        return ops

    def _view(self, name: str, layout: Any) -> Any:
        return self.buffers[name][: layout.elements].reshape(layout.stored, layout.cols, layout.ld)

    def _fill(self, mode: str) -> None:
        import cupy

        self.buffers = {}  # the last mode's arrays go before the new ones are made
        self.mode = None  # until they are all made: out of memory leaves no half pool
        sizes = self.sizes[mode]
        rng = cupy.random.default_rng(0)
        storage = mode_of(mode).storage
        for name in ("a", "b", "bias"):
            count = max(sizes[name], 1)
            values = rng.standard_normal((count,), dtype=cupy.float32)
            self.buffers[name] = operands.stored(values, mode)
        self.buffers["c"] = cupy.empty((max(sizes["c"], 1),), dtype=storage)
        self.mode = mode


@dataclass
class _Queued:
    case: Case
    slot: int = -1  # the case's place among the chunk's check sums; -1: not queued
    first_call: int = 0  # where its calls start among the chunk's traced calls
    events: list[tuple[Any, Any]] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)
    result: dict[str, Any] | None = None  # set at once where the case could not be queued


@dataclass
class _Chunk:
    marker: str
    queued: list[_Queued]
    marked: int = 0  # marker kernels queued: the calls CUPTI must show
    sums: Any = None
    indices: Any = None
    end: Any = None
    # pinned host copies: a pageable copy would wait for everything queued, the next chunk too
    host_sums: Any = None
    host_indices: Any = None


@dataclass
class _Settled:
    """A chunk whose GPU work is done and whose traced calls are taken (or why none are)."""

    chunk: _Chunk
    calls: list[tuple[kernel_trace.KernelLaunch, ...]] | str


class MapEngine:
    """Runs the map's cases in chunks (planning.chunks); `started(case)` as each is queued,
    `finished(case, result)` in that order once it is measured."""

    def __init__(
        self,
        cases: Sequence[Case],
        reps: int,
        prepare: Prepare,
        failed: Callable[[BaseException], dict[str, Any]],
        single: Callable[[Case], dict[str, Any]],
        untraced: str = "",
    ) -> None:
        self.reps = reps
        self.prepare = prepare
        self.failed = failed
        self.single = single
        self.untraced = untraced  # why CUPTI cannot trace here ('' where it can)
        self.pool = OperandPool(cases)
        self.scratch = quick_check.Scratch()
        self.leftover: list[kernel_trace.KernelLaunch] = []
        self.chunks = 0
        self.tracing = False
        self.last = time.perf_counter()
        # where the engine's wall time went: queueing (host), waiting for the GPU, reading back
        # and recording, and the cases run alone (benchmarks/map_speed.py reports the shares)
        self.seconds = {"queue": 0.0, "wait": 0.0, "flush": 0.0, "read": 0.0, "alone": 0.0}

    def run(
        self,
        cases: Sequence[Case],
        started: Callable[[Case], None],
        finished: Finished,
        careful: int = 0,
    ) -> None:
        settled: _Settled | None = None
        for group, alone in chunk_groups(cases, careful):
            if not pooled(group[0]):
                self._read(settled, finished)
                settled = None
                self._stop_tracing()  # the single path records its own calls
                began = time.perf_counter()
                started(group[0])
                finished(group[0], self.single(group[0]))
                self.last = time.perf_counter()
                self.seconds["alone"] += self.last - began
                continue
            began = time.perf_counter()
            chunk = self._queue(group, started)
            self.seconds["queue"] += time.perf_counter() - began
            # chunk i - 1's results, while the GPU runs what chunk i left queued: its smallest
            # problems, behind the CUDA launch queue's limit (the host's queueing blocks there)
            self._read(settled, finished)
            settled = self._settle(chunk)
            if alone:  # careful: one case in flight at a time
                self._read(settled, finished)
                settled = None
        self._read(settled, finished)
        self._stop_tracing()

    # ----- queueing ------------------------------------------------------------------------
    def _queue(self, group: Sequence[Case], started: Callable[[Case], None]) -> _Chunk:
        import cupy

        marker = kernel_trace.MARKERS[self.chunks % 2]
        self.chunks += 1
        chunk = _Chunk(marker, [_Queued(case) for case in group])
        picks = [quick_check.picked(case.batch, case.n) for case in group]
        offsets: list[int] = []
        values: list[int] = []
        for pick in picks:
            offsets.append(len(values))
            values.extend(pick.index_values())
        chunk.host_indices = _pinned(values, "int32")
        chunk.indices = cupy.empty(len(values), dtype=cupy.int32)
        chunk.indices.set(chunk.host_indices, stream=cupy.cuda.get_current_stream())
        chunk.sums = cupy.zeros(4 * len(group), dtype=cupy.float64)
        if not self.untraced:
            self._start_tracing()
        for slot, (item, pick, offset) in enumerate(zip(chunk.queued, picks, offsets, strict=True)):
            started(item.case)
            try:
                self._queue_case(item, slot, pick, chunk, offset)
            except Exception as exc:  # a case that cannot be made is recorded; the map goes on
                item.result = self.failed(exc)
        chunk.host_sums = _pinned([0.0] * chunk.sums.size, "float64")
        chunk.sums.get(stream=cupy.cuda.get_current_stream(), out=chunk.host_sums, blocking=False)
        chunk.end = cupy.cuda.Event()
        chunk.end.record()
        return chunk

    def _queue_case(
        self, item: _Queued, slot: int, pick: quick_check.Picked, chunk: _Chunk, offset: int
    ) -> None:
        import cupy

        ops = self.pool.operands(item.case)
        launch, item.closers = self.prepare(item.case, ops)
        stream = cupy.cuda.get_current_stream()
        operands.poison(ops.c, ops.mode)
        mark = kernel_trace.marker(chunk.marker) if not self.untraced else None
        item.first_call = chunk.marked
        for _ in range(self.reps):
            if mark is not None:
                mark()
                chunk.marked += 1
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            launch()
            stop.record(stream)
            item.events.append((start, stop))
        width = len(pick.index_values())
        sums = chunk.sums[4 * slot : 4 * slot + 2 * len(pick.entries)]
        indices = chunk.indices[offset : offset + width]
        quick_check.enqueue(ops, ops.c, pick, indices, sums, self.scratch)
        item.slot = slot

    # ----- reading back --------------------------------------------------------------------
    def _settle(self, chunk: _Chunk) -> _Settled:
        """Waits for the chunk's GPU work, then takes its CUPTI records: with nothing else in
        flight, as the forced flush needs (it hands over the records of kernels still running
        unfinished: the first engine, flushing while the next chunk ran, lost their calls)."""
        began = time.perf_counter()
        chunk.end.synchronize()
        waited = time.perf_counter()
        calls = self._calls(chunk)
        self.seconds["wait"] += waited - began
        self.seconds["flush"] += time.perf_counter() - waited
        return _Settled(chunk, calls)

    def _read(self, settled: _Settled | None, finished: Finished) -> None:
        """A settled chunk's results, in queue order (host work: the GPU runs the next chunk)."""
        if settled is None:
            return
        began = time.perf_counter()
        chunk = settled.chunk
        sums = chunk.host_sums.tolist()  # copied before the chunk's end event
        state = clocks.state()  # once a chunk: the clocks move slower than a chunk lasts
        share = round((began - self.last) / len(chunk.queued), 6)
        self.last = began
        for item in chunk.queued:
            result = item.result
            if result is None:
                result = self._measured(item, sums, settled.calls, state)
            for close in item.closers:
                close()
            finished(item.case, {**result, "case_s": share})
        self.seconds["read"] += time.perf_counter() - began

    def _calls(self, chunk: _Chunk) -> list[tuple[kernel_trace.KernelLaunch, ...]] | str:
        """The chunk's traced calls in queue order, or why there are none."""
        if self.untraced:
            return f"unavailable: {self.untraced}"
        records = self.leftover + kernel_trace.tracer().flushed()
        calls, self.leftover = kernel_trace.split_chunk(records, chunk.marker, CHECK_KERNELS)
        if len(calls) != chunk.marked:
            return f"unavailable: CUPTI saw {len(calls)} of {chunk.marked} marked calls"
        return calls

    def _measured(
        self,
        item: _Queued,
        sums: list[float],
        calls: list[tuple[kernel_trace.KernelLaunch, ...]] | str,
        state: dict[str, float | int],
    ) -> dict[str, Any]:
        import cupy

        slots = 2 * len(quick_check.picked(item.case.batch, item.case.n).entries)
        error = quick_check.error_from_sums(sums[4 * item.slot : 4 * item.slot + slots])
        if not error <= operands.tolerance(item.case.mode):
            return map_result(item.case.mode, error)
        samples = tuple(float(cupy.cuda.get_elapsed_time(a, b)) for a, b in item.events)
        if isinstance(calls, str):
            traced: kernel_trace.TracedCalls | str = calls
        else:
            mine = calls[item.first_call : item.first_call + len(item.events)]
            traced = kernel_trace.TracedCalls(tuple(mine))
        return map_result(item.case.mode, error, Timing(samples), traced, state)

    # ----- CUPTI -----------------------------------------------------------------------------
    def _start_tracing(self) -> None:
        if not self.tracing:
            kernel_trace.tracer().enable()
            self.leftover = []
            self.tracing = True

    def _stop_tracing(self) -> None:
        if self.tracing:
            kernel_trace.tracer().disable()
            self.tracing = False


def map_result(
    mode: str,
    error: float,
    timing: Timing | None = None,
    traced: kernel_trace.TracedCalls | str = "",
    state: dict[str, float | int] | None = None,
) -> dict[str, Any]:
    """A map case's record: its quick check, and where the result is right its timed calls and
    their kernels (`traced`), or why none were traced."""
    result: dict[str, Any] = {"max_rel_err": error, "check": "quick"}
    tolerance = operands.tolerance(mode)
    if not error <= tolerance or timing is None:
        detail = f"relative error {error:.3g} > {tolerance:g} (quick check)"
        return {**result, "status": "wrong", "detail": detail}
    if isinstance(traced, str):
        result["kernel_time_status"] = traced
    else:
        result.update(traced.columns("kernel_time"), **traced.launch_columns())
        result["kernel_time_status"] = "ok"
    result.update(status="ok", **timing.summary("time"), **(state or {}))
    result["time_samples_ms"] = list(timing.samples_ms)
    return result


def measure_alone(ops: Operands, launch: Launch, reps: int, untraced: str) -> dict[str, Any]:
    """A case on its own (beta != 0, or beyond the pool): the quick check first (also the
    warm-up: a wrong result is not timed), then `reps` calls timed and traced together, events
    alone where CUPTI cannot trace (`untraced` says why)."""
    import cupy

    from cublas_audit.device.timing import one_call_ms

    error = operands.checked(launch, ops, quick=True)
    if not error <= operands.tolerance(ops.mode):
        return map_result(ops.mode, error)
    if untraced:
        stream = cupy.cuda.get_current_stream()
        timing = Timing(tuple(one_call_ms(launch, stream) for _ in range(reps)))
        return map_result(ops.mode, error, timing, f"unavailable: {untraced}", clocks.state())
    timing, traced = kernel_trace.time_and_trace(launch, reps)
    return map_result(ops.mode, error, timing, traced, clocks.state())


def _pinned(values: Sequence[float], dtype: str) -> Any:
    """`values` in page-locked host memory (asynchronous copies to and from the GPU)."""
    import cupyx
    import numpy

    array = cupyx.empty_pinned((len(values),), dtype=dtype)
    array[...] = numpy.asarray(values, dtype=dtype)
    return array
