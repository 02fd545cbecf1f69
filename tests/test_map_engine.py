"""The map engine's pure parts: how CUPTI's records of a queued chunk become calls, how a plan is
cut into chunks, which outputs the quick check compares and how its sums become the error. The
engine itself runs on the GPU (tests/test_gpu_map_engine.py)."""

from __future__ import annotations

import math

import pytest

from cublas_audit.device import check_chunk, map_records, quick_check
from cublas_audit.device.kernel_trace import KernelLaunch
from cublas_audit.device.map_engine import CHECK_KERNELS
from cublas_audit.device.operand_pool import OperandPool
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import (
    CHUNK,
    POOLED_BYTES,
    REGION_BYTES,
    chunk_groups,
    dealt,
    output_offsets,
    output_span,
    region_limit,
    within_region,
)

CHECK, ONE_CHECK = CHECK_KERNELS
POISON, CASE_END = map_records.POISON, map_records.CASE_END


def launch(name: str, start: int) -> KernelLaunch:
    return KernelLaunch(name, start, start + 5, (1, 1, 1), (128, 1, 1), 32)


def names(calls: list[tuple[KernelLaunch, ...]]) -> list[list[str]]:
    return [[k.name for k in call] for call in calls]


def marker(sequence: int, start: int) -> KernelLaunch:
    threads = map_records.marker_threads(sequence)
    return KernelLaunch(map_records.CHUNK_MARKER, start, start + 1, (1, 1, 1), (threads, 1, 1), 8)


def test_a_chunk_is_read_once_the_next_chunks_marker_has_arrived() -> None:
    # GPU order: a late record of the chunk before, chunk 7's three cases (each opened by its
    # poison: the first of two calls with a split-K reduction each, the second closed early, the
    # third's calls refused at once) and the chunk's check, then chunk 8 begun. Records arrive in
    # any order.
    records = [
        marker(6, 0), launch("old_gemm", 1), launch(CHECK, 2),
        marker(7, 10), launch(POISON, 11), launch("gemm_a", 12), launch("reduce", 13),
        launch("gemm_a", 14), launch("reduce", 15),
        launch(POISON, 20), launch("gemm_b", 21), launch(CASE_END, 22),
        launch(POISON, 23), launch(CASE_END, 24), launch(CHECK, 25),
        marker(8, 30), launch(POISON, 31), launch("gemm_c", 32),
    ][::-1]  # fmt: skip
    assert map_records.chunk_records(records[:4], 7, last=False) is None  # chunk 8 not yet seen
    found = map_records.chunk_records(records, 7, last=False)
    assert found is not None
    mine, after = found
    assert [k.name for k in after] == [map_records.CHUNK_MARKER, POISON, "gemm_c"]
    cases = map_records.case_records(mine)
    assert [[k.name for k in c] for c in cases] == [["gemm_a", "reduce"] * 2, ["gemm_b"], []]
    assert map_records.check_seconds(mine) == 5e-9  # the check's kernel, 5 ns
    calls = map_records.split_calls(cases[0], 2)
    assert not isinstance(calls, str)
    assert names(list(calls)) == [["gemm_a", "reduce"], ["gemm_a", "reduce"]]
    # the last chunk queued takes every record after its marker once the flush was forced
    last = map_records.chunk_records(after, 8, last=True)
    assert last is not None and [k.name for k in last[0]] == [POISON, "gemm_c"]
    assert [[k.name for k in c] for c in map_records.case_records(last[0])] == [["gemm_c"]]


def test_a_case_that_failed_before_its_poison_has_no_records_and_moves_no_other() -> None:
    # the Python engine's case that cannot be made launches its poison first all the same (no
    # bytes) and then CASE_END; a CASE_END with no case open (its poison's launch failed) stands
    # for a case of no records
    records = [
        launch(POISON, 1), launch("gemm", 2), launch(POISON, 3), launch(CASE_END, 4),
        launch(CASE_END, 5), launch(POISON, 6), launch("gemm", 7), launch(CHECK, 8),
    ]  # fmt: skip
    cases = map_records.case_records(records)
    assert [[k.name for k in c] for c in cases] == [["gemm"], [], [], ["gemm"]]


