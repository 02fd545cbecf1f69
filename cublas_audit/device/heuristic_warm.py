"""cuBLAS's kernel choice made ahead of the map, on other host cores (data/heuristic_warm.c).

On the H100 a fresh shape's first cublasGemmEx took 142 us of host time (median; 781 us mean,
with its kernel's first load), a later call of the shape 11 us: over the 262,144 fresh shapes of
a full BF16 grid, cuBLAS choosing kernels was most of the map's time, the GPU idle. Worker threads
in C make the map's coming calls first, each inside a stream capture that is thrown away (no
kernel runs, the GPU's timed work is untouched), so that the map's own call finds the choice in
cuBLAS's process-wide heuristics cache. The choice is cuBLAS's own either way: the same call
with the same arguments; a call the workers have not reached is chosen by the map as before.

The C source ships in the package and is compiled once per version with the system's C compiler
into the user's cache (device.native). Without a compiler, on a system without /proc, or with
CUBLAS_AUDIT_WARM_THREADS=0, nothing is warmed (`Warmer.reason` says why) and the map is only
slower.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

from cublas_audit.device import native
from cublas_audit.device.launchers import ClassicCall, classic_call
from cublas_audit.planning.cases import Case

THREADS_VARIABLE = "CUBLAS_AUDIT_WARM_THREADS"
MAX_THREADS = 8  # H100 host, fresh shapes: 1 worker 181-203 us a call, 2: 108, 4: 55, 8: 45
# calls the workers may run ahead of the map: well inside cuBLAS's heuristics cache (an LRU of
# 8,192 problems by default), so that no choice is evicted before the map reaches it
WINDOW = 2048


class WarmCall(ctypes.Structure):
    """heuristic_warm.c's warm_call."""

    _fields_ = [
        *((name, ctypes.c_int32) for name in ("routine", "transa", "transb", "m", "n", "k")),
        *((name, ctypes.c_int32) for name in ("lda", "ldb", "ldc", "batch")),
        ("data_type", ctypes.c_int32),
        ("compute_type", ctypes.c_int32),
        *((name, ctypes.c_int64) for name in ("stride_a", "stride_b", "stride_c")),
        *((name, ctypes.c_uint64) for name in ("a", "b", "c")),
        ("beta", ctypes.c_float),
        ("pad", ctypes.c_int32),
    ]


SKIP = WarmCall(routine=-1)  # a case with no classic call (cuBLASLt, a loop): counted, not run


def thread_count(environ: dict[str, str] | None = None) -> int:
    """Worker threads: CUBLAS_AUDIT_WARM_THREADS where set, else the cores this process may use
    less two (the map's thread and CUPTI's), at most MAX_THREADS."""
    environ = dict(os.environ) if environ is None else environ
    wanted = environ.get(THREADS_VARIABLE, "").strip()
    if wanted:
        return max(0, int(wanted)) if wanted.isdigit() else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(0, min(MAX_THREADS, (cores or 1) - 2))


def warm_call(call: ClassicCall | None) -> WarmCall:
    """The C struct of a classic call (SKIP for none)."""
    if call is None:
        return SKIP
    return WarmCall(
        call.routine, call.transa, call.transb, call.m, call.n, call.k, call.lda, call.ldb,
        call.ldc, call.batch, call.data_type, call.compute_type, call.stride_a, call.stride_b,
        call.stride_c, call.a, call.b, call.c, call.beta, 0,
    )  # fmt: skip


