"""Rules over a dense map of sizes (one series: the same call at many m, n, k): a problem slower
than a larger one (`size-inversion`), and a throughput drop where the dispatched kernel changes
between neighbouring sizes (`dispatch-cliff`). Kernel times only (CUPTI): across cases, the
host's share of a call's time is noise that can invert any two small calls."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cublas_audit.judge.finding import Finding, of_group, with_compared
from cublas_audit.judge.rules.frame import RuleContext, measured
from cublas_audit.judge.timed_rows import column, judged_time, pair_verdict, time_words
from cublas_audit.judge.verdicts import Verdict

# The settings a map series shares: problems of one series differ only in m, n, k.
MAP_SERIES = [
    "gpu_label",
    "api",
    "routine",
    "mode",
    "batch",
    "transa",
    "transb",
    "broadcast",
    "beta",
]


def size_inversion(ctx: RuleContext) -> list[Finding]:
    """A problem slower than another of the same series that is no smaller in any dimension:
    the smaller problem's kernel is a poor pick, and padding it to the larger size is a
    workaround a user can apply today."""
    t = ctx.thresholds
    rows = _kernel_timed(ctx.rows)
    found = []
    for _, series in rows.groupby(MAP_SERIES, dropna=False, sort=False):
        if len(series) < 2:
            continue
        on = judged_time(series)
        times = series[column(on)].astype(float).to_numpy()
        dims = series[["m", "n", "k"]].astype(int).to_numpy()
        for i in range(len(series)):
            larger = (dims >= dims[i]).all(axis=1) & (dims > dims[i]).any(axis=1)
            faster = larger & (times < times[i])
            if not faster.any():
                continue
            j = int(np.argmin(np.where(faster, times, np.inf)))
            row, best = series.iloc[i], series.iloc[j]
            if pair_verdict(best, row, on, t.inversion_margin_pct / 100) is not Verdict.slower:
                continue
            message = (
                f"{row['shape']} takes {times[i] / times[j]:.2f}x the time of the larger "
                f"{best['shape']} ({row['kernel_short']} against {best['kernel_short']}), "
                f"comparing {time_words(on)}."
            )
            padded = f"{best['m']}x{best['n']}x{best['k']}"
            work = f"Pad the problem to {padded} (with zeros): it runs sooner."
            finding = of_group("size-inversion", "medium", series.iloc[[i]], message, work)
            # effect: the share of the time padding saves (a cliff's is the throughput lost)
            found.append(with_compared(finding, best.name, 1 - times[j] / times[i]))
    return found


def dispatch_cliff(ctx: RuleContext) -> list[Finding]:
    """Between neighbouring grid points (consecutive square sizes, or consecutive values of one
    dimension with the other two fixed): where the dispatched kernel changes and throughput drops
    by at least `cliff_drop_pct`."""
    t = ctx.thresholds
    rows = _kernel_timed(ctx.rows)
    found = []
    for _, series in rows.groupby(MAP_SERIES, dropna=False, sort=False):
        on = judged_time(series)
        dims = series[["m", "n", "k"]].astype(np.int64).to_numpy()
        flops = 2.0 * dims.prod(axis=1).astype(float) * series["batch"].astype(float).to_numpy()
        rate = flops / series[column(on)].astype(float).to_numpy()
        kernels = series["kernel_short"].fillna("").astype(str).to_numpy()
        before, after = _neighbours(dims)
        drop = 1 - rate[after] / rate[before]
        cliff = (kernels[after] != kernels[before]) & (drop * 100 >= t.cliff_drop_pct)
        for b, a, lost in zip(before[cliff], after[cliff], drop[cliff], strict=True):
            first, then = series.iloc[b], series.iloc[a]
            message = (
                f"From {first['shape']} to {then['shape']} the kernel changes from "
                f"{first['kernel_short']} to {then['kernel_short']} and throughput drops by "
                f"{100 * lost:.0f} %, comparing {time_words(on)}."
            )
            work = (
                f"Pad to a size that keeps {first['kernel_short']}, or take it through cuBLASLt "
                "if its heuristic lists it."
            )
            finding = of_group("dispatch-cliff", "medium", series.iloc[[a]], message, work)
            found.append(with_compared(finding, first.name, lost))
    return found


def _kernel_timed(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a measured kernel time (above zero: the rules divide by it)."""
    if "kernel_time_ms" not in rows.columns:
        return rows.iloc[0:0]
    return measured(rows[~rows["is_loop"]], "kernel_time_ms")


def _neighbours(dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions (before, after) of neighbouring problems among rows of (m, n, k): consecutive
    square sizes, and consecutive values of one dimension with the other two equal (consecutive
    among the observed values: in a sampled map, or a follow-up's pair)."""
    pairs = []
    square = np.flatnonzero((dims[:, 0] == dims[:, 1]) & (dims[:, 1] == dims[:, 2]))
    order = square[np.argsort(dims[square, 0], kind="stable")]
    pairs.append((order[:-1], order[1:]))
    for axis in range(3):
        fixed = [d for d in range(3) if d != axis]
        order = np.lexsort((dims[:, axis], dims[:, fixed[1]], dims[:, fixed[0]]))
        ordered = dims[order]
        same = (ordered[1:, fixed] == ordered[:-1, fixed]).all(axis=1)
        pairs.append((order[:-1][same], order[1:][same]))
    before = np.concatenate([p[0] for p in pairs]).astype(np.int64)
    after = np.concatenate([p[1] for p in pairs]).astype(np.int64)
    return before, after
