"""device.heuristic_warm without a GPU: the C source compiles with the system's compiler and its
call struct matches Python's byte for byte; the calls handed to the workers are the launcher's
own (cuBLAS's numbering from its headers); chunks go ahead of the engine in its order, never
past a mode whose operands are not loaded; and where nothing can be warmed, the map is told why
instead of failing. The GPU half (the kernels cuBLAS then dispatches are the ones it chooses
itself) is tests/test_gpu_map_engine.py's."""

from __future__ import annotations

import ctypes
import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.device import heuristic_warm, native
from cublas_audit.device.launchers import ROUTINES, classic_call
from cublas_audit.judge.diff import compare
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import chunk_groups
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.table.inputs import Dataset, load_one_gpu
from tests.fake_libraries import against_the_fake, needs_cc

PLAN = Path(__file__).resolve().parent.parent / "reports/h100/maps/20261125-092546-bf16-random"
# cublas_api.h / library_types.h: CUBLAS_OP_N 0, CUBLAS_OP_T 1, CUDA_R_16BF 14, CUDA_R_32F 0,
# CUBLAS_COMPUTE_32F 68
OP_T, CUDA_R_16BF, CUDA_R_32F, COMPUTE_32F = 1, 14, 0, 68


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def library(cache: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(native.compiled(cache)))


@needs_cc
def test_the_c_struct_and_the_python_struct_are_the_same_size(library: ctypes.CDLL) -> None:
    library.warm_call_size.restype = ctypes.c_int64
    assert library.warm_call_size() == ctypes.sizeof(heuristic_warm.WarmCall) == 104
    # the fields a misordered struct would shift: the 64-bit strides and addresses
    assert heuristic_warm.WarmCall.stride_a.offset == 48 and heuristic_warm.WarmCall.a.offset == 72
    assert heuristic_warm.WarmCall.beta.offset == 96


@needs_cc
def test_the_library_is_compiled_once_per_source_text(library: ctypes.CDLL, cache: Path) -> None:
    (first,) = cache.rglob("native-*.so")
    stamp = first.stat().st_mtime_ns
    assert native.compiled(cache) == first and first.stat().st_mtime_ns == stamp
    assert not list(cache.rglob("*.tmp"))


def test_a_recorded_bf16_problem_is_handed_over_as_the_launcher_calls_it() -> None:
    case = read_plan(PLAN / "plan.json")[0]  # cublasGemmEx, bf16, 64 x 1280 x 2816, nn
    call = classic_call(case, 0x1000, 0x2000, 0x3000)
    assert call is not None and ROUTINES[call.routine] == "cublasGemmEx"
    assert (call.m, call.n, call.k, call.batch) == (64, 1280, 2816, 1)
    assert (call.lda, call.ldb, call.ldc) == (64, 2816, 64)  # column-major, as cuBLAS reads
    assert (call.data_type, call.compute_type, call.beta) == (CUDA_R_16BF, COMPUTE_32F, 0.0)
    packed = heuristic_warm.warm_call(call)
    assert (packed.routine, packed.a, packed.b, packed.c) == (2, 0x1000, 0x2000, 0x3000)
    assert (packed.lda, packed.ldb, packed.ldc, packed.k) == (64, 2816, 64, 2816)


def test_a_transposed_batch_and_fp32_take_their_own_routine_and_strides() -> None:
    batched = classic_call(Case("cublas", "bf16", 128, 64, 96, 4, transa="t"), 1, 2, 3)
    assert batched is not None and ROUTINES[batched.routine] == "cublasGemmStridedBatchedEx"
    assert (batched.transa, batched.transb, batched.lda) == (OP_T, 0, 96)
    assert (batched.stride_a, batched.stride_b, batched.stride_c) == (96 * 128, 96 * 64, 128 * 64)
    single = classic_call(Case("cublas", "fp32", 64, 64, 64, 1), 1, 2, 3)
    assert single is not None and ROUTINES[single.routine] == "cublasSgemm"
    assert single.data_type == CUDA_R_32F
    assert classic_call(Case("cublasLt", "bf16", 64, 64, 64, 1), 1, 2, 3) is None
    assert classic_call(Case("cublas", "fp32", 64, 64, 64, 4, loop=True), 1, 2, 3) is None
    assert heuristic_warm.warm_call(None).routine == -1


