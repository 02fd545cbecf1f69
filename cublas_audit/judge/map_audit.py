"""The dispatch map judged once: its own rules (size-inversion, dispatch-cliff) over the map's
table, and, where the deep tier measured them again, which findings hold there and what
cuBLASLt's candidates offered. The follow-up, the report and the CLI's summary take these."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.forked import Forks
from cublas_audit.judge import noise
from cublas_audit.judge.candidates import CandidateVerdicts, judge_candidates
from cublas_audit.judge.finding import Finding, order
from cublas_audit.judge.roofline import with_roofline
from cublas_audit.judge.rules import audit, prepare
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.inputs import Dataset
from cublas_audit.table.json_records import record
from cublas_audit.table.rundir import findings_file, read_findings
from cublas_audit.vocabulary import FollowUp, Verdict

MAP_RULES = ("size-inversion", "dispatch-cliff")
# A map of this many rows is judged rule by rule at once (map_findings); below it a fork saves
# nothing (a full grid: size-inversion 4.6 s of CPU, dispatch-cliff 1.5 s, reports/h100/atlas/bf16).
FORK_ROWS = 20_000


def map_findings(
    frame: pd.DataFrame, thresholds: Thresholds | None = None, prepared: pd.DataFrame | None = None
) -> list[Finding]:
    """The map rules' findings, largest effect first (`prepared`: rules.prepare of `frame`, where
    the caller has it). A map of FORK_ROWS rows or more is judged rule by rule at once: every
    rule but the first in a forked child (forked.Forks) while this process runs the first
    (size-inversion, which forks its own pairs' parts: judge.rules.maps), over the table
    prepared once; the same findings as one process, in its order (each rule's findings as it
    makes them, then audit's order)."""
    # a map's problems shift between runs more than a sweep's cases: its own floors
    model = noise.load().for_maps()
    # (as audit prepares it)
    rows = with_roofline(prepare(frame) if prepared is None else prepared, None)
    if len(frame) < FORK_ROWS:
        found = audit(frame, thresholds, rules=MAP_RULES, prepared=rows, model=model)
    else:
        each = [
            functools.partial(audit, frame, thresholds, rules=(rule,), prepared=rows, model=model)
            for rule in MAP_RULES
        ]
        others = Forks(each[1:])
        found = sorted([*each[0](), *itertools.chain(*others.results())], key=order)
    return sorted(found, key=lambda f: (-f.effect, f.rule, f.sizes))


def recorded_findings(run_dir: Path) -> list[Finding] | None:
    """The findings a map run judged, as its findings.json holds them (None where it has none: a
    map written before the file existed). What a reader of a large map takes instead of judging
    it again: size-inversion compares every problem with every other of its series."""
    path = findings_file(run_dir)
    if not path.is_file():
        return None
    try:
        data = read_findings(path)
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


# A finding's whole identity: its call (mode, api, routine, batch), its rule and its sizes. The
# follow-up's verdicts are keyed by it: by (rule, sizes) alone, a bf16 finding of a two-mode map
# read "holds" because the same rule held at the same sizes in fp32.
FindingKey = tuple[str, str, str, int, str, tuple[str, ...]]


def finding_key(finding: Finding) -> FindingKey:
    f = finding
    return (f.mode, f.api, f.routine, int(f.batch), f.rule, tuple(f.sizes))


@dataclass(frozen=True)
class FollowUpVerdicts:
    """The follow-up's run: its prepared rows (by case id), the findings that hold on its
    full-length measurement (by their whole identity), and its candidate audit as judged."""

    dataset: Dataset
    rows: pd.DataFrame
    holds: frozenset[FindingKey]
    candidates: CandidateVerdicts | None


@dataclass(frozen=True)
class MapAudit:
    """A map judged: its prepared rows (the findings' row labels index them), its findings and,
    where it was followed up, the follow-up's verdict on each (None: not measured there)."""

    dataset: Dataset
    rows: pd.DataFrame
    findings: list[Finding]
    follow_up: FollowUpVerdicts | None
    thresholds: Thresholds
    verdicts: tuple[FollowUp | None, ...]

    def with_verdicts(self) -> list[tuple[Finding, FollowUp | None]]:
        return list(zip(self.findings, self.verdicts, strict=True))


def audit_map(
    dataset: Dataset,
    thresholds: Thresholds | None = None,
    found: list[Finding] | None = None,
    follow_up: Dataset | None = None,
    rows: pd.DataFrame | None = None,
) -> MapAudit:
    """The map's findings (as its run judged them, where given) and its follow-up's verdicts.
    `rows`: rules.prepare of the dataset's table, where the run that judged it has it (a full
    map's 262,144 rows: ~0.5 s of CPU here to prepare again)."""
    thresholds = thresholds or Thresholds()
    rows = prepare(dataset.frame) if rows is None else rows
    if found is None:
        found = map_findings(dataset.frame, thresholds, rows)
    deep = None
    if follow_up is not None:
        holds = frozenset(finding_key(f) for f in map_findings(follow_up.frame, thresholds))
        audited = follow_up.candidates
        verdicts = None
        if audited is not None and not audited.empty:
            verdicts = judge_candidates(audited, thresholds.candidate_gap_pct / 100)
        deep_rows = prepare(follow_up.frame).set_index("case_id", drop=False)
        deep = FollowUpVerdicts(follow_up, deep_rows, holds, verdicts)
    said = tuple(follow_up_verdict(rows, finding, deep) for finding in found)
    return MapAudit(dataset, rows, found, deep, thresholds, said)


def follow_up_verdict(
    rows: pd.DataFrame, finding: Finding, deep: FollowUpVerdicts | None
) -> FollowUp | None:
    """The finding on the follow-up's full-length measurement: it holds there (the follow-up
    found the same finding of the same call) or is not confirmed; None where the follow-up did not
    measure all its cases (`rows`: the prepared map its row labels index)."""
    if deep is None or not all(case_id in deep.rows.index for case_id in case_ids(rows, finding)):
        return None
    return FollowUp.holds if finding_key(finding) in deep.holds else FollowUp.not_confirmed


def case_ids(rows: pd.DataFrame, finding: Finding) -> list[str]:
    """The cases of a finding's rows and of those it was compared with (rows: the prepared map
    its labels index)."""
    return [str(rows.at[label, "case_id"]) for label in [*finding.rows, *finding.compared]]
