"""CUPTI's kernel records for the map taken in C (data/cupti_records.c) rather than through
cupti-python's Python callbacks: while the map traces, CUPTI hands its buffers to C, which keeps
each kernel record's start, end, grid, block, registers and name as one compact row, and the
map's reader takes the rows as KernelLaunch records (device.cupti_tracer's tracer, `native`).
cupti-python still enables, flushes and disables the tracing, and its record type gives the
fields' offsets (no CUPTI header is needed); its callbacks are registered again when the map
stops tracing. Each switch is made with no buffer out (a forced flush first), so that a buffer
goes back to the side that gave it.

Where the C part cannot be had (no compiler, no libcupti in this process, CUPTI refusing the
callbacks) the map reads the records through cupti-python as before.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from cublas_audit.device import native
from cublas_audit.device.cupti_tracer import KernelLaunch, Tracer
from cublas_audit.device.loaded import loaded_library

# CUPTI's buffers while the map traces in C: CUPTI's worker thread hands a buffer over once it
# is full and its kernels have run (checking every FLUSH_PERIOD_MS), so that a small one (~900
# records, some 130 problems: about a chunk) brings a chunk's records a chunk or so behind the
# GPU without the map asking for a flush (the tracer's `arrived`)
BUFFER_BYTES = 128 * 1024
FLUSH_PERIOD_MS = 1
# data/cupti_records.c's kernel_row
ROW = np.dtype(
    [("start", "<i8"), ("end", "<i8"), ("grid", "<i4", (3,)), ("block", "<i4", (3,)),
     ("registers", "<i4"), ("name", "<i4")]
)  # fmt: skip
# the kernel record's fields data/cupti_records.c reads, in its order (cupti-python's names)
FIELDS = ("kind", "start", "end", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
          "registers_per_thread", "name")  # fmt: skip


def layout(record: np.dtype[Any]) -> tuple[list[int], list[int]]:
    """The offsets and widths (bytes) of FIELDS in a kernel record type (cupti-python's numpy
    type of it, whose names may be CUPTI's own: gridX for grid_x); ValueError if one is missing."""
    fields: Mapping[str, tuple[Any, ...]] = record.fields or {}
    by_name = {_plain(name): (int(at), kind.itemsize) for name, (kind, at, *_) in fields.items()}
    missing = [name for name in FIELDS if _plain(name) not in by_name]
    if missing:
        raise ValueError(f"the kernel record has no {', '.join(missing)}")
    return [by_name[_plain(n)][0] for n in FIELDS], [by_name[_plain(n)][1] for n in FIELDS]


def _plain(name: str) -> str:
    return name.replace("_", "").lower()


def kernel_record_type(cupti: Any) -> np.dtype[Any]:
    """cupti-python's newest kernel record type (activity_kernel<N>_dtype): the one its CUPTI
    writes for a concurrent kernel."""
    named = (re.fullmatch(r"activity_kernel(\d+)_dtype", name) for name in dir(cupti))
    versions = [found for found in named if found]
    if not versions:
        raise ValueError("cupti-python has no kernel record type")
    newest = max(versions, key=lambda m: int(m.group(1)))
    found: np.dtype[Any] = np.dtype(getattr(cupti, newest.group(0)))
    return found


class NativeRecords:
    """The C side's rows, taken as KernelLaunch records (names decoded once each)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.names: list[str] = []

    def take(self) -> list[KernelLaunch]:
        wanted = self._counts()[0]
        rows = np.empty(wanted, ROW)
        rows = rows[: int(self.lib.cupti_records_take(rows.ctypes.data, wanted))]
        names = self._named(int(rows["name"].max()) + 1 if len(rows) else 0)
        columns = zip(
            [names[n] for n in rows["name"].tolist()], rows["start"].tolist(),
            rows["end"].tolist(), _triples(rows["grid"]), _triples(rows["block"]),
            rows["registers"].tolist(), strict=True,
        )  # fmt: skip
        # (tuple's own constructor: ~1.3x faster than the named tuple's; a map's ~1.6 million
        # records a grid are the map's one Python thread's time)
        return [tuple.__new__(KernelLaunch, fields) for fields in columns]

    def _named(self, count: int) -> list[str]:
        while len(self.names) < count:
            found = self.lib.cupti_records_name(len(self.names))
            self.names.append(found.decode(errors="replace") if found is not None else "")
        return self.names

    @property
    def skipped(self) -> int:
        """Records the C side did not keep (another kind, or no memory left)."""
        return self._counts()[1]

    def _counts(self) -> tuple[int, int]:
        waiting, not_kept = ctypes.c_int64(0), ctypes.c_int64(0)
        self.lib.cupti_records_counts(ctypes.byref(waiting), ctypes.byref(not_kept))
        return waiting.value, not_kept.value


def _triples(values: np.ndarray[Any, Any]) -> list[tuple[int, int, int]]:
    """Launch dimensions (x under 2**31, y and z under 2**16: CUDA's limits) as tuples, one tuple
    object per distinct value (a grid's records repeat a few launch shapes: looked up, not made,
    per record)."""
    wide = values.astype(np.int64)
    keys = (wide[:, 0] | wide[:, 1] << 31 | wide[:, 2] << 47).tolist()
    made = {key: (key & 0x7FFFFFFF, key >> 31 & 0xFFFF, key >> 47) for key in set(keys)}
    return [made[key] for key in keys]


def _declared(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64 = ctypes.c_int64
    lib.cupti_records_start.argtypes = [
        ctypes.c_char_p, ctypes.POINTER(i64), ctypes.POINTER(i64), i64, i64,
        ctypes.POINTER(ctypes.c_int),
    ]  # fmt: skip
    lib.cupti_records_take.argtypes = [ctypes.c_void_p, i64]
    lib.cupti_records_take.restype = i64
    lib.cupti_records_counts.argtypes = [ctypes.POINTER(i64), ctypes.POINTER(i64)]
    lib.cupti_records_name.argtypes = [ctypes.c_int32]
    lib.cupti_records_name.restype = ctypes.c_char_p
    return lib


def start(lib: ctypes.CDLL, cupti: Any, libcupti: str) -> NativeRecords:
    """CUPTI's buffers handed to the C side of `lib` (the libcupti at that path, loaded): any
    buffer out is handed back to cupti-python's callbacks first. OSError where it cannot be."""
    try:
        offsets, widths = layout(kernel_record_type(cupti))
    except ValueError as exc:
        raise OSError(str(exc)) from exc
    lib = _declared(lib)
    cupti.activity_flush_all(1)
    status = ctypes.c_int(0)
    code = lib.cupti_records_start(
        libcupti.encode(), (ctypes.c_int64 * len(FIELDS))(*offsets),
        (ctypes.c_int64 * len(FIELDS))(*widths), int(cupti.ActivityKind.CONCURRENT_KERNEL),
        BUFFER_BYTES, ctypes.byref(status),
    )  # fmt: skip
    if code:
        raise OSError(f"CUPTI's buffers cannot be taken in C ({code}, CUPTI status {status.value})")
    cupti.activity_flush_period(FLUSH_PERIOD_MS)
    return NativeRecords(lib)


def take_over(tracer: Tracer) -> str:
    """The tracer's kernel records taken in C from now on (tracer.native); '' where they are,
    else why not (the tracer goes on through cupti-python)."""
    try:
        records = start(native.library(), tracer.cupti, loaded_library("libcupti.so"))
    except Exception as exc:  # no compiler, no libcupti, CUPTI refusing: only slower
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    tracer.native = records.take
    return ""


def hand_back(tracer: Tracer) -> None:
    """cupti-python's callbacks registered again (the tracer disabled: no buffer is out); any
    row left is the tracer's."""
    if tracer.native is None:
        return
    left = tracer.native()
    tracer.native = None
    with tracer.lock:
        tracer.records.extend(left)
    tracer.cupti.activity_flush_period(0)  # CUPTI's own heuristics again
    tracer.register()
