"""The measuring half of the candidate audit (judge.candidates: its table and verdicts).

For each problem, posed exactly as the plan's case poses it (layout, leading dimensions,
broadcast, beta, bias, workspace limit), every candidate the heuristic returns (up to a limit) is
run once and its output compared with the default's, then the candidates that ran correctly are
timed together (CUDA events, interleaved rounds, median) and traced with CUPTI for their
kernel-only times where it can trace; a second, independent round of the default and the best
confirms or refutes a gap, on the same basis, where the judge asks for it (`Screen.confirm`,
judge.candidates.ScreenJudge: the child measures, never compares a gap with a threshold). Each
case is judged on its kernels' time where every timed candidate has one
(table.candidates_table.timing_basis): a call's event time holds launch overhead that dilutes a
short kernel's gap. Runs in the probe's child process
(`--phase candidates`), so the sweep's --probe-python, --cublas-lib and --probe-env apply to it
as to every other measurement.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import pandas as pd

from cublas_audit.device import kernel_trace, l2, launchers, lt, operands, timing
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case, candidate_problems
from cublas_audit.table import rundir
from cublas_audit.table.candidates_table import (
    CONFIRM_COLUMNS,
    DEFAULT_LIMIT,
    DEFAULT_MIN_REPS,
    SCHEMA_VERSION,
    from_records,
    journal_line,
    problem_columns,
    read_journal,
    write_candidates,
)

# A first, short interleaved round (this many timed calls each, at least) ranks the candidates;
# only those within SCREEN_MARGIN of its best, and the default, get the full >= min_reps round.
# Calls long enough to need screening (>= ~5 ms) vary by ~1% call to call: a candidate 10%
# behind after two calls is not the best one.
SCREEN_REPS = 2
SCREEN_MARGIN = 1.10
# Two correct algorithms differ from each other by at most the sum of their errors.
CROSS_CHECK_FACTOR = 2.0


class Screen(Protocol):
    """What the audit asks its judge between rounds (judge.candidates.ScreenJudge), handed in by
    whoever starts it: the measuring side decides nothing."""

    def confirm(self, rows: pd.DataFrame) -> str | None:
        """The candidate to time again against the default after the first round (its key)."""
        ...

    def progress_line(self, case_id: str, rows: pd.DataFrame) -> str:
        """One problem's audit in a line."""
        ...


@dataclass
class Settings:
    screen: Screen
    limit: int = DEFAULT_LIMIT
    min_reps: int = DEFAULT_MIN_REPS
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES
    gpu_label: str = ""
    log: IO[str] = field(default_factory=lambda: sys.stderr)
    trace: bool = True  # kernel-only times through CUPTI (False: event times alone)
    cold: bool = True  # L2 flushed before every timed call (device.l2)


def run_candidates(
    cases: Iterable[Case],
    out_dir: Path | None,
    limit: int = DEFAULT_LIMIT,
    *,
    screen: Screen,
    min_reps: int = DEFAULT_MIN_REPS,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
    gpu_label: str = "",
    progress: Callable[[str], None] = lambda line: None,
    journal: Path | None = None,
    started: Callable[[str], None] = lambda case_id: None,
    finished: Callable[[str], None] = lambda case_id: None,
    trace: bool = True,
    cold: bool = True,
) -> pd.DataFrame:
    """Audits every problem of `cases`; writes candidates.csv (and candidates.log, the
    tracebacks of failed cases and candidates) to out_dir when given. One failing case never
    stops the rest: it becomes a `skipped` row with its reason. With a `journal`
    (candidates.jsonl of a run directory), each problem's rows are appended to it as it finishes,
    and the problems it already holds are taken from it, not measured again (a resumed audit).
    `started` and `finished` hear each problem's case_id (the probe's progress lines). `trace`
    False (--observer events) times with events alone, as where CUPTI cannot trace. `cold` (the
    default) flushes L2 before every timed call; every row records which (`operands`)."""
    lt.bindings()  # a missing nvmath-python is one clear error before any work
    todo = candidate_problems(cases)
    done = read_journal(journal) if journal is not None else {}
    log_path = out_dir / rundir.CANDIDATES_LOG if out_dir is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    with (
        open(log_path, "a") if log_path else contextlib.nullcontext(sys.stderr) as log,
        open(journal, "a") if journal else contextlib.nullcontext() as journal_out,
    ):
        settings = Settings(screen, limit, min_reps, workspace_bytes, gpu_label, log)
        settings.trace = trace and _can_trace(log)
        settings.cold = cold
        for number, case in enumerate(todo, 1):
            if case.case_id in done:
                continue
            started(case.case_id)
            rows = audit_case(case, settings)
            done[case.case_id] = rows
            if journal_out is not None:
                journal_out.write(journal_line(case.case_id, rows))
                journal_out.flush()
            line = screen.progress_line(case.case_id, from_records(rows))
            progress(f"[{number}/{len(todo)}] {line}")
            finished(case.case_id)
    frame = from_records([row for case in todo for row in done[case.case_id]])
    if out_dir is not None:
        write_candidates(frame, out_dir / rundir.CANDIDATES_FILE)
    return frame


