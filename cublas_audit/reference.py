"""The bundled reference FP32 SGEMM: specialize, compile with CuPy, launch, check, time, tune.

Layout is the probe's (column-major, cuBLAS "nn"): for a problem (m, n, k, batch), `a` is a float32
CuPy array of shape (batch, k, m), `b` (batch, n, k) and `c` (batch, n, m), all C-contiguous.

Each problem gets a source with M, N, K and the tile parameters as #defines, compiled once per
process (and once per machine: CuPy keeps compiled cubins in its kernel cache, keyed by the full
source). The batch count is the grid's z extent, so every batch count of a problem shares a module.
GPUs of compute capability 9.0 and newer run the TMA kernel (reference_kernels/sgemm_tma.cu); older
ones, and sizes TMA cannot describe (M or K not a multiple of 4), the cp.async kernel. Tile shapes
come from a per-architecture strategy table (cublas_audit/data/strategy_sm<cc>.json) that
`cublas-audit reference --tune` writes.

CuPy, cuda-bindings and numpy are imported inside the functions: this module imports anywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import math
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError, ToolMissingError

KERNEL_DIR = Path(__file__).resolve().parent.parent / "reference_kernels"
DATA_DIR = Path(__file__).resolve().parent / "data"
KERNEL_NAMES = {"tma": "cublas_audit_ref_tma_sgemm", "cpasync": "cublas_audit_ref_cpasync_sgemm"}
SOURCES = {"tma": "sgemm_tma.cu", "cpasync": "sgemm_cpasync.cu"}
COMMON_HEADER = "sgemm_common.cuh"
ZERO_KERNEL = "cublas_audit_ref_zero_tiles"
FMA_ORDERS = (0, 1, 2)  # fma_order() in sgemm_common.cuh
ACC_LAYOUT_SPELLING = re.compile(r"(\d+)x(\d+)(?:/([rc])([rc]))?")
# What an SM computes in the few microseconds a work unit spends filling its pipeline and writing
# (or adding) its tile: the fixed cost of a unit, against which splitting a tile must pay off.
UNIT_OVERHEAD_FLOP = 1e6
MIN_BALANCE_GAIN = 0.005  # split a launch's last wave only if that shortens it by this much
BALANCE_SLACK = 0.0005  # splits this close to the best one count as equal
# A last wave this much short of full or less is left alone: the SMs that finish first absorb a
# few leftover tiles (on the H100 splitting 4, 8 or 16 leftover tiles of 132 gained nothing, where
# splitting 68 or 116 gained 1.3 % and 0.7 %).
MIN_TAIL_SHARE = 0.25
TOLERANCE = 1e-5  # normwise relative error; FP32 accumulation over K=8192 lands near 1e-6
CHECK_COLUMNS = 64  # output columns per batch entry compared with float64 beyond CHECK_FULL
CHECK_FULL = 2048 * 2048  # outputs per batch entry up to which every column is compared


@dataclass(frozen=True)
class AccLayout:
    """Where the thread's accumulators lie in its array (acc_index() in sgemm_common.cuh): the
    TM x TN register tile cut into block_m x block_n blocks (0: the whole tile's extent), blocks
    stored row by row of blocks or column by column, each block row by row or column by column."""

    block_m: int = 0
    block_n: int = 0
    blocks_by_column: bool = False
    by_column: bool = False

    @classmethod
    def parse(cls, name: str) -> AccLayout | None:
        """A name of NAMED_ACC_LAYOUTS, or "RxC" blocks with an optional "/" and two letters, r or
        c, for the order of the blocks and within them ("4x4/cr"); None if it is neither."""
        if name in NAMED_ACC_LAYOUTS:
            return NAMED_ACC_LAYOUTS[name]
        spelled = ACC_LAYOUT_SPELLING.fullmatch(name)
        if spelled is None:
            return None
        rows, columns, blocks, within = spelled.groups(default="r")
        return cls(int(rows), int(columns), blocks == "c", within == "c")

    def defines(self, tm: int, tn: int) -> dict[str, int]:
        """acc_index()'s #defines for a TM x TN register tile."""
        return {
            "ACC_BLOCK_M": self.block_m or tm,
            "ACC_BLOCK_N": self.block_n or tn,
            "ACC_BLOCKS_BY_COLUMN": int(self.blocks_by_column),
            "ACC_BY_COLUMN": int(self.by_column),
        }


NAMED_ACC_LAYOUTS = {
    "rows": AccLayout(),
    "columns": AccLayout(by_column=True),
    "pairs": AccLayout(block_n=2),  # pairs of columns, row by row within a pair
    "blocks": AccLayout(4, 4),
}
ACC_LAYOUTS = tuple(NAMED_ACC_LAYOUTS)  # what the tuner tries for each tile


@dataclass(frozen=True)
class Config:
    """One specialization's tile parameters (the kernel's #defines besides the problem size)."""

    kernel: str = "tma"
    bm: int = 128
    bn: int = 128
    bk: int = 16
    tm: int = 16
    tn: int = 8
    stages: int = 4
    splitk: int = 1
    swizzle: int = 8
    min_blocks: int = 1
    vec: int = 4
    order: int = 0
    acc_layout: str = "rows"

    @property
    def threads(self) -> int:
        return 32 * (self.bm // (8 * self.tm)) * (self.bn // (4 * self.tn))

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the ring (the epilogue parks the C tile there too, so at least a
        tile), then (TMA) one mbarrier and one counter per stage."""
        ring = self.stages * 4 * (self.bm + self.bn) * self.bk
        tile = 4 * self.bm * self.bn
        return max(ring, tile) + (16 * self.stages if self.kernel == "tma" else 0)

    def label(self) -> str:
        extra = f" splitk{self.splitk}" if self.splitk > 1 else ""
        vec = " vec1" if self.vec == 1 else ""
        order = f" o{self.order}" if self.order else ""
        layout = f" acc-{self.acc_layout}" if self.acc_layout != "rows" else ""
        return (
            f"{self.kernel} {self.bm}x{self.bn}x{self.bk} t{self.tm}x{self.tn} "
            f"s{self.stages} w{self.swizzle}{extra}{vec}{order}{layout}"
        )

    def problems(self) -> list[str]:
        """What makes the tile unusable, independent of the problem size (empty if fine)."""
        why = []
        if self.kernel not in KERNEL_NAMES:
            why.append(f"kernel {self.kernel!r} is not one of {', '.join(KERNEL_NAMES)}")
        if self.tm % 4 or self.bk % 4 or self.bm % (8 * self.tm) or self.bn % (4 * self.tn):
            why.append(
                "tile must hold whole 8x4-lane warps of TMxTN, with TM and BK multiples of 4"
            )
        if self.kernel == "tma" and max(self.bm, self.bn, self.bk) > 256:
            why.append("TMA boxes are at most 256 elements a side")
        if (
            self.kernel == "cpasync"
            and self.threads
            and (
                (self.bm * self.bk // self.vec) % self.threads
                or (self.bn * self.bk // self.vec) % self.threads
            )
        ):
            why.append("cp.async chunks must split evenly over the threads")
        if not 0 < self.threads <= 1024:
            why.append(f"{self.threads} threads per block")
        if self.order not in FMA_ORDERS:
            why.append(f"FMA order {self.order} is not one of {sorted(FMA_ORDERS)}")
        layout = AccLayout.parse(self.acc_layout)
        if layout is None:
            why.append(
                f"accumulator layout {self.acc_layout!r} is neither one of "
                f"{', '.join(NAMED_ACC_LAYOUTS)} nor blocks spelled like 4x4 or 4x4/cr"
            )
        elif any(
            block and extent % block
            for block, extent in ((layout.block_m, self.tm), (layout.block_n, self.tn))
        ):
            why.append(f"accumulator blocks {self.acc_layout} do not tile t{self.tm}x{self.tn}")
        return why

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Config:
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        return cls(**known)


# ----- strategy tables ---------------------------------------------------------------------------


def arch_of(cc: str) -> str:
    """'9.0', '90' or 'sm_90' -> '90'."""
    digits = cc.removeprefix("sm_").replace(".", "")
    if not digits.isdigit() or len(digits) < 2:
        raise AuditError(f"not a compute capability: {cc!r}")
    return digits


def table_path(cc: str) -> Path:
    """The shipped table for this architecture: its own, else the newest older one shipped."""
    arch = int(arch_of(cc))
    shipped = sorted(
        (int(p.stem.removeprefix("strategy_sm")), p) for p in DATA_DIR.glob("strategy_sm*.json")
    )
    usable = [path for number, path in shipped if number <= arch]
    if not usable:
        raise AuditError(f"no reference strategy table for sm_{arch} in {DATA_DIR}")
    return usable[-1]


@functools.lru_cache(maxsize=16)
def load_table(path: Path) -> tuple[tuple[int, int, Config], ...]:
    """(size, batch, config) entries of a strategy table file."""
    try:
        data = json.loads(path.read_text())
        return tuple(
            (int(e["size"]), int(e["batch"]), Config.from_json(e["config"]))
            for e in data["entries"]
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AuditError(f"unreadable strategy table {path}: {exc}") from exc


def strategy_for(cc: str, m: int, n: int, k: int, batch: int, table: Path | None = None) -> Config:
    """The table's nearest entry (size first, then batch, on a log scale), fitted to the problem."""
    entries = load_table(table or table_path(cc))
    if not entries:
        raise AuditError("empty reference strategy table")
    size = max(m, n)

    def distance(entry: tuple[int, int, Config]) -> tuple[float, float]:
        return (abs(math.log2(entry[0] / size)), abs(math.log2(entry[1] / batch)))

    return fit(min(entries, key=distance)[2], cc, m, n, k)


def fit(config: Config, cc: str, m: int, n: int, k: int) -> Config:
    """Adapts a tile to the GPU and problem: kernel family, copy width, split-K that has work."""
    tma_ok = int(arch_of(cc)) >= 90 and m % 4 == 0 and k % 4 == 0
    kernel = "tma" if config.kernel == "tma" and tma_ok else "cpasync"
    vec = 4 if m % 4 == 0 and k % 4 == 0 else 1
    k_tiles = -(-k // config.bk)
    splitk = max(1, min(config.splitk, k_tiles))
    fitted = replace(config, kernel=kernel, vec=vec, splitk=splitk)
    if kernel == "cpasync":
        # ptxas spills the cp.async kernel's address arithmetic under a 2-blocks register cap, and
        # with 4-byte copies next to a 16x8 register tile.
        fitted = replace(fitted, min_blocks=1)
        if vec == 1 and fitted.tm > 8:
            fitted = replace(fitted, bm=128, bn=128, tm=8, tn=8, stages=3)
    if fitted.problems():  # a TMA tile may not split evenly into cp.async chunks: use a safe one
        fitted = replace(FALLBACK, vec=vec, splitk=splitk)
    return fitted


FALLBACK = Config(kernel="cpasync", bm=64, bn=64, bk=16, tm=8, tn=4, stages=3)


# ----- source and compilation --------------------------------------------------------------------


def source_for(config: Config, m: int, n: int, k: int) -> str:
    """A self-contained source: the problem's #defines, then the kernel with its header inlined
    (inlined rather than #included so that CuPy's cache key, the source text, changes with it)."""
    values = {
        "M": m,
        "N": n,
        "K": k,
        "BM": config.bm,
        "BN": config.bn,
        "BK": config.bk,
        "TM": config.tm,
        "TN": config.tn,
        "STAGES": config.stages,
        "SWIZZLE": config.swizzle,
        "MIN_BLOCKS": config.min_blocks,
        "VEC": config.vec,
        "ORDER": config.order,
    }
    layout = AccLayout.parse(config.acc_layout)
    if layout is not None:  # an unknown layout is reported by Config.problems()
        values |= layout.defines(config.tm, config.tn)
    defines = "".join(f"#define {name} {value}\n" for name, value in values.items())
    header = (KERNEL_DIR / COMMON_HEADER).read_text()
    body = (KERNEL_DIR / SOURCES[config.kernel]).read_text()
    return defines + body.replace(f'#include "{COMMON_HEADER}"', header)


@dataclass(frozen=True)
class Kernels:
    """One compiled specialization: the SGEMM and the kernel that zeroes the tiles it splits."""

    sgemm: Any
    zero: Any


@functools.lru_cache(maxsize=256)
def _kernel(source: str, name: str, smem_bytes: int) -> Kernels:
    import cupy

    # CuPy adds -arch=sm_<cc> (cubin) itself; TMA and mbarrier need only plain sm_90.
    module = cupy.RawModule(code=source, options=("-std=c++17",))
    kernel = module.get_function(name)
    if smem_bytes > 48 * 1024:  # above 48 KB a kernel must opt in to more dynamic shared memory
        kernel.max_dynamic_shared_size_bytes = smem_bytes
    return Kernels(kernel, module.get_function(ZERO_KERNEL))


def build(config: Config, m: int, n: int, k: int) -> Kernels:
    """The compiled kernels of one specialization (cached in the process and on disk)."""
    _require_gpu()
    return _kernel(source_for(config, m, n, k), KERNEL_NAMES[config.kernel], config.smem_bytes)


# ----- work units --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Units:
    """How one launch covers the batch's `tiles` output tiles (the kernel's `Unit`): the first
    `whole` tiles one CTA each, every later tile `split` CTAs over equal runs of its k tiles, whose
    partial sums are added into C after the zero kernel cleared those tiles."""

    tiles: int
    whole: int
    split: int = 1

    @property
    def ctas(self) -> int:
        return self.whole + (self.tiles - self.whole) * self.split

    @property
    def zeroed(self) -> int:
        """Tiles that receive partial sums and must be zeroed first."""
        return self.tiles - self.whole if self.split > 1 else 0


def balanced_units(tiles: int, k_tiles: int, slots: int, unit_cost: float) -> Units:
    """Whole tiles, unless splitting the tiles of the last wave over idle SMs shortens the launch.

    With `slots` CTAs resident at once, `tiles` whole tiles take ceil(tiles / slots) rounds of
    (k_tiles + unit_cost) k-tile times; a launch whose last round is part-empty leaves SMs idle for
    a whole tile's time (8192^3 in 128x256 tiles on 132 SMs: 15 full rounds and 68 tiles).
    Splitting the last `tail` tiles (the part round, or it and one or two full rounds before it)
    into `split` runs of k tiles spreads that work over every slot, where the part round holds at
    least MIN_TAIL_SHARE of the slots' worth of tiles. Among the splits within
    BALANCE_SLACK of the shortest estimated makespan, the one with the fewest partial sums wins
    (each costs an atomic pass over a tile), if it beats whole tiles by MIN_BALANCE_GAIN."""
    if tiles % slots < MIN_TAIL_SHARE * slots:
        return Units(tiles, tiles)
    whole_unit = k_tiles + unit_cost
    plain_span = -(-tiles // slots) * whole_unit
    options = []
    for tail in (tiles % slots + j * slots for j in range(3)):
        if not 0 < tail <= tiles:
            continue
        before = (tiles - tail) // slots * whole_unit
        for split in range(2, k_tiles + 1):
            span = before + -(-tail * split // slots) * (-(-k_tiles // split) + unit_cost)
            options.append((span, tail * split, Units(tiles, tiles - tail, split)))
    if not options:
        return Units(tiles, tiles)
    shortest = min(span for span, _, _ in options)
    if shortest > plain_span * (1 - MIN_BALANCE_GAIN):
        return Units(tiles, tiles)
    near = [option for option in options if option[0] <= shortest + BALANCE_SLACK * plain_span]
    return min(near, key=lambda option: option[1])[2]


def units_for(config: Config, tiles: int, k: int, slots: int) -> Units:
    """The table's split-K (small problems: every tile), or a balanced last wave."""
    if config.splitk > 1:
        return Units(tiles, 0, config.splitk)
    unit_cost = UNIT_OVERHEAD_FLOP / (2 * config.bm * config.bn * config.bk)
    return balanced_units(tiles, -(-k // config.bk), slots, unit_cost)


def resident_ctas(kernel: Any, threads: int, smem_bytes: int) -> int:
    """CTAs of this kernel the whole GPU holds at once (the driver's occupancy calculation)."""
    from cuda.bindings import driver

    cupy = _require_gpu()
    err, per_sm = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        driver.CUfunction(kernel.kernel.ptr), threads, smem_bytes
    )
    if err != driver.CUresult.CUDA_SUCCESS or per_sm < 1:
        raise AuditError(f"the reference kernel cannot be resident on this GPU ({err})")
    return int(per_sm) * int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def build_all(specializations: Iterable[tuple[Config, int, int, int]], workers: int = 8) -> None:
    """Builds (config, m, n, k) specializations at once: NVRTC runs outside the GIL, so a cold
    kernel cache costs one compile's time per `workers` modules, not one per module. A build that
    fails is left for its first use to meet again and report."""

    def attempt(item: tuple[Config, int, int, int]) -> None:
        with contextlib.suppress(Exception):
            build(*item)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(attempt, set(specializations)))


def precompile(problems: Iterable[tuple[int, int, int, int]]) -> None:
    """Builds the strategy table's specialization of every (m, n, k, batch): a sweep's first,
    cold-cache run compiles in parallel, not case by case."""
    cc = device_cc()
    build_all((strategy_for(cc, m, n, k, batch), m, n, k) for m, n, k, batch in problems)


def _require_gpu() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise ToolMissingError(f"the reference kernel needs cupy ({exc})") from exc
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise ToolMissingError("the reference kernel needs a CUDA GPU; none is visible")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise ToolMissingError(f"the reference kernel needs a CUDA GPU: {exc}") from exc
    return cupy


def device_cc() -> str:
    return str(_require_gpu().cuda.Device().compute_capability)


# ----- launch ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """A prepared reference call on the current CuPy stream. Calling it computes c = a x b:
    `zero` clears the tiles that receive partial sums (nothing when no tile is split), then
    `sgemm` runs the kernel; a profiler can take the two apart to see the SGEMM alone."""

    zero: Callable[[], None]
    sgemm: Callable[[], None]

    def __call__(self) -> None:
        self.zero()
        self.sgemm()


def prepare(
    m: int, n: int, k: int, batch: int, a: Any, b: Any, c: Any, config: Config | None = None
) -> Launch:
    """The launcher computing c = a x b."""
    import numpy

    cupy = _require_gpu()
    _check_operands(m, n, k, batch, a, b, c)
    cc = device_cc()
    config = fit(config, cc, m, n, k) if config else strategy_for(cc, m, n, k, batch)
    limit = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    if config.smem_bytes > limit:
        raise AuditError(f"{config.label()} needs {config.smem_bytes} B of shared memory > {limit}")
    kernels = build(config, m, n, k)
    tiles = -(-m // config.bm) * -(-n // config.bn) * batch
    slots = resident_ctas(kernels.sgemm, config.threads, config.smem_bytes)
    units = units_for(config, tiles, k, slots)
    if config.kernel == "tma":
        operands: tuple[Any, ...] = (
            _tensor_map(a.data.ptr, (m, k, batch), (config.bm, config.bk)),
            _tensor_map(b.data.ptr, (k, n, batch), (config.bk, config.bn)),
            c,
        )
    else:
        operands = (a, b, c)
    args = (*operands, numpy.int32(units.whole), numpy.int32(units.split))
    zero_args = (c, numpy.int32(units.whole))

    def zero() -> None:
        if units.zeroed:
            kernels.zero((units.zeroed,), (256,), zero_args)

    def sgemm() -> None:
        kernels.sgemm((units.ctas,), (config.threads,), args, shared_mem=config.smem_bytes)

    return Launch(zero, sgemm)


def _check_operands(m: int, n: int, k: int, batch: int, a: Any, b: Any, c: Any) -> None:
    for name, array, shape in (
        ("a", a, (batch, k, m)),
        ("b", b, (batch, n, k)),
        ("c", c, (batch, n, m)),
    ):
        if tuple(array.shape) != shape or array.dtype.name != "float32":
            raise AuditError(f"{name}: expected float32 {shape}, got {array.dtype} {array.shape}")
        if not array.flags.c_contiguous:
            raise AuditError(f"{name}: must be C-contiguous")


def _tensor_map(ptr: int, dims: tuple[int, int, int], box: tuple[int, int]) -> Any:
    """A 3-D FP32 tensor map (rows, columns, batch) of a column-major batch, as the 128 raw bytes
    that the kernel's __grid_constant__ parameter takes by value (a one-element numpy array is
    passed by value by CuPy's launcher)."""
    import numpy

    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise ToolMissingError(f"the TMA reference kernel needs cuda-bindings ({exc})") from exc
    rows, cols, _ = dims
    strides = (rows * 4, rows * cols * 4)  # bytes, of dims 1 and 2
    err, tmap = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        3,
        ptr,
        [driver.cuuint64_t(d) for d in dims],
        [driver.cuuint64_t(s) for s in strides],
        [driver.cuuint32_t(x) for x in (*box, 1)],
        [driver.cuuint32_t(1)] * 3,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != driver.CUresult.CUDA_SUCCESS:
        raise AuditError(f"cuTensorMapEncodeTiled{(dims, box)} failed: {err}")
    raw = ctypes.string_at(tmap.getPtr(), 128)
    return numpy.frombuffer(raw, dtype=numpy.dtype((numpy.void, 128))).copy()


# ----- correctness -------------------------------------------------------------------------------


def random_operands(
    m: int, n: int, k: int, batch: int, seed: int | None = None
) -> tuple[Any, Any, Any]:
    """Fresh standard-normal A and B (never zeros) and a NaN-poisoned C, in the probe's layout."""
    cupy = _require_gpu()
    rng = cupy.random.default_rng(seed)
    a = rng.standard_normal((batch, k, m), dtype=cupy.float32)
    b = rng.standard_normal((batch, n, k), dtype=cupy.float32)
    c = cupy.full((batch, n, m), cupy.nan, dtype=cupy.float32)
    return a, b, c


def relative_error(a: Any, b: Any, c: Any, seed: int = 0) -> float:
    """max over batch entries of ||C - A.B||_F / ||A.B||_F against float64, NaN if any output
    element is not finite (the output was poisoned with NaN: an unwritten element shows).
    Large outputs compare CHECK_COLUMNS random columns per entry; small ones compare all."""
    import numpy

    cupy = _require_gpu()
    if not bool(cupy.isfinite(c).all()):
        return math.nan
    batch, n, m = c.shape
    rng = numpy.random.default_rng(seed)
    worst = 0.0
    for i in range(batch):
        picked = numpy.arange(n) if m * n <= CHECK_FULL else rng.permutation(n)[:CHECK_COLUMNS]
        cols = cupy.asarray(picked)
        # Rows of b[i] are columns of B, rows of c[i] columns of C: C[:, cols]^T = B[:, cols]^T A^T.
        exact = b[i][cols].astype(cupy.float64) @ a[i].astype(cupy.float64)
        diff = c[i][cols].astype(cupy.float64) - exact
        worst = max(worst, float(cupy.linalg.norm(diff) / cupy.linalg.norm(exact)))
    return worst


def checked(launch: Callable[[], None], a: Any, b: Any, c: Any) -> float:
    """Poisons c, runs the launcher once and returns its relative error."""
    cupy = _require_gpu()
    c.fill(cupy.nan)
    launch()
    cupy.cuda.get_current_stream().synchronize()
    return relative_error(a, b, c)


# ----- cuBLAS and comparison ---------------------------------------------------------------------


class _CublasCall:
    """cublasSgemm (batch 1) or cublasSgemmStridedBatched on the same arrays, alpha 1, beta 0,
    host pointer mode; holds the host scalars for as long as the launcher lives."""

    def __init__(self, m: int, n: int, k: int, batch: int, a: Any, b: Any, c: Any) -> None:
        import numpy

        cupy = _require_gpu()
        from cupy_backends.cuda.libs import cublas

        self.cublas = cublas
        self.handle = cupy.cuda.device.get_cublas_handle()
        cublas.setPointerMode(self.handle, cublas.CUBLAS_POINTER_MODE_HOST)
        self.scalars = numpy.array([1.0, 0.0], dtype=numpy.float32)
        self.shape = (m, n, k, batch)
        self.pointers = (a.data.ptr, b.data.ptr, c.data.ptr)

    def __call__(self) -> None:
        blas, (m, n, k, batch), (pa, pb, pc) = self.cublas, self.shape, self.pointers
        alpha = self.scalars.ctypes.data
        beta = alpha + 4
        op_n = blas.CUBLAS_OP_N
        if batch == 1:
            blas.sgemm(self.handle, op_n, op_n, m, n, k, alpha, pa, m, pb, k, beta, pc, m)
            return
        blas.sgemmStridedBatched(
            self.handle,
            op_n,
            op_n,
            m,
            n,
            k,
            alpha,
            pa,
            m,
            m * k,
            pb,
            k,
            k * n,
            beta,
            pc,
            m,
            m * n,
            batch,
        )


def cublas_launcher(
    m: int, n: int, k: int, batch: int, a: Any, b: Any, c: Any
) -> Callable[[], None]:
    return _CublasCall(m, n, k, batch, a, b, c)


@dataclass(frozen=True)
class Comparison:
    """One problem: the reference against cuBLAS, timed interleaved (median of >= 20)."""

    m: int
    n: int
    k: int
    batch: int
    config: str
    ref_ms: float
    cublas_ms: float
    ref_error: float
    cublas_error: float

    @property
    def efficiency(self) -> float:
        """cuBLAS time / reference time: above 1 the reference is faster."""
        return self.cublas_ms / self.ref_ms

    @property
    def ref_tflops(self) -> float:
        return 2e-9 * self.m * self.n * self.k * self.batch / self.ref_ms

    @property
    def cublas_tflops(self) -> float:
        return 2e-9 * self.m * self.n * self.k * self.batch / self.cublas_ms

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "efficiency": self.efficiency,
            "ref_tflops": self.ref_tflops,
            "cublas_tflops": self.cublas_tflops,
        }


def compare(
    m: int, n: int, k: int, batch: int, config: Config | None = None, min_reps: int = 20
) -> Comparison:
    """Checks both contenders on fresh random inputs, then times them interleaved."""
    from cublas_audit.timing import time_interleaved

    a, b, c = random_operands(m, n, k, batch)
    ref_c = c.copy()
    cc = device_cc()
    chosen = fit(config, cc, m, n, k) if config else strategy_for(cc, m, n, k, batch)
    ref = prepare(m, n, k, batch, a, b, ref_c, chosen)
    blas = cublas_launcher(m, n, k, batch, a, b, c)
    ref_error, blas_error = checked(ref, a, b, ref_c), checked(blas, a, b, c)
    if not ref_error <= TOLERANCE:
        raise AuditError(
            f"reference {chosen.label()} wrong at {m}x{n}x{k} batch {batch}: "
            f"relative error {ref_error:.3g} > {TOLERANCE:g}"
        )
    times = time_interleaved({"ref": ref, "cublas": blas}, min_reps)
    return Comparison(
        m,
        n,
        k,
        batch,
        chosen.label(),
        times["ref"].median_ms,
        times["cublas"].median_ms,
        ref_error,
        blas_error,
    )


# ----- tuning ------------------------------------------------------------------------------------


def candidates(cc: str, m: int, n: int, k: int, batch: int) -> list[Config]:
    """The tile space searched for one problem on this architecture, fitted and deduplicated."""
    kernel = "tma" if int(arch_of(cc)) >= 90 else "cpasync"
    tiles = [
        (256, 128, 16, 16, 8, 4, 1),
        (128, 256, 16, 16, 8, 4, 1),
        (256, 128, 32, 16, 8, 3, 1),
        (128, 256, 32, 16, 8, 3, 1),
        (128, 128, 16, 16, 8, 4, 1),
        (128, 128, 32, 16, 8, 4, 1),
        (128, 128, 16, 8, 8, 4, 2),
        (128, 64, 16, 8, 8, 4, 2),
        (64, 64, 16, 8, 4, 4, 1),
    ]
    work = m * n * batch
    splits = [1, 2, 4, 8] if work <= 1024 * 1024 * 4 else [1]
    found: dict[Config, None] = {}
    for bm, bn, bk, tm, tn, stages, min_blocks in tiles:
        for splitk in splits:
            for swizzle in (8, 16) if work >= 4096 * 4096 else (8,):
                raw = Config(kernel, bm, bn, bk, tm, tn, stages, splitk, swizzle, min_blocks)
                found[fit(raw, cc, m, n, k)] = None
    return list(found)


def time_alone(launch: Callable[[], None], reps: int = 10) -> float:
    """Median ms of `reps` CUDA-event-timed calls after one discarded call (tuning only)."""
    cupy = _require_gpu()
    stream = cupy.cuda.get_current_stream()
    samples = []
    for _ in range(reps + 1):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        launch()
        stop.record(stream)
        stop.synchronize()
        samples.append(float(cupy.cuda.get_elapsed_time(start, stop)))
    return statistics.median(samples[1:])


def tune_problem(
    m: int,
    n: int,
    k: int,
    batch: int,
    space: Sequence[Config],
    deadline: float,
    log: Callable[[str], None],
) -> Config | None:
    """The fastest correct config of `space` (search_space's order) for one problem, measured in
    that order until `deadline` (time.monotonic)."""
    best: tuple[float, Config] | None = None
    a, b, c = random_operands(m, n, k, batch)
    for config in space:
        if time.monotonic() > deadline:
            log(f"  time budget spent at {m}x{n}x{k} batch {batch}")
            break
        try:
            launch = prepare(m, n, k, batch, a, b, c, config)
            error = checked(launch, a, b, c)
            if not error <= TOLERANCE:
                log(f"  {config.label()}: WRONG, relative error {error:.3g}")
                continue
            ms = time_alone(launch)
        except Exception as exc:  # one failing tile must not stop the search
            log(f"  {config.label()}: failed: {type(exc).__name__}: {exc}".splitlines()[0])
            continue
        log(f"  {config.label()}: {ms:.4f} ms")
        if best is None or ms < best[0]:
            best = (ms, config)
    return best[1] if best else None


def search_space(cc: str, m: int, n: int, k: int, batch: int) -> list[Config]:
    """The current table's pick first, then its tile in every accumulator layout and FMA order
    (the pick's order first), then every other candidate tile (in the pick's order and layout): a
    short budget still refines the pick."""
    current = strategy_for(cc, m, n, k, batch)
    orders = dict.fromkeys([current.order, *FMA_ORDERS])
    layouts = dict.fromkeys([current.acc_layout, *ACC_LAYOUTS])
    loops = [replace(current, order=o, acc_layout=x) for o in orders for x in layouts]
    tiles = [
        replace(x, order=current.order, acc_layout=current.acc_layout)
        for x in candidates(cc, m, n, k, batch)
    ]
    return list(dict.fromkeys([current, *loops, *tiles]))


def tune(
    sizes: Sequence[int], batches: Sequence[int], budget_s: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """This GPU's strategy table with the fastest tile of each (size, batch) searched, square
    problems. Every candidate is compiled first, in parallel and off the clock; the budget is for
    measuring, each problem getting an equal share (what one leaves unused passes to the next).
    Entries of the current table that were not searched, or where nothing was measured in time,
    stay as they were."""
    cc = device_cc()
    spaces = {
        (size, batch): search_space(cc, size, size, size, batch)
        for size in sizes
        for batch in batches
    }
    log(f"compiling the candidates of {len(spaces)} problems")
    build_all((config, size, size, size) for (size, _), space in spaces.items() for config in space)
    start = time.monotonic()
    measured: dict[tuple[int, int], Config] = {}
    for i, ((size, batch), space) in enumerate(spaces.items()):
        log(f"tuning {size}^3 batch {batch}")
        deadline = start + budget_s * (i + 1) / len(spaces)
        best = tune_problem(size, size, size, batch, space, deadline, log)
        if best is not None:
            measured[(size, batch)] = best
    return merged_table(cc, measured, list(spaces))


def merged_table(
    cc: str, measured: dict[tuple[int, int], Config], searched: Sequence[tuple[int, int]]
) -> dict[str, Any]:
    """The current table with the measured entries replaced or added, its source saying which."""
    entries = {(size, batch): config for size, batch, config in load_table(table_path(cc))}
    entries.update(measured)
    sizes = sorted({size for size, _ in measured})
    source = (
        f"cublas-audit reference --tune on {len(measured)} of {len(searched)} searched problems "
        f"(sizes {', '.join(map(str, sizes)) or 'none'}); other entries as before"
    )
    return {
        "arch": f"sm_{arch_of(cc)}",
        "source": source,
        "entries": [
            {"size": size, "batch": batch, "config": config.to_json()}
            for (size, batch), config in sorted(entries.items())
        ],
    }


def write_table(table: dict[str, Any], out: Path | None) -> Path:
    path = out or DATA_DIR / f"strategy_{table['arch'].replace('_', '')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    load_table.cache_clear()
    return path


def comparisons(
    sizes: Iterable[int],
    batches: Sequence[int],
    log: Callable[[str], None],
    min_reps: int = 20,
) -> list[Comparison]:
    """compare() over a grid of square problems. A missing tool or a wrong result stops it; any
    other failure (out of memory, a launch error) is logged and the grid goes on."""
    rows = []
    for size in sizes:
        for batch in batches:
            try:
                rows.append(compare(size, size, size, batch, min_reps=min_reps))
            except AuditError:
                raise
            except Exception as exc:
                log(f"{size} batch {batch}: {type(exc).__name__}: {exc}".splitlines()[0])
    return rows


def markdown(rows: Sequence[Comparison]) -> str:
    """The comparison as a Markdown table, one row per problem."""
    from tabulate import tabulate

    body = [
        [
            f"{r.m}x{r.n}x{r.k}",
            r.batch,
            r.config,
            f"{r.ref_ms:.4f}",
            f"{r.cublas_ms:.4f}",
            f"{r.efficiency:.3f}",
            f"{r.ref_tflops:.1f}",
            f"{r.cublas_tflops:.1f}",
            f"{r.ref_error:.1e}",
        ]
        for r in rows
    ]
    headers = ["size", "batch", "config", "ref ms", "cuBLAS ms", "efficiency", "ref TFLOP/s"]
    headers += ["cuBLAS TFLOP/s", "ref rel. error"]
    return str(tabulate(body, headers=headers, tablefmt="github"))
