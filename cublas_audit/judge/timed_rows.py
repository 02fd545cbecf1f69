"""Table rows -> verdicts.judge: the one adapter the rules, the diff and the candidate audit judge
times through.

It owns the three choices every timing comparison makes: which time judges (`on_kernels`: the
kernels' where every side traced them, else the call's), the columns a side's distribution is
read from (`column`: `<side><time>_ms<suffix>`), and the noise floor the comparison is widened by
(`floor_kind`, and a `FloorOf` that says at which time scale). Callers only say which rows are
the two sides and which floor applies: a within-run pair, two runs, or two interleaved timings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.judge import noise
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.verdicts import Judgement, Timed, Verdict, judge
from cublas_audit.vocabulary import FloorKind

# The two times a comparison can judge -> the prefix of their table columns.
# The kernels' time answers "did the dispatch get worse", the call's "did the call get slower".
TIMES = {"kernel": "kernel_time", "call": "time"}

# The floor of a comparison of A and B, from their two sides.
FloorOf = Callable[[Timed, Timed], float]


def column(on: str, side: str = "", suffix: str = "") -> str:
    """A side's column of the time `on`: 'time_ms', 'ref_kernel_time_ms', 'kernel_time_ms_b'."""
    return f"{side}{TIMES[on]}_ms{suffix}"


def on_kernels(
    rows: pd.DataFrame, sides: Sequence[str] = ("",), suffixes: Sequence[str] = ("",)
) -> pd.Series:
    """Which rows are judged on the kernels' time (CUPTI): those where every side (`sides` x
    `suffixes` name their columns) traced its kernels; the others on the call's (CUDA events).

    A dispatch audit judges the dispatched kernels, and the call's time of a launch-bound call
    moves by up to 2.5x between runs of the same GPU with the kernels unchanged (host noise,
    reports/h100/noise/kernel-b/run-04); but a comparison must read one time on both sides, so
    where either side lacks its kernels' time the call's judges."""
    columns = [column("kernel", side, suffix) for side in sides for suffix in suffixes]
    if any(c not in rows.columns for c in columns):
        return pd.Series(False, index=rows.index)
    traced = pd.Series(True, index=rows.index)
    for c in columns:
        traced &= rows[c].notna()
    return traced.astype(bool)


def judged_time(rows: pd.DataFrame) -> str:
    """The time a comparison among these rows (each one side) judges: `on_kernels` for all."""
    return "kernel" if len(rows) and bool(on_kernels(rows).all()) else "call"


def judged_on(kernels: pd.Series) -> np.ndarray:
    """'kernel' or 'call' for each row of an `on_kernels` answer."""
    return np.where(kernels, "kernel", "call")


def judged_ratio(rows: pd.DataFrame, kernels: pd.Series, fast: str, slow: str) -> pd.Series:
    """slow / fast on the time each row is judged on (`fast`, `slow`: the sides' prefixes)."""

    def ratio(on: str) -> pd.Series:
        return rows[column(on, slow)].astype(float) / rows[column(on, fast)].astype(float)

    by_call = ratio("call")
    return ratio("kernel").where(kernels, by_call) if kernels.any() else by_call


def floor_kind(on: str, mode: str) -> FloorKind:
    """The noise model kind of a time compared between runs: the kernels' by their pipe."""
    return noise.kernel_kind(mode) if on == "kernel" else FloorKind.call


def floor_kinds(kernels: pd.Series, interleaved: pd.Series) -> np.ndarray:
    """Each row's floor kind (`kernels`: `on_kernels`' answer): of its judged time between runs,
    or of the two times' ratio where they were timed interleaved (FloorKind.interleaved)."""
    between = np.where(kernels, FloorKind.kernel, FloorKind.call)
    ratio = np.where(kernels, FloorKind.kernel.interleaved, FloorKind.call.interleaved)
    return np.where(interleaved, ratio, between)


def at_slower(model: NoiseModel, kind: str) -> FloorOf:
    """Two cases of one run: the floor of `kind` at the time of B, the side claimed slower."""
    return lambda a, b: model.floor(b.median_ms, kind)


def between_runs(model: NoiseModel, kind: str, launches: float) -> FloorOf:
    """One case in two runs: the floor at the time of one launch (the geometric mean of the
    sides over the launches of a call), infinite for a host-bound call time."""
    return lambda a, b: model.between_runs(math.sqrt(a.median_ms * b.median_ms) / launches, kind)


def judge_sides(
    a: Any,
    b: Any,
    on: str,
    threshold: float,
    floor: FloorOf,
    sides: tuple[str, str] = ("", ""),
    suffixes: tuple[str, str] = ("", ""),
) -> Judgement | None:
    """B against A on the time `on`, each side read from its row (a table row or a record; the
    same one for both where `sides` or `suffixes` tell their columns apart). None where either
    side has no time."""
    ta = Timed.from_row(a, f"{sides[0]}{TIMES[on]}", suffixes[0])
    tb = Timed.from_row(b, f"{sides[1]}{TIMES[on]}", suffixes[1])
    if ta is None or tb is None:
        return None
    return judge(ta, tb, floor(ta, tb), threshold)


def pair_verdict(
    fast: pd.Series, slow: pd.Series, on: str, threshold: float, model: NoiseModel | None = None
) -> Verdict:
    """`slow` against `fast`, two cases of one run, on the time `on`: the between-run floor of
    that time (at the slower side's; of `model`, else the shipped one); `same` where either was
    not timed."""
    floor = at_slower(model or noise.load(), floor_kind(on, str(slow["mode"])))
    judged = judge_sides(fast, slow, on, threshold, floor)
    return Verdict.same if judged is None else judged.verdict


def row_verdicts(rows: pd.DataFrame, fast: str, slow: str, threshold: float) -> pd.Series:
    """`slow` against `fast` on each row (`fast`, `slow`: the sides' column prefixes, 'ref_',
    'loop_', ''), on the time its `judged_on` column names, widened by the floor of its
    `floor_kind` column at the slower side's time: `slower` is a confident finding, and a row
    either side of which was not timed is `same`."""
    model = noise.load()
    # the records hold only what is judged: the call's and the kernels' times of both sides
    prefixes = tuple(f"{side}{time}_" for side in (fast, slow) for time in TIMES.values())
    read = [c for c in rows.columns if c in ("judged_on", "floor_kind") or c.startswith(prefixes)]
    judged = []
    for record in rows[read].to_dict("records"):
        on = "kernel" if record.get("judged_on") == "kernel" else "call"
        floor = at_slower(model, FloorKind(record.get("floor_kind") or FloorKind.call))
        judgement = judge_sides(record, record, on, threshold, floor, sides=(fast, slow))
        judged.append(Verdict.same if judgement is None else judgement.verdict)
    return pd.Series(judged, index=rows.index, dtype=object)


def ratio_verdict(ratio: float, floor: float, threshold: float) -> Verdict:
    """A ratio of two timings made interleaved in one process (no distributions, the floor of
    their ratio): is the timing it divides slower than the one it divides by?"""
    return judge(Timed(1.0), Timed(ratio), floor, threshold).verdict


def time_words(on: str) -> str:
    """The time a finding compared, in its message: its readers must know whether launches
    count."""
    return "the kernels' time (CUPTI)" if on == "kernel" else "the calls' time (CUDA events)"
