"""A map case's record (device.map_engine): its quick check, and where the result is right its
timed calls with their kernels; and a case the engine does not pool, measured on its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cublas_audit.device import clocks, kernel_trace, operands
from cublas_audit.device.operands import Operands
from cublas_audit.device.timing import Timing

Launch = Callable[[], None]


def map_result(
    mode: str,
    error: float,
    timing: Timing | None = None,
    traced: kernel_trace.TracedCalls | str = "",
    state: dict[str, float | int] | None = None,
) -> dict[str, Any]:
    """A map case's record: its quick check, and where the result is right its timed calls and
    their kernels (`traced`), or why none were traced."""
    result: dict[str, Any] = {"max_rel_err": error, "check": "quick"}
    tolerance = operands.tolerance(mode)
    if not error <= tolerance or timing is None:
        detail = f"relative error {error:.3g} > {tolerance:g} (quick check)"
        return {**result, "status": "wrong", "detail": detail}
    if isinstance(traced, str):
        result["kernel_time_status"] = traced
    else:
        result.update(traced.columns("kernel_time"), **traced.launch_columns())
        result["kernel_time_status"] = "ok"
    result.update(status="ok", **timing.summary("time"), **(state or {}))
    result["time_samples_ms"] = list(timing.samples_ms)
    return result


def measure_alone(ops: Operands, launch: Launch, reps: int, untraced: str) -> dict[str, Any]:
    """A case on its own (beta != 0, or beyond the pool): the quick check first (also the
    warm-up: a wrong result is not timed), then `reps` calls timed and traced together, events
    alone where CUPTI cannot trace (`untraced` says why)."""
    import cupy

    from cublas_audit.device.timing import one_call_ms

    error = operands.checked(launch, ops, quick=True)
    if not error <= operands.tolerance(ops.mode):
        return map_result(ops.mode, error)
    if untraced:
        stream = cupy.cuda.get_current_stream()
        timing = Timing(tuple(one_call_ms(launch, stream) for _ in range(reps)))
        return map_result(ops.mode, error, timing, f"unavailable: {untraced}", clocks.state())
    timing, traced = kernel_trace.time_and_trace(launch, reps)
    return map_result(ops.mode, error, timing, traced, clocks.state())
