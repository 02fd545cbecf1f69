"""The measuring half of the candidate audit (judge.candidates: its table and verdicts).

For each problem, every candidate the heuristic returns (up to a limit) is run once and its output
compared with the default's, then the candidates that ran correctly are timed together (CUDA
events, interleaved rounds, median); a second, independent timing round of the default and the
best confirms or refutes a gap. Runs in the probe's child process (`--phase candidates`), so the
sweep's --probe-python, --cublas-lib and --probe-env apply to it as to every other measurement.
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
from typing import IO, Any

import pandas as pd

from cublas_audit.device import launchers as launch
from cublas_audit.device import lt, operands, timing
from cublas_audit.judge.candidates import (
    DEFAULT_LIMIT,
    DEFAULT_MIN_REPS,
    DEFAULT_THRESHOLD,
    case_summary,
)
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case, candidate_problems
from cublas_audit.table import rundir
from cublas_audit.table.candidates_table import (
    SCHEMA_VERSION,
    from_records,
    journal_line,
    read_journal,
    write_candidates,
)
from cublas_audit.table.dispatch import plain

# A first, short interleaved round (this many timed calls each, at least) ranks the candidates;
# only those within SCREEN_MARGIN of its best, and the default, get the full >= min_reps round.
# Calls long enough to need screening (>= ~5 ms) vary by ~1% call to call: a candidate 10%
# behind after two calls is not the best one.
SCREEN_REPS = 2
SCREEN_MARGIN = 1.10
# Two correct algorithms differ from each other by at most the sum of their errors.
CROSS_CHECK_FACTOR = 2.0


@dataclass
class Settings:
    limit: int = DEFAULT_LIMIT
    threshold: float = DEFAULT_THRESHOLD
    min_reps: int = DEFAULT_MIN_REPS
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES
    gpu_label: str = ""
    log: IO[str] = field(default_factory=lambda: sys.stderr)


def run_candidates(
    cases: Iterable[Case],
    out_dir: Path | None,
    limit: int = DEFAULT_LIMIT,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    min_reps: int = DEFAULT_MIN_REPS,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
    gpu_label: str = "",
    progress: Callable[[str], None] = lambda line: None,
    journal: Path | None = None,
    started: Callable[[str], None] = lambda case_id: None,
    finished: Callable[[str], None] = lambda case_id: None,
) -> pd.DataFrame:
    """Audits every problem of `cases`; writes candidates.csv (and candidates.log, the
    tracebacks of failed cases and candidates) to out_dir when given. One failing case never
    stops the rest: it becomes a `skipped` row with its reason. With a `journal`
    (candidates.jsonl of a run directory), each problem's rows are appended to it as it finishes,
    and the problems it already holds are taken from it, not measured again (a resumed audit).
    `started` and `finished` hear each problem's case_id (the probe's progress lines)."""
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
        settings = Settings(limit, threshold, min_reps, workspace_bytes, gpu_label, log)
        for number, case in enumerate(todo, 1):
            if case.case_id in done:
                continue
            started(case.case_id)
            rows = audit_case(case, settings)
            done[case.case_id] = rows
            if journal_out is not None:
                journal_out.write(journal_line(case.case_id, rows))
                journal_out.flush()
            progress(f"[{number}/{len(todo)}] {_progress_line(case, rows)}")
            finished(case.case_id)
    frame = from_records([row for case in todo for row in done[case.case_id]])
    if out_dir is not None:
        write_candidates(frame, out_dir / rundir.CANDIDATES_FILE)
    return frame


def _progress_line(case: Case, rows: Sequence[Mapping[str, Any]]) -> str:
    summary = case_summary(from_records(rows)).iloc[0]
    if summary["status"] == "skipped":
        return f"{case.case_id}: skipped ({summary['reason']})"
    return (
        f"{case.case_id}: {summary['candidates']} candidates, {summary['correct']} correct, "
        f"default rank {plain(summary['default_rank'])}, "
        f"left on table {_three_decimals(summary['left_on_table'])}"
    )


def _three_decimals(value: Any) -> str:
    value = plain(value)
    return "—" if value is None else f"{float(value):.3f}"


def audit_case(case: Case, settings: Settings) -> list[dict[str, Any]]:
    """The rows of one problem: one per candidate, or one `skipped` row with the reason."""
    import cupy

    base = {
        "schema_version": SCHEMA_VERSION,
        "gpu_label": settings.gpu_label,
        "case_id": case.case_id,
        "mode": case.mode,
        "m": case.m,
        "n": case.n,
        "k": case.k,
        "batch": case.batch,
    }
    try:
        rows = _audit(case, settings)
    except Exception as exc:  # out of memory, no algorithm, a failing default: record, go on
        _log_exception(settings.log, case.case_id, exc)
        rows = [{"status": "skipped", "reason": _reason(exc)}]
    finally:
        cupy.get_default_memory_pool().free_all_blocks()
    return [{**base, **row} for row in rows]


def _audit(case: Case, settings: Settings) -> list[dict[str, Any]]:
    ops = operands.make_for(case)
    with launch.lt(case, ops, settings.workspace_bytes) as gemm:
        listed = _with_default(gemm.heuristics(settings.limit), gemm.default())
        default = next(cand for cand, is_default in listed if is_default)
        default_error = operands.checked(functools.partial(gemm.run, default), ops)
        expected = ops.c.copy()  # what every other candidate is checked against
        rows = [
            _check(gemm, cand, is_default, ops, expected, default_error, case, settings)
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
    """Fills time_ms, min_ms, reps, timing, tflops, and the confirmation round's times."""
    launchers = {
        str(cand.index): functools.partial(gemm.run, cand)
        for (cand, _), row in zip(listed, rows, strict=True)
        if row["status"] == "ok"
    }
    if not launchers:
        return
    default_key = str(next(cand.index for cand, is_default in listed if is_default))
    times = time_candidates(launchers, default_key, settings.min_reps)
    for row in rows:
        measured = times.get(str(row["candidate"]))
        if measured is not None:
            took, how = measured
            row.update(time_ms=took.median_ms, min_ms=took.min_ms, reps=took.reps)
            row.update(timing=how, tflops=case.flops / (took.median_ms * 1e9))
    _confirm(launchers, default_key, rows, settings)


