"""A chunk's quick checks in one launch, and the poison each problem's C gets before its calls
(data/quick_check.cu's cublas_audit_check_chunk and cublas_audit_poison).

The map checked each problem with a launch of its own right after its calls: ~13 us of GPU time
a problem whatever its size (check_kernel_h100.json's fit: the kernel's chain of dependent memory
round trips), 6.9 s of the H100's BF16 grid with nothing else on the GPU. Here each problem of a
chunk writes its own C, side by side with the others' in one region (planning.chunks), so that
its output stays until every call of the chunk is queued; then one launch checks every problem
of the chunk, the problems' blocks running together, each problem's the same arithmetic as its
own launch made (device.quick_check), with at most MOST_K values of K a block. The same sums
land in the same slots: every problem is still checked, on the output its calls wrote. On the
H100, GPU-paced over 256 problems of the BF16 grid in two chunks (check_kernel_h100.json's chunk
leg): 7.2 us a problem (11.8 before the paired loads), the grid's check 6.9 -> 2.2 s in situ.

Before its calls, each problem's C is poisoned where the check reads it (its checked columns; the
whole C was memset before), by a kernel: CUPTI records it, so that it opens the problem's records
(device.map_records), as the check's kernel closed them.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cublas_audit.device import quick_check
from cublas_audit.planning.cases import Case
from cublas_audit.planning.modes import mode as mode_of

# data/quick_check.cu's Job, every field 64 bits wide (no padding to get wrong)
JOB_FIELDS = (
    "a", "b", "c", "bias", "storage", "m", "n", "k", "transa", "transb", "lda", "ldb",
    "stride_a", "stride_b", "entries", "columns", "n_columns", "per_block", "blocks_x",
    "blocks_y", "slots", "first_block", "scratch", "sums",
)  # fmt: skip
CHUNK_JOBS = 128  # data/quick_check.cu's CHUNK_JOBS: the problems a launch checks at most
MOST_K = 1024  # values of K a block sums at most (the problems of a chunk fill the GPU together)
CHUNK_KERNEL = "cublas_audit_check_chunk"
POISON_KERNEL = "cublas_audit_poison"
POISON_THREADS = 256


@functools.lru_cache(maxsize=1)
def job_dtype() -> Any:
    import numpy

    return numpy.dtype([(name, "<i8") for name in JOB_FIELDS])


@functools.lru_cache(maxsize=1)
def params_dtype() -> Any:
    """The chunk kernel's one parameter: CHUNK_JOBS jobs and their count (24 KiB, passed whole:
    each block reads its problem's from the constant bank)."""
    import numpy

    return numpy.dtype([("jobs", job_dtype(), (CHUNK_JOBS,)), ("count", "<i8")])


def scratch_values(largest_m: int) -> int:
    """The float64 scratch a chunk's check needs at most: CHUNK_JOBS problems of `largest_m`
    rows, two batch entries checked (K does not size it)."""
    return CHUNK_JOBS * quick_check.geometry(largest_m, 1, 2, MOST_K).scratch_values


@dataclass(frozen=True)
class Planned:
    """A chunk's check as launched: the kernel's parameter bytes and its blocks."""

    params: Any  # numpy array of one params_dtype()
    blocks: int

    @property
    def jobs(self) -> Any:
        """Its problems' jobs, in queue order (numpy records of job_dtype())."""
        return self.params["jobs"][0, : int(self.params["count"][0])]


@dataclass(frozen=True)
class Operands:
    """The device addresses a chunk's problems read: the pool's A, B and bias, each problem's C."""

    a: int
    b: int
    bias: int
    outputs: Sequence[int]


def planned(
    cases: Sequence[Case],
    picks: Sequence[quick_check.Picked],
    offsets: Sequence[int],
    operands: Operands,
    indices: int,
    sums: int,
    scratch: int,
) -> Planned:
    """The check of `cases` (a chunk, in queue order): each problem's picked entries and columns
    at its offset (int32 values) in the chunk's `indices`, its sums in its slot of `sums`, its
    own part of the float64 `scratch` (all zeros; each check leaves it so)."""
    import numpy

    if len(cases) > CHUNK_JOBS:
        raise ValueError(f"a chunk's check takes {CHUNK_JOBS} problems at most, not {len(cases)}")
    rows, first, at = [], 0, scratch
    places = zip(cases, picks, offsets, operands.outputs, strict=True)
    for slot, (case, pick, offset, c) in enumerate(places):
        la, lb = case.operand("a"), case.operand("b")
        entries = len(pick.entries)
        shape = quick_check.geometry(case.m, case.k, entries, MOST_K)
        rows.append((
            operands.a, operands.b, c, operands.bias if case.bias else 0, _storage(case.mode),
            case.m, case.n, case.k, case.transa == "t", case.transb == "t", la.ld, lb.ld,
            la.stride, lb.stride, quick_check.index_address(indices, offset),
            quick_check.index_address(indices, offset + entries), pick.n_columns,
            shape.per_block, shape.grid[0], shape.grid[1], entries, first, at,
            quick_check.sums_address(sums, slot),
        ))  # fmt: skip
        first += shape.grid[0] * shape.grid[1] * entries
        at += 8 * shape.scratch_values
    params = numpy.zeros(1, dtype=params_dtype())
    params["jobs"][0, : len(rows)] = numpy.array(rows, dtype=job_dtype())
    params["count"] = len(rows)
    return Planned(params, first)


@functools.lru_cache(maxsize=16)
def _storage(mode: str) -> int:
    return quick_check.STORAGE_CODES[mode_of(mode).storage]


def launch(check: Planned, stream: int) -> None:
    """Queues a chunk's check on `stream` (the driver copies its parameter at the launch)."""
    pointers = (ctypes.c_void_p * 1)(check.params.ctypes.data)
    quick_check.driver_launch(CHUNK_KERNEL, check.blocks, quick_check.ROWS, stream, pointers)


def poison_blocks(jobs: Any) -> Any:
    """The poison's blocks for each of `jobs`: one a checked column of each checked entry."""
    return jobs["slots"] * jobs["n_columns"]


def poison(case: Case, job: Any, stream: int) -> None:
    """Queues the poison of `case`'s checked columns of its C on `stream`, where its `job` says
    they are (job None: nothing poisoned, the kernel launched all the same: it opens the case's
    records)."""
    c, entries, columns, n_columns, blocks = 0, 0, 0, 1, 1
    if job is not None:
        c, entries, columns, n_columns = (
            int(job[name]) for name in ("c", "entries", "columns", "n_columns")
        )
        blocks = int(poison_blocks(job))
    values = [
        ctypes.c_void_p(c), ctypes.c_longlong(case.m), ctypes.c_longlong(case.n),
        ctypes.c_longlong(mode_of(case.mode).element_bytes), ctypes.c_void_p(entries),
        ctypes.c_void_p(columns), ctypes.c_int(n_columns),
    ]  # fmt: skip
    pointers = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    quick_check.driver_launch(POISON_KERNEL, blocks, POISON_THREADS, stream, pointers)
