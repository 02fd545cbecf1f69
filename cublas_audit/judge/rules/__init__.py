"""Rules over a dispatch table -> `Finding` records: what is wrong, where, evidence, workaround.

Every rule is a plain function of a `RuleContext` (rules/frame.py: the prepared table, the
thresholds, the run's cuBLASLt candidate audit), registered with its stable id, group and public
name in rules/registry.py, in the order the docs list them; a module per rule family beside
this one. Every timing claim goes through judge.timed_rows.
"""

from __future__ import annotations

from collections.abc import Collection

import pandas as pd

from cublas_audit.judge.candidates import CandidateVerdicts
from cublas_audit.judge.finding import Finding, order
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.roofline import Machine, with_roofline
from cublas_audit.judge.rules.frame import Rule, RuleContext, judged_columns, prepare
from cublas_audit.judge.rules.registry import REGISTRY, checks, name_of, spec
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.vocabulary import Verdict

__all__ = ["RULES", "audit", "prepare", "rule_name", "unsure_case_ids"]

# Every check audit runs, in registry order (judge.rules.registry is the one list of them).
RULES: list[Rule] = [entry.check for entry in REGISTRY if entry.check is not None]


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
    # by id or public name; an unknown one is a ValueError, never a rule silently not run
    chosen = [entry.check for entry in checks(rules) if entry.check is not None]
    found = [finding for rule in chosen for finding in rule(context)]
    return sorted(found, key=order)


def rule_name(rule: Rule) -> str:
    """A rule's public name in findings and docs (size-inversion): the registry's, never its
    function's."""
    return name_of(rule)


# The rules whose verdict compares two timed calls: an unsure one is worth measuring again.
TIMING_RULES = (spec("CA301").name, spec("CA302").name)


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
            if finding.rule == spec("CA302").name:  # and its loop companion
                wanted.append("loop." + case_id.split(".", 1)[1])
    return list(dict.fromkeys(wanted))
