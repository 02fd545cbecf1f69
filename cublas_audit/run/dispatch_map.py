"""The dispatch map: dense grids of problems, observed cheaply, then the cases it flags observed
deeply.

Screen wide: every planned case runs once through the probe's `map` phase, in one long-lived
child process (a quick float64 check, then a few calls timed with CUDA events and traced with
CUPTI at once: kernel names, kernel-only times, launch geometry; no counter permission). Results
stream into the run directory's timing.jsonl as they finish, so an interrupted map resumes where
it stopped (`map --resume DIR`, the sweep's own resume). The table has the sweep's schema.

Confirm deep: `--follow-up` takes the cases the map's rules flag (size-inversion, dispatch-cliff),
and the faster neighbour each was compared with, through a normal sweep into `follow-up/` inside
the map's run directory: ncu counters and stalls where ncu may run, full-length timing with the
reference kernel, and cuBLASLt's candidates, so each finding arrives with its evidence.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.rules import audit, prepare
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.judge.units import write_units_report
from cublas_audit.observe.environment import Gpu
from cublas_audit.planning.cases import Case, Variants, parse_int_list, read_plan
from cublas_audit.run import multi_gpu
from cublas_audit.run.sweep import Progress
from cublas_audit.run.sweep_setup import SweepOptions, SweepResult, sweep
from cublas_audit.table import rundir

MAX_MAP_CASES = 1_000_000  # beyond this, --sample: a plan.json of millions of cases is no map
DEFAULT_REPS = 5  # timed and traced calls per case (kernel times vary ~1 % call to call)
DEFAULT_FOLLOW_UP = 8  # findings the follow-up takes deep, largest effect first
FOLLOW_UP_DIR = "follow-up"
FOLLOW_UP_CANDIDATES = 32  # cuBLASLt candidates per followed-up problem
MAP_RULES = ("size-inversion", "dispatch-cliff")


@dataclass(frozen=True)
class Grid:
    """The problems of a map: square sizes, and the cross product of m, n and k values."""

    sizes: tuple[int, ...] = ()
    m: tuple[int, ...] = ()
    n: tuple[int, ...] = ()
    k: tuple[int, ...] = ()

    @classmethod
    def parse(cls, sizes: str, m: str, n: str, k: str) -> Grid:
        """From the command line's texts; --m, --n and --k come together or not at all."""
        dims = {"--m": m, "--n": n, "--k": k}
        given = [name for name, text in dims.items() if text.strip()]
        if given and len(given) < 3:
            missing = ", ".join(name for name in dims if name not in given)
            raise AuditError(
                f"{', '.join(given)} without {missing}: give --m, --n and --k together"
            )
        grid = cls(
            sizes=tuple(parse_int_list(sizes, "--sizes")) if sizes.strip() else (),
            **{
                name.strip("-"): tuple(parse_int_list(text, name)) if text.strip() else ()
                for name, text in dims.items()
            },
        )
        if grid.count == 0:
            raise AuditError("nothing to map: give --sizes, or --m, --n and --k")
        return grid

    @property
    def count(self) -> int:
        return len(self.sizes) + len(self.m) * len(self.n) * len(self.k)

    def problem(self, index: int) -> tuple[int, int, int]:
        """The index-th problem: squares first, then the cross product in m, n, k order."""
        if index < len(self.sizes):
            size = self.sizes[index]
            return size, size, size
        index -= len(self.sizes)
        rest, k = divmod(index, len(self.k))
        i, j = divmod(rest, len(self.n))
        return self.m[i], self.n[j], self.k[k]

    def problems(self, sample: int | None = None, seed: int = 0) -> list[tuple[int, int, int]]:
        """Every problem, or `sample` of them drawn at random (without building the whole grid),
        deduplicated and in ascending order: memory grows along the map, and an out-of-memory
        case comes last."""
        picked: Sequence[int] = range(self.count)
        if sample is not None and sample < self.count:
            picked = random.Random(seed).sample(picked, sample)
        return sorted({self.problem(i) for i in picked})


def plan(
    problems: Sequence[tuple[int, int, int]],
    batches: Sequence[int],
    modes: Sequence[str],
    apis: Sequence[str],
    variants: Variants | None = None,
) -> list[Case]:
    """The map's cases: every problem at every batch count (1: the single call), mode, API and
    layout. No loop companions: a map asks what cuBLAS dispatches, not how a loop compares."""
    variants = variants or Variants()
    total = len(problems) * len(batches) * len(modes) * len(apis) * len(variants.layouts)
    if total > MAX_MAP_CASES:
        raise AuditError(
            f"the map has {total:,} cases (at most {MAX_MAP_CASES:,}): take --sample N of them"
        )
    cases = [
        case
        for (m, n, k), batch, mode, api in itertools.product(problems, batches, modes, apis)
        for case in variants.cases(api, mode, m, n, k, batch)
        if not case.loop
    ]
    return list(dict.fromkeys(cases))


