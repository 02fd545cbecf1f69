"""device.native_queue without a GPU: the C thread (data/map_queue.c) against a stand-in for
libcuda and libcublas (tests/fake_cuda) makes, for a chunk of recorded BF16 problems, the very
stream operations the Python engine made, in its order: the chunk's indices up, its sums zeroed,
its marker; per problem its own C poisoned by the poison kernel and the calls between events; a
problem cuBLAS refuses closed by the case-end marker and reported; then the chunk's one check
with every problem's job (device.check_chunk), the sums down and the end event last. The records
Python hands over match the C structs byte for byte. The GPU half (the same kernels and results
as the Python engine) is tests/test_gpu_map_engine.py's."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from cublas_audit.device import check_chunk, native, native_queue, quick_check
from cublas_audit.device.map_engine import MapEngine
from cublas_audit.planning.cases import Case
from cublas_audit.planning.plan_file import read_plan
from tests.fake_libraries import against_the_fake, needs_cc

PLAN = Path(__file__).resolve().parent.parent / "reports/h100/maps/20261125-092546-bf16-random"
MEMSET, EVENT, GEMM, LAUNCH, COPY_UP, COPY_DOWN, ARGS = 1, 2, 3, 4, 5, 6, 7  # fake_cuda.c's
CHECK, CASE_END, MARKER, POISON = 0x100, 0x300, 0x400, 0x500  # the kernels' stand-in handles
A, B, C, BIAS = 0x10000, 0x20000, 0x30000, 0x40000  # the pooled operands' stand-in addresses
INDICES, SUMS, SCRATCH = 0x50000, 0x60000, 0x70000
# each problem's C in the chunk's region: 64 x 1280 bf16 values, then 13 x 1408 (36,608 bytes,
# a multiple of 256), then the third
OUTPUTS = [C, C + 64 * 1280 * 2, C + 64 * 1280 * 2 + 13 * 1408 * 2]


def recorded_cases() -> list[Case]:
    cases = read_plan(PLAN / "plan.json")[:3]
    # the fake cuBLAS refuses m = 13: the middle problem, as a recorded one resized
    cases[1] = Case(cases[1].api, cases[1].mode, 13, cases[1].n, cases[1].k, cases[1].batch)
    return cases


def planned(cases: list[Case]) -> check_chunk.Planned:
    """The chunk's check: each problem's picks after the one before's 17 indices."""
    picks = [quick_check.picked(case.batch, case.n) for case in cases]
    on = check_chunk.Operands(A, B, BIAS, OUTPUTS[: len(cases)])
    offsets = [17 * i for i in range(len(cases))]
    return check_chunk.planned(cases, picks, offsets, on, INDICES, SUMS, SCRATCH)


def test_a_recorded_problem_is_described_with_its_call_and_its_own_output() -> None:
    cases = recorded_cases()
    rows = native_queue.rows_of(cases, planned(cases), (A, B, C))
    first = rows[0]  # cublasGemmEx, bf16, 64 x 1280 x 2816, nn (the launcher's call)
    assert (first["routine"], first["m"], first["n"], first["k"]) == (2, 64, 1280, 2816)
    assert (first["a"], first["b"], first["beta"]) == (A, B, 0.0)
    assert list(rows["c"]) == OUTPUTS  # each problem writes its own C
    # its checked columns poisoned before the calls: 2-byte values, one batch entry (its index
    # first, then its 16 columns), a block a column
    assert (first["item"], first["n_columns"], first["poison_blocks"]) == (2, 16, 16)
    assert (rows[1]["entries"], rows[1]["columns"]) == (INDICES + 4 * 17, INDICES + 4 * 18)
    lt = Case("cublasLt", "bf16", 64, 64, 64, 1)
    with pytest.raises(ValueError, match="not a classic"):
        native_queue.rows_of([lt], planned([lt]), (A, B, C))


