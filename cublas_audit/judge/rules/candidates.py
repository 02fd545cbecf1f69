"""`better-candidate`: cuBLASLt's heuristic offers a faster algorithm than its own default. The
verdicts are judge.candidates' (a run's candidates.csv); this rule places them on the table's
cuBLASLt rows of the same problem."""

from __future__ import annotations

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
        case = item["evidence"][0]
        same = ctx.rows[
            (ctx.rows["api"] == "cublasLt")
            & (ctx.rows["mode"] == item["mode"])
            & (ctx.rows["batch"] == case["batch"])
            & (ctx.rows["m"] == case["m"])
            & (ctx.rows["n"] == case["n"])
            & (ctx.rows["k"] == case["k"])
        ]
        rows = [int(index) for index in same.index]
        found.append(Finding(**{**item, "gpu_label": item["gpu_label"] or label, "rows": rows}))
    return found
