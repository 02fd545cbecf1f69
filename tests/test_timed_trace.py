"""Timing and tracing the same calls (device.kernel_trace.time_interleaved_traced), on the CPU.

Long calls are traced while their CUDA events time them, short ones after the timing in calls of
their own. The kernels come from the recorded default batched sweep of the H100
(reports/h100/checks/20261124-003639-batched-no-ncu: kernel names, kernels per call, kernel and
event times); a fake stream runs them in host order on a fake GPU clock, and a fake CUPTI keeps
the kernels launched while it records, handed back shuffled as CUPTI's buffers come.
"""

from __future__ import annotations

import json
import random
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cublas_audit.device import kernel_trace, l2, timing
from cublas_audit.device.kernel_trace import (
    AFTER_EVENTS,
    MARKER,
    PRIME,
    WITH_EVENTS,
    KernelLaunch,
    assign_calls,
    with_events,
)

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "reports/h100/checks/20261124-003639-batched-no-ncu"
REFERENCE_KERNEL = "cublas_audit_ref_tma_sgemm"  # the reference's kernel under ncu, same grid
GAP_NS = 2_000  # host launch gap before each kernel on the fake stream


def recorded() -> dict[str, dict[str, Any]]:
    """The recorded timing results of the default batched grid, by case id."""
    lines = (json.loads(line) for line in (RUN / "timing.jsonl").read_text().splitlines())
    return {r["case_id"]: r for r in lines if r.get("event") == "done"}


class FakeGpu:
    """One stream in host order: each kernel starts after the previous one and a launch gap;
    CUPTI, while on, keeps a record of each kernel; each event-timed call notes whether it ran
    traced."""

    def __init__(self) -> None:
        self.clock = 0
        self.tracing = False
        self.records: list[KernelLaunch] = []
        self.timed: list[tuple[str, bool]] = []  # (first kernel's name, traced) per timed call
        self.ran: list[str] = []  # every kernel's name, in stream order

    def kernel(self, name: str, duration_ns: int) -> None:
        start = self.clock + GAP_NS
        self.clock = start + duration_ns
        self.ran.append(name)
        if self.tracing:
            self.records.append(KernelLaunch(name, start, self.clock, (1, 1, 1), (1, 1, 1), 32))

    def launcher(self, kernels: list[tuple[str, float]]) -> Callable[[], None]:
        def launch() -> None:
            for name, ms in kernels:
                self.kernel(name, round(ms * 1e6))

        launch.kernels = kernels  # type: ignore[attr-defined]
        return launch

    def one_call_ms(self, launch: Any, stream: object) -> float:
        start = self.clock
        launch()
        self.timed.append((launch.kernels[0][0], self.tracing))
        return (self.clock - start) / 1e6


class FakeTracer:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu

    @contextmanager
    def recording(self) -> Iterator[None]:
        self.take()
        self.gpu.tracing = True
        try:
            yield
        finally:
            self.gpu.tracing = False

    def take(self) -> list[KernelLaunch]:
        taken, self.gpu.records = self.gpu.records, []
        random.Random(len(taken)).shuffle(taken)  # CUPTI's buffers come in any order
        return taken


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake = FakeGpu()
    stream = types.SimpleNamespace(synchronize=lambda: None)
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(timing, "one_call_ms", fake.one_call_ms)
    monkeypatch.setattr(kernel_trace, "tracer", lambda: FakeTracer(fake))
    marker = lambda name=MARKER: lambda: fake.kernel(name, 1_000)  # noqa: E731
    monkeypatch.setattr(kernel_trace, "marker", marker)
    # cold timing's L2 flush: a kernel of its own on the stream, between calls (20 us)
    monkeypatch.setattr(l2, "flush", lambda: fake.kernel(l2.FLUSH_KERNEL, 20_000))
    return fake


