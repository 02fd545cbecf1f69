"""How the map engine (device.map_engine) tells CUPTI's kernel records apart: one marker kernel a
chunk, the poison kernel opening each case, and a case's calls told apart by their count.

The engine used to launch a marker kernel before every call (5 a problem) and to flush CUPTI with
nothing in flight after every chunk of 128 problems. Both cost the GPU's time: a marker is a
launch and a record to parse, and a forced flush idles the GPU while CUPTI hands its records to
Python (29 s of the BF16 grid's 300 s). Now:

- A chunk opens with one marker kernel whose block size names the chunk (its sequence number
  modulo MARKED_CHUNKS, plus one): any record of it tells which chunk it opens, so the records of
  several chunks in flight are told apart without a synchronisation.
- A case's records begin after its poison's kernel (device.check_chunk: C poisoned before its
  calls; launched first, even for a case that cannot be made) and end at the next case's
  poison, at CASE_END where the case could not be queued whole (an error after some launches),
  or at the chunk's check kernel, after every case's calls.
- The calls of one case are made by one launcher on the same operands, so cuBLAS dispatches the
  same kernels for each: the case's kernels split into `reps` groups of equal length, and the
  split is kept only where every group runs the same kernels in the same order (else the case's
  kernel times are "unavailable", never a guess).

Records come from CUPTI's non-forced flush while the GPU runs later chunks (it hands over only
buffers whose records are complete), so a chunk is read once the next chunk's marker has been
delivered: every kernel of the chunk ran before it, on the one stream.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from cublas_audit.device.kernel_trace import MARKERS, KernelLaunch

CHUNK_MARKER, CASE_END = MARKERS  # a chunk's opening marker; a case closed before its end
# (device.check_chunk's names: not imported, it reads the kernels' source)
POISON = "cublas_audit_poison"
CHECK = "cublas_audit_check_chunk"
CHECK_KERNELS = (CHECK, "cublas_audit_check")  # a chunk's check; one problem's (quick_check)
MARKED_CHUNKS = 1024  # chunks told apart by their marker's block size (at most 1024 threads)
# CUPTI's buffers while the map traces through cupti-python (device.cupti_records takes them in
# C where it can): each buffer CUPTI hands over, and the new one it asks for, goes through a
# Python callback and the interpreter lock, and held the C thread's launches up ~1.5 ms of idle
# GPU (BF16 grid on one H100: the problems' timed calls 48.9 s with 128 KiB buffers, 5,170
# exchanges; 44.2 s with 4 MiB, 2,046). The reader's non-forced flush after each chunk hands
# its buffer over however full (one exchange a flush at either size), so the records still
# arrive a chunk or two behind the GPU
BUFFER_BYTES = 4 * 1024 * 1024

Calls = tuple[tuple[KernelLaunch, ...], ...]


def marker_threads(sequence: int) -> int:
    """The block size of chunk `sequence`'s opening marker."""
    return sequence % MARKED_CHUNKS + 1


@functools.lru_cache(maxsize=2)
def _kernel(name: str) -> object:
    import cupy

    return cupy.RawKernel(f'extern "C" __global__ void {name}() {{}}', name)


def open_chunk(sequence: int) -> None:
    """Queues chunk `sequence`'s marker on the current stream."""
    _kernel(CHUNK_MARKER)((1,), (marker_threads(sequence),), ())  # type: ignore[operator]


def kernel_addresses() -> tuple[int, int]:
    """The CUfunctions of CASE_END and the chunk marker (data/map_queue.c launches them)."""
    return (
        _kernel(CASE_END).kernel.ptr,  # type: ignore[attr-defined]
        _kernel(CHUNK_MARKER).kernel.ptr,  # type: ignore[attr-defined]
    )


def close_case() -> None:
    """Queues CASE_END: the case's records end here (it could not be queued whole)."""
    _kernel(CASE_END)((1,), (1,), ())  # type: ignore[operator]


def chunk_records(
    records: Sequence[KernelLaunch], sequence: int, last: bool
) -> tuple[list[KernelLaunch], list[KernelLaunch]] | None:
    """Chunk `sequence`'s records (its marker excluded) and the records after them, from the
    records delivered so far; None while the next chunk's marker is not among them (unless
    `last`: nothing was queued after this chunk, and every record is in). Records before the
    chunk's marker belong to no chunk still read and are dropped."""
    ordered = sorted(records, key=lambda k: k.start_ns)
    mine, after = marker_threads(sequence), marker_threads(sequence + 1)
    begin = end = None
    for index, record in enumerate(ordered):
        if record.name != CHUNK_MARKER:
            continue
        if begin is None and record.block[0] == mine:
            begin = index
        elif begin is not None and record.block[0] == after:
            end = index
            break
    if begin is None or (end is None and not last):
        return None
    end = len(ordered) if end is None else end
    return list(ordered[begin + 1 : end]), list(ordered[end:])


def case_records(records: Sequence[KernelLaunch]) -> list[list[KernelLaunch]]:
    """A chunk's records (in GPU order) cut into its cases': each opens at its POISON and ends at
    the next POISON, a CASE_END or the chunk's CHECK (a CASE_END with no case open is a case that
    failed before its poison: no records); neither marker nor check is a call's kernel."""
    cases: list[list[KernelLaunch]] = []
    current: list[KernelLaunch] | None = None
    for record in records:
        if record.name in (POISON, CASE_END, CHECK):
            if current is not None or record.name == CASE_END:
                cases.append(current or [])
            current = [] if record.name == POISON else None
        elif current is not None:
            current.append(record)
    if current is not None:
        cases.append(current)
    return cases


def check_seconds(records: Sequence[KernelLaunch]) -> float:
    """The GPU seconds of the check kernels among `records` (what the map spends checking)."""
    return sum(r.end_ns - r.start_ns for r in records if r.name in CHECK_KERNELS) / 1e9


def split_calls(kernels: Sequence[KernelLaunch], reps: int) -> Calls | str:
    """One case's kernels as its `reps` calls, or why they cannot be split: the count must be a
    multiple of `reps` and every call must run the same kernels in the same order."""
    if reps <= 0 or not kernels or len(kernels) % reps:
        return f"unavailable: CUPTI saw {len(kernels)} kernels for {reps} calls"
    width = len(kernels) // reps
    calls = tuple(tuple(kernels[i * width : (i + 1) * width]) for i in range(reps))
    names = [k.name for k in calls[0]]
    if any([k.name for k in call] != names for call in calls[1:]):
        return f"unavailable: the {reps} calls did not launch the same kernels"
    return calls