def time_candidates(
    launchers: Mapping[str, Callable[[], None]], default_key: str, min_reps: int
) -> dict[str, tuple[timing.Timing, str]]:
    """key -> (Timing, "full" | "screen"): a screening round over all candidates, then a full
    round (>= min_reps each) over the default and those near the screening's best."""
    # Every candidate has just run for its correctness check, and the finalists in the screen.
    screen = timing.time_interleaved(launchers, min(SCREEN_REPS, min_reps), warm=True)
    if all(t.reps >= min_reps for t in screen.values()):
        return {key: (t, "full") for key, t in screen.items()}  # short calls: screen was full
    finalists = finalist_keys({key: t.median_ms for key, t in screen.items()}, default_key)
    full = timing.time_interleaved({key: launchers[key] for key in finalists}, min_reps, warm=True)
    return {
        key: (full[key], "full") if key in full else (screen[key], "screen") for key in launchers
    }


def finalist_keys(medians: Mapping[str, float], default_key: str) -> list[str]:
    """The default and every candidate within SCREEN_MARGIN of the fastest, in input order."""
    best = min(medians.values())
    return [k for k, t in medians.items() if k == default_key or t <= SCREEN_MARGIN * best]


def _confirm(
    launchers: Mapping[str, Callable[[], None]],
    default_key: str,
    rows: list[dict[str, Any]],
    settings: Settings,
) -> None:
    """A second, independent round (fresh warm-up and repetitions) of the default against the
    best, run only where the first round shows a gap at or above the threshold."""
    timed = [r for r in rows if pd.notna(r.get("time_ms"))]
    default = next((r for r in timed if str(r["candidate"]) == default_key), None)
    if default is None:
        return
    best = min(timed, key=lambda r: (r["time_ms"], r["candidate"]))
    if best is default or default["time_ms"] / best["time_ms"] < 1.0 + settings.threshold:
        return
    keys = (default_key, str(best["candidate"]))
    again = timing.time_interleaved({key: launchers[key] for key in keys}, settings.min_reps)
    default["confirm_time_ms"] = again[keys[0]].median_ms
    best["confirm_time_ms"] = again[keys[1]].median_ms
    ratio = again[keys[0]].median_ms / again[keys[1]].median_ms
    for row in rows:
        row["confirm_left_on_table"] = ratio


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _log_exception(log: IO[str], what: str, exc: BaseException) -> None:
    log.write(f"--- {what}\n")
    log.write("".join(traceback.format_exception(exc)))
    log.flush()
