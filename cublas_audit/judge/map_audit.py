"""The dispatch map judged once: its own rules (size-inversion, dispatch-cliff) over the map's
table, and, where the deep tier measured them again, which findings hold there and what
cuBLASLt's candidates offered. The follow-up, the report and the CLI's summary take these."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.judge import noise
from cublas_audit.judge.candidates import CandidateVerdicts, judge_candidates
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.rules import audit
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.inputs import Dataset
from cublas_audit.table.json_records import record
from cublas_audit.table.rundir import FINDINGS_FILE
from cublas_audit.vocabulary import Verdict

MAP_RULES = ("size-inversion", "dispatch-cliff")


def map_findings(frame: pd.DataFrame, thresholds: Thresholds | None = None) -> list[Finding]:
    """The map rules' findings, largest effect first."""
    # a map's problems shift between runs more than a sweep's cases: its own floors
    found = audit(frame, thresholds=thresholds, rules=MAP_RULES, model=noise.load().for_maps())
    return sorted(found, key=lambda f: (-f.effect, f.rule, f.sizes))


def recorded_findings(run_dir: Path) -> list[Finding] | None:
    """The findings a map run judged, as its findings.json holds them (None where it has none: a
    map written before the file existed). What a reader of a large map takes instead of judging
    it again: size-inversion compares every problem with every other of its series."""
    path = Path(run_dir) / FINDINGS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise ValueError("expected a list of findings")
        return [
            record(Finding, _with_verdict(item), f"finding {i + 1}") for i, item in enumerate(data)
        ]
    except (OSError, ValueError) as exc:
        raise AuditError(f"{path}: not the map's findings ({exc})") from exc


def _with_verdict(item: Any) -> Any:
    """A finding as findings.json holds it; one written before findings carried their verdict
    has it from its tier, as the map rules gave them: `info` within the map's rerun noise."""
    if not isinstance(item, dict) or "verdict" in item or item.get("rule") not in MAP_RULES:
        return item
    return {**item, "verdict": Verdict.unsure if item.get("severity") == "info" else Verdict.slower}


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
