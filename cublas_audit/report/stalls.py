"""The report's stall breakdown: each flagged case (its largest size) beside the best-utilized
unflagged case of its mode, the stall reasons ncu measured for both."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.grouping import every_row
from cublas_audit.report.markdown import LISTED_MAX, md_number, md_table, md_text

STALLS_SHOWN = 8


def stall_tables(rows: pd.DataFrame, found: Sequence[Finding]) -> tuple[list[dict[str, str]], int]:
    """Each flagged case (its largest size) beside the best-utilized unflagged case of its mode,
    for the first LISTED_MAX findings that have both; and how many more have."""
    stalls = [c for c in rows.columns if c.startswith("stall_")]
    if not stalls:
        return [], 0
    measured = rows.dropna(subset=[*stalls[:1], "util"])
    flagged_rows = {row for f in found for row in every_row(f)}
    healthy_pool = measured[~measured.index.isin(list(flagged_rows))]
    # which findings have a table, told without a filter of the table per finding
    labels, modes = set(measured.index), set(healthy_pool["mode"])
    shown = [f for f in found if f.mode in modes and any(row in labels for row in f.rows)]
    tables = []
    for finding in shown[:LISTED_MAX]:
        flagged = measured[measured.index.isin(finding.rows)]
        healthy = healthy_pool[healthy_pool["mode"] == finding.mode]
        case = flagged.sort_values("size").iloc[-1]
        good = healthy.sort_values("util", kind="stable").iloc[-1]
        tables.append(
            {
                "heading": md_text(f"{finding.rule}: {_case_name(case)}"),
                "table": _stall_table(case, good, stalls),
            }
        )
    return tables, len(shown) - len(tables)


def _case_name(row: pd.Series) -> str:
    return f"{row['kernel_short']} at {row['shape']}, batch {row['batch']}"


def _stall_table(flagged: pd.Series, healthy: pd.Series, stalls: Sequence[str]) -> str:
    pair = pd.DataFrame({"flagged": flagged[list(stalls)], "healthy": healthy[list(stalls)]})
    pair = pair.astype("Float64").fillna(0.0).astype(float)  # an unmeasured reason (NA) is 0
    top = pair.loc[pair.max(axis=1).sort_values(ascending=False).index[:STALLS_SHOWN]]
    body = [
        (md_text(str(reason).removeprefix("stall_")), f"{flagged_pct:.1f}", f"{healthy_pct:.1f}")
        for reason, flagged_pct, healthy_pct in top.itertuples(name=None)
    ]
    utilization = (md_number(flagged["util"], 0), md_number(healthy["util"], 0))
    body.insert(0, ("pipe utilization %", *utilization))
    headers = [
        "stall reason (% of issue-active cycles)",
        f"flagged: {md_text(_case_name(flagged))}",
        f"healthy: {md_text(_case_name(healthy))}",
    ]
    return md_table(headers, body)
