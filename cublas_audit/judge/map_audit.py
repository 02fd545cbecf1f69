"""The dispatch map judged once: its own rules (size-inversion, dispatch-cliff) over the map's
table, and, where the deep tier measured them again, which findings hold there and what
cuBLASLt's candidates offered. The follow-up, the report and the CLI's summary take these."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from cublas_audit.judge.candidates import CandidateVerdicts, judge_candidates
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.rules import audit
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.inputs import Dataset

MAP_RULES = ("size-inversion", "dispatch-cliff")


def map_findings(frame: pd.DataFrame, thresholds: Thresholds | None = None) -> list[Finding]:
    """The map rules' findings, largest effect first."""
    found = audit(frame, thresholds=thresholds, rules=MAP_RULES)
    return sorted(found, key=lambda f: (-f.effect, f.rule, f.sizes))


@dataclass(frozen=True)
class FollowUpVerdicts:
    """The follow-up's run: the findings that hold on its full-length measurement, by (rule,
    sizes), and its candidate audit as judged."""

    dataset: Dataset
    holds: frozenset[tuple[str, tuple[str, ...]]]
    candidates: CandidateVerdicts | None


@dataclass(frozen=True)
class MapAudit:
    dataset: Dataset
    findings: list[Finding]
    follow_up: FollowUpVerdicts | None
    thresholds: Thresholds


def audit_map(
    dataset: Dataset,
    thresholds: Thresholds | None = None,
    found: list[Finding] | None = None,
    follow_up: Dataset | None = None,
) -> MapAudit:
    """The map's findings (as its run judged them, where given) and its follow-up's verdicts."""
    thresholds = thresholds or Thresholds()
    if found is None:
        found = map_findings(dataset.frame, thresholds)
    deep = None
    if follow_up is not None:
        holds = frozenset(
            (f.rule, tuple(f.sizes)) for f in map_findings(follow_up.frame, thresholds)
        )
        audited = follow_up.candidates
        verdicts = None
        if audited is not None and not audited.empty:
            verdicts = judge_candidates(audited, thresholds.candidate_gap_pct / 100)
        deep = FollowUpVerdicts(follow_up, holds, verdicts)
    return MapAudit(dataset, found, deep, thresholds)