def listed(cases: Sequence[Case]) -> list[Case]:
    """A shape list's or a trace's cases as map cases (their loop companions dropped)."""
    return [case for case in cases if not case.loop]


@dataclass(frozen=True)
class MapResult:
    run_dir: Path
    frame: pd.DataFrame | None  # None for a replicated map: its units are compared (units.md)
    report: Path
    follow_up: Path | None = None
    findings: list[Finding] = field(default_factory=list)


def run(
    options: SweepOptions,
    follow_up: int | None = None,
    thresholds: Thresholds | None = None,
    progress: Progress | None = None,
    spread: multi_gpu.Spread | None = None,
    progress_for: Callable[[Gpu], Progress] | None = None,
) -> MapResult:
    """The map (new or resumed; on one GPU, or spread over several), then with `follow_up` the
    deep tier for that many findings (on the first GPU), then the report with both."""
    from cublas_audit.report.map_report import write_map_report

    options = replace(options, phase="map")
    if spread is None:
        mapped = sweep(options, progress, report=False)
    else:
        plan, shards = multi_gpu.on_devices(options, spread, progress_for)
        if plan.replicate:
            for shard in shards:
                write_map_report(shard, thresholds)
            units = write_units_report(plan.run_dir, shards, thresholds)
            return MapResult(plan.run_dir, None, units)
        frame = multi_gpu.merged_table(plan, shards)
        mapped = SweepResult(plan.run_dir, frame, plan.run_dir / rundir.REPORT_FILE)
    found = map_findings(mapped.frame, thresholds)  # once: the follow-up and the report share it
    deep = None
    if follow_up:
        deep = run_follow_up(mapped, options, found[:follow_up], progress)
    report = write_map_report(mapped.run_dir, thresholds, found)
    return MapResult(mapped.run_dir, mapped.frame, report, deep, found)


def map_findings(frame: pd.DataFrame, thresholds: Thresholds | None = None) -> list[Finding]:
    """The map rules' findings, largest effect first."""
    found = audit(frame, thresholds=thresholds, rules=MAP_RULES)
    return sorted(found, key=lambda f: (-f.effect, f.rule, f.sizes))


def follow_up_cases(
    frame: pd.DataFrame, cases: Sequence[Case], followed: Sequence[Finding]
) -> list[Case]:
    """The cases of the findings followed up and of the rows they were compared with, in plan
    order."""
    rows = prepare(frame)
    wanted: set[str] = set()
    for finding in followed:
        labels = [*finding.rows, *finding.compared]
        wanted.update(str(rows.loc[label, "case_id"]) for label in labels)
    return [case for case in cases if case.case_id in wanted]


def run_follow_up(
    mapped: SweepResult,
    options: SweepOptions,
    followed: Sequence[Finding],
    progress: Progress | None,
) -> Path | None:
    """The flagged cases through a sweep into follow-up/ (resumed where it was started): ncu
    where it may run (else CUPTI), the reference, cuBLASLt's candidates."""
    out = mapped.run_dir / FOLLOW_UP_DIR
    cases = follow_up_cases(mapped.frame, read_plan(mapped.run_dir / rundir.PLAN_FILE), followed)
    if not cases:
        (progress or Progress()).note("follow-up: the map flagged nothing")
        return None
    started = (out / rundir.PLAN_FILE).exists()
    record = rundir.read_env(mapped.run_dir)  # the map's probe settings, also when resumed
    cublas_lib = record.get("cublas_lib")
    deep = SweepOptions(
        cases=[] if started else cases,
        gpu_label=str(record.get("gpu_label") or options.gpu_label or "") or None,
        out=None if started else out,
        resume=out if started else None,
        probe_python=None if started else record.get("probe_python"),
        cublas_lib=None if started or not cublas_lib else Path(cublas_lib),
        probe_env={} if started else dict(record.get("probe_env") or {}),
        candidate_limit=None if started else FOLLOW_UP_CANDIDATES,
        command=[*options.command, f"(follow-up of {len(cases)} cases)"],
        phase=None if started else "time",
        # ncu where it can run (the sweep's default); events where the map was told not to trace
        observer="events" if record.get("observer") == "events" and not started else None,
    )
    (progress or Progress()).note(f"follow-up: {len(cases)} cases to the deep tier")
    return sweep(deep, progress).run_dir