def test_a_chunks_check_holds_each_problems_job_in_its_own_slots() -> None:
    cases = recorded_cases()
    check = planned(cases)
    jobs = check.params["jobs"][0]
    assert int(check.params["count"][0]) == 3 and check.params.nbytes == 24 * 1024 + 8
    first, second = jobs[0], jobs[1]
    assert (first["a"], first["b"], first["c"], first["bias"]) == (A, B, C, 0)  # no bias asked
    assert first["storage"] == quick_check.STORAGE_CODES["uint16"]
    # 64 rows: one block of rows, K = 2816 split so that no block sums more than 1024: three
    # blocks of 960 (30 steps of 32), the last summing 896
    assert (first["per_block"], first["blocks_x"], first["blocks_y"]) == (960, 1, 3)
    # the second's blocks follow the first's three; its scratch follows the first's 16 x 64
    # partial sums and ticket; its entries after the first's 17 indices, its columns after its
    # one entry; its sums the second slot of 4 float64
    assert second["first_block"] == 3 and jobs[2]["first_block"] == 3 + 5
    assert second["scratch"] == SCRATCH + 8 * (16 * 64 + 1)
    assert (second["entries"], second["columns"]) == (INDICES + 4 * 17, INDICES + 4 * 18)
    assert second["sums"] == SUMS + 32
    assert check.blocks == 3 + 5 + 6  # 4672 and 5632 in 5 and 6 blocks of at most 1024
    assert all(int(job["m"]) == 0 for job in jobs[3:])  # the unused jobs: never read
    # a batch of 4 checks its first and last entries: its columns after its two entry indices
    batched = Case("cublas", "bf16", 64, 1280, 2816, 4)
    pick = quick_check.picked(4, 1280)
    on = check_chunk.Operands(A, B, BIAS, [C])
    (job,) = check_chunk.planned([batched], [pick], [0], on, INDICES, SUMS, SCRATCH).jobs
    assert pick.entries == (0, 3)
    assert (job["entries"], job["columns"], job["slots"]) == (INDICES, INDICES + 4 * 2, 2)


CHILD = r"""
import ctypes, json, sys
from pathlib import Path
import numpy
from cublas_audit.device import check_chunk, native, native_queue, quick_check
from cublas_audit.device.map_engine import MapEngine
sys.path.insert(0, sys.argv[3])
from test_native_queue import *

fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # 'libcuda.so.1' and libcublas
lib = ctypes.CDLL(str(native.compiled(Path(sys.argv[2]))))
lib.native_resolve.argtypes = [ctypes.c_char_p]
assert lib.native_resolve(sys.argv[1].encode()) == 0
lib.map_queued_case_size.restype = lib.map_queued_chunk_size.restype = ctypes.c_int64
sizes = [lib.map_queued_case_size(), lib.map_queued_chunk_size()]
lib.map_queue_start.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_void_p,
                                                        ctypes.c_int]
lib.map_queue_submit.argtypes = [ctypes.POINTER(native_queue.QueuedChunk)]
lib.map_queue_finished.restype = ctypes.c_int64
functions = (ctypes.c_void_p * 4)(CHECK, CASE_END, MARKER, POISON)
assert lib.map_queue_start(None, 3, 1, 2, functions, 0) == 0
cases = recorded_cases()
picks = [quick_check.picked(case.batch, case.n) for case in cases]
check = planned(cases)
rows = native_queue.rows_of(cases, check, (A, B, C))
events = (ctypes.c_void_p * 9)(*range(0xE0, 0xE9))  # reps + 1 = 3 a problem
status = numpy.zeros(6, dtype=numpy.int32)
host = numpy.zeros(12, dtype=numpy.float64)
chunk = native_queue.QueuedChunk(rows.ctypes.data, 3, ctypes.addressof(events),
                                 status.ctypes.data, INDICES, host.ctypes.data, 204, SUMS,
                                 host.ctypes.data, 96, check.params.ctypes.data, check.blocks, 7,
                                 0xEE, -1, 0)
assert lib.map_queue_submit(ctypes.byref(chunk)) == 0
lib.map_queue_wait_ms.argtypes = [ctypes.c_int64]
waited = lib.map_queue_wait_ms(1000)
finished = lib.map_queue_finished()
lib.map_queue_stop(0)
out = (ctypes.c_int64 * (5 * 200))()
count = fake.fake_ops(out, 200)
print(json.dumps({"sizes": sizes, "finished": finished, "waited": waited,
                  "status": status.tolist(),
                  "setup": chunk.setup_status,
                  "ops": [list(out[5 * i: 5 * i + 5]) for i in range(count)]}))
"""


