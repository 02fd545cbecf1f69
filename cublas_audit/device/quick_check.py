"""The quick float64 check as two CUDA kernels: the map's check of every problem, made without a
synchronisation or a CuPy temporary, so that it queues behind the calls it checks.

It computes the check's metric (device.operands: ||C_i - R_i||_F / ||R_i||_F, R the float64
product of the same stored inputs) over QUICK_COLUMNS columns of the first and last batch entries:
`cublas_audit_check_partial` accumulates R's picked columns in float64, split over K between
blocks (atomics into a scratch array) so that a 4096-row problem still fills the GPU;
`cublas_audit_check_final` adds beta C0 and the bias, compares with C and adds each entry's
squared error and squared norm into its two slots of `sums`. A NaN or infinity in C makes the
sums NaN or infinite: the error is then infinite, never a pass.

The same arithmetic as the CuPy check it replaced (widen to float64, matmul, norms), without its
dozen kernel launches, its NVRTC compiles on a cold cache and its two synchronisations a case.
Each block stages a tile of A and of B's picked columns in shared memory with all its loads in
flight at once: loading one value of A and waiting for it before the next made the first version
latency-bound (65 us a grid problem on average, 17 s of the BF16 grid's GPU time; now 39 us).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cublas_audit.planning.modes import mode as mode_of

MAX_COLUMNS = 16  # columns of each checked entry (device.operands.QUICK_COLUMNS)
ROWS = 128  # rows of C per block of the partial kernel
K_TILE = 32  # values of K staged in shared memory at once
# blocks worth launching at least: four per SM of an H100 (benchmarks/check_kernel.py: 10.3 s of
# the BF16 grid's check against 11.8 s at two per SM; 792 and 1056 no faster)
FILL_BLOCKS = 528
FINAL_THREADS = 256
STORAGE_CODES = {"float32": 0, "float16": 1, "uint16": 2}  # uint16: bf16 bits
# float64 sums a problem's check adds into (the map's chunks hold this many a problem): a squared
# error and a squared norm for each of at most two checked batch entries
SUMS_PER_CASE = 4


def index_address(indices: int, offset: int) -> int:
    """The device address of a problem's picked entries and columns, at `offset` (int32 values)
    in a chunk's index array at `indices`."""
    return indices + 4 * offset


def sums_address(sums: int, slot: int) -> int:
    """The device address of the problem in `slot`'s sums in a chunk's float64 array at `sums`."""
    return sums + 8 * SUMS_PER_CASE * slot


# the kernels' CUDA source (compiled with NVRTC through CuPy on first use)
SOURCE = (Path(__file__).resolve().parent.parent / "data" / "quick_check.cu").read_text()


@dataclass(frozen=True)
class Picked:
    """What one case's check compares: the batch entries and, per entry, the columns."""

    entries: tuple[int, ...]
    columns: tuple[tuple[int, ...], ...]

    @property
    def n_columns(self) -> int:
        return len(self.columns[0])

    def index_values(self) -> list[int]:
        """The entries then every entry's columns, as the kernels read them from one array."""
        return [*self.entries, *(c for cols in self.columns for c in cols)]


@functools.lru_cache(maxsize=4096)
def picked(batch: int, n: int, columns: int = MAX_COLUMNS) -> Picked:
    """The first and last batch entries and, for each, `columns` random columns of n (all of
    them where n is no more): a fixed seed, so a rerun checks the same outputs."""
    import numpy

    rng = numpy.random.default_rng(0)
    entries = tuple(sorted({0, batch - 1}))
    count = min(columns, n)
    chosen = tuple(tuple(int(j) for j in rng.permutation(n)[:count]) for _ in entries)
    return Picked(entries, chosen)