def test_cold_rounds_flush_before_every_call_and_no_call_keeps_the_flush(gpu: FakeGpu) -> None:
    contenders = contenders_of(gpu, "cublas.fp32.256x256x256.b4.nn", ref=True)

    def noted(launch: Callable[[], None]) -> Callable[[], None]:
        def call() -> None:
            gpu.ran.append("<call>")
            launch()

        call.kernels = launch.kernels  # type: ignore[attr-defined]
        return call

    seen = kernel_trace.time_interleaved_traced(
        {name: noted(launch) for name, launch in contenders.items()}, 20, warmed_up=True
    )
    # the traced calls hold the call's own kernels alone
    for calls in seen.traced.values():
        assert all(l2.FLUSH_KERNEL not in {k.name for k in call} for call in calls.calls)
    # and every call, timed or traced, ran right after a flush (and its marker, where traced)
    ran = gpu.ran
    starts = [i for i, name in enumerate(ran) if name == "<call>"]
    assert len(starts) > 400
    for i in starts:
        before = ran[i - 2] if ran[i - 1] == MARKER else ran[i - 1]
        assert before == l2.FLUSH_KERNEL, ran[max(0, i - 3) : i + 1]


def test_warm_rounds_never_flush(gpu: FakeGpu) -> None:
    contenders = contenders_of(gpu, "cublas.fp32.256x256x256.b4.nn")
    kernel_trace.time_interleaved_traced(contenders, 20, warmed_up=True, cold=False)
    timing.time_interleaved(contenders, 20, cold=False)
    kernel_trace.trace_calls(contenders, 5, cold=False)
    assert gpu.ran and l2.FLUSH_KERNEL not in gpu.ran


def contenders_of(gpu: FakeGpu, case_id: str, *, ref: bool = False) -> dict[str, Any]:
    """The recorded case as a call of its kernels (the loop's `traced_launches` kernels share its
    kernel time), and the reference beside it when asked."""
    result = recorded()[case_id]
    names = result["traced_kernels"].split(" + ")
    launches = result["traced_launches"]
    each = result["kernel_time_ms"] / launches
    found = {"call": gpu.launcher([(names[i % len(names)], each) for i in range(launches)])}
    if ref:
        found["ref"] = gpu.launcher([(REFERENCE_KERNEL, result["ref_kernel_time_ms"])])
    return found


def test_long_calls_are_traced_in_their_timed_calls_with_the_reference_interleaved(
    gpu: FakeGpu,
) -> None:
    contenders = contenders_of(gpu, "cublas.fp32.8192x8192x8192.b16.nn", ref=True)
    seen = kernel_trace.time_interleaved_traced(
        contenders, 20, warmed_up=True, launches={"call": 1}
    )
    assert seen.how == WITH_EVENTS
    # one traced call per event sample, every timed call traced, no call of its own after; a
    # call of ~340 ms is timed as often as 20 x 0.1 s holds (timing.repetitions): 5 times
    assert [t.reps for t in seen.timings.values()] == [5, 5]
    assert [len(t.calls) for t in seen.traced.values()] == [5, 5]
    assert len(gpu.timed) == 10 and all(traced for _name, traced in gpu.timed)
    # each contender got its own kernels, and each call's kernels fit inside its event time
    assert {k.name for call in seen.traced["ref"].calls for k in call} == {REFERENCE_KERNEL}
    assert REFERENCE_KERNEL not in {k.name for call in seen.traced["call"].calls for k in call}
    for name in contenders:
        kernel_ms = seen.traced[name].timing().samples_ms
        events_ms = seen.timings[name].samples_ms
        assert all(k <= e for k, e in zip(kernel_ms, events_ms, strict=True))
    columns = seen.columns()
    assert columns["kernel_trace"] == WITH_EVENTS and columns["kernel_time_n"] == 5
    assert columns["ref_kernel_time_n"] == 5 and columns["traced_launches"] == 1


