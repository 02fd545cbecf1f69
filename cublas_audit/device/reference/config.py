"""The reference SGEMM's configuration: tile parameters, the per-architecture strategy tables, and
how a table entry is fitted to a problem and split into work units. Pure Python: no GPU needed.

Tile shapes come from a per-architecture strategy table (cublas_audit/data/strategy_sm<cc>.json)
that `cublas-audit reference --tune` writes. GPUs of compute capability 9.0 and newer run the TMA
kernel; older ones, and sizes TMA cannot describe (M or K not a multiple of 4), the cp.async kernel.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError

DATA_DIR = Path(__file__).resolve().parent.parent.parent / "data"
KERNEL_NAMES = {"tma": "cublas_audit_ref_tma_sgemm", "cpasync": "cublas_audit_ref_cpasync_sgemm"}
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
