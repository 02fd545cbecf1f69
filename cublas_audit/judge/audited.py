"""Judging happens here, once per input: a GPU's table and its candidate audit become findings and
candidate verdicts, with what could not be judged and why. Reports, the terminal and the API
render an `Audited`; none of them calls a rule or compares with a threshold again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from cublas_audit.judge.candidates import CandidateVerdicts, judge_candidates
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.grouping import by_cause
from cublas_audit.judge.impact import TraceVerdict, trace_verdict, weigh
from cublas_audit.judge.map_audit import MAP_RULES
from cublas_audit.judge.roofline import Machine, machine_of, with_roofline
from cublas_audit.judge.rules import audit, prepare
from cublas_audit.judge.stall_pairs import StallPairs, stall_pairs
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.inputs import Dataset


@dataclass(frozen=True)
class Unjudged:
    """Rules a table gives nothing to judge: the column they read is missing or empty."""

    rules: tuple[str, ...]
    column: str
    what: str


@dataclass(frozen=True)
class Audited:
    dataset: Dataset
    # the table as the rules read it (rules.prepare: main launches, derived columns), once
    rows: pd.DataFrame
    findings: list[Finding]
    candidates: CandidateVerdicts | None
    thresholds: Thresholds
    # what the rules could not judge on this table, said beside "no rule fired"
    unjudged: list[Unjudged] = field(default_factory=list)
    machine: Machine | None = None  # the roofline's figures the findings were judged with
    trace: TraceVerdict | None = None  # a trace audit's verdict on the model (judge.impact)
    # the stall breakdown's flagged cases and the healthy case each is compared with
    stalls: StallPairs = field(default_factory=StallPairs)


def audit_dataset(dataset: Dataset, thresholds: Thresholds | None = None) -> Audited:
    """One GPU's findings (and its candidate audit's verdicts, where the run has one)."""
    thresholds = thresholds or Thresholds()
    verdicts = None
    if dataset.candidates is not None:
        verdicts = judge_candidates(dataset.candidates, thresholds.candidate_gap_pct / 100)
    machine = machine_of(dataset.env, dataset.frame)
    rows = with_roofline(prepare(dataset.frame), machine)
    found = audit(dataset.frame, thresholds, verdicts, prepared=rows, machine=machine)
    found = weigh(found, rows, dataset.trace, thresholds)  # what each is worth (a trace's too)
    found = by_cause(found)  # one finding per cause and problem, the rest its observations
    verdict = trace_verdict(dataset.trace, verdicts, found, thresholds)
    pairs = stall_pairs(rows, found)
    return Audited(
        dataset, rows, found, verdicts, thresholds, unjudged(dataset), machine, verdict, pairs
    )


def audit_all(datasets: Sequence[Dataset], thresholds: Thresholds | None = None) -> list[Audited]:
    return [audit_dataset(dataset, thresholds) for dataset in datasets]


# Rules that judge nothing without a column, and what the column holds.
NEEDS = (Unjudged(MAP_RULES, "kernel_time_ms", "kernel times, recorded by CUPTI"),)


def unjudged(dataset: Dataset) -> list[Unjudged]:
    """The rules a table gives nothing to judge, and the column they need."""
    frame = dataset.frame
    return [
        need
        for need in NEEDS
        if need.column not in frame.columns or frame[need.column].isna().all()
    ]
