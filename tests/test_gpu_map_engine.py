"""The map engine on the GPU: the quick check's kernels against float64 computed on the host,
the check catching output never written or a transpose ignored, and the engine's queued chunks
giving each case the kernels, call count and result that the one-case-at-a-time path gives."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from typing import Any

import pytest

from cublas_audit.planning.cases import Case

pytestmark = pytest.mark.gpu

LAYOUTS = [
    {},
    {"transa": "t"},
    {"transb": "t", "broadcast": "b"},
    {"transa": "t", "transb": "t", "bias": True, "api": "cublasLt"},  # the bias epilogue
    {"beta": 0.5, "lda": 200},
]


def host_error(ops: Any, out: Any) -> float:
    """The quick check's metric computed with NumPy in float64 on the same outputs."""
    import numpy

    from cublas_audit.device import operands, quick_check

    case = ops.case
    chosen = quick_check.picked(case.batch, case.n)
    a, b = (operands.widen(x).get() for x in (ops.a, ops.b))
    got_all = operands.widen(out).get()
    worst = 0.0
    for entry, cols in zip(chosen.entries, chosen.columns, strict=True):
        ea, eb = a[entry if a.shape[0] > 1 else 0], b[entry if b.shape[0] > 1 else 0]
        op_a = ea[:, : case.m].T if case.transa == "n" else ea[:, : case.k]  # m x k
        op_b = eb[:, : case.k].T if case.transb == "n" else eb[:, : case.n]  # k x n
        exact = op_a @ op_b[:, list(cols)]
        if ops.c0 is not None:
            exact += case.beta * operands.widen(ops.c0).get()[entry][list(cols), : case.m].T
        if ops.bias is not None:
            exact += operands.widen(ops.bias).get()[:, None]
        got = got_all[entry][list(cols), : case.m].T
        worst = max(worst, numpy.linalg.norm(got - exact) / numpy.linalg.norm(exact))
    return float(worst)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16"])
def test_the_quick_check_kernels_compute_the_float64_metric(mode: str, layout: dict) -> None:
    from cublas_audit.device import operands, quick_check

    settings = dict(layout)
    case = Case(settings.pop("api", "cublas"), mode, 160, 96, 130, 3, **settings)
    ops = operands.make_for(case, seed=3)
    operands.reset(ops)
    launch, closers = prepare(case, ops)
    launch()
    for close in closers:
        close()
    on_gpu = quick_check.error_now(ops, ops.c)
    assert 0 < on_gpu <= operands.tolerance(mode)
    assert on_gpu == pytest.approx(host_error(ops, ops.c), rel=1e-9)


@pytest.mark.parametrize(
    ("mode", "settings"),
    [
        ("bf16", {}),
        ("fp16", {"transa": "t", "lda": 3001}),
        ("fp32", {"transa": "t"}),
        ("bf16", {"ldb": 3000}),  # read in pairs: K odd, its last pair half the problem's
        ("fp16", {"lda": 1002, "ldb": 3000}),
    ],
    ids=str,
)
def test_the_quick_check_stages_whole_tiles_of_a_large_odd_problem(
    mode: str, settings: dict
) -> None:
    # rows past m and K values past each block's share (K = 2999: no whole tile, split between
    # blocks) must add nothing, and an odd lda must not misalign the transposed tile's loads
    from cublas_audit.device import operands, quick_check

    case = Case("cublas", mode, 1000, 64, 2999, 1, **settings)
    ops = operands.make_for(case, seed=5)
    operands.reset(ops)
    launch, _closers = prepare(case, ops)
    launch()
    assert quick_check.geometry(case.m, case.k, 1).grid[1] > 1  # K split over blocks
    on_gpu = quick_check.error_now(ops, ops.c)
    assert 0 < on_gpu <= operands.tolerance(mode)
    assert on_gpu == pytest.approx(host_error(ops, ops.c), rel=1e-9)


