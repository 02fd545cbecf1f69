"""The reference SGEMM on a GPU: right on fresh random inputs, every output element written.

Each case draws new standard-normal A and B (device.operands.make), poisons C with NaN, runs the
reference once and compares with a float64 product (normwise relative error at most 1e-5); a NaN
left anywhere in C fails it. Sizes that are not multiples of any tile, odd batches and non-square
problems included.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cublas_audit.device import operands
from cublas_audit.device.reference import bench, build
from cublas_audit.device.reference.config import ACC_LAYOUTS, FMA_ORDERS, Config, strategy_for

pytestmark = pytest.mark.gpu

# Stricter than the fp32 mode's tolerance (modes.py, 3e-5, which bench.compare applies): the
# reference kernel accumulates in FP32 like cuBLAS, and over K=8192 lands near 1e-6.
TOLERANCE = 1e-5

PROBLEMS = [
    (256, 256, 256, 1),
    (1000, 1000, 1000, 1),
    (1023, 1023, 1023, 3),
    (1024, 1024, 1024, 4),
    (3000, 3000, 3000, 1),
    (2999, 3001, 3003, 2),
    (4096, 4096, 4096, 3),
    (1024, 520, 1000, 3),
    (72, 4100, 36, 1),
    (512, 512, 512, 7),
]


def fp32(m: int, n: int, k: int, batch: int) -> operands.Operands:
    return operands.make("fp32", m, n, k, batch)


def assert_each_is_correct(configs: list[Config], m: int, n: int, k: int, batch: int) -> None:
    """Every config, built at once, computes one fresh random problem within TOLERANCE."""
    build.build_all((config, m, n, k) for config in configs)
    ops = fp32(m, n, k, batch)
    for config in configs:
        launch = build.prepare(m, n, k, batch, ops.a, ops.b, ops.c, config)
        error = operands.checked(launch, ops)
        assert error <= TOLERANCE, f"{config.label()}: relative error {error}"


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    """Every table pick built at once, in parallel, before the first test needs one."""
    build.precompile(PROBLEMS)


@pytest.mark.parametrize(("m", "n", "k", "batch"), PROBLEMS)
def test_table_pick_is_correct(m: int, n: int, k: int, batch: int) -> None:
    ops = fp32(m, n, k, batch)
    launch = build.prepare(m, n, k, batch, ops.a, ops.b, ops.c)
    error = operands.checked(launch, ops)
    assert error <= TOLERANCE, f"relative error {error}"


@pytest.mark.parametrize(("m", "n", "k", "batch"), [(1000, 1000, 1000, 3), (1023, 777, 515, 3)])
def test_every_candidate_tile_is_correct(m: int, n: int, k: int, batch: int) -> None:
    configs = bench.candidates(build.device_cc(), m, n, k, batch)
    assert_each_is_correct(configs, m, n, k, batch)


# M and K multiples of 4 take the TMA kernel, others the cp.async one (config.fit).
@pytest.mark.parametrize(("m", "n", "k", "batch"), [(1020, 777, 516, 3), (1023, 777, 515, 3)])
def test_every_fma_order_and_accumulator_layout_is_correct(
    m: int, n: int, k: int, batch: int
) -> None:
    large = strategy_for(build.device_cc(), 8192, 8192, 8192, 8)
    configs = [
        replace(large, order=order, acc_layout=layout)
        for order in FMA_ORDERS
        for layout in ACC_LAYOUTS
    ]
    # Spelled blocks, in the orders of blocks and within them that no named layout uses.
    spelled = [replace(large, acc_layout=x) for x in ("4x2/rc", "2x4/cr", "8x4/cc")]
    assert_each_is_correct(configs + spelled, m, n, k, batch)


def test_repeated_launches_agree_and_reuse_the_module() -> None:
    m = n = k = 1024
    ops = fp32(m, n, k, 2)
    first = operands.checked(build.prepare(m, n, k, 2, ops.a, ops.b, ops.c), ops)
    builds = build._kernel.cache_info().misses
    again = operands.checked(build.prepare(m, n, k, 2, ops.a, ops.b, ops.c), ops)
    assert build._kernel.cache_info().misses == builds
    # Split tiles add their partial sums atomically, in whatever order the CTAs finish: the
    # results agree to rounding, not bit for bit.
    assert first <= TOLERANCE and abs(first - again) < 1e-7


def test_the_reference_is_in_the_cublas_league_at_4096() -> None:
    row = bench.compare(4096, 4096, 4096, 1)
    assert row.ref_error <= TOLERANCE and row.efficiency > 0.5, row
