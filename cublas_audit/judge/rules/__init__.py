"""Rules over a dispatch table -> `Finding` records: what is wrong, where, evidence, workaround.

Every rule is a plain function of a `RuleContext` (rules/frame.py: the prepared table, the
thresholds, the run's cuBLASLt candidate audit), registered below in the order the docs list
them; a module per rule family beside this one. Every timing claim goes through
judge.timed_rows.
"""

from __future__ import annotations

from collections.abc import Collection

import pandas as pd

from cublas_audit.judge.candidates import CandidateVerdicts
from cublas_audit.judge.finding import Finding, order
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.roofline import Machine, with_roofline
from cublas_audit.judge.rules.candidates import better_candidate
from cublas_audit.judge.rules.causes import unaligned_operand
from cublas_audit.judge.rules.frame import Rule, RuleContext, judged_columns, prepare
from cublas_audit.judge.rules.layout import broadcast_slower_than_folded, layout_penalty
from cublas_audit.judge.rules.maps import dispatch_cliff, size_inversion
from cublas_audit.judge.rules.occupancy import underfilled_grid
from cublas_audit.judge.rules.timing import batched_slower_than_loop, reference_faster
from cublas_audit.judge.rules.utilization import legacy_kernel, low_utilization, no_escalation
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.vocabulary import Verdict

__all__ = ["RULES", "audit", "prepare", "rule_name", "unsure_case_ids"]

RULES: list[Rule] = [
    no_escalation,
    legacy_kernel,
    low_utilization,
    reference_faster,
    batched_slower_than_loop,
    better_candidate,
    layout_penalty,
    broadcast_slower_than_folded,
    unaligned_operand,
    underfilled_grid,
    size_inversion,
    dispatch_cliff,
]


def audit(
    frame: pd.DataFrame,
    thresholds: Thresholds | None = None,
    candidates: CandidateVerdicts | None = None,
    rules: Collection[str] | None = None,
    prepared: pd.DataFrame | None = None,
    machine: Machine | None = None,
    model: NoiseModel | None = None,
) -> list[Finding]:
    """The findings of a table (of every rule, or of the rules named), most severe first; with
    the run's candidate audit as judged (judge.audited.audit_dataset judges it once)."""
    # `prepared`: the caller's, of frame, with its roofline columns (judge.audited's)
    rows = with_roofline(prepare(frame), machine) if prepared is None else prepared
    context = RuleContext(
        judged_columns(rows), thresholds or Thresholds(), candidates, machine, model
    )
    chosen = [rule for rule in RULES if rules is None or rule_name(rule) in rules]
    found = [finding for rule in chosen for finding in rule(context)]
    return sorted(found, key=order)


def rule_name(rule: Rule) -> str:
    """A rule's name in findings and docs: its function's, dashed (size-inversion)."""
    return rule.__name__.replace("_", "-")


# The rules whose verdict compares two timed calls: an unsure one is worth measuring again.
TIMING_RULES = (rule_name(reference_faster), rule_name(batched_slower_than_loop))


def unsure_case_ids(frame: pd.DataFrame, thresholds: Thresholds | None = None) -> list[str]:
    """The cases behind every unsure timing comparison of this table (the call of an unsure
    reference-faster, the batched call and its loop companion of an unsure
    batched-slower-than-loop): what the sweep re-measures, interleaved, before its verdict."""
    prepared = prepare(frame)
    wanted: list[str] = []
    for finding in audit(frame, thresholds):
        if finding.rule not in TIMING_RULES or finding.verdict is not Verdict.unsure:
            continue
        for row in finding.rows:
            case_id = str(prepared.at[row, "case_id"])
            wanted.append(case_id)
            if finding.rule == "batched-slower-than-loop":
                wanted.append("loop." + case_id.split(".", 1)[1])
    return list(dict.fromkeys(wanted))