def test_a_cases_kernels_split_into_its_calls_only_where_each_call_ran_the_same() -> None:
    a, b = launch("gemm_a", 1), launch("gemm_b", 2)
    assert map_records.split_calls([a, b, a, b], 2) == ((a, b), (a, b))
    assert map_records.split_calls([a, a, b], 2).startswith("unavailable: CUPTI saw 3")
    assert "same kernels" in str(map_records.split_calls([a, b, b, a], 2))
    assert map_records.split_calls([], 5).startswith("unavailable")
    # a chunk's markers name it modulo MARKED_CHUNKS: neighbours never share one
    assert map_records.marker_threads(0) != map_records.marker_threads(1)
    assert map_records.marker_threads(map_records.MARKED_CHUNKS - 1) == map_records.MARKED_CHUNKS


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
    # (8,192) or 64 x 512 x 4 (131,072), B 64 x 64 or 512 x 32 x 4 (65,536); C a region for a
    # chunk (128) of the largest output, 128 x 64 or 64 x 32 x 4 (8,192)
    assert pool.sizes["fp32"] == {"a": 131_072, "b": 65_536, "c": 128 * 8_192, "bias": 0}
    assert pool.sizes["bf16"] == {"a": 256 * 64, "b": 64 * 64, "c": 128 * 256 * 64, "bias": 0}
    assert [len(g) for g, alone in chunk_groups([huge, *small], 0) if alone] == [1]


def test_the_quick_check_compares_the_first_and_last_entries_on_fixed_columns() -> None:
    chosen = quick_check.picked(8, 1000)
    assert chosen.entries == (0, 7)
    assert chosen == quick_check.picked(8, 1000)  # a rerun checks the same outputs
    for cols in chosen.columns:
        assert len(set(cols)) == quick_check.MAX_COLUMNS and all(0 <= c < 1000 for c in cols)
    assert chosen.columns[0] != chosen.columns[1]
    # a chunk's picks in one int32 array: each after the one before (2 entries + 2 x 16 columns)
    one = quick_check.picked(1, 1000)
    offsets, values = quick_check.laid_out([chosen, one, chosen])
    assert offsets == [0, 34, 51] and len(values) == 85
    assert values[:2] == [0, 7] and values[34:51] == one.index_values()
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


def test_the_checks_driver_launch_passes_each_kernel_parameter_as_its_c_type() -> None:
    # the ctypes parameters of the check's kernel (quick_check._DriverLaunch) read off the
    # CUDA source's signature: a pointer passed as an int (or the reverse) faults on the GPU
    kinds = {"const void*": "p", "void*": "p", "const int*": "p", "const double*": "p",
             "double*": "p", "int": "i", "long long": "q", "double": "d"}  # fmt: skip
    assert quick_check.KERNEL == ONE_CHECK  # what the reader counts as the check's time
    signature = quick_check.SOURCE.split(f" {ONE_CHECK}(")[1].split(")")[0]
    declared = [" ".join(p.split()[:-1]) for p in signature.split(",")]
    assert "".join(kinds[d] for d in declared) == quick_check.PARAMS


def test_the_chunk_kernels_jobs_are_the_cuda_structs_field_for_field() -> None:
    # check_chunk's records are read by the kernel as data/quick_check.cu's Job and Chunk: a
    # field missing, moved or of another width would check the wrong memory
    source = quick_check.SOURCE
    body = source.split("struct Job {")[1].split("};")[0]
    declared = [name.strip() for line in body.split(";") for name in line.split(",")[0:]]
    names = [d.split()[-1] for d in declared if d.strip()]
    assert tuple(names) == check_chunk.JOB_FIELDS
    assert all(
        line.split()[0:2] == ["long", "long"] for line in body.strip().split(";") if line.strip()
    )
    assert f"#define CHUNK_JOBS {check_chunk.CHUNK_JOBS} " in source
    assert check_chunk.CHUNK_JOBS >= CHUNK  # a chunk's check takes a whole chunk
    # its one parameter within the 32,764 bytes CUDA 12.1 on takes (4,096 before)
    assert 4096 < check_chunk.params_dtype().itemsize <= 32_764
    assert f" {check_chunk.CHUNK_KERNEL}(" in source and f" {check_chunk.POISON_KERNEL}(" in source
    assert (CHECK, POISON) == (check_chunk.CHUNK_KERNEL, check_chunk.POISON_KERNEL)


