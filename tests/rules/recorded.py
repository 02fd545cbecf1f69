"""Recorded fixtures the per-rule tests share: committed run directories under reports/ (and
tests/fixtures/), read once per test process, and slices of them by case id. Every number a rule
judges here was measured; a test changes a threshold or drops rows, never a measurement."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from functools import cache
from pathlib import Path

import pandas as pd

from cublas_audit.judge.candidates import judge_candidates
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.roofline import machine_of, with_roofline
from cublas_audit.judge.rules import audit, prepare
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.inputs import Dataset, load_inputs
from tests.conftest import FIXTURES, REPORTS


def path_of(run: str) -> Path:
    """'h100/checks/...' under reports/, 'fixtures:h100-smoke' under tests/fixtures/."""
    if run.startswith("fixtures:"):
        return FIXTURES / run.removeprefix("fixtures:")
    return REPORTS / run


@cache
def dataset(run: str, gpu_label: str = "") -> Dataset:
    """A run directory's one GPU, or a table's GPU of this label (a published table has several)."""
    found = [d for d in load_inputs([path_of(run)]) if gpu_label in ("", d.gpu_label)]
    (data,) = found
    return data


def joined(*runs: str) -> Dataset:
    """Several runs' tables as one (with the first's record): companions measured apart."""
    first = dataset(runs[0])
    frame = pd.concat([dataset(run).frame for run in runs], ignore_index=True)
    return replace(first, frame=frame)


def sliced(run: str, case_ids: Iterable[str]) -> Dataset:
    """The run with only the rows of these cases (every launch of each), as recorded."""
    data = dataset(run)
    wanted = set(case_ids)
    frame = data.frame[data.frame["case_id"].astype(str).isin(wanted)].copy()
    missing = wanted - set(frame["case_id"].astype(str))
    assert not missing, f"{run} has no case {sorted(missing)}"
    return replace(data, frame=frame)


def judged(
    data: Dataset, rule: str, model: NoiseModel | None = None, **thresholds: float
) -> list[Finding]:
    """One rule's findings on a dataset, judged as judge.audited judges a run: its candidate
    audit, its GPU's roofline (env.json, else the table's columns); the shipped noise model
    unless another is given."""
    t = Thresholds(**thresholds)  # type: ignore[arg-type]
    verdicts = None
    if data.candidates is not None:
        verdicts = judge_candidates(data.candidates, t.candidate_gap_pct / 100)
    machine = machine_of(data.env, data.frame)
    rows = with_roofline(prepare(data.frame), machine)
    return audit(data.frame, t, verdicts, [rule], rows, machine, model)


def case_ids(data: Dataset, finding: Finding, which: str = "rows") -> list[str]:
    """The case ids of a finding's judged rows (or of the rows it was `compared` with)."""
    rows = prepare(data.frame)
    return [str(rows.at[row, "case_id"]) for row in getattr(finding, which)]
