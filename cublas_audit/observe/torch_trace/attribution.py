"""Attribution: the kernels of each GEMM op, through correlation ids.

Attribution (`gemm_calls`): a kernel belongs to the innermost GEMM op whose time span holds its
launch event on the same thread, through the launch's correlation id, never by order. `matmul`
and `linear` are containers: they call `mm`/`addmm`/`bmm`, which describe the problem. A kernel
counts as the GEMM's own (its GPU time) when the GEMM op launched it directly and it is not one
of PyTorch's own kernels (`at::native::...`); everything else launched inside a GEMM op (the copy
`.contiguous()` or `reshape` makes, the copy of baddbmm's C, memcpys and memsets) is kept as that
problem's `aux` work, shown apart and never in its GEMM time. A container's launches go to the
GEMM op it calls (the first one starting after the launch, else the last). Each GPU activity is
attributed at most once.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from cublas_audit.observe.torch_trace.problems import GemmProblem, problem_of
from cublas_audit.observe.torch_trace.reader import (
    GEMM_OPS,
    LEAF_OPS,
    CpuOp,
    GpuActivity,
    Launch,
    Trace,
)

# PyTorch's own kernels (copies, fills, elementwise epilogues): never cuBLAS's GEMM.
_PYTORCH_KERNEL = re.compile(r"\bat::native::|\bat::cuda::")
_NEVER = 1 << 62  # later than any trace time, in nanoseconds


@dataclass(frozen=True)
class GemmCall:
    """One leaf GEMM op of the trace: its problem, the kernels that did its GEMM, the other GPU
    work launched inside it or its container (`aux`), and its containers' names (`via`)."""

    problem: GemmProblem
    op: CpuOp
    kernels: tuple[GpuActivity, ...]
    aux: tuple[GpuActivity, ...] = ()
    via: tuple[str, ...] = ()

    @property
    def gpu_ms(self) -> float:
        return sum(k.duration_us for k in self.kernels) / 1e3

    @property
    def aux_ms(self) -> float:
        return sum(k.duration_us for k in self.aux) / 1e3


class _Attributed(NamedTuple):
    gemm: int  # index into trace.ops of the innermost GEMM op holding the launch
    direct: bool  # launched by that op itself, not inside an op it called
    launch: Launch


class UnreadGemm(NamedTuple):
    """A leaf GEMM op whose problem the trace does not give (no input dims: recorded without
    record_shapes; or dims that are no matrix product), with the kernels it launched itself."""

    op: CpuOp
    kernels: tuple[GpuActivity, ...]

    @property
    def gpu_ms(self) -> float:
        return sum(k.duration_us for k in self.kernels) / 1e3


@dataclass(frozen=True)
class GemmAccount:
    """Every leaf GEMM op of a trace: `calls`, those whose problem the recorded inputs give, and
    `unread`, the others (their kernels' time is still part of the trace's GEMM time)."""

    calls: list[GemmCall]
    unread: list[UnreadGemm]


def gemm_calls(trace: Trace) -> list[GemmCall]:
    """Every leaf GEMM op with a recorded problem, each with its kernels (module docstring)."""
    return gemm_account(trace).calls


