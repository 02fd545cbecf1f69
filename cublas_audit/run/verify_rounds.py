"""`verify`: each fix of a fix.json rebuilt and re-measured on this GPU, never trusted.

Per fix: the pin is rebuilt (cublasLtMatmulAlgoInit + its attributes) and checked with
cublasLtMatmulAlgoCheck (a pin this cuBLAS cannot build is `refused`); a shape change runs the
problem it names instead. Default and fixed then run interleaved, in two independent rounds, on
kernel time where CUPTI traces (else CUDA events); and each result is compared with a float64
product after its output was poisoned with NaN, so a call that computed nothing or something
wrong is `wrong result`, loudly, whatever its speed. A fix holds when both rounds put the default
beyond the interleaved noise floor and the threshold, as the candidate audit judged it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cublas_audit.device import kernel_trace, launchers, operands, timing
from cublas_audit.device.lt_pin import pinned_candidate
from cublas_audit.errors import PinRefused
from cublas_audit.judge.candidates import DEFAULT_THRESHOLD, floor_words, rounds_hold
from cublas_audit.judge.fixes import short_names
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.table.fix_file import Fix, FixSet, Stamp
from cublas_audit.vocabulary import Outcome

HOLDS, DOES_NOT_HOLD, REFUSED, WRONG = (
    Outcome.holds,
    Outcome.does_not_hold,
    Outcome.refused,
    Outcome.wrong,
)
MIN_REPS = 10


@dataclass(frozen=True)
class Checked:
    """One fix as measured here."""

    fix_id: str
    status: str
    reason: str = ""
    timing: str = ""
    default_ms: float | None = None
    fixed_ms: float | None = None
    speedup: float | None = None
    confirm_speedup: float | None = None
    default_kernel: str = ""
    fixed_kernel: str = ""
    default_error: float | None = None
    fixed_error: float | None = None

    def line(self) -> str:
        if self.status == HOLDS:
            return f"{self.fix_id}: holds ({self.speedup:.2f}x, again {self.confirm_speedup:.2f}x)"
        if self.status == DOES_NOT_HOLD and self.speedup is not None:
            return f"{self.fix_id}: does not hold here ({self.speedup:.2f}x; {self.reason})"
        return f"{self.fix_id}: {self.status} ({self.reason})"


@dataclass(frozen=True)
class Side:
    """One contender: its launch, the operands it writes, and the problem it runs."""

    run: Callable[[], None]
    ops: operands.Operands
    case: Case


def verify(
    fixes: FixSet,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    progress: Callable[[str], None] = print,
    cold: bool = True,
) -> list[Checked]:
    """Every fix of `fixes` measured on the current GPU (`cold`: L2 flushed before every timed
    call, device.l2)."""
    checked = []
    for fix in fixes.fixes:
        found = verify_fix(fix, threshold, cold=cold)
        progress(found.line())
        checked.append(found)
    return checked


def verify_fix(fix: Fix, threshold: float = DEFAULT_THRESHOLD, *, cold: bool = True) -> Checked:
    import cupy

    try:
        with _sides(fix) as (default, fixed):
            return _measured(fix, default, fixed, threshold, cold)
    except PinRefused as exc:
        return Checked(fix.id, REFUSED, str(exc))
    except cupy.cuda.memory.OutOfMemoryError:
        return Checked(fix.id, DOES_NOT_HOLD, "out of memory on this GPU: not measured")
    finally:
        cupy.get_default_memory_pool().free_all_blocks()


@contextlib.contextmanager
def _sides(fix: Fix) -> Iterator[tuple[Side, Side]]:
    """The default and the fixed call, on operands of their own problems."""
    workspace = max(fix.pin.workspace_bytes if fix.pin else 0, DEFAULT_WORKSPACE_BYTES)
    case = fix.problem.case()
    ops = operands.make_for(case)
    with launchers.lt(case, ops, workspace) as gemm:
        default = Side(functools.partial(gemm.run, gemm.default()), ops, case)
        if fix.pin is not None:
            pinned = pinned_candidate(gemm, fix.pin)
            if pinned.workspace_bytes > gemm.workspace_bytes:  # never a silent non-result
                raise PinRefused(
                    f"the pin needs {pinned.workspace_bytes} B of workspace here, more than the "
                    f"{gemm.workspace_bytes} B given"
                )
            yield default, Side(functools.partial(gemm.run, pinned), ops, case)
            return
        assert fix.instead is not None  # fix_file refuses a shape change without it
        other = fix.instead.case()
        other_ops = operands.make_for(other)
        with launchers.lt(other, other_ops, workspace) as changed:
            yield default, Side(functools.partial(changed.run, changed.default()), other_ops, other)


def _measured(fix: Fix, default: Side, fixed: Side, threshold: float, cold: bool = True) -> Checked:
    """Results first: a fixed call whose output differs from float64 (or stayed as poisoned:
    it computed nothing) is a wrong result, and is not timed; then the two timing rounds."""
    errors = [operands.checked(side.run, side.ops) for side in (default, fixed)]
    if errors[1] > operands.tolerance(fix.problem.mode):
        reason = f"the fixed call's result differs from a float64 product: error {errors[1]:.3g}"
        return Checked(fix.id, WRONG, reason, default_error=errors[0], fixed_error=errors[1])
    contenders = {"default": default.run, "fixed": fixed.run}
    first, kernels, basis = _round(contenders, cold)
    second, _, _ = _round(contenders, cold)
    ratio, again = first["default"] / first["fixed"], second["default"] / second["fixed"]
    holds = rounds_hold((ratio, again), threshold)  # the judge's verdict on both rounds
    reason = "" if holds else f"not beyond the {floor_words(threshold)} in both rounds"
    return Checked(
        fix.id,
        HOLDS if holds else DOES_NOT_HOLD,
        reason,
        timing=basis,
        default_ms=first["default"],
        fixed_ms=first["fixed"],
        speedup=ratio,
        confirm_speedup=again,
        default_kernel=kernels.get("default", ""),
        fixed_kernel=kernels.get("fixed", ""),
        default_error=errors[0],
        fixed_error=errors[1],
    )


def _round(
    contenders: dict[str, Callable[[], None]], cold: bool
) -> tuple[dict[str, float], dict[str, str], str]:
    """One interleaved round: median time per contender, the kernels each launched, and the
    basis ('kernel' where CUPTI traced them, else 'call')."""
    events = timing.time_interleaved(contenders, MIN_REPS, cold=cold)
    if kernel_trace.available() is not None:
        return {k: t.median_ms for k, t in events.items()}, {}, "call"
    reps = max(MIN_REPS, min(t.reps for t in events.values()))
    traced = kernel_trace.trace_calls(contenders, reps, cold=cold)
    times = {name: calls.timing().median_ms for name, calls in traced.items()}
    kernels = {name: short_names(calls.kernel_names) for name, calls in traced.items()}
    return times, kernels, "kernel"


def elsewhere(stamp: Stamp, here: Stamp) -> str:
    """'' where the fixes were proven on this GPU model and cuBLAS, else what differs (no error:
    they are re-measured here)."""
    differs = [
        f"{what} {theirs} (here {ours})"
        for what, theirs, ours in (
            ("GPU", stamp.gpu_name, here.gpu_name),
            ("cuBLAS", stamp.cublas_version, here.cublas_version),
            ("driver", stamp.driver_version, here.driver_version),
        )
        if theirs != ours
    ]
    return "; ".join(differs)