def test_a_chunks_outputs_lie_side_by_side_aligned_and_a_chunk_too_large_is_cut() -> None:
    bf16 = [Case("cublas", "bf16", m, n, 64, 1) for m, n in ((64, 64), (13, 7), (64, 3))]
    # 64 x 64 x 2 = 8,192 bytes; 13 x 7 x 2 = 182, taken to 256; then the third
    assert output_offsets(bf16) == [0, 8192, 8192 + 256]
    assert sum(map(output_span, bf16)) == 8192 + 256 + 512  # 64 x 3 x 2 = 384, to 512
    # the H100's FP32 grid's largest problems: 128 of 4096 x 4096 x 4 bytes fill 8 GiB, cut
    # in two of 64 (REGION_BYTES is 4 GiB)
    large = [Case("cublas", "fp32", 4096, 4096, 64 * i, 1) for i in range(1, 129)]
    parts = within_region(large)
    assert [len(part) for part in parts] == [64, 64] and parts[0] + parts[1] == large
    assert all(sum(map(output_span, part)) <= REGION_BYTES for part in parts)
    assert within_region(bf16) == [bf16]
    # the region a pool makes: room for a chunk of its largest output, REGION_BYTES at most (the
    # BF16 grid's 4096 x 4096 x 2 bytes: 128 x 32 MiB = 4 GiB; FP32's cut there)
    assert region_limit(182) == 128 * 256
    assert region_limit(4096 * 4096 * 2) == 4 << 30 == region_limit(1 << 30)
    # a GPU with little free memory asks less (device.operand_pool.region_here): the chunks are
    # cut at its region, a case larger than it alone, and the region holds that case whole
    assert [len(part) for part in within_region(large, 3 * 64 << 20)] == [3] * 42 + [2]
    assert within_region(large[:2], 32 << 20) == [large[:1], large[1:2]]
    assert region_limit(64 << 20, 32 << 20) == 64 << 20
    assert region_limit(182, 1024) == 1024


@pytest.mark.parametrize(("reason", "tries"), [("", 3), ("OSError: no C compiler here", 1)])
def test_records_in_c_are_taken_at_each_tracing_start_unless_it_failed_once(
    monkeypatch: pytest.MonkeyPatch, reason: str, tries: int
) -> None:
    """Tracing stops around every case run alone and starts again after it. Where CUPTI's records
    came in C they are taken over again at each start (stopping handed them back); where taking
    them failed, it is not tried again at each start (each try compiles), and the reason stays."""
    from types import SimpleNamespace

    from cublas_audit.device import cupti_records, cupti_tracer, map_engine

    calls: list[object] = []
    tracer = SimpleNamespace(buffer_bytes=0, enable=lambda: None, disable=lambda: None)
    monkeypatch.setattr(cupti_tracer, "tracer", lambda: tracer)
    monkeypatch.setattr(cupti_records, "take_over", lambda t: calls.append(t) or reason)
    monkeypatch.setattr(cupti_records, "hand_back", lambda t: None)
    engine = map_engine.MapEngine.__new__(map_engine.MapEngine)  # (no GPU: the tracing parts)
    engine.tracing, engine.records_reason = False, "untraced"
    engine.reader = SimpleNamespace(records=[])  # type: ignore[assignment]
    for _ in range(3):
        engine._start_tracing()
        engine._stop_tracing()
    assert calls == [tracer] * tries
    assert engine.records_reason == reason
