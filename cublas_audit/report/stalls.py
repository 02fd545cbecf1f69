"""The report's stall breakdown: the pairs the judge chose (judge.stall_pairs: each flagged case
beside the healthy case of its mode), the stall reasons ncu measured for both."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cublas_audit.judge.stall_pairs import StallPairs
from cublas_audit.report.markdown import md_number, md_table, md_text

STALLS_SHOWN = 8


def stall_tables(rows: pd.DataFrame, chosen: StallPairs) -> tuple[list[dict[str, str]], int]:
    """A table for each chosen pair (its rows' labels in `rows`, the prepared table); and how
    many more findings have one."""
    tables = []
    for pair in chosen.pairs:
        case, good = _row(rows, pair.flagged), _row(rows, pair.healthy)
        tables.append(
            {
                "heading": md_text(f"{pair.finding.rule}: {_case_name(case)}"),
                "table": _stall_table(case, good, chosen.stalls),
            }
        )
    return tables, chosen.more


def _row(rows: pd.DataFrame, label: int) -> pd.Series:
    found = rows.loc[label]
    assert isinstance(found, pd.Series)  # index labels of a prepared table are unique
    return found


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
