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
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from cublas_audit.device import clocks, kernel_trace, map_records, operands, quick_check
from cublas_audit.device.heuristic_warm import Ahead, Warmer
from cublas_audit.device.map_chunk import Chunk, Queued, made
from cublas_audit.device.map_result import map_result
from cublas_audit.device.native_queue import Described, NativeQueue, refusal, rows_of
from cublas_audit.device.operand_pool import OperandPool
from cublas_audit.device.operands import Operands
from cublas_audit.device.timing import Timing
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import chunk_groups, pooled

CHECK_KERNELS = map_records.CHECK_KERNELS
# chunks queued ahead of the oldest one not yet read, beyond which the engine waits and reads all
MAX_PENDING = 8
# The interpreter's switch interval while the C thread queues: CUPTI asks that thread for a new
# record buffer through a Python callback, and hands full ones over through another on its own
# thread, each waiting for the interpreter lock the map's reading holds; at Python's default
# 5 ms a wait, the C thread stalled for 45 s of a BF16 grid's 85 s (the H100).
SWITCH_S = 0.0002
# how long the oldest chunk's records may take to arrive once its GPU work is done, before the
# engine waits for everything and forces CUPTI's flush
RECORDS_WAIT_S = 2.0

Launch = Callable[[], None]
Finished = Callable[[Case, dict[str, Any]], None]
# (launch, closers) for a case on its operands: the closers run once its calls have finished
Prepare = Callable[[Case, Operands], tuple[Launch, list[Callable[[], None]]]]


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
        native: bool = True,
    ) -> None:
        self.reps = reps
        self.prepare = prepare
        self.failed = failed
        self.single = single
        self.untraced = untraced  # why CUPTI cannot trace here ('' where it can)
        self.pool = OperandPool(cases)
        self.scratch = quick_check.Scratch()
        self.records: list[kernel_trace.KernelLaunch] = []  # delivered, not yet read
        self.pending: collections.deque[Chunk] = collections.deque()
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
        # chunks of classic calls queued by a C thread (device.native_queue) where it starts
        self.use_native = native
        # the GPU's time in the problems' timed calls (first to last event), and from a
        # problem's last event to the next one's first (its check, the next poison, any idle)
        self.gpu_seconds = {"gpu_calls_s": 0.0, "gpu_between_s": 0.0}
        self.settled: Callable[[], None] = lambda: None
        self.native: NativeQueue | None = None
        self.queue_reason = "" if native else "off"

    def run(
        self,
        cases: Sequence[Case],
        started: Callable[[Case], None],
        finished: Finished,
        careful: int = 0,
        settled: Callable[[], None] = lambda: None,
    ) -> None:
        """`settled` is called once a chunk's start records are made (before its GPU work is
        queued) and once its results are: the caller flushes its records a chunk at a time."""
        self.settled = settled
        groups = chunk_groups(cases, careful)
        warmer = Warmer(self.warm_threads)
        chunks = [group for group, alone in groups if not alone and pooled(group[0])]
        self.ahead = Ahead(warmer, chunks, MAX_PENDING)
        self._start_native(chunks, warmer.running)
        switch = sys.getswitchinterval()
        if self.native is not None:
            sys.setswitchinterval(SWITCH_S)
        try:
            self._run(groups, started, finished)
        finally:
            sys.setswitchinterval(switch)
            busy = self.native.busy_seconds() if self.native is not None else None
            if self.native is not None:
                self.native.stop()  # what it was handed is queued, then its thread joined
            self.warm = {"threads": warmer.threads, "reason": warmer.reason, **warmer.counts()}
            self.warm["queue"] = self.queue_reason or "c thread"
            # what bounds the map: the C thread's queueing, and the GPU's time between events
            self.warm.update(queue_busy_s=busy, **self.gpu_seconds)
            warmer.stop()  # its threads joined before the map's own handles go

    def _start_native(self, chunks: Sequence[Sequence[Case]], warming: bool) -> None:
        if not self.use_native or not chunks:
            return
        largest = max(case.m for chunk in chunks for case in chunk)
        try:
            values = 2 * quick_check.MAX_COLUMNS * largest  # at most 2 checked entries
            self.native = NativeQueue(self.reps, values, warming)
        except Exception as exc:  # no compiler, no GPU: every chunk is queued from Python
            self.queue_reason = f"python: {type(exc).__name__}: {exc}".splitlines()[0]

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
                self.settled()
                finished(group[0], self.single(group[0]))
                self.settled()
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
    def _queue(self, group: Sequence[Case], started: Callable[[Case], None]) -> Chunk:
        chunk = made(self.chunks, group, self._events(len(group)), self.reps)
        self.chunks += 1
        if group[0].mode != self.pool.mode:
            self._native_wait()  # the C thread's chunks use the pool's present operands
        # the pool's filling kernels before the chunk's marker, no case's records (out of
        # memory: each case meets it again and is recorded)
        with contextlib.suppress(Exception):
            self.pool.load(group[0].mode)
        chunk.native = self._described(chunk)
        for item in chunk.queued:
            started(item.case)
        self.settled()
        if chunk.native is not None and self.native is not None:
            for slot, item in enumerate(chunk.queued):
                item.slot = slot
            self.native.submit(chunk.native)
        else:
            self._queue_python(chunk)
        return chunk

    def _described(self, chunk: Chunk) -> Described | None:
        """The chunk as the C thread's record; None where Python queues it (no thread, a problem
        that is no classic call, no operands: out of memory)."""
        if self.native is None or self.pool.mode != chunk.queued[0].case.mode:
            return None
        a, b, c = self.pool.addresses()[self.pool.mode]
        bias = self.pool.buffers["bias"].data.ptr
        try:
            rows = rows_of(chunk.group, chunk.picks, chunk.offsets, (a, b, c, bias),
                           chunk.indices.data.ptr, chunk.sums.data.ptr)  # fmt: skip
        except ValueError:
            return None
        ahead, addresses = self.ahead, self.pool.addresses()
        warm = -1 if ahead is None else ahead.queuing(chunk.group, addresses, tell=False)
        marker = 0 if self.untraced else map_records.marker_threads(chunk.sequence)
        if marker:
            self._start_tracing()
        return self.native.describe(rows, chunk.events, chunk, marker, warm)

    def _queue_python(self, chunk: Chunk) -> None:
        import cupy

        self._native_wait()  # the chunks before this one are on the stream first
        stream = cupy.cuda.get_current_stream()
        chunk.indices.set(chunk.host_indices, stream=stream)
        cupy.cuda.runtime.memsetAsync(chunk.sums.data.ptr, 0, chunk.sums.nbytes, stream.ptr)
        if self.ahead is not None:
            self.ahead.queuing(chunk.group, self.pool.addresses())
        if not self.untraced:
            self._start_tracing()
            map_records.open_chunk(chunk.sequence)
        places = zip(chunk.queued, chunk.picks, chunk.offsets, strict=True)
        for slot, (item, pick, offset) in enumerate(places):
            try:
                self._queue_case(item, slot, pick, chunk, offset, stream.ptr)
            except Exception as exc:  # a case that cannot be made is recorded; the map goes on
                item.result = self.failed(exc)
                if not self.untraced:
                    map_records.close_case()  # its records (if any) end here
        chunk.sums.get(stream=stream, out=chunk.host_sums, blocking=False)
        chunk.end.record(stream)

    def _native_wait(self) -> None:
        """Until the C thread has queued every chunk handed to it."""
        if self.native is not None:
            self.native.wait()

    def _on_stream(self, chunk: Chunk) -> bool:
        """Whether the chunk's work is queued (a chunk handed to the C thread may not be yet)."""
        if chunk.native is None or self.native is None:
            return True
        return self.native.finished() > chunk.native.index

    def _queue_case(
        self,
        item: Queued,
        slot: int,
        pick: quick_check.Picked,
        chunk: Chunk,
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
        the oldest lags MAX_PENDING chunks behind, waits for it (_wait_oldest)."""
        if not self.pending:
            return
        began = time.perf_counter()
        if not self.untraced:
            self.records += kernel_trace.tracer().delivered()
        self.seconds["flush"] += time.perf_counter() - began
        while self.pending:
            chunk = self.pending[0]
            if not self._on_stream(chunk):  # (an event not yet recorded reads as done)
                break
            split = self._split(chunk, last=False)
            if split is None or not chunk.end.done:
                break
            self.pending.popleft()
            self._read(chunk, split, finished)
        if len(self.pending) > MAX_PENDING:
            self._wait_oldest(finished)

    def _wait_oldest(self, finished: Finished) -> None:
        """Waits for the oldest chunk alone (its end event, then its records through CUPTI's
        non-forced flush as later chunks fill its buffers) and reads it, while the GPU runs the
        chunks queued after it; waits for everything (_drain) only where its records have not
        arrived after RECORDS_WAIT_S. Draining every time idled the GPU while all the chunks
        were read: where the C thread queues, the GPU, not the host, is what the map waits for."""
        chunk = self.pending[0]
        began = time.perf_counter()
        while not self._on_stream(chunk):
            time.sleep(0.0002)
        chunk.end.synchronize()
        split = self._split(chunk, last=False)  # (untraced: why, at once)
        while split is None:
            if time.perf_counter() - began > RECORDS_WAIT_S:
                self.seconds["wait"] += time.perf_counter() - began
                self._drain(finished)
                return
            time.sleep(0.0005)
            self.records += kernel_trace.tracer().delivered()
            split = self._split(chunk, last=False)
        self.seconds["wait"] += time.perf_counter() - began
        self.pending.popleft()
        self._read(chunk, split, finished)

    def _drain(self, finished: Finished) -> None:
        """Every queued chunk read: waits for the GPU, then takes CUPTI's records with nothing
        in flight (a forced flush)."""
        if not self.pending:
            return
        began = time.perf_counter()
        self._native_wait()
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

    def _split(self, chunk: Chunk, last: bool) -> list[list[Any]] | str | None:
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

    def _read(self, chunk: Chunk, split: list[list[Any]] | str, finished: Finished) -> None:
        """A chunk's results, in queue order (host work: the GPU runs later chunks)."""
        began = time.perf_counter()
        sums = chunk.host_sums.tolist()  # copied before the chunk's end event
        state = clocks.state()  # once a chunk: the clocks move slower than a chunk lasts
        share = round((began - self.last) / len(chunk.queued), 6)
        self.last = began
        self._refused(chunk)
        for index, item in enumerate(chunk.queued):
            result = item.result
            if result is None:
                kernels = split if isinstance(split, str) else split[index]
                result = self._measured(item, sums, kernels, state)
            for close in item.closers:
                close()
            finished(item.case, {**result, "case_s": share})
        self._gpu_spans(chunk)
        self.spare_events.append(chunk.events)
        self.settled()
        self.seconds["read"] += time.perf_counter() - began

    def _gpu_spans(self, chunk: Chunk) -> None:
        import cupy

        elapsed = cupy.cuda.runtime.eventElapsedTime
        measured = [item.events for item in chunk.queued if item.result is None]
        for events, following in zip(measured, [*measured[1:], None], strict=True):
            with contextlib.suppress(Exception):  # (an event a refused call never recorded)
                self.gpu_seconds["gpu_calls_s"] += elapsed(events[0], events[-1]) / 1e3
                if following is not None:
                    self.gpu_seconds["gpu_between_s"] += elapsed(events[-1], following[0]) / 1e3

    def _refused(self, chunk: Chunk) -> None:
        """The C thread's refusals as the cases' results, as the Python engine records them."""
        if chunk.native is None:
            return
        setup = int(chunk.native.record.setup_status)
        status = chunk.native.status.tolist()
        for slot, item in enumerate(chunk.queued):
            where, code = (2, setup) if setup else (status[2 * slot], status[2 * slot + 1])
            if where:
                try:  # raised, so that the probe logs it with its traceback as any other
                    raise refusal(where, code)
                except Exception as exc:
                    item.result = self.failed(exc)

    def _measured(
        self,
        item: Queued,
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