@needs_cc
def test_the_c_thread_queues_what_the_python_engine_queued(tmp_path: Path) -> None:
    found = against_the_fake(tmp_path, CHILD, str(Path(__file__).resolve().parent))
    record = native_queue.case_dtype().itemsize, ctypes.sizeof(native_queue.QueuedChunk)
    assert found["sizes"] == list(record) and found["finished"] == 1 and found["setup"] == 0
    assert found["waited"] == 1
    assert found["status"] == [0, 0, 1, 7, 0, 0]  # the second refused by cuBLAS (status 7)
    ops = [tuple(op) for op in found["ops"]]
    first, third = recorded_cases()[0], recorded_cases()[2]

    def problem(case: Case, events: range, slot: int) -> list[tuple[int, ...]]:
        return [
            # its own C's 16 checked columns (NaN in bf16); its picks after the 17 before
            (LAUNCH, POISON, 16, OUTPUTS[slot], case.m),
            (ARGS, POISON, 2, INDICES + 4 * 17 * slot, INDICES + 4 * (17 * slot + 1)),
            (EVENT, events[0], 0, 0, 0),
            (GEMM, 2, case.m, 0, 0),
            (EVENT, events[1], 0, 0, 0),
            (GEMM, 2, case.m, 0, 0),
            (EVENT, events[2], 0, 0, 0),
        ]

    refused = [
        (LAUNCH, POISON, 16, OUTPUTS[1], 13),
        (ARGS, POISON, 2, INDICES + 4 * 17, INDICES + 4 * 18),
        (EVENT, 0xE3, 0, 0, 0),
        (GEMM, 2, 13, 0, 0),  # refused: no more calls
        (LAUNCH, CASE_END, 1_001_001, 1, 0),
    ]
    assert ops == [
        (COPY_UP, INDICES, 204, 0, 0),
        (MEMSET, SUMS, 0, 96, 0),
        (LAUNCH, MARKER, 1_001_001, 7, 0),  # the chunk's marker: its block size names it
        *problem(first, range(0xE0, 0xE3), 0),
        *refused,
        *problem(third, range(0xE6, 0xE9), 2),
        # the chunk's check: 3 + 5 + 6 blocks, its 3 jobs, the first's m; the second's first
        # block, the third's scratch (after the first two's) and sums (its slot)
        (LAUNCH, CHECK, 14, 3, 64),
        (ARGS, CHECK, 3, SCRATCH + 8 * (16 * 64 + 1 + 16 * 13 + 1), SUMS + 64),
        (COPY_DOWN, SUMS, 96, 0, 0),
        (EVENT, 0xEE, 0, 0, 0),  # the chunk's end: after everything it queued
    ]


def test_the_map_queues_from_python_where_the_c_part_cannot_be_had(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_compiler(cache: Path | None = None) -> Path:
        raise OSError("no C compiler (cc) found")

    monkeypatch.setattr(native, "compiled", no_compiler)
    native.library.cache_clear()
    cases = recorded_cases()
    engine = MapEngine(cases, 5, None, None, None)  # type: ignore[arg-type]
    engine._start_native([cases], warming=False)
    assert engine.native is None  # every chunk then goes through _queue_python
    assert engine.queue_reason == "python: OSError: no C compiler (cc) found"
    off = MapEngine(cases, 5, None, None, None, native=False)  # type: ignore[arg-type]
    off._start_native([cases], warming=False)
    assert off.native is None and off.queue_reason == "off"


INTERRUPTED = r"""
import ctypes, json, sys, threading, time
from pathlib import Path
import numpy
from cublas_audit.device import check_chunk, native, native_queue

fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(str(native.compiled(Path(sys.argv[2]))))
lib.native_resolve.argtypes = [ctypes.c_char_p]
assert lib.native_resolve(sys.argv[1].encode()) == 0
lib.map_queue_start.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_void_p,
                                                        ctypes.c_int]
lib.map_queue_submit.argtypes = [ctypes.POINTER(native_queue.QueuedChunk)]
lib.map_queue_finished.restype = ctypes.c_int64
lib.map_queue_wait_ms.argtypes = [ctypes.c_int64]
functions = (ctypes.c_void_p * 4)(0x100, 0x200, 0x300, 0x400)
assert lib.map_queue_start(None, 3, 1, 1, functions, 0) == 0
rows = numpy.zeros(0, dtype=native_queue.case_dtype())  # chunks of no problem
host = numpy.zeros(4, dtype=numpy.float64)
params = numpy.zeros(1, dtype=check_chunk.params_dtype())
chunks = [native_queue.QueuedChunk(rows.ctypes.data, 0, None, None, 0x50000, host.ctypes.data,
                                   8, 0x60000, host.ctypes.data, 8, params.ctypes.data, 0, 0,
                                   end, -1, 0)
          for end in (0xB10C, 0xE1, 0xE2)]  # the first one's end event holds the thread
for chunk in chunks:
    assert lib.map_queue_submit(ctypes.byref(chunk)) == 0
time.sleep(0.2)
waited = lib.map_queue_wait_ms(50)  # the thread is held: not all queued after 50 ms
threading.Timer(0.3, fake.fake_release).start()
began = time.monotonic()
lib.map_queue_stop(1)  # interrupted: the chunk begun is finished, the two after it never begun
stopped = time.monotonic() - began
out = (ctypes.c_int64 * (5 * 50))()
count = fake.fake_ops(out, 50)
events = [out[5 * i + 1] for i in range(count) if out[5 * i] == 2]
print(json.dumps({"waited": waited, "finished": lib.map_queue_finished(), "events": events,
                  "stopped": stopped}))
"""


@needs_cc
def test_an_interrupted_map_leaves_the_chunks_not_begun_unqueued(tmp_path: Path) -> None:
    found = against_the_fake(tmp_path, INTERRUPTED)
    assert found["waited"] == 0  # a wait gives Python its turn (Ctrl-C) before all are queued
    assert found["finished"] == 1 and found["events"] == [0xB10C]  # chunks 2 and 3: nothing
    assert found["stopped"] >= 0.2  # (it waited for the chunk it had begun)
