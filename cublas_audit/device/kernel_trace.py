"""Kernel-only times and launch geometry of each call, through the CUPTI activity API.

A call's event time holds the host's share (launch, cuBLAS's heuristic, the loop of launches) and
moves by 15-25 % between runs at 20 us; the durations of the kernels it dispatched move by about
1 % (measured on the H100 and H200). "Did the dispatch get worse" is judged on these, "did the
call get slower" on the event time (cublas_audit.judge.verdicts).

CUPTI's activity tracing needs no counter permission (it works where ncu gets ERR_NVGPUCTRPERM)
and no profiler process: the records come from cupti-python (with the nvidia-cuda-cupti wheel's
libcupti). A one-thread marker kernel is launched on the stream before each call, so the kernels
between two markers, in GPU order, are one call's: no reliance on how many kernels a call
launches (split-K adds a reduction kernel, a loop launches `batch`) nor on aligning host and GPU
clocks (CUPTI's host timestamps and kernel timestamps can differ by microseconds, more than a
4 us call lasts: bracketing calls by host time lost them).

A sweep's timing (time_interleaved_traced) traces the event-timed calls themselves where they are
long enough per launch that tracing cannot weigh on their event times, the marker before each
call's start event; shorter calls are traced after the event timing, in calls of their own.

The records themselves come from device.cupti_tracer (one tracer a process; its names that the
sweep and the map call kernel_trace's are imported here as they were): it imports CUPTI inside
the tracer, so that this module imports on machines without it, and a probe without it records
why and times with events alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cublas_audit.device import clocks, l2, timing
from cublas_audit.device.cupti_tracer import MEMSET as MEMSET
from cublas_audit.device.cupti_tracer import KernelLaunch as KernelLaunch
from cublas_audit.device.cupti_tracer import available as available
from cublas_audit.device.cupti_tracer import tracer as tracer
from cublas_audit.device.timing import Timing

# Traced calls per contender: at least this many, else about as many as the event timing made.
MIN_REPS = 10


@dataclass(frozen=True)
class TracedCalls:
    """The kernels of each traced call of one contender, in call order."""

    calls: tuple[tuple[KernelLaunch, ...], ...]

    def timing(self) -> Timing:
        """Kernel-only time per call: the sum of its kernels' and memsets' durations (gaps
        between them are the host's share, which the event time already measures)."""
        return Timing(tuple(sum(k.duration_ms for k in call) for call in self.calls if call))

    def columns(self, prefix: str) -> dict[str, Any]:
        """The table's columns for this contender: `<prefix>_ms` and its distribution, and (for
        the call itself) the kernels it ran and the geometry of its longest one."""
        found: dict[str, Any] = {}
        if any(self.calls):
            found.update(self.timing().summary(prefix))
        return found

    @property
    def first_call(self) -> tuple[KernelLaunch, ...]:
        """The kernels of the first call that launched any (every call of one launcher runs the
        same ones); its memsets are no kernels."""
        first = next((call for call in self.calls if call), ())
        return tuple(k for k in first if k.name != MEMSET)

    @property
    def kernel_names(self) -> str:
        """The distinct kernels of one call, in launch order, ' + '-joined ('' where none)."""
        return " + ".join(dict.fromkeys(k.name for k in self.first_call))

    def launch_columns(self) -> dict[str, Any]:
        first = self.first_call
        if not first:
            return {}
        longest = max(first, key=lambda k: k.end_ns - k.start_ns)
        return {
            "traced_kernels": self.kernel_names,
            "traced_launches": len(first),
            "traced_ctas": longest.ctas,
            "traced_block": "x".join(str(v) for v in longest.block),
            "traced_registers": longest.registers,
        }


MARKER = "cublas_audit_call_marker"
MARKERS = (MARKER, "cublas_audit_call_marker_b")  # the map engine's (device.map_records)
# The marker that opens a recording, ahead of every call (the `order` name of its call, which
# belongs to no contender): CUPTI's start-up work for a recording (its first activity buffer)
# runs on it and a synchronize, never inside a timed call.
PRIME = ""

# Calls this long per kernel they launch are traced while their CUDA events time them. CUPTI's
# activity tracing costs the host about a microsecond per launch, which the events see where the
# GPU waits for the launch: under 0.1 % of such a call (a loop of `batch` cublasSgemm calls
# launches `batch` kernels, hence per launch). On the H100, traced against untraced event times
# of FP32 calls of 2.6 to 21 ms differed by 0.13 % at most (observer_overhead_h100.json). Shorter
# calls are traced in calls of their own after the event timing (trace_calls).
WITH_EVENTS_MS_PER_LAUNCH = 1.0
# How a call's kernel times were taken (the probe's `kernel_trace` field in timing.jsonl).
WITH_EVENTS = "with-events"  # in the event-timed calls themselves
AFTER_EVENTS = "after-events"  # in calls of their own, after the event timing


def trace_calls(
    contenders: Mapping[str, Callable[[], None]], reps: int, *, cold: bool = True
) -> dict[str, TracedCalls]:
    """Runs each contender `reps` times, round-robin like the event timing, a marker kernel before
    each call (`cold`: after an L2 flush, whose kernel no call keeps); returns their kernels per
    call."""
    with _Recorded(contenders, cold=cold) as recorded:
        for _ in range(reps):
            recorded.stream.synchronize()  # the round starts with free clocks (timing.timed_round)
            clocks.cool_down()
            for name, launch in contenders.items():
                if cold:
                    l2.flush()
                recorded.mark(name)
                launch()
        recorded.stream.synchronize()
    return recorded.traced()


def time_and_trace(
    launch: Callable[[], None], reps: int, *, cold: bool = False
) -> tuple[Timing, TracedCalls]:
    """The map's observation: `reps` calls, each timed with CUDA events (as timing does) and its
    kernels traced at once, so that one pass gives both times. The marker runs before the start
    event, outside the timed call. Warm unless `cold`, and never waiting for the clocks
    (clocks.cool_down): the map's fast pass says so in its record and its follow-up re-measures
    cold and settled."""
    contenders = {"call": launch}
    with _Recorded(contenders, cold=cold, settle=False) as recorded:
        rounds = [recorded.timed_round() for _ in range(reps)]
    return timing.timings_of(rounds)["call"], recorded.traced()["call"]


@dataclass(frozen=True)
class Observed:
    """Interleaved contenders timed with CUDA events, and their kernels (CUPTI), taken `how`:
    WITH_EVENTS (the timed calls themselves: one traced call per sample) or AFTER_EVENTS."""

    timings: dict[str, Timing]
    traced: dict[str, TracedCalls]
    how: str

    def columns(self) -> dict[str, Any]:
        """The table's kernel-time columns: the call's (`kernel_time_*` and its launches), each
        other contender's as `<name>_kernel_time_*` (ref, batched); `kernel_trace` says `how`
        (a field of the probe's record, no column)."""
        call = self.traced["call"]
        found: dict[str, Any] = {"kernel_time_status": "ok", "kernel_trace": self.how}
        found.update(call.columns("kernel_time"), **call.launch_columns())
        for name, calls in self.traced.items():
            if name != "call":
                found.update(calls.columns(f"{name}_kernel_time"))
        return found


def time_interleaved_traced(
    contenders: Mapping[str, Callable[[], None]],
    min_reps: int = timing.MIN_REPS,
    *,
    warmed_up: bool = False,
    launches: Mapping[str, int] | None = None,
    cold: bool = True,
) -> Observed:
    """timing.time_interleaved (round-robin rounds, sized by repetitions), with the kernels of the
    timed calls themselves traced where the calls are long enough that tracing cannot weigh on
    their event times (with_events: `launches` says how many kernels a contender's call launches,
    1 where it names none), else traced after the timing in calls of their own (trace_calls, as
    many as repetitions gives with at least MIN_REPS).

    `cold`: L2 flushed before every call (device.l2). Unless `warmed_up` (every contender has just
    run: a correctness check is a warm-up), an untraced
    warm-up round runs first and is dropped. The first round, which sizes the run and decides, is
    traced: where the calls are long it is the first sample and every round is timed and traced
    at once (a marker before each call's start event, so the markers split the kernels into the
    timed calls, whatever contenders interleave); where they are short it is dropped and the
    timed rounds run untraced."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    if not warmed_up:
        timing.timed_round(contenders, stream, cold=cold)
    with _Recorded(contenders, cold=cold) as recorded:
        rounds = [recorded.timed_round()]
        reps = timing.repetitions(max(rounds[0].values()), min_reps)
        long_calls = with_events(rounds[0], launches or {})
        if long_calls:
            rounds += [recorded.timed_round() for _ in range(reps - 1)]
    if long_calls:
        return Observed(timing.timings_of(rounds), recorded.traced(), WITH_EVENTS)
    rounds = [timing.timed_round(contenders, stream, cold=cold) for _ in range(reps)]
    timings = timing.timings_of(rounds)
    slowest = max(t.median_ms for t in timings.values())
    traced = trace_calls(contenders, timing.repetitions(slowest, MIN_REPS), cold=cold)
    return Observed(timings, traced, AFTER_EVENTS)


def with_events(first_ms: Mapping[str, float], launches: Mapping[str, int]) -> bool:
    """Whether every contender's first timed call lasted WITH_EVENTS_MS_PER_LAUNCH per kernel it
    launches (`launches`, 1 where a contender is not named): then tracing those calls cannot weigh
    on their event times."""
    return all(
        took >= WITH_EVENTS_MS_PER_LAUNCH * max(1, launches.get(name, 1))
        for name, took in first_ms.items()
    )


def assign_calls(order: Sequence[str], records: Sequence[KernelLaunch]) -> dict[str, TracedCalls]:
    """The kernels of each marked call (split_at_markers), given to the contender `order` names
    for its marker, in call order; the call of a PRIME marker belongs to none. Every marker must
    have been recorded, or no call can be told from the next."""
    calls = split_at_markers(records)
    if len(calls) != len(order):
        raise RuntimeError(f"CUPTI saw {len(calls)} of {len(order)} marked calls")
    grouped: dict[str, list[tuple[KernelLaunch, ...]]] = {}
    for name, kernels in zip(order, calls, strict=True):
        if name != PRIME:
            grouped.setdefault(name, []).append(kernels)
    return {name: TracedCalls(tuple(found)) for name, found in grouped.items()}


def split_at_markers(records: Sequence[KernelLaunch]) -> list[tuple[KernelLaunch, ...]]:
    """The kernels after each marker kernel up to the next, in GPU start order (one stream)."""
    calls: list[list[KernelLaunch]] = []
    for record in sorted(records, key=lambda k: k.start_ns):
        if record.name == MARKER:
            calls.append([])
        elif record.name == l2.FLUSH_KERNEL:
            continue  # queued between calls (cold timing): no call's
        elif calls:  # a kernel before the first marker belongs to no traced call
            calls[-1].append(record)
    return [tuple(call) for call in calls]


class _Recorded:
    """One CUPTI recording of marked calls on the current stream: opened with a PRIME marker and
    a synchronize, then each call after a marker (`mark`), its contender's name kept in order."""

    def __init__(
        self, contenders: Mapping[str, Callable[[], None]], *, cold: bool, settle: bool = True
    ) -> None:
        import cupy

        self.contenders = contenders
        self.cold = cold
        self.settle = settle  # timing.timed_round's; the map's fast pass never waits
        self.stream = cupy.cuda.get_current_stream()
        self.tracer = tracer()
        self.marker = marker()
        self.order: list[str] = []
        self.recording = self.tracer.recording()

    def __enter__(self) -> _Recorded:
        self.recording.__enter__()
        self.mark(PRIME)
        self.stream.synchronize()
        return self

    def __exit__(self, *exc: object) -> None:
        self.recording.__exit__(*exc)

    def mark(self, name: str) -> None:
        self.marker()
        self.order.append(name)

    def timed_round(self) -> dict[str, float]:
        """One call of each contender, each marked, then timed with CUDA events."""
        return timing.timed_round(
            self.contenders, self.stream, before=self.mark, cold=self.cold, settle=self.settle
        )

    def traced(self) -> dict[str, TracedCalls]:
        """Each contender's traced calls, once the recording is closed (every record flushed)."""
        return assign_calls(self.order, self.tracer.take())


@functools.lru_cache(maxsize=2)
def marker(name: str = MARKER) -> Callable[[], None]:
    """A launcher of the empty one-thread kernel `name` (one of MARKERS) on the current stream."""
    import cupy

    kernel = cupy.RawKernel(f'extern "C" __global__ void {name}() {{}}', name)
    return lambda: kernel((1,), (1,), ())