def error_from_sums(sums: Any) -> float:
    """The largest normwise error over the entries, from each entry's (squared error, squared
    norm); infinite where the output held a NaN or an infinity."""
    worst = 0.0
    for diff2, ref2 in zip(sums[0::2], sums[1::2], strict=True):
        if not (math.isfinite(diff2) and math.isfinite(ref2)):
            return math.inf
        error = math.sqrt(diff2 / ref2) if ref2 > 0 else math.sqrt(diff2)
        worst = max(worst, error)
    return worst


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any]:
    import cupy

    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    return (
        module.get_function("cublas_audit_check_partial"),
        module.get_function("cublas_audit_check_final"),
    )


def k_per_block(m: int, k: int, entries: int) -> int:
    """K values each partial block sums: split so that at least FILL_BLOCKS blocks run, in whole
    K_TILE steps."""
    row_blocks = -(-m // ROWS)
    splits = max(1, min(-(-k // K_TILE), -(-FILL_BLOCKS // (row_blocks * entries))))
    per_block = -(-k // splits)
    return -(-per_block // K_TILE) * K_TILE


@dataclass(frozen=True)
class Geometry:
    """How one problem's check is launched: its K split, both kernels' grids, and the float64
    scratch values the partial kernel sums into."""

    per_block: int
    partial_grid: tuple[int, int, int]
    final_grid: tuple[int, int, int]
    scratch_values: int


@functools.lru_cache(maxsize=65536)
def geometry(m: int, k: int, slots: int) -> Geometry:
    """The check's launch geometry for an m x k problem checking `slots` batch entries (also
    what data/map_queue.c launches with)."""
    per_block = k_per_block(m, k, slots)
    return Geometry(
        per_block,
        (-(-m // ROWS), -(-k // per_block), slots),
        (-(-m // FINAL_THREADS), slots, 1),
        slots * MAX_COLUMNS * m,
    )


class Scratch:
    """The partial kernel's float64 accumulator, grown as needed and reused by every case on
    the stream (each case zeroes it before use, in stream order)."""

    def __init__(self) -> None:
        self.array: Any = None

    def reserve(self, values: int) -> Any:
        """The array, at least `values` long (made anew where it was shorter)."""
        import cupy

        if self.array is None or self.array.size < values:
            self.array = cupy.empty(max(values, 1), dtype=cupy.float64)
        return self.array

    def zeroed(self, values: int, stream: Any) -> Any:
        import cupy

        self.reserve(values)
        cupy.cuda.runtime.memsetAsync(self.array.data.ptr, 0, values * 8, stream.ptr)
        return self.array


def enqueue(ops: Any, out: Any, chosen: Picked, indices: Any, sums: Any, scratch: Scratch) -> None:
    """Queues the check of `out` (shaped like C) against ops's inputs on the current stream:
    `indices` holds chosen.index_values() on the GPU (int32), `sums` receives 2 float64 per
    entry (zeroed by the caller). Nothing synchronises."""
    enqueue_at(ops, out, chosen, indices.data.ptr, sums.data.ptr, scratch)


def enqueue_at(
    ops: Any, out: Any, chosen: Picked, indices: int, sums: int, scratch: Scratch
) -> None:
    """enqueue with `indices` and `sums` given as device addresses (the map engine's slots of its
    chunk's arrays: no CuPy view made per case), the kernels launched through the driver
    (_DriverLaunch: CuPy's launch of 16 arguments cost ~40 us of host time each)."""
    import cupy

    case = ops.case
    if not DRIVER_LAUNCH:
        partial_kernel, final_kernel = _cupy_launchers()
    else:
        partial_kernel, final_kernel = _launchers()
    stream = cupy.cuda.get_current_stream().ptr
    storage = STORAGE_CODES[mode_of(case.mode).storage]
    la, lb = case.operand("a"), case.operand("b")
    slots = len(chosen.entries)
    columns = indices + 4 * slots  # int32 entries first
    shape = geometry(case.m, case.k, slots)
    partial = scratch.zeroed(shape.scratch_values, cupy.cuda.get_current_stream())
    per_block = shape.per_block
    partial_kernel(
        shape.partial_grid, (ROWS, 1, 1), stream,
        (ops.a.data.ptr, ops.b.data.ptr, storage, case.m, case.k, int(case.transa == "t"),
         int(case.transb == "t"), la.ld, lb.ld, la.stride, lb.stride, indices, columns,
         chosen.n_columns, per_block, partial.data.ptr),
    )  # fmt: skip
    c0 = ops.c0.data.ptr if ops.c0 is not None else 0
    bias = ops.bias.data.ptr if ops.bias is not None else 0
    final_kernel(
        shape.final_grid, (FINAL_THREADS, 1, 1), stream,
        (out.data.ptr, c0, bias, storage, float(case.beta), case.m, case.n, indices, columns,
         chosen.n_columns, partial.data.ptr, sums),
    )  # fmt: skip


# The kernels' parameters in order, as ctypes types (SOURCE's signatures)
_PTR, _INT, _LONG, _DOUBLE = "p", "i", "q", "d"
PARTIAL_PARAMS = "ppiiiiiqqqqppiip"
FINAL_PARAMS = "pppidiippipp"


class _DriverLaunch:
    """One kernel launched with cuLaunchKernel through ctypes: its parameters live in ctypes
    objects made once (the driver copies them at the launch), set anew for each launch."""

    def __init__(self, libcuda: Any, function: int, params: str) -> None:
        import ctypes

        kinds = {
            _PTR: ctypes.c_void_p, _INT: ctypes.c_int, _LONG: ctypes.c_longlong,
            _DOUBLE: ctypes.c_double,
        }  # fmt: skip
        self.launch = libcuda.cuLaunchKernel
        self.function = ctypes.c_void_p(function)
        self.args: list[Any] = [kinds[kind]() for kind in params]
        pointers = [ctypes.cast(ctypes.pointer(arg), ctypes.c_void_p) for arg in self.args]
        self.params = (ctypes.c_void_p * len(pointers))(*pointers)

    def __call__(
        self, grid: tuple[int, int, int], block: tuple[int, int, int], stream: int, values: Any
    ) -> None:
        for arg, value in zip(self.args, values, strict=True):
            arg.value = value
        status = self.launch(self.function, *grid, *block, 0, stream, self.params, None)
        if status:
            raise RuntimeError(f"cuLaunchKernel of the quick check failed: CUDA error {status}")


DRIVER_LAUNCH = True


@functools.lru_cache(maxsize=1)
def _cupy_launchers() -> tuple[Any, Any]:
    import numpy

    kinds = {_PTR: numpy.uintp, _INT: numpy.int32, _LONG: numpy.int64, _DOUBLE: numpy.float64}

    def through_cupy(kernel: Any, params: str) -> Any:
        def launch(grid: Any, block: Any, stream: int, values: Any) -> None:
            del stream  # CuPy launches on the current stream
            kernel(grid, block, tuple(kinds[k](v) for k, v in zip(params, values, strict=True)))

        return launch

    partial, final = _kernels()
    return through_cupy(partial, PARTIAL_PARAMS), through_cupy(final, FINAL_PARAMS)


@functools.lru_cache(maxsize=1)
def _launchers() -> tuple[_DriverLaunch, _DriverLaunch]:
    import ctypes

    libcuda = ctypes.CDLL("libcuda.so.1")
    c_uint = ctypes.c_uint
    libcuda.cuLaunchKernel.argtypes = [
        ctypes.c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    libcuda.cuLaunchKernel.restype = ctypes.c_int
    partial, final = _kernels()
    return (
        _DriverLaunch(libcuda, partial.kernel.ptr, PARTIAL_PARAMS),
        _DriverLaunch(libcuda, final.kernel.ptr, FINAL_PARAMS),
    )


def error_now(ops: Any, out: Any) -> float:
    """The quick check of `out` against ops's inputs, synchronously (one case, one readback)."""
    import cupy

    case = ops.case
    chosen = picked(case.batch, case.n)
    indices = cupy.asarray(chosen.index_values(), dtype=cupy.int32)
    sums = cupy.zeros(2 * len(chosen.entries), dtype=cupy.float64)
    enqueue(ops, out, chosen, indices, sums, Scratch())
    return error_from_sums(sums.get().tolist())