def _can_trace(log: IO[str]) -> bool:
    """Whether CUPTI traces in this process; where it cannot, the reason goes to the log once."""
    missing = kernel_trace.available()
    if missing:
        log.write(f"--- CUPTI unavailable, candidates timed with events alone: {missing}\n")
    return not missing


def audit_case(case: Case, settings: Settings) -> list[dict[str, Any]]:
    """The rows of one problem: one per candidate, or one `skipped` row with the reason."""
    import cupy

    workspace = case.workspace_limit(settings.workspace_bytes)
    base = {
        "schema_version": SCHEMA_VERSION,
        "gpu_label": settings.gpu_label,
        "case_id": case.case_id,
        "mode": case.mode,
        "m": case.m,
        "n": case.n,
        "k": case.k,
        "batch": case.batch,
        **problem_columns(case, workspace),
        "operands": l2.temperature(settings.cold),
    }
    try:
        rows = _audit(case, settings, base, workspace)
    except Exception as exc:  # out of memory, no algorithm, a failing default: record, go on
        _log_exception(settings.log, case.case_id, exc)
        rows = [{"status": "skipped", "reason": _reason(exc)}]
    finally:
        cupy.get_default_memory_pool().free_all_blocks()
    return [{**base, **row} for row in rows]


def _audit(
    case: Case, settings: Settings, base: Mapping[str, Any], workspace: int
) -> list[dict[str, Any]]:
    """The candidates of the case's own problem, each row complete (`base`: the problem)."""
    ops = operands.make_for(case)
    with launchers.lt(case, ops, workspace) as gemm:
        listed = _with_default(gemm.heuristics(settings.limit), gemm.default())
        default = next(cand for cand, is_default in listed if is_default)
        default_error = operands.checked(functools.partial(gemm.run, default), ops)
        expected = ops.c.copy()  # what every other candidate is checked against
        rows = [
            {**base, **_check(gemm, cand, is_default, ops, expected, default_error, case, settings)}
            for cand, is_default in listed
        ]
        _time_rows(gemm, listed, rows, case, settings)
    return rows


def _with_default(
    listed: list[lt.LtCandidate], default: lt.LtCandidate
) -> list[tuple[lt.LtCandidate, bool]]:
    """Marks the default in the heuristic's list; appends it when the list (limit) lacks it."""
    key = default.algo.tobytes()
    marked = [(cand, cand.algo.tobytes() == key) for cand in listed]
    if not any(is_default for _, is_default in marked):
        default.index = len(listed)
        marked.append((default, True))
    return marked


def _check(
    gemm: lt.LtGemm,
    cand: lt.LtCandidate,
    is_default: bool,
    ops: operands.Operands,
    expected: Any,
    default_error: float,
    case: Case,
    settings: Settings,
) -> dict[str, Any]:
    """Runs one candidate once and compares its output with the default's."""
    row: dict[str, Any] = {**cand.attributes(), "is_default": int(is_default)}
    row["candidate"] = row.pop("index")
    tolerance = operands.tolerance(case.mode)
    if is_default:
        wrong = default_error > tolerance
        reason = f"differs from a float64 product: error {default_error:.3g}" if wrong else ""
        status = "wrong" if wrong else "ok"
        return {**row, "status": status, "reason": reason, "rel_err": default_error}
    if cand.workspace_bytes > gemm.workspace_bytes:
        reason = f"needs {cand.workspace_bytes} B of workspace, {gemm.workspace_bytes} B allowed"
        return {**row, "status": "unsupported", "reason": reason}
    status, reason, error = _run_and_compare(gemm, cand, ops, expected, case, settings)
    return {**row, "status": status, "reason": reason, "rel_err": error}


def _run_and_compare(
    gemm: lt.LtGemm,
    cand: lt.LtCandidate,
    ops: operands.Operands,
    expected: Any,
    case: Case,
    settings: Settings,
) -> tuple[str, str, float]:
    import cupy

    operands.reset(ops)
    try:
        gemm.run(cand)
        cupy.cuda.get_current_stream().synchronize()
    except Exception as exc:
        _log_exception(settings.log, f"{case.case_id} candidate {cand.index}", exc)
        status = "unsupported" if "NOT_SUPPORTED" in str(exc) else "failed"
        return status, _reason(exc), math.nan
    error = operands.relative_error(ops.c, expected)
    limit = CROSS_CHECK_FACTOR * operands.tolerance(case.mode)
    if error > limit:
        return "wrong", f"differs from the default's output: error {error:.3g} > {limit:g}", error
    return "ok", "", error