def gemm_account(trace: Trace) -> GemmAccount:
    """Every leaf GEMM op with its kernels (module docstring), those whose problem cannot be
    read apart."""
    parent: dict[int, int] = {}
    attributed: list[_Attributed] = []
    for ops, launches in _by_thread(trace):
        attributed += _sweep(trace.ops, ops, launches, parent)
    children: dict[int, list[int]] = defaultdict(list)
    for child, up in sorted(parent.items(), key=lambda item: trace.ops[item[0]].start):
        children[up].append(child)
    own: dict[int, list[GpuActivity]] = defaultdict(list)
    aux: dict[int, list[GpuActivity]] = defaultdict(list)
    seen: set[int] = set()
    for item in attributed:
        correlation = item.launch.correlation
        activities = trace.activities.get(correlation)
        if not activities or correlation in seen:
            continue
        seen.add(correlation)  # a correlation launched twice (runtime and driver) counts once
        leaf = _leaf(trace.ops, children, item.gemm, item.launch.start)
        if leaf is None:
            continue
        for activity in activities:
            mine = leaf == item.gemm and item.direct and _is_gemm_kernel(activity)
            (own if mine else aux)[leaf].append(activity)
    calls, unread = [], []
    for index, op in enumerate(trace.ops):
        if op.name not in LEAF_OPS:
            continue
        problem = problem_of(op)
        if problem is None:
            unread.append(UnreadGemm(op, tuple(own[index])))
        else:
            via = _containers(trace.ops, parent, index)
            calls.append(GemmCall(problem, op, tuple(own[index]), tuple(aux[index]), via))
    return GemmAccount(calls, unread)


def _by_thread(trace: Trace) -> Iterator[tuple[list[int], list[Launch]]]:
    """Per thread: the indices of its CPU ops, and its launches."""
    ops: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for index, op in enumerate(trace.ops):
        ops[op.thread].append(index)
    launches: dict[tuple[Any, Any], list[Launch]] = defaultdict(list)
    for launch in trace.launches:
        if launch.thread in ops:
            launches[launch.thread].append(launch)
    for thread, indices in ops.items():
        if any(trace.ops[i].name in GEMM_OPS for i in indices):
            yield indices, launches.get(thread, [])


def _sweep(
    all_ops: list[CpuOp], indices: list[int], launches: list[Launch], parent: dict[int, int]
) -> list[_Attributed]:
    """One pass over a thread's ops and launches in time order with a stack of the open ops:
    each launch gets the innermost GEMM op around it, each GEMM op its enclosing GEMM op."""
    order = sorted(indices, key=lambda i: (all_ops[i].start, -all_ops[i].end))
    starts = [all_ops[i].start for i in order]
    # stack entries: (end, op index, innermost GEMM op index at or above it, or -1)
    stack: list[tuple[int, int, int]] = []
    found: list[_Attributed] = []
    pushed = 0

    def open_until(time: int, upto: int) -> None:
        nonlocal pushed
        for position in range(pushed, upto):
            index = order[position]
            op = all_ops[index]
            while stack and stack[-1][0] < op.start:
                stack.pop()
            above = stack[-1][2] if stack else -1
            if op.name in GEMM_OPS:
                if above >= 0:
                    parent[index] = above
                above = index
            stack.append((op.end, index, above))
        pushed = max(pushed, upto)
        while stack and stack[-1][0] < time:
            stack.pop()

    for launch in sorted(launches, key=lambda launch: launch.start):
        open_until(launch.start, bisect.bisect_right(starts, launch.start))
        if stack and stack[-1][2] >= 0:
            _, innermost, gemm = stack[-1]
            found.append(_Attributed(gemm, innermost == gemm, launch))
    open_until(_NEVER, len(order))
    return found


def _leaf(ops: list[CpuOp], children: dict[int, list[int]], index: int, time: int) -> int | None:
    """The leaf GEMM op that work launched at `time` inside op `index` belongs to: the op
    itself, or for a container the GEMM op it calls (first starting after `time`, else last)."""
    while ops[index].name not in LEAF_OPS:
        inner = children.get(index)
        if not inner:
            return None  # a container that ran no GEMM op (matmul of vectors: dot, mv)
        index = next((c for c in inner if ops[c].start >= time), inner[-1])
    return index


def _containers(ops: list[CpuOp], parent: dict[int, int], index: int) -> tuple[str, ...]:
    names = []
    while index in parent:
        index = parent[index]
        names.append(ops[index].name)
    return tuple(reversed(names))


def _is_gemm_kernel(activity: GpuActivity) -> bool:
    return activity.kind == "kernel" and not _PYTORCH_KERNEL.search(activity.name)
