"""Rules that compare one problem posed in different ways in the same run: in another layout
(`layout-penalty`), and as a batch with a shared A against the one GEMM it folds into
(`broadcast-slower-than-folded`). Kernels' time where every compared case traced it, else the
call's (timed_rows.judged_time)."""

from __future__ import annotations

import numpy as np

from cublas_audit.judge.finding import Finding, of_group, with_compared
from cublas_audit.judge.rules.frame import RuleContext, measured
from cublas_audit.judge.timed_rows import column, judged_time, pair_verdict, time_words
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.vocabulary import Severity


def layout_penalty(ctx: RuleContext) -> list[Finding]:
    """The same problem, mode and call in several layouts: one is confidently at least
    `layout_penalty_ratio` slower than the best (kernels' time where traced, else the call's)."""
    t = ctx.thresholds
    rows = ctx.rows[~ctx.rows["is_loop"]].dropna(subset=["time_ms"])
    on = judged_time(rows)
    took = column(on)
    rows = measured(rows, took)  # a zero time is no measurement: never the best, nor divided by
    key = ["gpu_label", "api", "routine", "mode", "m", "n", "k", "batch", "broadcast", "beta"]
    layouts = rows["transa"].astype(str).str.cat(rows["transb"].astype(str))
    posed = layouts.groupby([rows[c] for c in key], dropna=False).transform("nunique")
    rows = rows[posed >= 2]  # a problem posed in one layout has nothing to compare (most maps)
    found = []
    for _, group in rows.groupby(key, dropna=False, sort=False):
        best = group.iloc[int(np.argmin(group[took].to_numpy(dtype=float)))]
        slow = group.assign(ratio=group[took].astype(float) / float(best[took]))
        slow = slow[slow["ratio"] >= t.layout_penalty_ratio]
        for index, row in slow.iterrows():
            verdict = pair_verdict(best, row, on, t.layout_penalty_ratio - 1, ctx.model)
            if verdict is not Verdict.slower:
                continue
            layout = f"{row['transa']}{row['transb']}"
            message = (
                f"In layout {layout} the call takes {row['ratio']:.2f}x the time of layout "
                f"{best['transa']}{best['transb']} ({row['kernel_short']} against "
                f"{best['kernel_short']}) at {row['shape']}, comparing {time_words(on)}."
            )
            work = (
                f"Store the operands as layout {best['transa']}{best['transb']} expects (transpose "
                "once, outside the hot loop), or take that layout's algorithm through cuBLASLt."
            )
            severity = (
                Severity.high
                if row["ratio"] >= t.high_ratio * t.layout_penalty_ratio
                else Severity.medium
            )
            finding = of_group("layout-penalty", severity, slow.loc[[index]], message, work)
            # the measured layout is the proof and the fix: `fix` reads it as `compared`
            found.append(with_compared(finding, best.name, 1 - 1 / float(row["ratio"])))
    return found


def broadcast_slower_than_folded(ctx: RuleContext) -> list[Finding]:
    """A batched call whose A is shared (batch stride 0) against the single GEMM it folds into,
    C = A @ [B_1 .. B_batch] (m x n*batch), timed in the same run."""
    t = ctx.thresholds
    rows = ctx.rows[~ctx.rows["is_loop"]].dropna(subset=["time_ms"])
    on = judged_time(rows)
    took = column(on)
    rows = measured(rows, took)  # a zero time is no measurement: never the best, nor divided by
    shared = rows[(rows["broadcast"] == "a") & (rows["transb"] == "n")]
    single = rows[(rows["batch"] == 1) & (rows["broadcast"] == "")]
    found = []
    for index, row in shared.iterrows():
        folded = single[
            (single["gpu_label"] == row["gpu_label"])
            & (single["api"] == row["api"])
            & (single["mode"] == row["mode"])
            & (single["m"] == row["m"])
            & (single["k"] == row["k"])
            & (single["n"] == row["n"] * row["batch"])
            & (single["transa"] == row["transa"])
            & (single["transb"] == "n")
        ]
        if folded.empty:
            continue
        fold = folded.iloc[0]
        ratio = float(row[took]) / float(fold[took])
        if pair_verdict(fold, row, on, t.fold_margin_pct / 100, ctx.model) is not Verdict.slower:
            continue
        message = (
            f"The batched call with a shared A (batch stride 0) takes {ratio:.2f}x the time of "
            f"the one {fold['m']}x{fold['n']}x{fold['k']} GEMM it folds into "
            f"({row['kernel_short']} against {fold['kernel_short']}), comparing {time_words(on)}."
        )
        work = (
            "Fold the batch into one GEMM: reshape [batch, M, K] @ [K, N] to [batch*M, K] @ [K, N]."
        )
        severity = Severity.high if ratio >= t.high_ratio else Severity.medium
        found.append(
            of_group("broadcast-slower-than-folded", severity, rows.loc[[index]], message, work)
        )
    return found
