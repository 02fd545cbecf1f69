"""The map engine's reading back (device.map_engine): a chunk is read once its GPU work is done and
CUPTI has delivered its records (the next chunk's marker among them), in queue order, while the GPU
runs later chunks: its check's sums, its problems' event times and kernels, each problem's record
handed to `finished`; where MAX_PENDING chunks are in flight, the oldest is waited for alone; at
the end, or before a problem run alone, every chunk is waited for and CUPTI's flush forced."""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable
from typing import Any

from cublas_audit.device import (
    clocks,
    cupti_tracer,
    kernel_trace,
    map_records,
    operands,
    quick_check,
)
from cublas_audit.device.map_chunk import Chunk, Queued
from cublas_audit.device.map_result import map_result
from cublas_audit.device.native_queue import NativeQueue, refusal
from cublas_audit.device.timing import Timing
from cublas_audit.planning.cases import Case

# chunks queued ahead of the oldest one not yet read, beyond which the engine waits for it
MAX_PENDING = 8
# how long the oldest chunk's records may take to arrive once its GPU work is done, before the
# engine waits for everything and forces CUPTI's flush
RECORDS_WAIT_S = 2.0
# how long the oldest chunk's records may take to arrive by themselves (CUPTI's worker hands
# full buffers over: device.cupti_records) before the engine asks for them with a flush
FLUSH_AFTER_S = 0.02

Finished = Callable[[Case, dict[str, Any]], None]


class ChunkReader:
    """The chunks queued and not yet read (`pending`), read into `finished` in queue order;
    `seconds` (the engine's) gets the time spent waiting, flushing CUPTI and reading."""

    def __init__(
        self,
        reps: int,
        untraced: str,
        failed: Callable[[BaseException], dict[str, Any]],
        seconds: dict[str, float],
    ) -> None:
        self.reps = reps
        self.untraced = untraced  # why CUPTI cannot trace here ('' where it can)
        self.failed = failed
        self.seconds = seconds
        self.pending: collections.deque[Chunk] = collections.deque()
        self.records: list[cupti_tracer.KernelLaunch] = []  # delivered, not yet read
        self.spare_events: list[list[Any]] = []  # the events of chunks read, for reuse
        self.last = time.perf_counter()
        self.gpu_done = 0.0  # when the GPU last finished all that was queued (drain)
        self.native: NativeQueue | None = None  # the engine's C thread, where it queues
        self.settled: Callable[[], None] = lambda: None  # a chunk's results are all given
        # the GPU's time in the problems' timed calls (first to last event), from a problem's
        # last event to the next one's first in its chunk (the next poison, any idle), and in
        # the checks' kernels (CUPTI's records: one a chunk, after its problems)
        self.gpu_seconds = {"gpu_calls_s": 0.0, "gpu_between_s": 0.0, "gpu_check_s": 0.0}

    def read_ready(self, finished: Finished) -> None:
        """Reads every chunk whose GPU work is done and whose records have all arrived; where
        the oldest lags MAX_PENDING chunks behind, waits for it (_wait_oldest)."""
        if not self.pending:
            return
        began = time.perf_counter()
        if not self.untraced:
            self.records += cupti_tracer.tracer().arrived()
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
        """Waits for the oldest chunk alone (its end event, then its records: as they arrive,
        then through CUPTI's non-forced flush after FLUSH_AFTER_S) and reads it, while the GPU
        runs the chunks queued after it; waits for everything (_drain) only where its records
        have not arrived after RECORDS_WAIT_S. Draining every time idled the GPU while all the
        chunks were read: where the C thread queues, the GPU, not the host, is what the map waits
        for."""
        chunk = self.pending[0]
        began = time.perf_counter()
        while not self._on_stream(chunk):
            time.sleep(0.0002)
        chunk.end.synchronize()
        done = time.perf_counter()
        split = self._split(chunk, last=False)  # (untraced: why, at once)
        while split is None:
            if time.perf_counter() - began > RECORDS_WAIT_S:
                self.seconds["wait"] += time.perf_counter() - began
                self.drain(finished)
                return
            time.sleep(0.0005)
            tracer = cupti_tracer.tracer()  # (a flush where they have not come by themselves)
            late = time.perf_counter() - done > FLUSH_AFTER_S
            self.records += tracer.delivered() if late else tracer.arrived()
            split = self._split(chunk, last=False)
        self.seconds["wait"] += time.perf_counter() - began
        self.pending.popleft()
        self._read(chunk, split, finished)

    def drain(self, finished: Finished) -> None:
        """Every queued chunk read: waits for the GPU, then takes CUPTI's records with nothing
        in flight (a forced flush)."""
        if not self.pending:
            return
        began = time.perf_counter()
        if self.native is not None:
            self.native.wait()
        self.pending[-1].end.synchronize()
        waited = self.gpu_done = time.perf_counter()
        if not self.untraced:
            self.records += cupti_tracer.tracer().flushed()
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
        self.gpu_seconds["gpu_check_s"] += map_records.check_seconds(mine)
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
        first = quick_check.SUMS_PER_CASE * item.slot
        error = quick_check.error_from_sums(sums[first : first + slots])
        if not error <= operands.tolerance(item.case.mode):
            return map_result(item.case.mode, error)
        elapsed = cupy.cuda.runtime.eventElapsedTime
        events = item.events
        samples = tuple(float(elapsed(events[i], events[i + 1])) for i in range(self.reps))
        calls = kernels if isinstance(kernels, str) else map_records.split_calls(kernels, self.reps)
        traced = calls if isinstance(calls, str) else kernel_trace.TracedCalls(calls)
        return map_result(item.case.mode, error, Timing(samples), traced, state)

    def _on_stream(self, chunk: Chunk) -> bool:
        """Whether the chunk's work is queued (a chunk handed to the C thread may not be yet)."""
        if chunk.native is None or self.native is None:
            return True
        return self.native.finished() > chunk.native.index