class Warmer:
    """The C workers of one process (at most one Warmer runs at a time): `submit` the map's
    calls in its order, `progress` as it queues them, `stop` at the end. Where they cannot
    start, every method does nothing and `reason` says why."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.reason = ""
        self.submitted = 0
        self._library: Any = None
        if threads <= 0:
            self.reason = f"off ({THREADS_VARIABLE}=0)"
            return
        try:
            import cupy

            library = native.library()
            context = ctypes.c_void_p(cupy.cuda.driver.ctxGetCurrent())
            library.warm_start.argtypes = [
                ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
            ]  # fmt: skip
            status = library.warm_start(native.loaded_cublas().encode(), context, threads, WINDOW)
        except Exception as exc:  # no compiler, no GPU, no libcublas: the map chooses alone
            self.reason = f"off: {type(exc).__name__}: {exc}".splitlines()[0]
            return
        if status != 0:
            self.reason = f"off: warm_start returned {status}"
            return
        library.warm_submit.argtypes = [ctypes.POINTER(WarmCall), ctypes.c_int64]
        library.warm_progress.argtypes = [ctypes.c_int64]
        self._library = library

    @property
    def running(self) -> bool:
        return self._library is not None

    def submit(self, calls: Sequence[WarmCall]) -> None:
        if self._library is None or not calls:
            return
        array = (WarmCall * len(calls))(*calls)
        if self._library.warm_submit(array, len(calls)) == 0:
            self.submitted += len(calls)

    def progress(self, queued: int) -> None:
        if self._library is not None:
            self._library.warm_progress(queued)

    def counts(self) -> dict[str, float]:
        """Calls warmed, failed (cuBLAS refused the captured call: the map's call chooses) and
        late (the map queued them first)."""
        if self._library is None:
            return {}
        out = (ctypes.c_int64 * 3)()
        self._library.warm_counts(out)
        return {"warmed": float(out[0]), "warm_failed": float(out[1]), "warm_late": float(out[2])}

    def stop(self) -> None:
        if self._library is not None:
            self._library.warm_stop()
            self._library = None


class Ahead:
    """The map's chunks handed to a Warmer a few chunks before the engine queues them: `queuing`
    is told of each chunk as the engine starts it (the very list objects given here; any other,
    such as a careful case run alone, is not warmed), with the operand pool's base addresses of
    the mode loaded (a pooled problem's operands are views of their first elements). A chunk of
    a mode whose operands are not loaded yet waits until they are."""

    def __init__(self, warmer: Warmer, chunks: Sequence[Sequence[Case]], chunks_ahead: int) -> None:
        self.warmer = warmer
        self.chunks = list(chunks)
        self.chunks_ahead = chunks_ahead
        self.position = 0  # the next chunk the engine queues
        self.starts: list[int] = []  # each submitted chunk's first call's place among the calls
        # the classic calls of the chunks submitted and not yet queued, by place: the engine's
        # C thread queues the same calls (calls_for), made once on the map's one thread
        self.built: dict[int, list[ClassicCall | None]] = {}

    def queuing(
        self,
        chunk: Sequence[Case],
        addresses: dict[str, tuple[int, int, int]],
        tell: bool = True,
    ) -> int:
        """The chunks up to `chunks_ahead` after `chunk` handed to the workers; the place among
        the calls of `chunk`'s first (-1: none), which the workers are told as the map's
        progress now (`tell`) or by the engine's C thread as it queues the chunk."""
        if not self.warmer.running or self.position >= len(self.chunks):
            return -1
        if chunk is not self.chunks[self.position]:
            return -1
        last = min(len(self.chunks), self.position + 1 + self.chunks_ahead)
        while len(self.starts) < last and self.chunks[len(self.starts)][0].mode in addresses:
            coming = self.chunks[len(self.starts)]
            a, b, c = addresses[coming[0].mode]
            calls = self.built[len(self.starts)] = [classic_call(case, a, b, c) for case in coming]
            self.starts.append(self.warmer.submitted)
            self.warmer.submit([warm_call(call) for call in calls])
        progress = self.starts[self.position] if self.position < len(self.starts) else -1
        if tell and progress >= 0:
            self.warmer.progress(progress)
        self.built.pop(self.position, None)
        self.position += 1
        return progress

    def calls_for(self, chunk: Sequence[Case]) -> list[ClassicCall | None] | None:
        """The classic calls made for `chunk` when it was submitted, where it is the next chunk
        to queue (None: not made, or another chunk)."""
        if self.position < len(self.chunks) and chunk is self.chunks[self.position]:
            return self.built.get(self.position)
        return None