class Recording(heuristic_warm.Warmer):
    """A Warmer whose C side is a list: what the engine hands over, in order."""

    def __init__(self) -> None:
        super().__init__(0)
        self.calls: list[heuristic_warm.WarmCall] = []
        self.marks: list[int] = []

    @property
    def running(self) -> bool:
        return True

    def submit(self, calls: object) -> None:
        assert isinstance(calls, list)
        self.calls += calls
        self.submitted += len(calls)

    def progress(self, queued: int) -> None:
        self.marks.append(queued)


def test_chunks_go_ahead_of_the_engine_in_its_order_and_wait_for_their_operands() -> None:
    cases = read_plan(PLAN / "plan.json")[:40]
    cases += [Case("cublas", "fp32", 64 * i, 64, 64, 1) for i in range(1, 21)]
    groups = chunk_groups(cases, careful=2)
    chunks = [group for group, alone in groups if not alone]
    ahead = heuristic_warm.Ahead(recording := Recording(), chunks, chunks_ahead=1)
    ahead.queuing(groups[0][0], {"bf16": (1, 2, 3)})  # a careful case: not warmed, not counted
    assert recording.calls == [] and ahead.position == 0
    bf16 = {"bf16": (1, 2, 3)}
    ahead.queuing(chunks[0], bf16)  # its chunk and the next one (the fp32 chunk must wait)
    assert [c.m for c in recording.calls] == [c.m for c in chunks[0]] and recording.marks == [0]
    ahead.queuing(chunks[1], {"fp32": (4, 5, 6)})  # the fp32 pool is loaded now
    assert [c.a for c in recording.calls[len(chunks[0]) :]] == [4] * len(chunks[1])
    assert recording.marks == [0, len(chunks[0])]
    assert all(
        c.m == case.m for c, case in zip(recording.calls, chunks[0] + chunks[1], strict=True)
    )


def test_nothing_is_warmed_where_the_workers_cannot_start() -> None:
    assert heuristic_warm.thread_count({heuristic_warm.THREADS_VARIABLE: "0"}) == 0
    assert heuristic_warm.thread_count({heuristic_warm.THREADS_VARIABLE: "3"}) == 3
    assert heuristic_warm.thread_count({heuristic_warm.THREADS_VARIABLE: "many"}) == 0
    assert 0 <= heuristic_warm.thread_count({}) <= heuristic_warm.MAX_THREADS
    off = heuristic_warm.Warmer(0)
    assert not off.running and off.reason.startswith("off") and off.counts() == {}
    off.submit([heuristic_warm.SKIP])
    off.progress(1)
    off.stop()  # all harmless
    assert off.submitted == 0


