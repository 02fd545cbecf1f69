"""The stall breakdown's pairs, chosen once here: each flagged case (its finding's largest size)
beside the healthy case it is compared with, the best-utilized case of its mode that no finding
flags. The report renders the pairs' stall reasons (report.stalls); it chooses nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.grouping import every_row
from cublas_audit.judge.thresholds import LISTED_MAX


@dataclass(frozen=True)
class StallPair:
    """One finding's flagged case and its healthy comparison: labels of the prepared rows."""

    finding: Finding
    flagged: int
    healthy: int


@dataclass(frozen=True)
class StallPairs:
    """The table's stall columns (ncu's reasons, in table order), the first LISTED_MAX findings'
    pairs, and how many more findings have one."""

    stalls: tuple[str, ...] = ()
    pairs: tuple[StallPair, ...] = field(default_factory=tuple)
    more: int = 0


def stall_pairs(rows: pd.DataFrame, found: Sequence[Finding]) -> StallPairs:
    """Each finding's flagged case (its largest size) beside the best-utilized unflagged case of
    its mode, for the first LISTED_MAX findings that have both (measured stalls and utilization);
    none where the table has no stall reasons (no ncu)."""
    stalls = tuple(c for c in rows.columns if c.startswith("stall_"))
    if not stalls:
        return StallPairs()
    measured = rows.dropna(subset=[*stalls[:1], "util"])
    flagged_rows = {row for f in found for row in every_row(f)}
    healthy_pool = measured[~measured.index.isin(list(flagged_rows))]
    # which findings have a pair, told without a filter of the table per finding
    labels, modes = set(measured.index), set(healthy_pool["mode"])
    shown = [f for f in found if f.mode in modes and any(row in labels for row in f.rows)]
    pairs = []
    for finding in shown[:LISTED_MAX]:
        flagged = measured[measured.index.isin(finding.rows)]
        healthy = healthy_pool[healthy_pool["mode"] == finding.mode]
        case = flagged.sort_values("size").index[-1]
        good = healthy.sort_values("util", kind="stable").index[-1]
        pairs.append(StallPair(finding, int(case), int(good)))
    return StallPairs(stalls, tuple(pairs), len(shown) - len(pairs))
