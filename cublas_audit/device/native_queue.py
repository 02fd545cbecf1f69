"""The map's chunks queued on the GPU by a C thread (data/map_queue.c), beside Python's reading.

Queued from Python, a BF16 grid problem cost the map's one host thread ~295 us, more than the
GPU needed for it, and reading results back took the same thread another ~130 us: the map was
host-bound at ~425 us a problem. Here Python only describes a chunk (each problem's classic
cuBLAS call as the launcher makes it, its C's bytes to poison, the chunk's check as
device.check_chunk plans it) in one record, and a C thread makes exactly the driver and cuBLAS
calls the Python engine made, in the same order on the same stream, with the map's own cuBLAS
handle, while Python reads earlier chunks back. The kernels cuBLAS chooses are its own either
way (the same calls and arguments).

Only chunks of classic calls go this way (not cuBLASLt, not a batch looped as separate calls);
`NativeQueue` raises OSError where the C part cannot be had (no compiler: device.native), and
the engine then queues every chunk from Python as before, as it does with
CUBLAS_AUDIT_NATIVE_QUEUE=0.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cublas_audit.device import check_chunk, map_records, native, quick_check
from cublas_audit.device.launchers import ClassicCall, classic_call
from cublas_audit.planning.cases import Case
from cublas_audit.planning.modes import mode as mode_of

_CALL = (
    "routine", "transa", "transb", "m", "n", "k", "lda", "ldb", "ldc", "batch", "data_type",
    "compute_type", "stride_a", "stride_b", "stride_c", "a", "b", "c",
)  # fmt: skip
# map_queue.c's queued_case: every field 64 bits wide (no padding to get wrong)
CASE_FIELDS = (*_CALL, "beta", "item", "entries", "columns", "n_columns", "poison_blocks")


@functools.lru_cache(maxsize=1)
def case_dtype() -> Any:
    import numpy

    return numpy.dtype([(name, "<f8" if name == "beta" else "<i8") for name in CASE_FIELDS])


class QueuedChunk(ctypes.Structure):
    """map_queue.c's queued_chunk."""

    _fields_ = [
        ("cases", ctypes.c_void_p),
        ("count", ctypes.c_int64),
        ("events", ctypes.c_void_p),
        ("status", ctypes.c_void_p),
        ("indices", ctypes.c_uint64),
        ("host_indices", ctypes.c_void_p),
        ("indices_bytes", ctypes.c_int64),
        ("sums", ctypes.c_uint64),
        ("host_sums", ctypes.c_void_p),
        ("sums_bytes", ctypes.c_int64),
        ("check_params", ctypes.c_void_p),
        ("check_blocks", ctypes.c_int64),
        ("marker_threads", ctypes.c_int64),
        ("end", ctypes.c_void_p),
        ("warm_progress", ctypes.c_int64),
        ("setup_status", ctypes.c_int64),
    ]


REFUSED_BY_CUBLAS, REFUSED_BY_CUDA = 1, 2  # map_queue.c's status[2i]
WAIT_MS = 50  # a wait for the C thread, between which Python sees Ctrl-C
QUEUE_VARIABLE = "CUBLAS_AUDIT_NATIVE_QUEUE"  # 0: every chunk queued from Python


def wanted(environ: dict[str, str] | None = None) -> bool:
    """Whether the map queues its chunks from C (unless CUBLAS_AUDIT_NATIVE_QUEUE=0)."""
    environ = dict(os.environ) if environ is None else environ
    return environ.get(QUEUE_VARIABLE, "").strip() != "0"


