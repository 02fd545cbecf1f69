"""Rules on the pipe utilization ncu measured for the dispatched kernel, each against the bound
that applies (judge.roofline): one kernel kept over a wide range of sizes at low utilization
(`no-escalation`), a kernel family older than the GPU (`legacy-kernel`), and a call far below
what it can reach (`low-utilization`: a memory-bound one below its share of the GPU's DRAM
bandwidth, a compute-bound one far below the best utilization the GPU reaches in the mode).
A memory-bound call near its bandwidth bound is the right pick, whatever its pipe utilization."""

from __future__ import annotations

import pandas as pd

from cublas_audit.judge.finding import Finding, of_group, pct_range, size_list
from cublas_audit.judge.roofline import (
    Machine,
    attained_ms,
    bound_words,
    memory_bound,
    near_memory_bound,
)
from cublas_audit.judge.rules.causes import named_causes
from cublas_audit.judge.rules.frame import RuleContext, by_kernel, dispatched, kernel_runs
from cublas_audit.observe.kernels import LEGACY_FAMILIES
from cublas_audit.planning.modes import pipe_name
from cublas_audit.vocabulary import Severity


def no_escalation(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    found = []
    for run in kernel_runs(dispatched(ctx.rows), t.escalation_min_range):
        lo, hi = float(run["size"].min()), float(run["size"].max())
        if hi / lo < t.escalation_min_range or hi < t.escalation_min_size:
            continue
        large = run.loc[run["size"] >= t.escalation_min_size, "util"]
        if large.isna().any() or bool((large >= t.escalation_max_pct).any()):
            continue
        kernel, mode = str(run["kernel_short"].iloc[0]), str(run["mode"].iloc[0])
        message = (
            f"cuBLAS dispatches {kernel} at every size from {run['shape'].iloc[0]} to "
            f"{run['shape'].iloc[-1]} ({hi / lo:.0f}x in linear size) and never escalates to a "
            f"larger tile; {pipe_name(mode)} utilization stays at {pct_range(run['util'])} "
            f"(below {t.escalation_max_pct:.0f} % from {t.escalation_min_size:.0f} up); "
            f"{bound_words(run[run['size'] >= t.escalation_min_size], ctx.machine)}."
        )
        workaround = (
            "Time the alternatives for these shapes: a loop of single calls, cuBLASLt with a "
            "heuristic candidate of a larger tile, or TF32 / BF16x compute where the precision "
            "allows; send NVIDIA the reproduce script below."
        )
        found.append(of_group("no-escalation", Severity.high, run, message, workaround))
    return found


def legacy_kernel(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    legacy = dispatched(ctx.rows)
    legacy = legacy[legacy["family"].isin(LEGACY_FAMILIES)]
    # A matrix-vector problem (M or N = 1) is what gemv and dot kernels are for, and so is one
    # that is memory-bound and moves data near the GPU's bandwidth.
    vector = (legacy["family"] == "gemv") & (legacy[["m", "n"]].min(axis=1) == 1)
    legacy = legacy[~vector & ~near_memory_bound(legacy, t.memory_bound_min_pct)]
    found = []
    for group in by_kernel(legacy):
        kernel, family = str(group["kernel_short"].iloc[0]), str(group["family"].iloc[0])
        mode = str(group["mode"].iloc[0])
        message = (
            f"{kernel} (family {family}) is dispatched at {size_list(group)}: a code path older "
            f"than this GPU, at {pct_range(group['util'])} {pipe_name(mode)} utilization; "
            f"{bound_words(group, ctx.machine)}{_causes(group)}."
        )
        workaround = (
            "Reshape or re-batch the problem so it leaves the legacy path, or call cuBLASLt and "
            "take a heuristic candidate of a current family."
        )
        found.append(of_group("legacy-kernel", Severity.medium, group, message, workaround))
    return found


def low_utilization(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    rows = dispatched(ctx.rows)
    near = near_memory_bound(rows, t.memory_bound_min_pct)  # as fast as its bytes allow
    memory = memory_bound(rows, t.memory_bound_min_bytes) & ~near  # judged on its bandwidth
    found = _slow_memory_bound(rows[memory], ctx)
    compute = rows[~memory & ~near].dropna(subset=["util"])
    for _, same_pipe in compute.groupby(["gpu_label", "mode"], sort=True):
        best = same_pipe.sort_values("util", kind="stable").iloc[-1]
        fills = same_pipe["m"] * same_pipe["n"] * same_pipe["batch"] >= t.fill_min_elements
        low = same_pipe[fills & (same_pipe["util"] < t.low_util_fraction * best["util"])]
        for group in by_kernel(low):
            found.append(_low_utilization_finding(group, best, ctx.machine))
    return found


def _slow_memory_bound(rows: pd.DataFrame, ctx: RuleContext) -> list[Finding]:
    """Memory-bound calls long enough to measure that move well under the GPU's bandwidth."""
    t = ctx.thresholds
    seconds = attained_ms(rows)
    slow = rows[
        (rows["roofline_pct"] < t.memory_bound_min_pct) & (seconds >= t.memory_bound_min_ms)
    ]
    found = []
    for group in by_kernel(slow):
        message = (
            f"{group['kernel_short'].iloc[0]} at {size_list(group)}: "
            f"{bound_words(group, ctx.machine)}, below the {t.memory_bound_min_pct:.0f} % a "
            f"memory-bound call can reach{_causes(group)}."
        )
        workaround = (
            "Compare a cuBLASLt heuristic candidate or a batched form of the call; a GEMV that "
            "streams the matrix once should move most of the GPU's bandwidth."
        )
        found.append(of_group("low-utilization", Severity.medium, group, message, workaround))
    return found


def _low_utilization_finding(
    group: pd.DataFrame, best: pd.Series, machine: Machine | None
) -> Finding:
    mode = str(group["mode"].iloc[0])
    worst = float(group["util"].min())
    message = (
        f"{group['kernel_short'].iloc[0]} reaches only {pct_range(group['util'])} "
        f"{pipe_name(mode)} utilization at {size_list(group)}, {worst / best['util']:.0%} of the "
        f"{best['util']:.0f} % this GPU reaches in {mode} with {best['kernel_short']} "
        f"({best['routine'] or best['api']}, {best['shape']}, batch {best['batch']}); "
        f"{bound_words(group, machine)}{_causes(group)}."
    )
    workaround = (
        "Compare with the call that reaches the best utilization: a different batch split, a loop "
        "of single calls, or a cuBLASLt heuristic candidate may dispatch the better kernel."
    )
    return of_group("low-utilization", Severity.medium, group, message, workaround)


def _causes(group: pd.DataFrame) -> str:
    causes = named_causes(group)
    return f"; why: {causes}" if causes else ""
