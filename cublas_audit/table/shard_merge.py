"""Shard run directories (`--shard I/N`) joined into one run (`cublas-audit merge`): each shard
read and checked against its own record, the set checked whole (one plan, every part once, the
same versions and probe settings), then the whole plan's tables in plan order and one env.json
listing the shards. Pure: reads the shards, returns what the merged run holds; the job writes it.

Every refusal is one line and comes before anything is written.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.planning import plan_file
from cublas_audit.planning.cases import Case, candidate_problems
from cublas_audit.planning.plan_file import PlanFile
from cublas_audit.planning.shards import ShardSpec, split
from cublas_audit.table import candidates_table, rundir
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.validation import read_table
from cublas_audit.vocabulary import Phase

# What must agree between shards for their rows to be one measurement (unless --allow-mixed):
# the software measured, and every setting that decides what the probe measures.
VERSIONS = ("tool_version", "cublas_version", "driver_version", "cuda_runtime")
SETTINGS = (
    "phase",
    "observer",
    "profiled",
    "reference",
    "min_reps",
    "ncu_clock_control",
    "probe_env",
    "cublas_lib",
    "candidate_limit",
    "candidate_threshold",
    "candidate_min_reps",
    "workspace_bytes",
)
# A shard's own, listed per shard in the merged env.json rather than taken from the first.
PER_SHARD = (
    "shard",
    "host",
    "gpu_uuid",
    "device_index",
    "command",
    "started",
    "finished",
    "sweep_seconds",
    "phase_seconds",
    "probe",
)


@dataclass(frozen=True)
class ShardRun:
    """One shard run directory as recorded: its part, the whole plan, its env.json (the plans as
    their files state them: a full map's cases are built only where asked for)."""

    path: Path
    spec: ShardSpec
    plan_fingerprint: str
    env: dict[str, Any]
    plan: PlanFile
    whole_plan: PlanFile
    # its table's rows' places in the whole plan (PlanOrder.places), where found as it came back
    places: np.ndarray | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def cases(self) -> list[Case]:
        return self.plan.cases()

    @functools.cached_property
    def record(self) -> EnvRecord:
        """Its env.json as the typed record (`env`: the object, for the checks key by key)."""
        return EnvRecord.of(self.env, self.path / rundir.ENV_FILE)

    @functools.cached_property
    def whole(self) -> list[Case]:
        return self.whole_plan.cases()

    @property
    def has_table(self) -> bool:
        return rundir.has_table(self.path)

    @property
    def has_candidates(self) -> bool:
        return (self.path / rundir.CANDIDATES_FILE).is_file()


@dataclass(frozen=True)
class Merged:
    """What the merged run directory holds (None: no shard has that table)."""

    plan: PlanFile
    table: pd.DataFrame | None
    candidates: pd.DataFrame | None
    env: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def whole(self) -> list[Case]:
        return self.plan.cases()


def check_out(out: Path, runs: Sequence[Path]) -> None:
    """The merged run goes neither into a shard nor onto one: it would mix with its input."""
    target = Path(out).resolve()
    for run in runs:
        source = Path(run).resolve()
        if target == source or source in target.parents:
            raise AuditError(f"--out: {out} is inside the input {run}; pick a directory outside")


def read_shard(path: Path) -> ShardRun:
    """A shard run directory, its record checked against itself: its plan-whole.json is the plan
    its fingerprint names, and its plan.json that plan's part I of N."""
    env = rundir.read_env(path)
    if not env:
        raise AuditError(f"{path}: not a cublas-audit run directory (no env.json)")
    if "shard" not in env:
        raise AuditError(
            f"{path}: not a shard run (its env.json names no shard): merge joins "
            "the run directories of --shard I/N"
        )
    try:
        spec = ShardSpec.parse(str(env["shard"]))
    except AuditError as exc:
        raise AuditError(f"{path}: its env.json's shard: {exc}") from exc
    whole = _whole_plan((path / rundir.WHOLE_PLAN_FILE).read_bytes(), path)
    recorded = str(EnvRecord.of(env, path / rundir.ENV_FILE).plan_fingerprint)
    if recorded not in whole.fingerprints:
        if not whole.plan.matches(recorded):
            raise AuditError(
                f"{path}: its {rundir.WHOLE_PLAN_FILE} is not the plan its env.json names"
            )
        whole.fingerprints.add(recorded)
    cases = plan_file.read(path / rundir.PLAN_FILE)
    if cases.case_ids() != whole.part_ids(spec):
        raise AuditError(f"{path}: its {rundir.PLAN_FILE} is not part {spec} of its whole plan")
    return ShardRun(Path(path), spec, recorded, env, cases, whole.plan)


@dataclass(frozen=True)
class _Whole:
    """A whole plan as the shards of one run all hold it: read, fingerprinted and split once
    for them all (a full map's plan took seconds each time)."""

    plan: PlanFile
    fingerprints: set[str] = field(default_factory=set)
    parts: dict[int, list[list[int]]] = field(default_factory=dict)

    @functools.cached_property
    def ids(self) -> list[str]:
        return self.plan.case_ids()

    def part_ids(self, spec: ShardSpec) -> list[str]:
        if spec.count not in self.parts:
            self.parts[spec.count] = split(self.plan.flops(), spec.count)
        return [self.ids[p] for p in self.parts[spec.count][spec.index - 1]]


def _whole_plan(text: bytes, path: Path) -> _Whole:
    try:
        return _whole_of(text)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AuditError(
            f"{path / rundir.WHOLE_PLAN_FILE}: not a cublas-audit plan ({exc})"
        ) from exc


@functools.lru_cache(maxsize=2)
def _whole_of(text: bytes) -> _Whole:
    """(cached by the file's bytes: the shards of one run hold the same)"""
    return _Whole(plan_file.from_json(json.loads(text)))


def check_shards(shards: Sequence[ShardRun], allow_mixed: bool = False) -> None:
    """One plan, every part exactly once and finished, the same versions and settings (unless
    `allow_mixed`), and GPU models told apart by their labels."""
    if not shards:
        raise AuditError("merge: give the shard run directories")
    _check_one_plan(shards)
    _check_each_part_once(shards)
    for shard in shards:
        if not finished(shard):
            raise AuditError(
                f"{shard.path}: shard {shard.spec} is not finished (no {result_file(shard)}); "
                f"finish it with --resume {shard.path}"
            )
    if not allow_mixed:
        for key in (*VERSIONS, *SETTINGS, "gpu_name"):
            _check_same(shards, key)
    _check_models_labelled(shards)


def result_file(shard: ShardRun) -> str:
    """The table a finished shard holds: candidates.csv for a candidates run, else its dispatch
    table (dispatch.csv, or dispatch.parquet where it wrote one)."""
    if shard.record.phase is Phase.candidates:
        return rundir.CANDIDATES_FILE
    return rundir.table_file(shard.path).name


def finished(shard: ShardRun) -> bool:
    """Whether the shard ran to its end (its table is written last)."""
    return (shard.path / result_file(shard)).is_file()


def _check_one_plan(shards: Sequence[ShardRun]) -> None:
    first = shards[0]
    for shard in shards[1:]:
        if shard.plan_fingerprint != first.plan_fingerprint:
            raise AuditError(
                f"{first.path} and {shard.path} are shards of different plans (fingerprints "
                f"{first.plan_fingerprint[:12]} and {shard.plan_fingerprint[:12]})"
            )
        if shard.spec.count != first.spec.count:
            raise AuditError(
                f"{first.path} ({first.spec}) and {shard.path} ({shard.spec}) split the plan "
                "into different numbers of parts"
            )


def _check_each_part_once(shards: Sequence[ShardRun]) -> None:
    parts: dict[ShardSpec, Path] = {}
    for shard in shards:
        if shard.spec in parts:
            raise AuditError(
                f"shard {shard.spec} is given twice ({parts[shard.spec]} and {shard.path})"
            )
        parts[shard.spec] = shard.path
    seen: dict[str, Path] = {}  # parts of one plan never overlap: a record edited by hand
    for shard in shards:
        for case_id in shard.plan.case_ids():
            if case_id in seen:
                raise AuditError(
                    f"{shard.path}: shard {shard.spec} overlaps {seen[case_id]} "
                    f"(case {case_id} is in both)"
                )
            seen[case_id] = shard.path
    count = shards[0].spec.count
    missing = sorted(set(range(1, count + 1)) - {s.spec.index for s in shards})
    if missing:
        names = ", ".join(f"{i}/{count}" for i in missing)
        raise AuditError(f"merge: shard{'s' if len(missing) > 1 else ''} {names} missing")


def _check_same(shards: Sequence[ShardRun], key: str) -> None:
    first = shards[0]
    for shard in shards[1:]:
        if _canonical(shard.env.get(key)) != _canonical(first.env.get(key)):
            what = "GPU models" if key == "gpu_name" else key
            raise AuditError(
                f"shards differ in {what} ({first.spec}: {first.env.get(key)!r}, {shard.spec}: "
                f"{shard.env.get(key)!r}); give --allow-mixed to merge them anyway"
            )


def _check_models_labelled(shards: Sequence[ShardRun]) -> None:
    """A merged run of several models is read per model by gpu_label (as --devices
    --allow-mixed): one label must not stand for two models."""
    models: dict[str, str] = {}
    for shard in shards:
        label, name = str(shard.record.gpu_label), str(shard.record.gpu_name)
        if models.setdefault(label, name) != name:
            raise AuditError(
                f"gpu_label {label!r} names two GPU models ({models[label]}, {name}); merged "
                "runs are read per model by label: run each model's shards with its own "
                "--gpu-label"
            )


def merge(shards: Sequence[ShardRun], command: list[str]) -> Merged:
    """The checked shards as one run: the whole plan, its tables in plan order, one env.json."""
    ordered = sorted(shards, key=lambda s: s.spec)
    whole = ordered[0].whole_plan
    tables = read_tables([s.path for s in ordered if s.has_table])
    found = [candidates_table.read_candidates(s.path) for s in ordered if s.has_candidates]
    places = [s.places for s in ordered if s.has_table]
    table = in_plan_order(plan_order(whole), tables, places) if tables else None
    candidates = _merged_candidates(ordered[0].whole, found) if found else None
    return Merged(whole, table, candidates, merged_env(ordered, command))


def read_tables(paths: Sequence[Path]) -> list[pd.DataFrame]:
    """The shards' tables, read at once (pyarrow reads and decompresses a columnar table
    outside Python's lock: on a host of many cores the four tables of a full map take about the
    time of one)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(paths))) as pool:
        return list(pool.map(read_table, paths))


class PlanOrder:
    """A plan's case ids as an index, made once: where each table's rows go in the plan, looked
    up table by table (a --devices run looks a shard's up as soon as it is read, while the other
    shards still run: run.multi_gpu), then the tables joined in plan order (in_plan_order)."""

    def __init__(self, plan: Sequence[Case | str]) -> None:
        self.ids = pd.Index([case if isinstance(case, str) else case.case_id for case in plan])
        self.unique = self.ids.is_unique  # (and the index's hash table made, once)

    def places(self, frame: pd.DataFrame) -> np.ndarray | None:
        """Each row's position in the plan (a row of no case of the plan: after the last);
        None where an id is planned twice (in_plan_order then sorts by the last position)."""
        if not self.unique:
            return None
        position = self.ids.get_indexer(pd.Index(frame["case_id"]))  # (hashed in C)
        return np.where(position < 0, len(self.ids), position)


_ORDERS: list[tuple[PlanFile, PlanOrder]] = []  # the last whole plan's (one run's merge)


def plan_order(plan: PlanFile) -> PlanOrder:
    """The PlanOrder of a whole plan, made once for that plan (a --ray run's as its first shard
    comes back, while the others still run: jobs.fleet; a full map's ~0.3 s of CPU here)."""
    for known, order in _ORDERS:
        if known is plan:
            return order
    order = PlanOrder(plan.case_ids())
    _ORDERS[:] = [(plan, order)]
    return order


def in_plan_order(
    plan: Sequence[Case | str] | PlanOrder,
    frames: Sequence[pd.DataFrame],
    places: Sequence[np.ndarray | None] | None = None,
) -> pd.DataFrame:
    """Tables of parts of `plan` (its cases, or their ids, or their PlanOrder) as one, its rows
    in plan order (a case's rows as they were; rows of no case of the plan last). `places`:
    each table's PlanOrder.places where already looked up (None: looked up here)."""
    order = plan if isinstance(plan, PlanOrder) else PlanOrder(plan)
    frame = pd.concat(frames, ignore_index=True)
    if not order.unique:  # (a sweep's cases and their problems: the last position of an id)
        last = {case_id: i for i, case_id in enumerate(order.ids)}
        frame = frame.sort_values("case_id", key=lambda cases: cases.map(last), kind="stable")
        return frame.reset_index(drop=True)
    found = list(places) if places is not None else [None] * len(frames)
    position = np.concatenate(
        [order.places(table) if at is None else at for table, at in zip(frames, found, strict=True)]
    )
    return frame.iloc[np.argsort(position, kind="stable")].reset_index(drop=True)


def _merged_candidates(whole: Sequence[Case], frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The shards' candidate audits as one. A sweep --candidates shard audits the problems of its
    cases, so two shards can have audited one problem: the lower shard's audit is kept whole
    (ranks and gaps are per problem, never mixed between two audits)."""
    kept: list[pd.DataFrame] = []
    audited: set[str] = set()
    for frame in frames:
        fresh = ~frame["case_id"].isin(audited)
        kept.append(frame[fresh])
        audited |= set(frame["case_id"])
    # a candidates run's plan is its problems; a sweep's problems come from its cases
    problems = [*whole, *candidate_problems(whole)]
    return in_plan_order(problems, kept)


def merged_env(shards: Sequence[ShardRun], command: list[str]) -> dict[str, Any]:
    """The first shard's record of what was measured, each shard's own listed, the merge's."""
    first = shards[0]
    models = sorted({str(s.record.gpu_name) for s in shards})
    shared = {k: v for k, v in first.env.items() if k not in PER_SHARD}
    return {
        **shared,
        "gpu_name": models[0] if len(models) == 1 else "mixed",
        "allow_mixed": len(models) > 1,
        "shards": [_shard_entry(s) for s in shards],
        "mixed": _differing(shards),
        "command": command,
        "merged": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _shard_entry(shard: ShardRun) -> dict[str, Any]:
    keys = ("host", "gpu_name", "gpu_uuid", "started", "finished", "sweep_seconds")
    return {"shard": str(shard.spec), "run_dir": str(shard.path.absolute())} | {
        key: shard.env.get(key) for key in keys
    }


def _differing(shards: Sequence[ShardRun]) -> list[str]:
    """The versions and settings the shards differ in (merged with --allow-mixed)."""
    return [key for key in (*VERSIONS, *SETTINGS) if len(_values(shards, key)) > 1]


def _values(shards: Sequence[ShardRun], key: str) -> set[str]:
    return {_canonical(s.env.get(key)) for s in shards}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
