"""The map's engine: many problems queued per synchronisation, on operands made once.

A map problem's 5 calls take tens of microseconds of GPU time where it is small; made one at a
time (fresh operands, a synchronised check, a synchronisation after every call) the host's ~9 ms
a problem was the map's speed. Here:

- Operands come from a pool (OperandPool): per mode, one random A, B and bias, sized to the
  largest pooled problem of the plan and filled once, and a region holding a chunk's outputs
  side by side; a problem's operands are views (A and B of their first elements, laid out as
  device.operands describes, the views made once per layout; C at its offset in the region).
- A chunk of problems is queued without waiting: one marker kernel naming the chunk
  (device.map_records), then for each problem its C is poisoned (a kernel, which opens the
  problem's records), its calls run back to back between CUDA events (reps + 1 events: each
  call's stop is the next one's start; the events are made once and reused); then one kernel
  checks every problem's output in float64 (device.check_chunk, the quick check of
  device.quick_check for each) and adds its sums into the chunk's slots. The first call warms
  up and is timed too: a median of 5 ignores it, and the check reads the output all 5 calls
  wrote alike (beta = 0).
- A chunk of classic cuBLAS calls is queued by a C thread (device.native_queue: the same driver
  and cuBLAS calls, in the same order, on the same stream and handle), so that Python reads
  earlier chunks back meanwhile; other chunks, or every chunk where the C part cannot be had,
  are queued from Python as described above.
- No synchronisation between chunks: CUPTI's records arrive through its non-forced flush while
  the GPU runs later chunks, and a chunk is read (events, records, sums) once its end event has
  passed and the next chunk's marker is among the records (device.map_reader). Where
  MAX_PENDING chunks are in flight the oldest is waited for alone; only at the end or before a
  problem run alone does the engine wait for the GPU and force the flush (which must find no
  kernel running, or it hands over their records unfinished). Chunks are dealt to like work,
  their largest problem first: planning.chunks.
- cuBLAS's choice of kernel for a fresh shape (most of its first call's host time) is made a
  few chunks ahead by C worker threads (device.heuristic_warm: `warm_threads`), so that each
  problem's first call finds it cached; the choice is cuBLAS's own either way.

A problem with beta != 0 (its calls accumulate into C) or operands beyond POOLED_BYTES
(planning.chunks) runs on its own through the caller's `single` path, as before. `careful` runs
the first problems one chunk each, synchronised: after a crash the problem in flight is then
known exactly.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from cublas_audit import gc_pause
from cublas_audit.device import check_chunk, cupti_records, cupti_tracer, map_records, quick_check
from cublas_audit.device.heuristic_warm import Ahead, Warmer
from cublas_audit.device.map_chunk import Chunk, Queued, made
from cublas_audit.device.map_reader import MAX_PENDING, ChunkReader
from cublas_audit.device.native_queue import Described, NativeQueue, rows_of
from cublas_audit.device.operand_pool import OperandPool, region_here
from cublas_audit.device.operands import Operands
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import chunk_groups, pooled

CHECK_KERNELS = map_records.CHECK_KERNELS
# The interpreter's switch interval while the C thread queues: CUPTI asks that thread for a new
# record buffer through a Python callback, and hands full ones over through another on its own
# thread, each waiting for the interpreter lock the map's reading holds (Python's default: up to
# 5 ms a wait). Measured alone on the H100's BF16 grid it did not shorten the map (107.0 s map
# phase against 104.4 s without it; the C thread's waits were the GPU's, which _wait_oldest
# removed); kept as it ran in every measured map since, not measured apart since then.
SWITCH_S = 0.0002
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
        self.region = region_here()  # a chunk's outputs side by side, the most bytes
        self.pool = OperandPool(cases, self.region)
        self.scratch = quick_check.Scratch()  # the chunks' checks' (check_chunk.planned)
        self.scratch_values = 0
        self.chunks = 0
        self.tracing = False
        # where the engine's wall time went: queueing (host), waiting for the GPU, reading back
        # and recording, and the cases run alone (benchmarks/map_speed.py reports the shares)
        self.seconds = {"queue": 0.0, "wait": 0.0, "flush": 0.0, "read": 0.0, "alone": 0.0}
        self.reader = ChunkReader(reps, untraced, failed, self.seconds)
        # cuBLAS's kernel choice made ahead on other cores (device.heuristic_warm), and how it went
        self.warm_threads = warm_threads
        self.ahead: Ahead | None = None
        self.warm: dict[str, Any] = {}
        # chunks of classic calls queued by a C thread (device.native_queue) where it starts
        self.use_native = native
        self.native: NativeQueue | None = None
        self.queue_reason = "" if native else "off"
        self.records_reason = "untraced"  # how CUPTI's records came: '' in C, else why not
        self.set_up_s = 0.0  # run's seconds before its first chunk: groups, workers, C thread
        self.gpu_done_s = 0.0  # and until the GPU had run its last chunk

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
        self.reader.settled = settled
        began = time.perf_counter()
        groups = chunk_groups(cases, careful, self.region)
        warmer = Warmer(self.warm_threads)
        chunks = [group for group, alone in groups if not alone and pooled(group[0])]
        # the checks' scratch: a chunk of the largest problems' (all zeros: each check leaves it so)
        self.scratch_values = check_chunk.scratch_values(self.pool.largest_m)
        self.ahead = Ahead(warmer, chunks, MAX_PENDING)
        self._start_native(chunks, warmer.running)
        gc_pause.long_lived_settled()  # the plan, the pool and the chunks: made to stay
        self.set_up_s = time.perf_counter() - began
        switch = sys.getswitchinterval()
        if self.native is not None:
            sys.setswitchinterval(SWITCH_S)
        completed = False
        try:
            self._run(groups, started, finished)
            completed = True
            self.gpu_done_s = self.reader.gpu_done - began
        finally:
            sys.setswitchinterval(switch)
            busy = self.native.busy_seconds() if self.native is not None else None
            if self.native is not None:  # its thread joined; interrupted, at once
                self.native.stop(abandon=not completed)
            self.warm = {"threads": warmer.threads, "reason": warmer.reason, **warmer.counts()}
            self.warm["queue"] = self.queue_reason or "c thread"
            self.warm["records"] = self.records_reason or "c"
            # what bounds the map: the C thread's queueing, and the GPU's time between events
            self.warm.update(queue_busy_s=busy, **self.reader.gpu_seconds)
            warmer.stop()  # its threads joined before the map's own handles go

    def _start_native(self, chunks: Sequence[Sequence[Case]], warming: bool) -> None:
        if not self.use_native or not chunks:
            return
        try:
            queue = NativeQueue(self.reps, warming)
            self.native = self.reader.native = queue
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
                self.reader.drain(finished)
                self._stop_tracing()  # the single path records its own calls
                began = time.perf_counter()
                started(group[0])
                self.reader.settled()
                finished(group[0], self.single(group[0]))
                self.reader.settled()
                self.reader.last = time.perf_counter()
                self.seconds["alone"] += self.reader.last - began
                continue
            began = time.perf_counter()
            self.reader.pending.append(self._queue(group, started))
            self.seconds["queue"] += time.perf_counter() - began
            if alone:  # careful: one case in flight at a time
                self.reader.drain(finished)
            else:  # earlier chunks' results, while the GPU runs what is queued
                self.reader.read_ready(finished)
        self.reader.drain(finished)
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
            self._plan_check(chunk)
        chunk.native = self._described(chunk)
        for item in chunk.queued:
            started(item.case)
        self.reader.settled()
        if chunk.native is not None and self.native is not None:
            for slot, item in enumerate(chunk.queued):
                item.slot = slot
            self.native.submit(chunk.native)
        else:
            self._queue_python(chunk)
        return chunk

    def _plan_check(self, chunk: Chunk) -> None:
        """Each problem's C in the pool's region, and the chunk's check on them."""
        a, b, region = self.pool.addresses()[chunk.group[0].mode]  # (KeyError: not loaded)
        outputs = [region + offset for offset in chunk.c_offsets]
        bias = self.pool.buffers["bias"].data.ptr
        scratch = self.scratch.reserve(self.scratch_values).data.ptr
        on = check_chunk.Operands(a, b, bias, outputs)
        sums = chunk.sums.data.ptr
        chunk.check = check_chunk.planned(
            chunk.group, chunk.picks, chunk.offsets, on, chunk.indices.data.ptr, sums, scratch
        )

    def _described(self, chunk: Chunk) -> Described | None:
        """The chunk as the C thread's record; None where Python queues it (no thread, a problem
        that is no classic call, no operands: out of memory)."""
        if self.native is None or chunk.check is None:
            return None
        addresses = self.pool.addresses()
        ahead = self.ahead
        calls = ahead.calls_for(chunk.group) if ahead is not None else None
        try:
            on = addresses[chunk.group[0].mode]
            rows = rows_of(chunk.group, chunk.check, on, calls)
        except ValueError:
            return None
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
        for slot, item in enumerate(chunk.queued):
            try:
                self._queue_case(item, slot, chunk, stream.ptr)
            except Exception as exc:  # a case that cannot be made is recorded; the map goes on
                item.result = self.failed(exc)
                if not self.untraced:
                    map_records.close_case()  # its records (if any) end here
        if chunk.check is not None:
            check_chunk.launch(chunk.check, stream.ptr)
        chunk.sums.get(stream=stream, out=chunk.host_sums, blocking=False)
        chunk.end.record(stream)

    def _native_wait(self) -> None:
        """Until the C thread has queued every chunk handed to it."""
        if self.native is not None:
            self.native.wait()

    def _queue_case(self, item: Queued, slot: int, chunk: Chunk, stream: int) -> None:
        import cupy

        # the poison first: it opens the case's records, even where the case cannot be made
        # (no output region: nothing poisoned, then the case's CASE_END)
        planned = chunk.check
        job = planned.jobs[slot] if planned is not None else None
        check_chunk.poison(item.case, job, stream)
        ops = self.pool.operands(item.case, chunk.c_offsets[slot])
        launch, item.closers = self.prepare(item.case, ops)
        record = cupy.cuda.runtime.eventRecord
        events = item.events
        record(events[0], stream)
        for rep in range(self.reps):
            launch()
            record(events[rep + 1], stream)
        item.slot = slot

    def _events(self, cases: int) -> list[Any]:
        """Event handles for `cases` cases: reused from a chunk already read where one is spare
        (creating CUDA events costs host time every case)."""
        import cupy

        wanted = cases * (self.reps + 1)
        spare = self.reader.spare_events
        events = spare.pop() if spare else []
        while len(events) < wanted:
            events.append(cupy.cuda.runtime.eventCreate())
        return events

    # ----- CUPTI -----------------------------------------------------------------------------
    def _start_tracing(self) -> None:
        if not self.tracing:
            tracer = cupti_tracer.tracer()
            tracer.buffer_bytes = map_records.BUFFER_BYTES
            # (a take-over that failed once is not tried at each restart: a compile each time)
            if self.records_reason in ("untraced", ""):
                self.records_reason = cupti_records.take_over(tracer)
            tracer.enable()
            self.reader.records = []
            self.tracing = True

    def _stop_tracing(self) -> None:
        if self.tracing:
            tracer = cupti_tracer.tracer()
            tracer.disable()
            cupti_records.hand_back(tracer)
            tracer.buffer_bytes = cupti_tracer.BUFFER_BYTES
            self.tracing = False
