"""`underfilled-grid`: the dispatched kernel leaves most of the GPU's SMs without a CTA although
the problem would give every one work."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.judge.finding import Finding, of_group, size_list
from cublas_audit.judge.rules.frame import RuleContext, by_kernel, dispatched
from cublas_audit.judge.timed_rows import column, judged_time
from cublas_audit.planning.modes import mode as mode_spec
from cublas_audit.vocabulary import Severity


def underfilled_grid(ctx: RuleContext) -> list[Finding]:
    """The dispatched kernel launches fewer CTAs than a share of the SMs although the problem's
    operands would give every SM work: most of the GPU idles (the single-SM gemv of #114911)."""
    t = ctx.thresholds
    rows = dispatched(ctx.rows)
    if "sm_count" not in rows.columns or rows["sm_count"].isna().all():
        return []
    rows = rows[rows["sm_count"].notna()]
    rows = rows.assign(ctas=ctas(rows))
    sms = rows["sm_count"].astype(float)
    item = rows["mode"].map(lambda mode: mode_element_bytes(str(mode))).astype(float)
    volume = (rows["m"] * rows["k"] + rows["k"] * rows["n"] + rows["m"] * rows["n"]).astype(float)
    operand_bytes = volume * rows["batch"].astype(float) * item
    took = pd.to_numeric(rows[column(judged_time(rows))], errors="coerce").astype(float)
    under = (
        (rows["ctas"] < t.underfill_sm_fraction * sms)
        & (operand_bytes >= t.underfill_bytes_per_sm * sms)
        & (took >= t.underfill_min_ms)
    )
    found = []
    for group in by_kernel(rows[under.fillna(False).astype(bool)]):
        first = group.iloc[0]
        low, high = int(group["ctas"].min()), int(group["ctas"].max())
        message = (
            f"{first['kernel_short']} launches {low}-{high} CTAs on a GPU of "
            f"{int(first['sm_count'])} SMs at {size_list(group)}, where the "
            "operands would give every SM work: most of the GPU idles."
        )
        work = (
            "Pose the problem so that it fills the GPU (a single call instead of a batch of one, "
            "the transposed layout), or split K across calls and add the partial results."
        )
        found.append(of_group("underfilled-grid", Severity.high, group, message, work))
    return found


def mode_element_bytes(mode: str) -> int:
    try:
        return mode_spec(mode).element_bytes
    except KeyError:
        return 4


def ctas(rows: pd.DataFrame) -> pd.Series:
    """CTAs of each row's main launch: CUPTI's count, else the product of ncu's grid."""
    none = pd.Series(np.nan, index=rows.index)
    traced = pd.to_numeric(rows.get("traced_ctas", none), errors="coerce").astype(float)
    grid = rows["grid"].map(_grid_size) if "grid" in rows.columns else none
    return traced.fillna(grid.astype(float))


def _grid_size(grid: Any) -> float:
    try:
        x, y, z = (int(v) for v in str(grid).split("x"))
    except ValueError:
        return math.nan
    return float(x * y * z)
