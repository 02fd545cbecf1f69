"""Timing and tracing the same calls on the real GPU (device.kernel_trace.time_interleaved_traced):
a long call's event samples and its traced kernels are the same calls, the kernels inside each
call's events; a short call is traced after its timing."""

from __future__ import annotations

import dataclasses

import pytest

from cublas_audit.planning.cases import Case

pytestmark = pytest.mark.gpu


def test_long_calls_are_timed_and_traced_in_the_same_calls() -> None:
    pytest.importorskip("cupy")
    from cublas_audit.device import kernel_trace, launchers, operands

    if kernel_trace.available():
        pytest.skip(f"CUPTI cannot trace here: {kernel_trace.available()}")
    # 10.7 ms a call on the H100 (2.7 ms per matrix for the loop): long on any GPU
    case = Case("cublas", "fp32", 4096, 4096, 4096, 4)
    ops = operands.make_for(case, seed=5)
    contenders = {
        "call": launchers.loop(dataclasses.replace(case, loop=True), ops),
        "batched": launchers.classic(case, ops),
    }
    for launch in contenders.values():  # the correctness check, which is the warm-up
        assert operands.checked(launch, ops) <= operands.tolerance("fp32")
    seen = kernel_trace.time_interleaved_traced(
        contenders, 5, warmed_up=True, launches={"call": case.batch}
    )
    assert seen.how == kernel_trace.WITH_EVENTS
    for name in contenders:
        events = seen.timings[name].samples_ms
        kernels = seen.traced[name].timing().samples_ms
        assert len(events) >= 5 and len(kernels) == len(events) == len(seen.traced[name].calls)
        # the same calls: each call's kernels ran between its events (2 us for the timers)
        assert all(k <= e + 0.002 for k, e in zip(kernels, events, strict=True)), (kernels, events)
        assert all(k >= 0.5 * e for k, e in zip(kernels, events, strict=True))
    assert all(len(call) >= case.batch for call in seen.traced["call"].calls)


def test_short_calls_are_traced_after_their_timing() -> None:
    pytest.importorskip("cupy")
    from cublas_audit.device import kernel_trace, launchers, operands

    if kernel_trace.available():
        pytest.skip(f"CUPTI cannot trace here: {kernel_trace.available()}")
    case = Case("cublas", "fp32", 256, 256, 256, 1)
    ops = operands.make_for(case, seed=6)
    launch = launchers.classic(case, ops)
    assert operands.checked(launch, ops) <= operands.tolerance("fp32")
    seen = kernel_trace.time_interleaved_traced({"call": launch}, 20, warmed_up=True)
    assert seen.how == kernel_trace.AFTER_EVENTS
    assert seen.timings["call"].reps >= 20 and len(seen.traced["call"].calls) >= 10
    assert seen.columns()["kernel_time_status"] == "ok"
