"""The map engine's pure parts: how CUPTI's records of a queued chunk become calls, how a plan is
cut into chunks, which outputs the quick check compares and how its sums become the error. The
engine itself runs on the GPU (tests/test_gpu_map_engine.py)."""

from __future__ import annotations

import math

import pytest

from cublas_audit.device import quick_check
from cublas_audit.device.kernel_trace import MARKERS, KernelLaunch, split_chunk
from cublas_audit.device.map_engine import CHECK_KERNELS, OperandPool
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import CHUNK, POOLED_BYTES, chunk_groups, dealt

THIS, NEXT = MARKERS
PARTIAL, FINAL = CHECK_KERNELS


def launch(name: str, start: int) -> KernelLaunch:
    return KernelLaunch(name, start, start + 5, (1, 1, 1), (128, 1, 1), 32)


def names(calls: list[tuple[KernelLaunch, ...]]) -> list[list[str]]:
    return [[k.name for k in call] for call in calls]


def test_a_chunks_calls_end_at_its_check_and_the_next_chunk_is_left_over() -> None:
    # GPU order: a late record of the chunk before (other marker), this chunk's two cases of two
    # calls each (the second call of case 0 adds a split-K reduction), each case closed by the
    # check kernels, then the next chunk already begun. Records arrive in any order.
    records = [
        launch(NEXT, 0), launch("old_gemm", 1),
        launch(THIS, 10), launch("gemm_a", 11),
        launch(THIS, 20), launch("gemm_a", 21), launch("splitk_reduce", 22),
        launch(PARTIAL, 23), launch(FINAL, 24),
        launch(THIS, 30), launch("gemm_b", 31),
        launch(THIS, 40), launch("gemm_b", 41),
        launch(PARTIAL, 42), launch(FINAL, 43),
        launch(NEXT, 50), launch("gemm_c", 51),
    ][::-1]  # fmt: skip
    calls, leftover = split_chunk(records, THIS, CHECK_KERNELS)
    assert names(calls) == [["gemm_a"], ["gemm_a", "splitk_reduce"], ["gemm_b"], ["gemm_b"]]
    assert [k.name for k in leftover] == [NEXT, "gemm_c"]
    # the leftover opens the next chunk's split, where this chunk's marker no longer appears
    more = [launch(NEXT, 60), launch("gemm_c", 61), launch(PARTIAL, 62)]
    calls, leftover = split_chunk(leftover + more, NEXT, CHECK_KERNELS)
    assert names(calls) == [["gemm_c"], ["gemm_c"]] and leftover == []


def test_a_chunk_whose_records_have_not_all_arrived_shows_fewer_calls() -> None:
    # the engine compares the count with the markers it queued and then says CUPTI lost calls
    calls, _ = split_chunk([launch(THIS, 10), launch("gemm", 11)], THIS, CHECK_KERNELS)
    assert len(calls) == 1


def case(m: int, **kw: object) -> Case:
    return Case("cublas", str(kw.pop("mode", "fp32")), m, 64, 64, 1, **kw)  # type: ignore[arg-type]


def test_careful_cases_come_first_then_each_modes_chunks_then_unpooled_cases_alone() -> None:
    fp32 = [case(64 + i) for i in range(CHUNK + 5)]
    bf16 = [case(64 + i, mode="bf16") for i in range(3)]
    beta = case(64, beta=0.5)  # accumulates into C: not pooled
    cases = [*fp32[:3], beta, *bf16, *fp32[3:]]  # modes mixed, as a plan of two modes is
    groups = chunk_groups(cases, careful=2)
    assert [g for g, alone in groups[:2]] == [[fp32[0]], [fp32[1]]]  # one by one, given order
    assert all(alone for _, alone in groups[:2])
    # then the fp32 cases left (CHUNK + 3: two chunks), bf16's in one, the beta case last
    first = (CHUNK + 4) // 2
    assert [(len(g), alone) for g, alone in groups[2:]] == [
        (first, False), (CHUNK + 3 - first, False), (3, False), (1, True)
    ]  # fmt: skip
    assert groups[2][0][0] == fp32[-1]  # the largest problem starts the first chunk
    assert all(c.mode == "fp32" for g, _ in groups[2:4] for c in g)  # the pool fills once a mode
    assert groups[-1] == ([beta], True)
    assert sorted(c for g, _ in groups for c in g) == sorted(cases)  # every case once


