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

SOURCE = r"""
#define MAX_COLUMNS 16
#define ROWS 128
#define K_TILE 32
#define B_LOADS (K_TILE * MAX_COLUMNS / ROWS)  /* B values a thread stages a tile */

__device__ __forceinline__ double half_bits(unsigned short h) {
    const unsigned exponent = (h >> 10) & 0x1f, fraction = h & 0x3ff;
    double v;
    if (exponent == 0) v = ldexp((double)fraction, -24);
    else if (exponent == 31) v = fraction ? __longlong_as_double(0x7ff8000000000000ULL)
                                          : __longlong_as_double(0x7ff0000000000000ULL);
    else v = ldexp((double)(fraction | 0x400), (int)exponent - 25);
    return (h >> 15) ? -v : v;
}

/* A stored value as a float (exact for all three storages: float32, bf16 and fp16 values are
   all floats), so that the staged tile of A takes half the registers and shared memory. */
template <int STORAGE>
__device__ __forceinline__ float as_float(const void* p, long long i) {
    if (STORAGE == 0) return ((const float*)p)[i];
    const unsigned short h = ((const unsigned short*)p)[i];
    if (STORAGE == 2) return __uint_as_float(((unsigned)h) << 16);
    return (float)half_bits(h);
}

/* One K_TILE x ROWS tile of op(A) into shared memory, each thread issuing its loads 16 at a
   time (the first kernel loaded one value and waited for it before the next: latency-bound, ~65
   us a grid problem on average; all 32 at once took ~250 registers), coalesced in both
   layouts: a warp reads 32 consecutive rows of one column (transa = n) or 32 consecutive K
   values of one row (transa = t). Values outside the problem are zero. */
template <int STORAGE>
__device__ __forceinline__ void stage_a(
        float (*a_tile)[ROWS + 1], const void* a, long long offset, long long lda, int transa,
        int row0, int m, int base, int p1) {
    constexpr int HALF = K_TILE / 2;  /* 16 loads in flight a thread: fewer registers */
    float v[HALF];
    if (!transa) {  /* thread t: row row0 + t, K values base .. base + K_TILE */
        const int i = row0 + threadIdx.x;
        #pragma unroll 1
        for (int h = 0; h < K_TILE; h += HALF) {
            const long long at = offset + (long long)(base + h) * lda + i;
            #pragma unroll
            for (int q = 0; q < HALF; ++q)
                v[q] = (i < m && base + h + q < p1) ? as_float<STORAGE>(a, at + q * lda) : 0.0f;
            #pragma unroll
            for (int q = 0; q < HALF; ++q) a_tile[h + q][threadIdx.x] = v[q];
        }
    } else {  /* thread t: K value base + t % 32 of rows row0 + t / 32 + 4 r */
        const int q = threadIdx.x % K_TILE, first = threadIdx.x / K_TILE;
        constexpr int STEP = ROWS / K_TILE;
        #pragma unroll 1
        for (int h = 0; h < K_TILE; h += HALF) {
            const int row = first + STEP * h;
            const long long at = offset + (long long)(row0 + row) * lda + base + q;
            #pragma unroll
            for (int r = 0; r < HALF; ++r)
                v[r] = (row0 + row + STEP * r < m && base + q < p1)
                    ? as_float<STORAGE>(a, at + (long long)(STEP * r) * lda) : 0.0f;
            #pragma unroll
            for (int r = 0; r < HALF; ++r) a_tile[q][row + STEP * r] = v[r];
        }
    }
}

template <int STORAGE>
__device__ __forceinline__ void partial_sums(
        double (*tile)[MAX_COLUMNS], float (*a_tile)[ROWS + 1], const void* a, const void* b,
        int m, int k, int transa, int transb, long long lda, long long ldb, long long stride_a,
        long long stride_b, const int* entries, const int* columns, int n_columns,
        int k_per_block, double* partial) {
    const int slot = blockIdx.z;
    const long long e = entries[slot];
    const int row0 = blockIdx.x * ROWS;
    const int i = row0 + threadIdx.x;
    const int p0 = blockIdx.y * k_per_block;
    const int p1 = min(k, p0 + k_per_block);
    const int* cols = columns + slot * n_columns;
    double acc[MAX_COLUMNS];
    #pragma unroll
    for (int c = 0; c < MAX_COLUMNS; ++c) acc[c] = 0.0;
    for (int base = p0; base < p1; base += K_TILE) {
        /* the B tile's values loaded together (then A's), stored once all are asked for:
           one memory latency a tile, not one a value */
        double bv[B_LOADS];
        #pragma unroll
        for (int u = 0; u < B_LOADS; ++u) {
            const int t = threadIdx.x + ROWS * u;
            const int p = base + t / MAX_COLUMNS, c = t % MAX_COLUMNS;
            const long long j = c < n_columns ? cols[c] : 0;
            bv[u] = (p < p1 && c < n_columns)
                ? as_float<STORAGE>(b, e * stride_b + (transb ? p * ldb + j : j * ldb + p))
                : 0.0;
        }
        __syncthreads();  /* the last tile's values all read */
        #pragma unroll
        for (int u = 0; u < B_LOADS; ++u) {
            const int t = threadIdx.x + ROWS * u;
            tile[t / MAX_COLUMNS][t % MAX_COLUMNS] = bv[u];
        }
        stage_a<STORAGE>(a_tile, a, e * stride_a, lda, transa, row0, m, base, p1);
        __syncthreads();
        /* values past p1 are zero in both tiles: whole tiles summed, nothing added */
        #pragma unroll 4
        for (int q = 0; q < K_TILE; ++q) {
            const double x = a_tile[q][threadIdx.x];
            #pragma unroll
            for (int c = 0; c < MAX_COLUMNS; ++c) acc[c] += x * tile[q][c];
        }
    }
    if (i < m) {
        #pragma unroll
        for (int c = 0; c < MAX_COLUMNS; ++c)  // unrolled: acc stays in registers
            if (c < n_columns)
                atomicAdd(&partial[((long long)slot * MAX_COLUMNS + c) * m + i], acc[c]);
    }
}

extern "C" __global__ void __launch_bounds__(ROWS) cublas_audit_check_partial(
        const void* a, const void* b, int storage, int m, int k, int transa, int transb,
        long long lda, long long ldb, long long stride_a, long long stride_b,
        const int* entries, const int* columns, int n_columns, int k_per_block,
        double* partial) {
    __shared__ double tile[K_TILE][MAX_COLUMNS];
    __shared__ float a_tile[K_TILE][ROWS + 1];  /* +1: the transposed stores hit 32 banks */
    if (storage == 0)
        partial_sums<0>(tile, a_tile, a, b, m, k, transa, transb, lda, ldb, stride_a,
                        stride_b, entries, columns, n_columns, k_per_block, partial);
    else if (storage == 2)
        partial_sums<2>(tile, a_tile, a, b, m, k, transa, transb, lda, ldb, stride_a,
                        stride_b, entries, columns, n_columns, k_per_block, partial);
    else
        partial_sums<1>(tile, a_tile, a, b, m, k, transa, transb, lda, ldb, stride_a,
                        stride_b, entries, columns, n_columns, k_per_block, partial);
}

/* One row's squared error and squared norm over the checked columns, the columns' loads in
   flight together (unrolled, the storage known: a loop waiting for each column's loads in turn
   took ~12 us, as long as the partial sums of a mid-sized problem). */
template <int STORAGE>
__device__ __forceinline__ void row_sums(
        const void* c, const void* c0, const void* bias, double beta, int m, int n, long long e,
        const int* cols, int n_columns, const double* partial, int i, double& d2, double& r2) {
    const double added = bias ? (double)as_float<STORAGE>(bias, i) : 0.0;
    #pragma unroll
    for (int col = 0; col < MAX_COLUMNS; ++col) {
        if (col < n_columns) {
            const long long at = e * (long long)m * n + (long long)cols[col] * m + i;
            double exact = partial[(long long)col * m + i];
            if (c0) exact += beta * (double)as_float<STORAGE>(c0, at);
            if (bias) exact += added;  /* (in the first kernel's order) */
            const double diff = (double)as_float<STORAGE>(c, at) - exact;
            d2 += diff * diff;
            r2 += exact * exact;
        }
    }
}

extern "C" __global__ void cublas_audit_check_final(
        const void* c, const void* c0, const void* bias, int storage, double beta, int m,
        int n, const int* entries, const int* columns, int n_columns, const double* partial,
        double* sums) {
    const int slot = blockIdx.y;
    const long long e = entries[slot];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int* cols = columns + slot * n_columns;
    const double* mine = partial + (long long)slot * MAX_COLUMNS * m;
    double d2 = 0.0, r2 = 0.0;
    if (i < m) {
        if (storage == 0)
            row_sums<0>(c, c0, bias, beta, m, n, e, cols, n_columns, mine, i, d2, r2);
        else if (storage == 2)
            row_sums<2>(c, c0, bias, beta, m, n, e, cols, n_columns, mine, i, d2, r2);
        else
            row_sums<1>(c, c0, bias, beta, m, n, e, cols, n_columns, mine, i, d2, r2);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        d2 += __shfl_down_sync(0xffffffffu, d2, offset);
        r2 += __shfl_down_sync(0xffffffffu, r2, offset);
    }
    __shared__ double warp_sums[2][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { warp_sums[0][warp] = d2; warp_sums[1][warp] = r2; }
    __syncthreads();
    if (warp == 0) {
        const int warps = blockDim.x >> 5;
        d2 = lane < warps ? warp_sums[0][lane] : 0.0;
        r2 = lane < warps ? warp_sums[1][lane] : 0.0;
        for (int offset = 16; offset > 0; offset >>= 1) {
            d2 += __shfl_down_sync(0xffffffffu, d2, offset);
            r2 += __shfl_down_sync(0xffffffffu, r2, offset);
        }
        if (lane == 0) { atomicAdd(&sums[2 * slot], d2); atomicAdd(&sums[2 * slot + 1], r2); }
    }
}
"""


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
