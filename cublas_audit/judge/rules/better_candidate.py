"""`better-candidate`: cuBLASLt's heuristic offers a faster algorithm than its own default. The
verdicts are judge.candidates' (a run's candidates.csv); this rule places them on the table's
cuBLASLt rows of the same problem."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.rules.frame import RuleContext


def better_candidate(ctx: RuleContext) -> list[Finding]:
    """cuBLASLt's heuristic offers a faster algorithm than its own default (a run's
    candidates.csv): flagged on the table's cuBLASLt row of the same problem."""
    if ctx.candidates is None:
        return []
    label = str(ctx.rows["gpu_label"].iloc[0]) if len(ctx.rows) else ""
    found = []
    for item in ctx.candidates.flagged:
        same = rows_of_problem(ctx.rows, item.mode, item.evidence[0])
        rows = [int(index) for index in same.index]
        found.append(replace(item, gpu_label=item.gpu_label or label, rows=rows))
    return found


def rows_of_problem(rows: pd.DataFrame, mode: str, case: Mapping[str, Any]) -> pd.DataFrame:
    """The table's cuBLASLt rows of the audited problem: the case itself where the audit says
    how it was posed (its id is the cuBLASLt case's), else (a version-1 audit, layout unknown)
    every cuBLASLt row of its mode and shape."""
    if case.get("transa") is not None and "case_id" in rows.columns:
        same = rows["case_id"] == case["case_id"]
    else:
        same = (
            (rows["api"] == "cublasLt") & (rows["mode"] == mode) & (rows["batch"] == case["batch"])
        )
        same &= (rows["m"] == case["m"]) & (rows["n"] == case["n"]) & (rows["k"] == case["k"])
    found: pd.DataFrame = rows.loc[same]
    return found
