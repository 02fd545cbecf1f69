"""The map's engine: many problems queued per synchronisation, on operands made once.

A map problem's 5 calls take tens of microseconds of GPU time where it is small; made one at a
time (fresh operands, a synchronised check, a synchronisation after every call) the host's ~9 ms
a problem was the map's speed. Here:

- Operands come from a pool (OperandPool): per mode, one random A, B and bias and one C, sized to
  the largest pooled problem of the plan and filled once; a problem's operands are views of
  their first elements, laid out as device.operands describes (the views are made once per
  layout).
- A chunk of problems is queued without waiting: one marker kernel naming the chunk
  (device.map_records), then for each problem C is poisoned (a memset), its calls run back to
  back between CUDA events (reps + 1 events: each call's stop is the next one's start; the
  events are made once and reused), then the quick float64 check of the last call's output
  (device.quick_check) adds its sums into the chunk's slots; its kernels close the problem's
  records. The first call warms up and is timed too: a median of 5 ignores it, and the check
  reads the output all 5 calls wrote alike (beta = 0).
- No synchronisation between chunks: CUPTI's records arrive through its non-forced flush while
  the GPU runs later chunks, and a chunk is read (events, records, sums) once its end event has
  passed and the next chunk's marker is among the records. Only at the end, before a problem run
  alone, or where a chunk's records lag MAX_PENDING chunks behind, does the engine wait for the
  GPU and force the flush (which must find no kernel running, or it hands over their records
  unfinished). Chunks are dealt to like work, their largest problem first: planning.chunks.
- cuBLAS's choice of kernel for a fresh shape (most of its first call's host time) is made a
  few chunks ahead by C worker threads (device.heuristic_warm: `warm_threads`), so that each
  problem's first call finds it cached; the choice is cuBLAS's own either way.

A problem with beta != 0 (its calls accumulate into C) or operands beyond POOLED_BYTES
(planning.chunks) runs on its own through the caller's `single` path, as before. `careful` runs
the first problems one chunk each, synchronised: after a crash the problem in flight is then
known exactly.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cublas_audit.device import clocks, kernel_trace, map_records, operands, quick_check
from cublas_audit.device.heuristic_warm import Ahead, Warmer
from cublas_audit.device.operand_pool import OperandPool
from cublas_audit.device.operands import Operands
from cublas_audit.device.timing import Timing
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import chunk_groups, pooled

CHECK_KERNELS = map_records.CHECK_KERNELS
# chunks queued ahead of the oldest one not yet read, beyond which the engine waits and reads all
MAX_PENDING = 8

Launch = Callable[[], None]
Finished = Callable[[Case, dict[str, Any]], None]
# (launch, closers) for a case on its operands: the closers run once its calls have finished
Prepare = Callable[[Case, Operands], tuple[Launch, list[Callable[[], None]]]]


@dataclass
class _Queued:
    case: Case
    slot: int = -1  # the case's place among the chunk's check sums; -1: not queued
    events: list[int] = field(default_factory=list)  # reps + 1 CUDA event handles
    closers: list[Callable[[], None]] = field(default_factory=list)
    result: dict[str, Any] | None = None  # set at once where the case could not be queued


@dataclass
class _Chunk:
    sequence: int
    queued: list[_Queued]
    events: list[Any]  # the chunk's CUDA events (cupy Events), given back once it is read
    sums: Any = None
    indices: Any = None
    end: Any = None
    # pinned host copies: a pageable copy would wait for everything queued, the next chunk too
    host_sums: Any = None
    host_indices: Any = None


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
        warm_threads: int = 0,
    ) -> None:
        self.reps = reps
        self.prepare = prepare
        self.failed = failed
        self.single = single
        self.untraced = untraced  # why CUPTI cannot trace here ('' where it can)
        self.pool = OperandPool(cases)
        self.scratch = quick_check.Scratch()
        self.records: list[kernel_trace.KernelLaunch] = []  # delivered, not yet read
        self.pending: collections.deque[_Chunk] = collections.deque()
        self.spare_events: list[list[Any]] = []
        self.chunks = 0
        self.tracing = False
        self.last = time.perf_counter()
        # where the engine's wall time went: queueing (host), waiting for the GPU, reading back
        # and recording, and the cases run alone (benchmarks/map_speed.py reports the shares)
        self.seconds = {"queue": 0.0, "wait": 0.0, "flush": 0.0, "read": 0.0, "alone": 0.0}
        # cuBLAS's kernel choice made ahead on other cores (device.heuristic_warm), and how it went
        self.warm_threads = warm_threads
        self.ahead: Ahead | None = None
        self.warm: dict[str, Any] = {}

    def run(
        self,
        cases: Sequence[Case],
        started: Callable[[Case], None],
        finished: Finished,
        careful: int = 0,
    ) -> None:
        groups = chunk_groups(cases, careful)
        warmer = Warmer(self.warm_threads)
        chunks = [group for group, alone in groups if not alone and pooled(group[0])]
        self.ahead = Ahead(warmer, chunks, MAX_PENDING)
        try:
            self._run(groups, started, finished)
        finally:
            self.warm = {"threads": warmer.threads, "reason": warmer.reason, **warmer.counts()}
            warmer.stop()  # its threads joined before the map's own handles go

    def _run(
        self,
        groups: Sequence[tuple[list[Case], bool]],
        started: Callable[[Case], None],
        finished: Finished,
    ) -> None:
        for group, alone in groups:
            if not pooled(group[0]):
                self._drain(finished)
                self._stop_tracing()  # the single path records its own calls
                began = time.perf_counter()
                started(group[0])
                finished(group[0], self.single(group[0]))
                self.last = time.perf_counter()
                self.seconds["alone"] += self.last - began
                continue
            began = time.perf_counter()
            self.pending.append(self._queue(group, started))
            self.seconds["queue"] += time.perf_counter() - began
            if alone:  # careful: one case in flight at a time
                self._drain(finished)
            else:  # earlier chunks' results, while the GPU runs what is queued
                self._read_ready(finished)
        self._drain(finished)
        self._stop_tracing()

    # ----- queueing ------------------------------------------------------------------------
    def _queue(self, group: Sequence[Case], started: Callable[[Case], None]) -> _Chunk:
        import cupy

        stream = cupy.cuda.get_current_stream()
        chunk = _Chunk(self.chunks, [_Queued(case) for case in group], self._events(len(group)))
        self.chunks += 1
        picks = [quick_check.picked(case.batch, case.n) for case in group]
        offsets: list[int] = []
        values: list[int] = []
        for pick in picks:
            offsets.append(len(values))
            values.extend(pick.index_values())
        chunk.host_indices = _pinned(values, "int32")
        chunk.indices = cupy.empty(len(values), dtype=cupy.int32)
        chunk.indices.set(chunk.host_indices, stream=stream)
        chunk.sums = cupy.zeros(4 * len(group), dtype=cupy.float64)
        # the pool's filling kernels before the chunk's marker, no case's records (out of
        # memory: each case meets it again and is recorded)
        with contextlib.suppress(Exception):
            self.pool.load(group[0].mode)
        if self.ahead is not None:
            self.ahead.queuing(group, self.pool.addresses())
        if not self.untraced:
            self._start_tracing()
            map_records.open_chunk(chunk.sequence)
        per_case = self.reps + 1
        for slot, (item, pick, offset) in enumerate(zip(chunk.queued, picks, offsets, strict=True)):
            started(item.case)
            item.events = chunk.events[slot * per_case : (slot + 1) * per_case]
            try:
                self._queue_case(item, slot, pick, chunk, offset, stream.ptr)
            except Exception as exc:  # a case that cannot be made is recorded; the map goes on
                item.result = self.failed(exc)
                if not self.untraced:
                    map_records.close_case()  # its records (if any) end here
        chunk.host_sums = _pinned([0.0] * chunk.sums.size, "float64")
        chunk.sums.get(stream=stream, out=chunk.host_sums, blocking=False)
        chunk.end = cupy.cuda.Event()
        chunk.end.record(stream)
        return chunk

    def _queue_case(
        self,
        item: _Queued,
        slot: int,
        pick: quick_check.Picked,
        chunk: _Chunk,
        offset: int,
        stream: int,
    ) -> None:
        import cupy

        ops = self.pool.operands(item.case)
        launch, item.closers = self.prepare(item.case, ops)
        operands.poison(ops.c, ops.mode)
        record = cupy.cuda.runtime.eventRecord
        events = item.events
        record(events[0], stream)
        for rep in range(self.reps):
            launch()
            record(events[rep + 1], stream)
        indices = chunk.indices.data.ptr + 4 * offset  # int32 each
        sums = chunk.sums.data.ptr + 8 * 4 * slot  # 4 float64 slots a case
        quick_check.enqueue_at(ops, ops.c, pick, indices, sums, self.scratch)
        item.slot = slot

    def _events(self, cases: int) -> list[Any]:
        """Event handles for `cases` cases: reused from a chunk already read where one is spare
        (creating CUDA events costs host time every case)."""
        import cupy

        wanted = cases * (self.reps + 1)
        events = self.spare_events.pop() if self.spare_events else []
        while len(events) < wanted:
            events.append(cupy.cuda.runtime.eventCreate())
        return events

    # ----- reading back --------------------------------------------------------------------
    def _read_ready(self, finished: Finished) -> None:
        """Reads every chunk whose GPU work is done and whose records have all arrived; where
        the oldest lags MAX_PENDING chunks behind, waits for everything and reads them all."""
        if not self.pending:
            return
        began = time.perf_counter()
        if not self.untraced:
            self.records += kernel_trace.tracer().delivered()
        self.seconds["flush"] += time.perf_counter() - began
        while self.pending:
            chunk = self.pending[0]
            split = self._split(chunk, last=False)
            if split is None or not chunk.end.done:
                break
            self.pending.popleft()
            self._read(chunk, split, finished)
        if len(self.pending) > MAX_PENDING:
            self._drain(finished)

    def _drain(self, finished: Finished) -> None:
        """Every queued chunk read: waits for the GPU, then takes CUPTI's records with nothing
        in flight (a forced flush)."""
        if not self.pending:
            return
        began = time.perf_counter()
        self.pending[-1].end.synchronize()
        waited = time.perf_counter()
        if not self.untraced:
            self.records += kernel_trace.tracer().flushed()
        self.seconds["wait"] += waited - began
        self.seconds["flush"] += time.perf_counter() - waited
        while self.pending:
            chunk = self.pending.popleft()
            split = self._split(chunk, last=not self.pending)
            if split is None:
                split = f"unavailable: CUPTI delivered no record of chunk {chunk.sequence}"
            self._read(chunk, split, finished)

    def _split(self, chunk: _Chunk, last: bool) -> list[list[Any]] | str | None:
        """The chunk's records cut into its cases' (taken from self.records), why none can be,
        or None while they have not all arrived."""
        if self.untraced:
            return f"unavailable: {self.untraced}"
        found = map_records.chunk_records(self.records, chunk.sequence, last)
        if found is None:
            return None
        mine, self.records = found
        cases = map_records.case_records(mine)
        if len(cases) != len(chunk.queued):
            return f"unavailable: CUPTI saw {len(cases)} of {len(chunk.queued)} cases"
        return cases

    def _read(self, chunk: _Chunk, split: list[list[Any]] | str, finished: Finished) -> None:
        """A chunk's results, in queue order (host work: the GPU runs later chunks)."""
        began = time.perf_counter()
        sums = chunk.host_sums.tolist()  # copied before the chunk's end event
        state = clocks.state()  # once a chunk: the clocks move slower than a chunk lasts
        share = round((began - self.last) / len(chunk.queued), 6)
        self.last = began
        for index, item in enumerate(chunk.queued):
            result = item.result
            if result is None:
                kernels = split if isinstance(split, str) else split[index]
                result = self._measured(item, sums, kernels, state)
            for close in item.closers:
                close()
            finished(item.case, {**result, "case_s": share})
        self.spare_events.append(chunk.events)
        self.seconds["read"] += time.perf_counter() - began

    def _measured(
        self,
        item: _Queued,
        sums: list[float],
        kernels: list[Any] | str,
        state: dict[str, float | int],
    ) -> dict[str, Any]:
        import cupy

        slots = 2 * len(quick_check.picked(item.case.batch, item.case.n).entries)
        error = quick_check.error_from_sums(sums[4 * item.slot : 4 * item.slot + slots])
        if not error <= operands.tolerance(item.case.mode):
            return map_result(item.case.mode, error)
        elapsed = cupy.cuda.runtime.eventElapsedTime
        events = item.events
        samples = tuple(float(elapsed(events[i], events[i + 1])) for i in range(self.reps))
        calls = kernels if isinstance(kernels, str) else map_records.split_calls(kernels, self.reps)
        traced = calls if isinstance(calls, str) else kernel_trace.TracedCalls(calls)
        return map_result(item.case.mode, error, Timing(samples), traced, state)

    # ----- CUPTI -----------------------------------------------------------------------------
    def _start_tracing(self) -> None:
        if not self.tracing:
            tracer = kernel_trace.tracer()
            tracer.buffer_bytes = map_records.BUFFER_BYTES
            tracer.enable()
            self.records = []
            self.tracing = True

    def _stop_tracing(self) -> None:
        if self.tracing:
            tracer = kernel_trace.tracer()
            tracer.disable()
            tracer.buffer_bytes = kernel_trace.BUFFER_BYTES
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