def test_a_long_loop_interleaved_with_its_batched_call_is_split_at_its_markers(
    gpu: FakeGpu,
) -> None:
    # the recheck's contenders: the loop of 4 launches of 2.7 ms, the batched call beside it
    loop = contenders_of(gpu, "loop.fp32.4096x4096x4096.b4.nn")["call"]
    batched = contenders_of(gpu, "cublas.fp32.4096x4096x4096.b4.nn")["call"]
    seen = kernel_trace.time_interleaved_traced(
        {"call": loop, "batched": batched}, 100, warmed_up=True, launches={"call": 4}
    )
    assert seen.how == WITH_EVENTS
    assert [len(call) for call in seen.traced["call"].calls] == [4] * 100
    assert [len(call) for call in seen.traced["batched"].calls] == [1] * 100
    assert "batched_kernel_time_ms" in seen.columns()


def test_short_calls_are_timed_untraced_then_traced_in_calls_of_their_own(gpu: FakeGpu) -> None:
    # the 256^3 batch 4 loop: 8 launches (the GEMM and its split-K reduction per matrix) of
    # 25 us in all, with the batched call interleaved
    loop = contenders_of(gpu, "loop.fp32.256x256x256.b4.nn")["call"]
    batched = contenders_of(gpu, "cublas.fp32.256x256x256.b4.nn")["call"]
    seen = kernel_trace.time_interleaved_traced(
        {"call": loop, "batched": batched}, 20, warmed_up=True, launches={"call": 4}
    )
    assert seen.how == AFTER_EVENTS
    # the first, traced round only sized the run: the 200 samples kept are all untraced
    assert [t.reps for t in seen.timings.values()] == [200, 200]
    assert gpu.timed[:2] == [(loop.kernels[0][0], True), (batched.kernels[0][0], True)]
    assert not any(traced for _name, traced in gpu.timed[2:]) and len(gpu.timed) == 402
    # then traced in calls of their own, as many as repetitions gives the slowest
    assert [len(t.calls) for t in seen.traced.values()] == [200, 200]
    assert all(len(call) == 8 for call in seen.traced["call"].calls)
    assert seen.columns()["kernel_trace"] == AFTER_EVENTS


def test_a_loop_short_per_launch_is_traced_after_its_timing(gpu: FakeGpu) -> None:
    # 5.4 ms in all, but 16 launches of 0.34 ms: tracing would weigh on each launch
    loop = contenders_of(gpu, "loop.fp32.2048x2048x2048.b16.nn")
    seen = kernel_trace.time_interleaved_traced(loop, 20, warmed_up=True, launches={"call": 16})
    assert seen.how == AFTER_EVENTS and seen.timings["call"].reps == 20
    # repetitions(5.4 ms, at least 10) = 19 calls of its own
    assert len(seen.traced["call"].calls) == 19


def test_without_a_warm_up_behind_it_a_round_runs_untraced_and_is_dropped(gpu: FakeGpu) -> None:
    contenders = contenders_of(gpu, "cublasLt.fp32.8192x8192x8192.b4.nn")
    seen = kernel_trace.time_interleaved_traced(contenders, 20, warmed_up=False)
    assert seen.how == WITH_EVENTS and seen.timings["call"].reps == 20
    assert len(seen.traced["call"].calls) == 20
    assert [traced for _name, traced in gpu.timed] == [False] + [True] * 20


@pytest.mark.parametrize(
    ("first_ms", "launches", "traced"),
    [
        ({"call": 1.0}, {}, True),  # the threshold itself
        ({"call": 0.99}, {}, False),
        ({"call": 1.39, "ref": 1.43}, {"call": 1}, True),  # cublas 2048^3 b4 and the reference
        ({"call": 1.39}, {"call": 4}, False),  # its loop: 4 launches of 0.35 ms
        ({"call": 10.6}, {"call": 4}, True),  # the 4096^3 b4 loop
        ({"call": 42.0, "batched": 0.7}, {"call": 16}, False),  # one short contender: none
        ({"call": 2.0}, {"call": 0}, True),  # a call counts at least one launch
    ],
)
def test_which_calls_are_traced_with_their_events(
    first_ms: dict[str, float], launches: dict[str, int], traced: bool
) -> None:
    assert kernel_trace.WITH_EVENTS_MS_PER_LAUNCH == 1.0
    assert with_events(first_ms, launches) is traced