@pytest.mark.parametrize("mode", ["bf16", "fp32", "fp16"])
def test_a_chunks_one_check_gives_each_problem_the_sums_of_its_own(mode: str) -> None:
    # device.check_chunk: each problem's C in the pool's region, one launch checking them all
    # after every call; each problem's error is its own launch's and the host's, an output
    # never written fails alone, and the scratch is left all zeros
    import cupy

    from cublas_audit.device import check_chunk, operands, quick_check
    from cublas_audit.device.operand_pool import OperandPool
    from cublas_audit.planning.chunks import output_offsets

    cases = [
        Case("cublas", mode, 160, 96, 130, 3),
        Case("cublas", mode, 1000, 64, 2999, 1, transa="t"),
        Case("cublas", mode, 13, 7, 4672, 1),  # K in 5 blocks of at most 1024
        Case("cublasLt", mode, 256, 48, 256, 1, transa="t", transb="t", bias=True),
        Case("cublas", mode, 4096, 32, 64, 2, transb="t", broadcast="b"),
        Case("cublas", mode, 64, 4096, 1024, 1),
        # 2-byte values read in pairs (lda, ldb even) with m and k odd: the last pair's second
        # row and second K value are not the problem's
        Case("cublas", mode, 999, 40, 2999, 1, lda=1000, ldb=3000),
        Case("cublas", mode, 96, 80, 64, 1),  # never computed: its C stays poisoned
    ]
    pool = OperandPool(cases)  # (its region: room for a chunk of the largest output)
    offsets = output_offsets(cases)
    picks = [quick_check.picked(case.batch, case.n) for case in cases]
    index_offsets, values = quick_check.laid_out(picks)
    indices = cupy.asarray(values, dtype=cupy.int32)
    sums = cupy.zeros(quick_check.SUMS_PER_CASE * len(cases), dtype=cupy.float64)
    scratch = cupy.zeros(check_chunk.scratch_values(4096), dtype=cupy.float64)
    pool.load(mode)
    a, b, region = pool.addresses()[mode]
    on = check_chunk.Operands(a, b, pool.buffers["bias"].data.ptr, [region + o for o in offsets])
    check = check_chunk.planned(
        cases, picks, index_offsets, on, indices.data.ptr, sums.data.ptr, scratch.data.ptr
    )
    stream = cupy.cuda.get_current_stream().ptr
    made = []
    for case, offset, job in zip(cases, offsets, check.jobs, strict=True):
        ops = pool.operands(case, offset)
        ops.c.fill(0)  # a stale output: only the poison may make the unwritten one fail
        check_chunk.poison(case, job, stream)
        assert job["c"] == ops.c.data.ptr  # the job's C is the view the calls write
        if case is not cases[-1]:
            launch, closers = prepare(case, ops)
            launch()
            for close in closers:
                close()
        made.append(ops)
    check_chunk.launch(check, stream)
    got = sums.get().tolist()
    assert not scratch.any()  # each problem's check leaves its part zeroed
    for slot, (case, ops) in enumerate(zip(cases, made, strict=True)):
        first = quick_check.SUMS_PER_CASE * slot
        error = quick_check.error_from_sums(got[first : first + 2 * len(picks[slot].entries)])
        if case is cases[-1]:
            assert error == math.inf
            continue
        assert 0 < error <= operands.tolerance(mode), case
        assert error == pytest.approx(quick_check.error_now(ops, ops.c), rel=1e-9), case
        assert error == pytest.approx(host_error(ops, ops.c), rel=1e-9), case


def test_the_quick_check_fails_output_never_written_and_a_transpose_ignored() -> None:
    from cublas_audit.device import launchers, operands

    case = Case("cublas", "fp32", 256, 256, 256, 2, transa="t")
    ops = operands.make_for(case, seed=4)
    assert operands.checked(lambda: None, ops, quick=True) == math.inf  # C stays NaN
    wrong = launchers.classic(dataclasses.replace(case, transa="n"), ops)
    assert operands.checked(wrong, ops, quick=True) > 0.5


def prepare(case: Case, ops: Any) -> tuple[Any, list[Any]]:
    from cublas_audit.device import launchers

    if case.api == "cublasLt":
        gemm = launchers.lt(case, ops)
        return gemm.run, [gemm.close]
    return (launchers.loop(case, ops) if case.loop else launchers.classic(case, ops)), []