def test_the_loaded_cublas_is_found_in_the_memory_map(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    lines = [
        "7f00-7f01 r-xp 00000000 08:01 1 /lib/libcublasLt.so.13.1.0.3",  # sorts first
        "7f02-7f03 r-xp 00000000 08:01 2 /site/nvidia/cublas/lib/libcublas.so.13",
        "7f04-7f05 rw-p 00000000 00:00 0",
    ]
    maps.write_text("\n".join(lines) + "\n")
    assert native.loaded_cublas(maps) == "/site/nvidia/cublas/lib/libcublas.so.13"
    maps.write_text(lines[2] + "\n")
    with pytest.raises(OSError):
        native.loaded_cublas(maps)


RECORDED = Path(__file__).resolve().parent / "fixtures" / "h100-map-reruns" / "bf16-s1"


def recorded(side: str) -> Dataset:
    env = json.loads((RECORDED / f"{side}.env.json").read_text())
    return dataclasses.replace(load_one_gpu(RECORDED / f"{side}.parquet"), env=env)


# the same map on 2026-11-27: `warm` with 8 workers choosing ahead (benchmarks/heuristic_warm.py),
# `native` also with its chunks queued by the C thread (benchmarks/native_queue.py), `checked`
# also with the staged float64 check kernels (device.quick_check, commit 6b49164) and each
# chunk's calls made once (7108929); on 2026-11-28 `fused`, its check one kernel a problem that
# leaves its scratch zeroed (no memset, no second kernel), `chunked`, a chunk's problems
# checked by one launch after their calls, each problem's C its own (device.check_chunk), and
# `records-in-c`, CUPTI's kernel records taken in C (device.cupti_records)
AGAIN = ["warm", "native", "checked", "fused", "chunked", "records-in-c"]
# the diff gate against the recorded runs: `checked` and `records-in-c` ran on hosts where one
# problem (704 x 2944 x 3456) ran its recorded kernel 1.5-1.6x faster than both recorded runs,
# beyond the noise model (the same kernel; SM clock 1785 MHz there, 1980 in the recorded runs);
# the Python-queued map of the same plan, in the same session on that host, passes the gate
# against it both ways (benchmarks/results/native_queue_h100.json, sample)
GATED = ["warm", "native", "fused", "chunked"]


@pytest.mark.parametrize("side", AGAIN)
def test_the_map_mapped_again_dispatched_the_recorded_kernels(side: str) -> None:
    # the 10,000-problem BF16 map of 2026-11-25 (runs a and b, before any warming, queued from
    # Python) mapped again: cuBLAS dispatched the same kernels, launches, CTAs and blocks on
    # every problem
    columns = ["case_id", "traced_kernels", "traced_launches", "traced_ctas", "traced_block"]
    again, a, b = (
        pd.read_parquet(RECORDED / f"{name}.parquet", columns=columns).set_index("case_id")
        for name in (side, "a", "b")
    )
    assert len(again) == 10_000 and set(again.index) == set(a.index)
    assert again.sort_index().equals(a.sort_index()) and again.sort_index().equals(b.sort_index())
    env = json.loads((RECORDED / f"{side}.env.json").read_text())
    command = env["command"]
    assert command[command.index("--seed") + 1] == "1" and "--sample" in command  # the same plan


@pytest.mark.parametrize("side", ["checked", "fused", "chunked", "records-in-c"])
def test_the_staged_check_reports_the_errors_the_first_check_kernel_reported(side: str) -> None:
    # the float64 check rewritten (tiles staged in shared memory, other block counts, so other
    # summation orders; then one kernel a problem; then one a chunk, its outputs side by side):
    # on the same inputs and outputs its errors are the recorded runs' (the first kernel's),
    # problem by problem, and every problem passed it
    columns = ["case_id", "max_rel_err", "status"]
    checked, a, b = (
        pd.read_parquet(RECORDED / f"{name}.parquet", columns=columns).set_index("case_id")
        for name in (side, "a", "b")
    )
    assert (checked["status"] == "ok").all()
    for before in (a, b):
        errors = before["max_rel_err"].reindex(checked.index)
        assert ((checked["max_rel_err"] / errors - 1).abs() < 1e-12).all()


@pytest.mark.heavy
@pytest.mark.parametrize("side", GATED)
def test_the_map_mapped_again_passes_the_diff_gate_against_the_recorded_runs(side: str) -> None:
    again = recorded(side)
    for before in (recorded("a"), recorded("b")):
        for judged in (compare(before, again), compare(again, before)):
            assert len(judged.matched) == 10_000 and judged.kernel_changes.empty
            assert not judged.fails("regression") and judged.rows("improvement").empty


WORKERS_CHILD = """
import ctypes, json, sys, time
from pathlib import Path
from cublas_audit.device import heuristic_warm, native

fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # 'libcuda.so.1' and libcublas
lib = ctypes.CDLL(str(native.compiled(Path(sys.argv[2]))))
lib.warm_start.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
lib.warm_submit.argtypes = [ctypes.POINTER(heuristic_warm.WarmCall), ctypes.c_int64]
lib.warm_progress.argtypes = [ctypes.c_int64]

def seen():
    out = (ctypes.c_int64 * (3 + 4 * 64))()
    count = fake.fake_seen(out, 64)
    counts = (ctypes.c_int64 * 3)()
    lib.warm_counts(counts)
    return {"calls": count, "outside": out[1], "handles": out[2], "counts": list(counts),
            "each": [list(out[3 + 4 * i : 7 + 4 * i]) for i in range(min(count, 64))]}

def settled(calls):
    deadline = time.monotonic() + 10
    while fake.fake_seen((ctypes.c_int64 * 3)(), 0) < calls and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(0.05)  # and no more than that
    return seen()

assert lib.warm_start(sys.argv[1].encode(), None, 3, 10) == 0
calls = [heuristic_warm.WarmCall(routine=2, m=100 + i) for i in range(30)]
calls[5].routine = -1  # no classic call: skipped
calls[7].m = 13  # the fake cuBLAS refuses m = 13
calls[9].routine, calls[9].beta = 3, 0.5
lib.warm_submit((heuristic_warm.WarmCall * 30)(*calls), 30)
first = settled(9)  # the window: calls 0..9 of the map's progress 0, one skipped
lib.warm_progress(25)  # the map queued 0..24 itself: 10..24 late, 25..29 warmed
second = settled(14)
lib.warm_stop()
print(json.dumps({"first": first, "second": second, "stopped": seen()}))
"""


@needs_cc
def test_the_workers_run_each_coming_call_once_inside_a_capture_within_the_window(
    tmp_path: Path, cache: Path, library: ctypes.CDLL
) -> None:
    # data/heuristic_warm.c's threads against a stand-in for libcuda and libcublas
    found = against_the_fake(tmp_path, WORKERS_CHILD, cache=cache)
    first, second, stopped = found["first"], found["second"], found["stopped"]
    assert first["calls"] == 9 and first["counts"] == [8, 1, 0]  # warmed, refused, late
    assert sorted(row[1] for row in first["each"]) == [13, 100, 101, 102, 103, 104, 106, 108, 109]
    assert [3, 109, 1, 500] in first["each"]  # its routine, m, inside a capture, beta x 1000
    assert second["calls"] == 14 and second["counts"] == [13, 1, 15]
    assert sorted(row[1] for row in second["each"][9:]) == [125, 126, 127, 128, 129]
    assert second["outside"] == 0  # every call inside a stream capture: no kernel ran
    assert stopped["handles"] == 0  # each worker's cuBLAS handle destroyed when stopped


def test_the_c_thread_queues_the_calls_made_for_the_workers_on_the_same_operands() -> None:
    # each chunk's classic calls made once, when it is handed to the workers; the engine's C
    # thread takes them (native_queue.rows_of), but never calls made on other operands
    from cublas_audit.device import check_chunk, native_queue, quick_check

    cases = [Case("cublas", "bf16", 64 * i, 128, 64, 1) for i in range(1, 9)]
    chunks = [cases[:4], cases[4:]]
    ahead = heuristic_warm.Ahead(Recording(), chunks, chunks_ahead=1)
    pool = {"bf16": (0x1000, 0x2000, 0x3000)}
    assert ahead.calls_for(chunks[0]) is None  # nothing made before it is queued
    ahead.queuing(chunks[0], pool)
    made = ahead.calls_for(chunks[1])
    assert made is not None and [call.m for call in made] == [case.m for case in chunks[1]]
    assert ahead.calls_for(chunks[0]) is None  # not the next chunk any more
    outputs = [0x3000 + 0x10000 * i for i in range(4)]  # each problem's own C in the region
    picks = [quick_check.picked(case.batch, case.n) for case in chunks[1]]
    on = check_chunk.Operands(0x1000, 0x2000, 0, outputs)
    check = check_chunk.planned(chunks[1], picks, range(0, 68, 17), on, 0x5000, 0x6000, 0x7000)
    taken = native_queue.rows_of(chunks[1], check, pool["bf16"], made)
    assert list(taken["m"]) == [case.m for case in chunks[1]]
    assert list(taken["c"]) == outputs  # the calls made on the region, each on its own C
    moved = native_queue.rows_of(chunks[1], check, (0x9000, 0x2000, 0x3000), made)
    assert set(moved["a"]) == {0x9000}  # the pool moved: made again on its addresses
    again = native_queue.rows_of(chunks[1], check, pool["bf16"])
    assert again.tobytes() == taken.tobytes()
