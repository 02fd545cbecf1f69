"""How a reference launch covers the batch's tiles: whole tiles, and the last wave split over idle
SMs when that shortens the launch. Pure arithmetic on the H100's shape (132 SMs, one 128x256x32
CTA per SM), checked against the kernel's own decoding of its work units (Unit in
reference_kernels/sgemm_common.cuh, mirrored below)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import takewhile

import pytest

from cublas_audit.device.reference.bench import search_space
from cublas_audit.device.reference.build import Launch, source_for
from cublas_audit.device.reference.config import (
    ACC_LAYOUTS,
    FMA_ORDERS,
    MIN_BALANCE_GAIN,
    Config,
    Units,
    balanced_units,
    strategy_for,
    units_for,
)

H100_SLOTS = 132
LARGE = Config(bm=128, bn=256, bk=32, tm=16, tn=8, stages=3, order=1)


def tiles(size: int, batch: int, config: Config = LARGE) -> int:
    return -(-size // config.bm) * -(-size // config.bn) * batch


def decode(units: Units, k_tiles: int) -> Counter[tuple[int, int]]:
    """(tile, k tile) -> how many CTAs compute it, as the kernel's Unit decodes blockIdx.x."""
    covered: Counter[tuple[int, int]] = Counter()
    for u in range(units.ctas):
        tile, slice_, parts = u, 0, 1
        if u >= units.whole:
            tile = units.whole + (u - units.whole) // units.split
            slice_, parts = (u - units.whole) % units.split, units.split
        first = slice_ * k_tiles // parts
        for kt in range(first, (slice_ + 1) * k_tiles // parts):
            covered[(tile, kt)] += 1
    return covered


@pytest.mark.parametrize(("size", "batch"), [(8192, 1), (4096, 1), (4096, 4), (2048, 8)])
def test_a_part_empty_last_wave_is_split_over_the_idle_sms(size: int, batch: int) -> None:
    count = tiles(size, batch)
    units = units_for(LARGE, count, size, H100_SLOTS)
    assert units.split > 1
    assert (count - units.whole) % H100_SLOTS == count % H100_SLOTS  # the part wave, and maybe
    assert units.zeroed == count - units.whole  # full ones before it; those tiles get zeroed


@pytest.mark.parametrize(("size", "batch"), [(4096, 8), (8192, 4), (8192, 8), (8192, 16)])
def test_a_few_leftover_tiles_stay_whole(size: int, batch: int) -> None:
    # 4, 8, 16 or 0 tiles past the last full wave: splitting them measured no faster on the H100
    count = tiles(size, batch)
    assert units_for(LARGE, count, size, H100_SLOTS) == Units(count, count)


def test_splitting_shortens_the_estimated_launch() -> None:
    k_tiles, cost = 256, 0.5
    units = balanced_units(2048, k_tiles, H100_SLOTS, cost)
    rounds_whole = -(-units.whole // H100_SLOTS)
    rounds_split = -(-(units.tiles - units.whole) * units.split // H100_SLOTS)
    span = rounds_whole * (k_tiles + cost) + rounds_split * (-(-k_tiles // units.split) + cost)
    plain = -(-2048 // H100_SLOTS) * (k_tiles + cost)
    assert span <= plain * (1 - MIN_BALANCE_GAIN)


@pytest.mark.parametrize(
    "units",
    [
        Units(2048, 1980, 13),
        Units(512, 396, 10),
        Units(37, 0, 4),
        Units(100, 100),
    ],
)
def test_every_k_tile_of_every_tile_is_computed_once(units: Units) -> None:
    k_tiles = 128
    covered = decode(units, k_tiles)
    assert set(covered.values()) == {1}
    assert set(covered) == {(t, kt) for t in range(units.tiles) for kt in range(k_tiles)}


def test_table_split_k_splits_every_tile() -> None:
    config = Config(bm=128, bn=64, bk=16, tm=8, tn=8, splitk=4)
    assert units_for(config, 32, 512, H100_SLOTS) == Units(32, 0, 4)


def test_fma_order_is_a_checked_parameter() -> None:
    assert Config(order=3).problems()
    assert " o1" in LARGE.label()
    assert "#define ORDER 1" in source_for(LARGE, 4096, 4096, 4096)


def layout_defines(config: Config) -> list[str]:
    """The accumulator #defines that source_for puts in front of the kernel."""
    source = source_for(config, 4096, 4096, 4096).splitlines()
    prefix = takewhile(lambda line: line.startswith("#define "), source)
    return [line for line in prefix if line.startswith("#define ACC_")]


def test_accumulator_layout_is_a_checked_parameter_of_the_source_and_the_table() -> None:
    blocks = replace(LARGE, acc_layout="blocks")
    assert layout_defines(LARGE) == [  # rows: one 16 x 8 block, row by row
        "#define ACC_BLOCK_M 16",
        "#define ACC_BLOCK_N 8",
        "#define ACC_BLOCKS_BY_COLUMN 0",
        "#define ACC_BY_COLUMN 0",
    ]
    assert layout_defines(blocks)[:2] == ["#define ACC_BLOCK_M 4", "#define ACC_BLOCK_N 4"]
    assert blocks.label().endswith(" o1 acc-blocks") and "acc-" not in LARGE.label()
    assert Config.from_json(blocks.to_json()) == blocks
    # Tables written before the parameter existed read as row-by-row layout.
    legacy = {k: v for k, v in LARGE.to_json().items() if k != "acc_layout"}
    assert Config.from_json(legacy) == LARGE
    assert replace(LARGE, acc_layout="diagonal").problems()
    assert replace(LARGE, acc_layout="blocks", tn=2, bn=64).problems()


@pytest.mark.parametrize(
    ("spelled", "named"),
    [("4x4", "blocks"), ("4x4/rr", "blocks"), ("16x2", "pairs"), ("16x8/rc", "columns")],
)
def test_a_spelled_accumulator_layout_compiles_like_the_named_one(spelled: str, named: str) -> None:
    assert layout_defines(replace(LARGE, acc_layout=spelled)) == layout_defines(
        replace(LARGE, acc_layout=named)
    )


def test_spelled_accumulator_blocks_set_their_orders_and_must_tile_the_register_tile() -> None:
    assert layout_defines(replace(LARGE, acc_layout="8x2/cr")) == [
        "#define ACC_BLOCK_M 8",
        "#define ACC_BLOCK_N 2",
        "#define ACC_BLOCKS_BY_COLUMN 1",
        "#define ACC_BY_COLUMN 0",
    ]
    assert not replace(LARGE, acc_layout="8x2/cr").problems()
    for bad in ("3x4", "4x16", "4x4/rx", "4x4/", "x4"):
        assert replace(LARGE, acc_layout=bad).problems(), bad


def test_the_tuner_tries_the_pick_first_then_every_layout_and_order_of_its_tile() -> None:
    pick = strategy_for("90", 8192, 8192, 8192, 8)
    space = search_space("90", 8192, 8192, 8192, 8)
    loops = len(FMA_ORDERS) * len(ACC_LAYOUTS)
    assert space[0] == pick and len(space) == len(set(space))
    assert {(c.order, c.acc_layout) for c in space[:loops]} == {
        (o, x) for o in FMA_ORDERS for x in ACC_LAYOUTS
    }
    assert all(
        replace(c, order=pick.order, acc_layout=pick.acc_layout) == pick for c in space[:loops]
    )
    assert all(c.order == pick.order for c in space[: len(ACC_LAYOUTS)])
    tiles = space[loops:]
    assert tiles and all((c.order, c.acc_layout) == (pick.order, pick.acc_layout) for c in tiles)
    assert all(not c.problems() for c in space)


def test_a_launch_clears_the_split_tiles_before_the_sgemm() -> None:
    calls: list[str] = []
    launch = Launch(lambda: calls.append("zero"), lambda: calls.append("sgemm"))
    launch()
    assert calls == ["zero", "sgemm"]