def alone(case: Case) -> dict[str, Any]:
    """The one-case path: fresh operands, its own trace (what the engine must agree with)."""
    from cublas_audit.device import kernel_trace, operands

    ops = operands.make_for(case)
    launch, closers = prepare(case, ops)
    _timing, traced = kernel_trace.time_and_trace(launch, 5)
    for close in closers:
        close()
    return {"status": "alone", "traced_kernels": traced.kernel_names}


def test_the_engine_gives_each_case_the_kernels_of_the_one_case_path() -> None:
    from cublas_audit.device.map_engine import MapEngine

    cases = [Case("cublas", "fp32", 64 * i, 64 * j, 128, 1) for i in (1, 3, 16) for j in (1, 5, 32)]
    cases += [
        Case("cublasLt", "bf16", 1024, 96, 4096, 1),
        Case("loop", "fp32", 256, 256, 256, 4),
        Case("cublas", "bf16", 640, 128, 64, 8, transa="t"),
        Case("cublas", "fp32", 512, 512, 512, 1, beta=0.5),  # not pooled: alone
    ]
    results: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    log: list[str] = []

    def started(case: Case) -> None:
        order.append(case.case_id)
        log.append("start")

    def finished(case: Case, result: dict[str, Any]) -> None:
        results[case.case_id] = result
        log.append("done")

    engine = MapEngine(cases, 5, prepare, lambda exc: {"status": "error"}, alone)
    engine.run(cases, started, finished, careful=3, settled=lambda: log.append("settled"))
    # records flushed a chunk at a time: its starts together before its GPU work, its results
    # together once read, nothing left unflushed at the end
    marks = "".join({"start": "S", "done": "D", "settled": "|"}[word] for word in log)
    assert marks.endswith("|") and all(len(set(run)) <= 1 for run in marks.split("|")), marks
    assert order == list(results)  # measured in the order queued
    assert order[:3] == [c.case_id for c in cases[:3]]  # careful: first, one by one
    assert sorted(order) == sorted(c.case_id for c in cases) and order[-1] == cases[-1].case_id
    assert results[cases[-1].case_id]["status"] == "alone"
    assert engine.warm["queue"] == "c thread"  # its chunks of classic calls queued from C
    for case in cases[:-1]:
        got = results[case.case_id]
        assert got["status"] == "ok", got
        assert got["kernel_time_status"] == "ok" and got["kernel_time_n"] == got["time_n"] == 5
        assert got["traced_kernels"] == alone(case)["traced_kernels"], case.case_id
        assert got["max_rel_err"] <= 1e-2 and got["case_s"] > 0
        assert got["kernel_time_ms"] <= got["time_ms"] * 1.05  # the kernels fit in the events


def test_every_call_is_traced_when_the_gpu_is_the_bottleneck(monkeypatch) -> None:
    # 2048^3 FP32 calls keep the GPU busier than the host that queues them, so chunks queue up
    # behind each other: CUPTI's forced flush must never meet a chunk still running (the first
    # engine flushed while the next chunk ran, and lost 9 in 10 problems' kernels that way).
    from cublas_audit.device import map_engine
    from cublas_audit.planning import chunks

    monkeypatch.setattr(chunks, "CHUNK", 8)
    cases = [Case("cublas", "fp32", 2048, 2048, 2048 - 64 * (i % 4), 1) for i in range(24)]
    results: list[dict[str, Any]] = []
    engine = map_engine.MapEngine(cases, 5, prepare, lambda exc: {"status": "error"}, alone)
    engine.run(cases, lambda c: None, lambda c, r: results.append(r))
    assert [r["kernel_time_status"] for r in results] == ["ok"] * len(cases)
    assert all(r["kernel_time_n"] == 5 and r["traced_kernels"] for r in results)