def _time_rows(
    gemm: lt.LtGemm,
    listed: Sequence[tuple[lt.LtCandidate, bool]],
    rows: list[dict[str, Any]],
    case: Case,
    settings: Settings,
) -> None:
    """Fills time_ms, min_ms, reps, timing, tflops, kernel_ms and kernels, and the confirmation
    round's times."""
    launchers = {
        str(cand.index): functools.partial(gemm.run, cand)
        for (cand, _), row in zip(listed, rows, strict=True)
        if row["status"] == "ok"
    }
    if not launchers:
        return
    default_key = str(next(cand.index for cand, is_default in listed if is_default))
    times = time_candidates(launchers, default_key, settings.min_reps, cold=settings.cold)
    traced = _kernel_times(launchers, times, case, settings)
    for row in rows:
        key = str(row["candidate"])
        if key in times:
            took, how = times[key]
            row.update(time_ms=took.median_ms, min_ms=took.min_ms, reps=took.reps)
            row.update(timing=how, tflops=case.flops / (took.median_ms * 1e9))
        if key in traced and traced[key].first_call:
            row.update(kernel_ms=_kernel_ms(traced[key]), kernels=traced[key].kernel_names)
    _confirm(launchers, default_key, rows, case, settings)


def time_candidates(
    launchers: Mapping[str, Callable[[], None]], default_key: str, min_reps: int, *, cold: bool
) -> dict[str, tuple[timing.Timing, str]]:
    """key -> (Timing, "full" | "screen"): a screening round over all candidates, then a full
    round (>= min_reps each) over the default and those near the screening's best."""
    # Every candidate has just run for its correctness check, and the finalists in the screen.
    screen = timing.time_interleaved(
        launchers, min(SCREEN_REPS, min_reps), warmed_up=True, cold=cold
    )
    if all(t.reps >= min_reps for t in screen.values()):
        return {key: (t, "full") for key, t in screen.items()}  # short calls: screen was full
    finalists = finalist_keys({key: t.median_ms for key, t in screen.items()}, default_key)
    chosen = {key: launchers[key] for key in finalists}
    full = timing.time_interleaved(chosen, min_reps, warmed_up=True, cold=cold)
    return {
        key: (full[key], "full") if key in full else (screen[key], "screen") for key in launchers
    }


def finalist_keys(medians: Mapping[str, float], default_key: str) -> list[str]:
    """The default and every candidate within SCREEN_MARGIN of the fastest, in input order."""
    best = min(medians.values())
    return [k for k, t in medians.items() if k == default_key or t <= SCREEN_MARGIN * best]


def _kernel_times(
    launchers: Mapping[str, Callable[[], None]],
    times: Mapping[str, tuple[timing.Timing, str]],
    case: Case,
    settings: Settings,
) -> dict[str, kernel_trace.TracedCalls]:
    """Each timed candidate's kernels, traced after the event timing (tracing never weighs on
    the event times) with as many calls as its round made: the finalists interleaved together,
    the screened-out ones (long calls, > SCREEN_MARGIN behind) in a short round of their own.
    Empty where CUPTI cannot trace; a tracing failure is logged and leaves the case on its
    call times."""
    if not settings.trace:
        return {}
    rounds: dict[str, list[str]] = {}
    for key, (_took, how) in times.items():
        rounds.setdefault(how, []).append(key)
    traced: dict[str, kernel_trace.TracedCalls] = {}
    try:
        for keys in rounds.values():
            reps = max(times[key][0].reps for key in keys)
            chosen = {key: launchers[key] for key in keys}
            traced.update(kernel_trace.trace_calls(chosen, reps, cold=settings.cold))
    except Exception as exc:  # CUPTI lost calls or failed: event times still stand
        _log_exception(settings.log, f"{case.case_id} kernel trace", exc)
        return {}
    return traced


def _kernel_ms(traced: kernel_trace.TracedCalls) -> float | None:
    """The median kernel-only time of a candidate's traced calls; None where no call of it was
    seen launching a kernel."""
    return traced.timing().median_ms if traced.first_call else None


def _confirm(
    launchers: Mapping[str, Callable[[], None]],
    default_key: str,
    rows: list[dict[str, Any]],
    case: Case,
    settings: Settings,
) -> None:
    """A second, independent round (fresh warm-up and repetitions) of the default against the
    candidate the judge names (where the first round shows a gap worth confirming), on the first
    round's basis (kernel or call time)."""
    screened = from_records(rows)
    best = settings.screen.confirm(screened)
    if best is None or best == default_key:
        return
    keys = (default_key, best)
    pair = {key: launchers[key] for key in keys}
    again = timing.time_interleaved(pair, settings.min_reps, cold=settings.cold)
    traced = _kernel_times(pair, {key: (again[key], "confirm") for key in keys}, case, settings)
    judged = CONFIRM_COLUMNS[str(screened["timing_basis"].iloc[0])]
    confirmed: dict[str, Any] = {}
    for row in rows:
        key = str(row["candidate"])
        if key in keys:
            row["confirm_time_ms"] = again[key].median_ms
            row["kernel_confirm_ms"] = _kernel_ms(traced[key]) if key in traced else None
            confirmed[key] = row[judged]
    default_ms, best_ms = (confirmed[key] for key in keys)
    if default_ms is None or best_ms is None or not best_ms > 0:
        return  # no confirmation on the basis's time (its kernel trace failed): no finding
    for row in rows:
        row["confirm_left_on_table"] = default_ms / best_ms


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _log_exception(log: IO[str], what: str, exc: BaseException) -> None:
    log.write(f"--- {what}\n")
    log.write("".join(traceback.format_exception(exc)))
    log.flush()
