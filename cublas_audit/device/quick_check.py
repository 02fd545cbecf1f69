"""The quick float64 check as one CUDA kernel a problem, made without a synchronisation or a CuPy
temporary, so that it queues behind the calls it checks (a problem's check on its own; the map
checks a chunk's problems in one launch of the same arithmetic: device.check_chunk).

It computes the check's metric (device.operands: ||C_i - R_i||_F / ||R_i||_F, R the float64
product of the same stored inputs) over QUICK_COLUMNS columns of the first and last batch entries:
`cublas_audit_check` accumulates R's picked columns in float64, split over K between blocks
(atomics into a scratch array) so that a 4096-row problem still fills the GPU; the last block of
each group of rows (a ticket in the scratch) adds beta C0 and the bias, compares with C, adds
each entry's squared error and squared norm into its two slots of `sums` and zeroes what it used
of the scratch, which every check leaves all zeros (Scratch: made zeroed once). A NaN or
infinity in C makes the sums NaN or infinite: the error is then infinite, never a pass.

The same arithmetic as the CuPy check it replaced (widen to float64, matmul, norms), without its
dozen kernel launches, its NVRTC compiles on a cold cache and its two synchronisations a case.
The products are the float64 tensor cores' (mma m8n8k4, exact float64 fused multiply-adds; the
same sums from shuffles before sm_80) on tiles of A and B staged in shared memory, the next
tile's loads in flight while one multiplies; a block's ticket is taken by one thread after a
release fence; untransposed 2-byte A and B are read two values a load (even leading dimensions
and batch strides: one aligned word), 32 values of K a tile. On the H100, GPU-paced over a
uniform sample of the BF16 grid (benchmarks/check_kernel.py, check_kernel_h100.json): 21.4 ->
18.6 us a problem with the paired loads (25.3 before the tensor cores), errors equal to 4e-16.
What is left is ~12.3 us a problem whatever its size (the fit's intercept; 1.6 us per million
of m x k): the kernel's chain of dependent memory round trips, not its arithmetic, which is why
the map checks a chunk's problems in one launch (device.check_chunk: 7.2 us a problem).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cublas_audit.planning.modes import mode as mode_of

MAX_COLUMNS = 16  # columns of each checked entry (device.operands.QUICK_COLUMNS)
ROWS = 128  # rows of C per block (data/quick_check.cu's ROWS)
K_TILE = 32  # the K split's quantum: each block sums a multiple of K_TILE values of K
# blocks worth launching at least: four per SM of an H100 (benchmarks/check_kernel.py, with the
# kernel before the tensor cores: 10.3 s of the BF16 grid's check against 11.8 s at two per SM;
# 792 and 1056 no faster)
FILL_BLOCKS = 528
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


# the kernel's CUDA source (compiled with NVRTC through CuPy on first use)
SOURCE = (Path(__file__).resolve().parent.parent / "data" / "quick_check.cu").read_text()
KERNEL = "cublas_audit_check"


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


def laid_out(picks: Sequence[Picked]) -> tuple[list[int], list[int]]:
    """Where each of `picks` begins in one int32 array of them all (a chunk's indices), and the
    array's values: each pick's index_values after the one before's."""
    offsets: list[int] = []
    values: list[int] = []
    for pick in picks:
        offsets.append(len(values))
        values.extend(pick.index_values())
    return offsets, values


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
def module() -> Any:
    """data/quick_check.cu compiled (NVRTC through CuPy): the checks' kernels and the poison."""
    import cupy

    return cupy.RawModule(code=SOURCE, options=("-std=c++17",))


def kernel() -> Any:
    return module().get_function(KERNEL)


def k_per_block(m: int, k: int, entries: int, most_k: int = 0) -> int:
    """K values each partial block sums, in whole K_TILE steps: split so that at least
    FILL_BLOCKS blocks run, or (`most_k`: a chunk's check, whose problems fill the GPU together)
    so that none sums more than most_k."""
    row_blocks = -(-m // ROWS)
    if most_k:
        splits = -(-k // most_k)
    else:
        splits = max(1, min(-(-k // K_TILE), -(-FILL_BLOCKS // (row_blocks * entries))))
    per_block = -(-k // splits)
    return -(-per_block // K_TILE) * K_TILE


@dataclass(frozen=True)
class Geometry:
    """How one problem's check is launched: its K split, its grid (row blocks, K splits,
    entries), and the float64 scratch values it uses: the partial sums, then a ticket for each
    entry's row block."""

    per_block: int
    grid: tuple[int, int, int]
    scratch_values: int


@functools.lru_cache(maxsize=65536)
def geometry(m: int, k: int, slots: int, most_k: int = 0) -> Geometry:
    """The check's launch geometry for an m x k problem checking `slots` batch entries
    (`most_k`: k_per_block's)."""
    per_block = k_per_block(m, k, slots, most_k)
    row_blocks = -(-m // ROWS)
    grid = (row_blocks, -(-k // per_block), slots)
    return Geometry(per_block, grid, slots * MAX_COLUMNS * m + slots * row_blocks)


class Scratch:
    """The check's float64 sums and tickets, grown as needed and reused by every case on the
    stream: made zeroed, and each check leaves it all zeros (no memset a case)."""

    def __init__(self) -> None:
        self.array: Any = None

    def reserve(self, values: int) -> Any:
        """The array, at least `values` long (made anew, zeroed, where it was shorter)."""
        import cupy

        if self.array is None or self.array.size < values:
            self.array = cupy.zeros(max(values, 1), dtype=cupy.float64)
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
    chunk's arrays: no CuPy view made per case), the kernel launched through the driver
    (_DriverLaunch: CuPy's launch of 22 arguments cost ~40 us of host time each)."""
    import cupy

    case = ops.case
    launch = _launcher() if DRIVER_LAUNCH else _cupy_launcher()
    stream = cupy.cuda.get_current_stream().ptr
    storage = STORAGE_CODES[mode_of(case.mode).storage]
    la, lb = case.operand("a"), case.operand("b")
    slots = len(chosen.entries)
    columns = indices + 4 * slots  # int32 entries first
    shape = geometry(case.m, case.k, slots)
    partial = scratch.reserve(shape.scratch_values)
    c0 = ops.c0.data.ptr if ops.c0 is not None else 0
    bias = ops.bias.data.ptr if ops.bias is not None else 0
    launch(
        shape.grid, (ROWS, 1, 1), stream,
        (ops.a.data.ptr, ops.b.data.ptr, out.data.ptr, c0, bias, storage, float(case.beta),
         case.m, case.n, case.k, int(case.transa == "t"), int(case.transb == "t"), la.ld, lb.ld,
         la.stride, lb.stride, indices, columns, chosen.n_columns, shape.per_block,
         partial.data.ptr, sums),
    )  # fmt: skip


# The kernel's parameters in order, as ctypes types (SOURCE's signature)
_PTR, _INT, _LONG, _DOUBLE = "p", "i", "q", "d"
PARAMS = "pppppidiiiiiqqqqppiipp"


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
def _cupy_launcher() -> Any:
    import numpy

    kinds = {_PTR: numpy.uintp, _INT: numpy.int32, _LONG: numpy.int64, _DOUBLE: numpy.float64}
    function = kernel()

    def launch(grid: Any, block: Any, stream: int, values: Any) -> None:
        del stream  # CuPy launches on the current stream
        function(grid, block, tuple(kinds[k](v) for k, v in zip(PARAMS, values, strict=True)))

    return launch


@functools.lru_cache(maxsize=1)
def _libcuda() -> Any:
    import ctypes

    libcuda = ctypes.CDLL("libcuda.so.1")
    c_uint = ctypes.c_uint
    libcuda.cuLaunchKernel.argtypes = [
        ctypes.c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    libcuda.cuLaunchKernel.restype = ctypes.c_int
    return libcuda


@functools.lru_cache(maxsize=1)
def _launcher() -> _DriverLaunch:
    return _DriverLaunch(_libcuda(), kernel().kernel.ptr, PARAMS)


def driver_launch(name: str, blocks: int, threads: int, stream: int, params: Any) -> None:
    """Kernel `name` of SOURCE launched with cuLaunchKernel, `params` the addresses of its
    parameters' bytes (a ctypes array of void pointers: the driver copies them at the launch)."""
    function = module().get_function(name).kernel.ptr
    status = _libcuda().cuLaunchKernel(function, blocks, 1, 1, threads, 1, 1, 0, stream, params,
                                       None)  # fmt: skip
    if status:
        raise RuntimeError(f"cuLaunchKernel of {name} failed: CUDA error {status}")


def error_now(ops: Any, out: Any) -> float:
    """The quick check of `out` against ops's inputs, synchronously (one case, one readback)."""
    import cupy

    case = ops.case
    chosen = picked(case.batch, case.n)
    indices = cupy.asarray(chosen.index_values(), dtype=cupy.int32)
    sums = cupy.zeros(2 * len(chosen.entries), dtype=cupy.float64)
    enqueue(ops, out, chosen, indices, sums, Scratch())
    return error_from_sums(sums.get().tolist())
