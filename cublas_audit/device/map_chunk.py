"""One chunk of the map engine (device.map_engine): its problems in queue order, each with its
events, check slot and own C, and the chunk's check (device.check_chunk: the picked indices going
up, the sums coming down through pinned host memory) and end event."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cublas_audit.device import check_chunk, quick_check
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import output_offsets

if TYPE_CHECKING:
    from cublas_audit.device.native_queue import Described


@dataclass
class Queued:
    case: Case
    slot: int = -1  # the case's place among the chunk's check sums; -1: not queued
    events: list[int] = field(default_factory=list)  # reps + 1 CUDA event handles
    closers: list[Callable[[], None]] = field(default_factory=list)
    result: dict[str, Any] | None = None  # set at once where the case could not be queued


@dataclass
class Chunk:
    sequence: int
    group: Sequence[Case]  # the planned chunk itself (device.heuristic_warm.Ahead knows it)
    queued: list[Queued]
    events: list[Any]  # the chunk's CUDA event handles, given back once it is read
    picks: list[quick_check.Picked] = field(default_factory=list)  # each problem's check
    offsets: list[int] = field(default_factory=list)  # where each problem's indices begin
    sums: Any = None
    indices: Any = None
    end: Any = None
    # pinned host copies: a pageable copy would wait for everything queued, the next chunk too
    host_sums: Any = None
    host_indices: Any = None
    native: Described | None = None  # queued by the C thread (device.native_queue)
    c_offsets: list[int] = field(default_factory=list)  # each problem's C in the pool's region
    check: check_chunk.Planned | None = None  # None: the pool has no operands (out of memory)


def made(sequence: int, group: Sequence[Case], events: list[Any], reps: int) -> Chunk:
    """Chunk `sequence` of `group`, each problem given its reps + 1 of `events`, with its check
    arrays made (not yet filled on the GPU: the indices are copied up and the sums zeroed where
    the chunk is queued)."""
    import cupy

    chunk = Chunk(sequence, group, [Queued(case) for case in group], events)
    chunk.picks = [quick_check.picked(case.batch, case.n) for case in group]
    chunk.c_offsets = output_offsets(group)
    chunk.offsets, values = quick_check.laid_out(chunk.picks)
    chunk.host_indices = _pinned(values, "int32")
    chunk.indices = cupy.empty(len(values), dtype=cupy.int32)
    chunk.host_sums = _pinned([0.0] * quick_check.SUMS_PER_CASE * len(group), "float64")
    chunk.sums = cupy.empty(len(chunk.host_sums), dtype=cupy.float64)
    chunk.end = cupy.cuda.Event()
    per_case = reps + 1
    for slot, item in enumerate(chunk.queued):
        item.events = events[slot * per_case : (slot + 1) * per_case]
    return chunk


def _pinned(values: Sequence[float], dtype: str) -> Any:
    """`values` in page-locked host memory (asynchronous copies to and from the GPU). As
    cupyx.empty_pinned makes it, without importing cupyx: it brought SciPy into the probe's
    start-up (~0.4 s a map)."""
    import cupy
    import numpy

    kind = numpy.dtype(dtype)
    memory = cupy.cuda.alloc_pinned_memory(max(1, len(values)) * kind.itemsize)
    array = numpy.ndarray((len(values),), dtype=kind, buffer=memory)
    array[...] = numpy.asarray(values, dtype=kind)
    return array