def refusal(where: int, status: int) -> Exception:
    """The exception the Python engine would have met where map_queue.c reports a refusal."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    error: Exception
    if where == REFUSED_BY_CUBLAS:
        error = cublas.CUBLASError(status)
    else:
        error = cupy.cuda.driver.CUDADriverError(status)
    return error


@dataclass
class Described:
    """A chunk as handed to the C thread: its record and everything the record points into (kept
    alive until the chunk is read)."""

    record: QueuedChunk
    rows: Any  # numpy array of case_dtype()
    events: Any  # ctypes array of the problems' event handles
    status: Any  # numpy int32, 2 a problem
    index: int = -1  # its place among the chunks handed over


def rows_of(
    cases: Sequence[Case],
    check: check_chunk.Planned,
    operands: tuple[int, int, int],
    calls: Sequence[ClassicCall | None] | None = None,
) -> Any:
    """Each problem's record: its classic call on the pooled A and B and its own C (`operands`:
    A, B and C's region, where `calls`, those made already for the heuristic warmer, were made;
    they are taken where they are, with the problem's C), and where the poison of its checked
    columns goes (the chunk's `check` says: each problem's C, entries and columns)."""
    import numpy

    a, b, region = operands
    jobs = check.jobs
    values = []
    for slot, (case, c) in enumerate(zip(cases, jobs["c"].tolist(), strict=True)):
        call = calls[slot] if calls is not None else None
        if call is None or (call.a, call.b, call.c) != (a, b, region):
            call = classic_call(case, a, b, c)
        if call is None:
            raise ValueError(f"{case.case_id} is not a classic cuBLAS call")
        values.append((*call._replace(c=c), 0, 0, 0, 0, 0))
    rows = numpy.array(values, dtype=case_dtype())
    rows["item"] = [mode_of(case.mode).element_bytes for case in cases]  # (C's value size)
    for name in ("entries", "columns", "n_columns"):
        rows[name] = jobs[name]
    rows["poison_blocks"] = check_chunk.poison_blocks(jobs)
    return rows


class NativeQueue:
    """The C thread of one map (at most one runs in a process): `submit` chunks in queue order,
    `finished` counts those on the GPU, `wait` for all, `stop` at the end."""

    def __init__(self, reps: int, warm: bool) -> None:
        self.library = native.library()  # (OSError first where there is no compiler)
        import cupy

        lib = self.library
        if lib.map_queued_case_size() != case_dtype().itemsize:
            raise OSError("map_queue.c's queued_case does not match the Python record")
        if lib.map_queued_chunk_size() != ctypes.sizeof(QueuedChunk):
            raise OSError("map_queue.c's queued_chunk does not match the Python record")
        lib.map_queue_start.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
            ctypes.c_int,
        ]  # fmt: skip
        lib.map_queue_submit.argtypes = [ctypes.POINTER(QueuedChunk)]
        lib.map_queue_finished.restype = ctypes.c_int64
        lib.map_queue_busy_seconds.restype = ctypes.c_double
        lib.map_queue_wait_ms.argtypes = [ctypes.c_int64]
        lib.map_queue_stop.argtypes = [ctypes.c_int]
        self.reps = reps
        self.stream = cupy.cuda.get_current_stream().ptr
        module = quick_check.module()
        functions = [
            module.get_function(check_chunk.CHUNK_KERNEL).kernel.ptr,
            *map_records.kernel_addresses(),
            module.get_function(check_chunk.POISON_KERNEL).kernel.ptr,
        ]
        self.functions = (ctypes.c_void_p * 4)(*functions)
        status = lib.map_queue_start(
            cupy.cuda.driver.ctxGetCurrent(), cupy.cuda.device.get_cublas_handle(), self.stream,
            reps, self.functions, int(warm),
        )  # fmt: skip
        if status != 0:
            raise OSError(f"the map's queue thread did not start ({status})")
        self.submitted = 0
        self.running = True

    def describe(
        self, rows: Any, events: Sequence[int], chunk: Any, marker: int, warm_progress: int
    ) -> Described:
        """The record of a chunk: `rows` (rows_of), its problems' events in order, the chunk's
        check (`chunk`: indices, sums and their pinned host copies, the planned check, its end
        event)."""
        import numpy

        handles = (ctypes.c_void_p * len(events))(*events)
        status = numpy.zeros(2 * len(rows), dtype=numpy.int32)
        record = QueuedChunk(
            rows.ctypes.data, len(rows), ctypes.addressof(handles), status.ctypes.data,
            chunk.indices.data.ptr, chunk.host_indices.ctypes.data, chunk.host_indices.nbytes,
            chunk.sums.data.ptr, chunk.host_sums.ctypes.data, chunk.host_sums.nbytes,
            chunk.check.params.ctypes.data, chunk.check.blocks, marker, chunk.end.ptr,
            warm_progress, 0,
        )  # fmt: skip
        return Described(record, rows, handles, status)

    def submit(self, described: Described) -> None:
        while self.library.map_queue_submit(ctypes.byref(described.record)) != 0:
            self.wait()  # its ring is full: hundreds of chunks ahead of the GPU
        described.index = self.submitted
        self.submitted += 1

    def finished(self) -> int:
        """Chunks queued on the GPU so far."""
        return int(self.library.map_queue_finished())

    def busy_seconds(self) -> float:
        """The C thread's time spent queueing so far (where it bounds the map: the engine's
        reading then waits for it)."""
        return float(self.library.map_queue_busy_seconds())

    def wait(self) -> None:
        """Until every chunk handed over is queued on the GPU: in short waits with the
        interpreter lock released, so that Ctrl-C is seen between them."""
        while not self.library.map_queue_wait_ms(WAIT_MS):
            pass

    def stop(self, abandon: bool = False) -> None:
        """Joins the thread once it has queued every chunk handed over, or (`abandon`: the map
        was interrupted) the chunk it is queueing; the others are never queued (their problems
        have start records and no results: the sweep's resume runs them)."""
        if self.running:
            self.library.map_queue_stop(int(abandon))
            self.running = False
