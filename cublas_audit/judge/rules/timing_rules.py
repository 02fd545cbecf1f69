"""Rules that compare the time of a cuBLAS call with a faster way to the same result, timed in
the same run: the bundled reference kernel (`reference-faster`) and a loop of single calls in
place of a batched one (`batched-slower-than-loop`). A gap the noise floor cannot confirm is an
info finding (`_unsure`): what the sweep re-measures, interleaved, before its verdict."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cublas_audit.judge import noise
from cublas_audit.judge.finding import Finding, kernel_of, of_group, ratio_range, size_list
from cublas_audit.judge.rules.frame import RuleContext, by_kernel
from cublas_audit.judge.timed_rows import (
    floor_kinds,
    judged_on,
    judged_ratio,
    on_kernels,
    row_verdicts,
    time_words,
)
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.table.dispatch import LAYOUT_DEFAULTS
from cublas_audit.vocabulary import Severity


def reference_faster(ctx: RuleContext) -> list[Finding]:
    if "ref_time_ms" not in ctx.rows.columns:
        return []
    t = ctx.thresholds
    rows = ctx.rows.dropna(subset=["time_ms", "ref_time_ms"])
    rows = rows[~rows["is_loop"]]
    # The kernels' times where CUPTI traced both: the reference is one kernel, and the dispatch is
    # what this rule judges. The classic call was timed interleaved with the reference, so its
    # ratio has the (smaller) interleaved floor; the other rows of the problem were not.
    interleaved = noise.interleaved_with_reference(rows)
    rows = _judged(rows, "ref_", interleaved, t.reference_margin_pct)
    found = _unsure(rows, "reference-faster", "the bundled reference kernel faster than cuBLAS")
    for group in by_kernel(rows[rows["verdict"] == Verdict.slower]):
        ratio = float(group["ratio"].max())
        message = (
            f"The bundled reference kernel is {ratio_range(group['ratio'])} faster than cuBLAS "
            f"({kernel_of(group) or 'kernel not recorded'}) at {size_list(group)}, "
            f"{_compared_time(group)}."
        )
        workaround = (
            "cuBLAS leaves speed on the table here: a hand-written kernel such as the bundled "
            "reference, or a cuBLASLt candidate with a larger tile, is faster for these shapes."
        )
        severity = Severity.high if ratio >= t.high_ratio else Severity.medium
        found.append(
            of_group("reference-faster", severity, group, message, workaround, Verdict.slower)
        )
    return found


def batched_slower_than_loop(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    timed = ctx.rows.dropna(subset=["time_ms"])
    if "kernel_time_ms" not in timed.columns:
        timed = timed.assign(kernel_time_ms=np.nan)
    key = LOOP_KEY
    loop_rows = timed.loc[timed["is_loop"]]
    loops = loop_rows[key].assign(
        loop_time_ms=loop_rows["time_ms"], loop_kernel_time_ms=loop_rows["kernel_time_ms"]
    )
    loops = loops.assign(**{c: loop_rows.get(c.replace("loop_", "", 1)) for c in _LOOP_EVIDENCE})
    batched = timed[~timed["is_loop"] & (timed["batch"] > 1)]
    paired = batched.reset_index().merge(loops, on=[c for c in key if c != "batch"])
    paired = paired[paired["batch_x"] == paired["batch_y"]].rename(columns={"batch_x": "batch"})
    paired = paired.set_index("index")
    # Where the sweep re-measured the pair interleaved (the batched call timed inside the loop
    # case), that measurement decides, against the interleaved floor.
    paired = _with_interleaved_recheck(paired, loop_rows)
    # Kernels against kernels where both were traced (the dispatch of the batched call against
    # that of the single call), else call against call; two cases, so between-run floors.
    paired = _judged(paired, "loop_", paired["interleaved"], t.loop_margin_pct)
    found = _unsure(paired, "batched-slower-than-loop", "the batched call slower than the loop")
    for group in by_kernel(paired[paired["verdict"] == Verdict.slower]):
        message = (
            f"{group['routine'].iloc[0] or 'The batched call'} "
            f"({kernel_of(group) or 'kernel not recorded'}) "
            f"takes {ratio_range(group['ratio'])} the time of a loop of {group['batch'].iloc[0]} "
            f"single calls at {size_list(group)}, {_compared_time(group)}."
        )
        workaround = "Call the single GEMM in a loop for these shapes until the dispatch is fixed."
        severity = Severity.high if float(group["ratio"].max()) >= t.high_ratio else Severity.medium
        found.append(
            of_group(
                "batched-slower-than-loop", severity, group, message, workaround, Verdict.slower
            )
        )
    return found


# A batched call and its loop companion: the same call but for the loop (planning.grid makes
# the companion as the case with loop=True), its layout, leading dimensions, broadcast and beta
# too; without them a 2048^3 tt call was judged against the loops of all four layouts at once.
LOOP_KEY = ["gpu_label", "api", "mode", "m", "n", "k", "batch", *LAYOUT_DEFAULTS]

# The loop companion's evidence, renamed beside the batched call's own on a paired row.
_LOOP_EVIDENCE = tuple(
    f"loop_{prefix}_{field}"
    for prefix in ("time", "kernel_time")
    for field in ("n", "q1_ms", "q3_ms")
)


def _judged(
    rows: pd.DataFrame, fast: str, interleaved: pd.Series, margin_pct: float
) -> pd.DataFrame:
    """Each row's call (its own columns) judged against the faster way (columns prefixed `fast`)
    on the time `on_kernels` chooses: its `ratio`, `judged_on`, `floor_kind` (the between-run
    floor of that time, or its interleaved floor where the two were timed interleaved) and
    `verdict`."""
    kernels = on_kernels(rows, sides=(fast, ""))
    on = judged_on(kernels)
    rows = rows.assign(
        ratio=judged_ratio(rows, kernels, fast, ""),
        judged_on=on,
        floor_kind=floor_kinds(kernels, interleaved),
    )
    return rows.assign(verdict=row_verdicts(rows, fast, "", margin_pct / 100))


def _compared_time(group: pd.DataFrame) -> str:
    """Which time a timing finding compared: its readers must know whether launches count."""
    on = set(group["judged_on"]) if "judged_on" in group.columns else {"call"}
    if len(on) == 1:
        return f"comparing {time_words(on.pop())}"
    return "comparing the kernels' time (CUPTI) where traced, else the calls' time"


def _with_interleaved_recheck(paired: pd.DataFrame, loop_rows: pd.DataFrame) -> pd.DataFrame:
    """The batched call's time as re-measured inside its loop companion's case (columns
    `batched_*` of the loop row), in place of its own row's, where the sweep made one."""
    paired = paired.assign(interleaved=False)
    if "batched_time_ms" not in loop_rows.columns:
        return paired
    key = LOOP_KEY
    columns = [c for c in loop_rows.columns if c.startswith(("batched_time", "batched_kernel"))]
    again = loop_rows[key + columns].dropna(subset=["batched_time_ms"])
    own = paired.drop(columns=[c for c in columns if c in paired.columns])  # empty on its rows
    merged = own.reset_index().merge(again, on=key, how="left").set_index("index")
    found = merged["batched_time_ms"].notna()
    for column in columns:
        target = column.removeprefix("batched_")
        if target in merged.columns:
            merged[target] = merged[column].where(found, merged[target])
    return merged.drop(columns=columns).assign(interleaved=found.astype(bool))


def _unsure(rows: pd.DataFrame, rule: str, claim: str) -> list[Finding]:
    """One info finding per kernel whose gap the noise floor cannot confirm: shown, never medium
    or high."""
    found = []
    claimed = (rows["verdict"] == Verdict.unsure) & (rows["ratio"] > 1)  # the claim's direction
    for group in by_kernel(rows[claimed]):
        message = (
            f"Unsure: the measurements put {claim} by {ratio_range(group['ratio'])} at "
            f"{size_list(group)}, within the run-to-run noise at that time scale "
            "(the noise model in docs/report.md); a rerun or a longer measurement would tell."
        )
        workaround = "None needed on this evidence."
        found.append(of_group(rule, Severity.info, group, message, workaround, Verdict.unsure))
    return found