def test_kernels_chosen_ahead_are_the_kernels_cublas_chooses_itself() -> None:
    # device.heuristic_warm: worker threads make each coming call first inside a stream capture;
    # the map's own call then finds cuBLAS's choice cached. Fresh shapes (never called in this
    # process), so that a choice warmed wrongly (another layout, beta, alignment) would show.
    from cublas_audit.device.map_engine import MapEngine

    def shapes(offset: int) -> list[Case]:
        return [
            Case("cublas", mode, 64 * i + offset, 64 * j + offset, 64 * (i + j) + offset, batch)
            for mode in ("bf16", "fp32")
            for i in range(1, 9)
            for j in range(1, 9)
            for batch in (1, 4)
        ]

    warm_cases, cold_cases = shapes(8), shapes(16)
    got: dict[str, dict[str, Any]] = {}
    engine = MapEngine(warm_cases, 5, prepare, lambda exc: {"status": "error"}, alone, "", 4)
    engine.run(warm_cases, lambda c: None, lambda c, r: got.update({c.case_id: r}))
    assert engine.warm["threads"] == 4 and not engine.warm["reason"], engine.warm
    assert engine.warm["warmed"] > 0 and engine.warm["warm_failed"] == 0, engine.warm
    forget_choices()  # cuBLAS chooses afresh for the one-case path
    for case in warm_cases:
        assert got[case.case_id]["traced_kernels"] == alone(case)["traced_kernels"], case
    cold = MapEngine(cold_cases, 5, prepare, lambda exc: {"status": "error"}, alone)
    cold.run(cold_cases, lambda c: None, lambda c, r: got.update({c.case_id: r}))
    assert cold.warm["reason"].startswith("off") and "warmed" not in cold.warm


def test_chunks_queued_from_c_measure_what_chunks_queued_from_python_measure() -> None:
    # device.native_queue: the C thread makes the Python engine's calls; the same kernels, the
    # same outputs (so the same check error), all 5 calls timed and traced; and a
    # call cuBLAS refuses (an lda below m: CUBLAS_STATUS_INVALID_VALUE) recorded as an error
    # while the problems after it are measured.
    from cublas_audit.device.map_engine import MapEngine

    cases = [
        Case("cublas", mode, 64 * i, 96 * j, 64 * (i + 2 * j), batch, transb="t")
        for mode in ("bf16", "fp32")
        for i in (1, 4, 9)
        for j in (1, 3)
        for batch in (1, 3)
    ]
    bad = copy.copy(cases[1])  # a plan would refuse this lda: set past the Case's own check
    object.__setattr__(bad, "lda", bad.m - 1)
    bad.__dict__.pop("_layouts", None)
    cases[1] = bad
    got: dict[bool, dict[str, dict[str, Any]]] = {True: {}, False: {}}
    for native in (True, False):
        engine = MapEngine(cases, 5, prepare, lambda exc: {"status": "error", "detail": str(exc)},
                           alone, native=native)  # fmt: skip
        engine.run(cases, lambda c: None, functools.partial(record, got[native]))
        assert engine.warm["queue"] == ("c thread" if native else "off")
    for case in cases:
        mine, theirs = got[True][case.case_id], got[False][case.case_id]
        if case is bad:
            assert mine["status"] == theirs["status"] == "error", (mine, theirs)
            assert "CUBLAS_STATUS_INVALID_VALUE" in mine["detail"] == theirs["detail"]
            continue
        assert mine["status"] == theirs["status"] == "ok", (mine, theirs)
        assert mine["traced_kernels"] == theirs["traced_kernels"], case
        # (the check's float64 sums are atomics: their order, so their last bits, vary)
        assert mine["max_rel_err"] == pytest.approx(theirs["max_rel_err"], rel=1e-9), case
        assert mine["kernel_time_n"] == mine["time_n"] == 5


def record(into: dict[str, dict[str, Any]], case: Case, result: dict[str, Any]) -> None:
    into[case.case_id] = result


def forget_choices() -> None:
    """Empties cuBLAS's process-wide heuristics cache (capacity 0 disables it, then back)."""
    import ctypes

    from cublas_audit.device.loaded import loaded_libraries

    lt = loaded_libraries("libcublasLt.so")[0]
    library = ctypes.CDLL(lt)
    capacity = ctypes.c_size_t()
    assert library.cublasLtHeuristicsCacheGetCapacity(ctypes.byref(capacity)) == 0
    assert library.cublasLtHeuristicsCacheSetCapacity(ctypes.c_size_t(0)) == 0
    assert library.cublasLtHeuristicsCacheSetCapacity(capacity) == 0