def test_on_the_recorded_grid_the_long_calls_need_no_second_pass() -> None:
    """The traced pass after the timing took 28.6 s of GPU time in the recorded sweep; the calls
    long enough to be traced with their events made all but about 1.4 s of it."""
    saved = kept = 0.0
    for result in recorded().values():
        first = {"call": result["time_ms"]}
        if "ref_time_ms" in result:
            first["ref"] = result["ref_time_ms"]
        api, _mode, _size, batch, _layout = result["case_id"].split(".")
        launches = int(batch.removeprefix("b")) if api == "loop" else 1
        pass_s = (
            result["kernel_time_n"]
            * sum(result.get(key) or 0.0 for key in ("kernel_time_ms", "ref_kernel_time_ms"))
            / 1e3
        )
        if with_events(first, {"call": launches}):
            saved += pass_s
        else:
            kept += pass_s
    assert saved > 27.0 and kept < 1.5


def test_calls_are_given_to_their_contenders_in_order_and_a_lost_marker_fails() -> None:
    names = recorded()["loop.fp32.256x256x256.b4.nn"]["traced_kernels"].split(" + ")
    gemm, split_k = names
    records = [
        KernelLaunch(MARKER, 0, 1, (1, 1, 1), (1, 1, 1), 8),  # the PRIME marker
        KernelLaunch(MARKER, 10, 11, (1, 1, 1), (1, 1, 1), 8),
        KernelLaunch(gemm, 12, 15, (256, 1, 1), (64, 1, 1), 80),
        KernelLaunch(split_k, 16, 17, (64, 1, 1), (128, 1, 1), 32),
        KernelLaunch(MARKER, 20, 21, (1, 1, 1), (1, 1, 1), 8),
        KernelLaunch(gemm, 22, 26, (256, 1, 1), (64, 1, 1), 80),
        KernelLaunch(MARKER, 30, 31, (1, 1, 1), (1, 1, 1), 8),
        KernelLaunch(gemm, 32, 35, (256, 1, 1), (64, 1, 1), 80),
        KernelLaunch(split_k, 36, 37, (64, 1, 1), (128, 1, 1), 32),
    ]
    shuffled = random.Random(3).sample(records, len(records))
    traced = assign_calls([PRIME, "call", "batched", "call"], shuffled)
    assert list(traced) == ["call", "batched"]
    assert [[k.name for k in call] for call in traced["call"].calls] == [[gemm, split_k]] * 2
    assert [[k.name for k in call] for call in traced["batched"].calls] == [[gemm]]
    with pytest.raises(RuntimeError, match="CUPTI saw 3 of 4 marked calls"):
        assign_calls([PRIME, "call", "batched", "call"], [r for r in records if r.start_ns != 20])


def test_a_calls_memset_is_its_time_but_no_kernel_of_its_own() -> None:
    """cuBLASLt zeroes the output before some pinned nvjet kernels: torch.profiler counted that
    Memset (reports/h100/fixes/20261127-105300-torch2.14.1, bf16 5888x832x4480), so the tool's
    kernel time counts it too, while the call's kernels stay the GEMM's."""
    from cublas_audit.device.kernel_trace import MEMSET, TracedCalls

    gemm = "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_coopA_NNT"
    call = (
        KernelLaunch(MEMSET, 0, 4_000, (0, 0, 0), (0, 0, 0), 0),
        KernelLaunch(gemm, 5_000, 105_000, (46, 7, 1), (384, 1, 1), 168),
    )
    traced = TracedCalls((call, call))
    assert traced.timing().samples_ms == pytest.approx((0.104, 0.104))  # 4 us memset + 100 us GEMM
    assert traced.kernel_names == gemm
    assert traced.launch_columns()["traced_launches"] == 1
    assert traced.launch_columns()["traced_ctas"] == 46 * 7