def test_chunks_are_dealt_to_like_gpu_work_not_cut_in_plan_order() -> None:
    # A map grid in plan order (K fastest): a chunk of neighbours holds a few M x N K axes, and
    # chunks differ in work over 400-fold; dealt by work they differ by an eighth.
    axis = range(64, 4097, 192)
    plan = [Case("cublas", "fp32", m, n, k, 1) for m in axis for n in axis for k in axis]
    chunks = dealt(plan, CHUNK)
    assert len(chunks) == -(-len(plan) // CHUNK) and max(map(len, chunks)) <= CHUNK
    assert sorted(c for chunk in chunks for c in chunk) == sorted(plan)
    assert all([c.flops for c in chunk] == sorted((c.flops for c in chunk), reverse=True)
               for chunk in chunks)  # fmt: skip
    work = [sum(c.flops for c in chunk) for chunk in chunks]
    assert max(work) / min(work) < 1.15
    neighbours = [sum(c.flops for c in plan[i : i + CHUNK]) for i in range(0, len(plan), CHUNK)]
    assert max(neighbours) / min(neighbours) > 400


def test_a_problem_beyond_the_pool_limit_runs_alone_and_does_not_size_the_pool() -> None:
    side = math.isqrt(POOLED_BYTES // 4 // 3) + 64
    huge = Case("cublas", "fp32", side, side, side, 1)
    small = [case(128), case(256, mode="bf16"), Case("cublas", "fp32", 64, 32, 512, 4)]
    pool = OperandPool([huge, *small])
    # per mode, the largest elements of each operand among pooled cases: fp32 A is 128 x 64
    # (8,192) or 64 x 512 x 4 (131,072), B 64 x 64 or 512 x 32 x 4 (65,536), C 128 x 64 or
    # 64 x 32 x 4 (8,192)
    assert pool.sizes["fp32"] == {"a": 131_072, "b": 65_536, "c": 8_192, "bias": 0}
    assert pool.sizes["bf16"] == {"a": 256 * 64, "b": 64 * 64, "c": 256 * 64, "bias": 0}
    assert [len(g) for g, alone in chunk_groups([huge, *small], 0) if alone] == [1]


def test_the_quick_check_compares_the_first_and_last_entries_on_fixed_columns() -> None:
    chosen = quick_check.picked(8, 1000)
    assert chosen.entries == (0, 7)
    assert chosen == quick_check.picked(8, 1000)  # a rerun checks the same outputs
    for cols in chosen.columns:
        assert len(set(cols)) == quick_check.MAX_COLUMNS and all(0 <= c < 1000 for c in cols)
    assert chosen.columns[0] != chosen.columns[1]
    narrow = quick_check.picked(1, 5)
    assert narrow.entries == (0,) and sorted(narrow.columns[0]) == [0, 1, 2, 3, 4]
    assert narrow.index_values() == [0, *narrow.columns[0]]


def test_the_error_is_the_worst_entrys_normwise_error_and_a_nan_fails() -> None:
    # entry 0: ||diff|| = 2, ||ref|| = 10 -> 0.2; entry 1: 1 / 20 -> 0.05
    assert quick_check.error_from_sums([4.0, 100.0, 1.0, 400.0]) == pytest.approx(0.2)
    assert quick_check.error_from_sums([math.nan, 100.0]) == math.inf
    assert quick_check.error_from_sums([math.inf, 100.0]) == math.inf
    assert quick_check.error_from_sums([9.0, 0.0]) == 3.0  # an all-zero reference: absolute


@pytest.mark.parametrize(("m", "k"), [(64, 64), (4096, 4096), (100, 33), (8192, 65_536)])
def test_the_check_splits_k_in_whole_tiles_that_cover_it(m: int, k: int) -> None:
    per_block = quick_check.k_per_block(m, k, 2)
    splits = -(-k // per_block)
    assert per_block % quick_check.K_TILE == 0 and splits * per_block >= k
    assert (splits - 1) * per_block < k  # no block without work
    row_blocks = -(-m // quick_check.ROWS)
    tiles = -(-k // quick_check.K_TILE)
    # enough blocks to fill the GPU, where K has enough tiles to share out
    assert row_blocks * 2 * splits >= min(quick_check.FILL_BLOCKS, row_blocks * 2 * tiles) // 2


def test_out_of_memory_in_the_pool_is_a_skipped_case_not_an_error() -> None:
    # CuPy's OutOfMemoryError (matched by name: the probe imports no CuPy at its top) raised
    # while the engine makes its pool: the case is recorded as skipped and the map goes on
    from probes.gemm_probe import Runner

    class OutOfMemoryError(Exception):
        pass

    message = "Out of memory allocating 1,073,741,824 bytes (allocated so far: 0 bytes)."
    assert Runner.failed(OutOfMemoryError(message)) == {
        "status": "skipped",
        "detail": f"out of memory: {message}",
    }
    assert Runner.failed(ValueError("bad"))["status"] == "error"
