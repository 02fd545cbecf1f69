"""Every GPU of a host: a run's cases sharded across them, or replicated on each.

    reports/<label>/<timestamp>/
      env.json, plan.json       the whole run: its devices, sharded or replicated, every case
      shards/gpu<index>/        one complete run directory per GPU (its own plan, env.json with
                                the GPU's index and UUID, timing.jsonl, ncu/, report.md)
      dispatch.csv, report.md   sharded: the shards' tables as one (dispatch.parquet when large;
                                device_index, gpu_uuid columns) and its report (a map's report
                                for a map)
      candidates.csv            `candidates --devices`: the shards' candidate audits as one
      units.md, units.json      replicated: the unit comparison (unit-mismatch findings, the
                                spread of unit speed, clocks and power beside it)

Each shard is a sweep (or a map) of its own, in a process of its own (run.shard_processes: the
shards' host work shares no interpreter lock): its probe (and its ncu, where ncu observes) runs
pinned to its GPU with CUDA_VISIBLE_DEVICES=<UUID>, so the shards run at the same time without
sharing a device. A shard streams its results into its own directory as a single-GPU run does, so
`--resume` of the run resumes every shard where it stopped. Shards are balanced by estimated
work (planning.shards: FLOPs plus a per-case cost), largest first, as `--shard I/N` splits a plan.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.errors import AuditError, InterruptedSweepError
from cublas_audit.observe.environment import Gpu, list_gpus
from cublas_audit.planning import plan_file
from cublas_audit.planning.cases import Case, candidate_problems
from cublas_audit.planning.grid import check_label, label_from_gpu_name
from cublas_audit.planning.plan_file import PlanFile, read_plan
from cublas_audit.planning.shards import PlanPart, ShardSpec, shard
from cublas_audit.run import shard_processes
from cublas_audit.run.devices import check_models, device_indices, parse_devices
from cublas_audit.run.sweep import Progress
from cublas_audit.run.sweep_options import SweepOptions, check_new_run_dir
from cublas_audit.run.sweep_setup import default_run_dir
from cublas_audit.table import candidates_table, rundir
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.shard_merge import PlanOrder, in_plan_order, read_tables
from cublas_audit.table.trace_record import write_trace_record
from cublas_audit.table.validation import read_table
from cublas_audit.version import __version__
from cublas_audit.vocabulary import Phase

SHARDS_DIR = "shards"
UNITS_REPORT = "units.md"
UNITS_JSON = "units.json"


@dataclass(frozen=True)
class Spread:
    """Over which GPUs a sweep or map runs: --devices, --replicate, --allow-mixed."""

    devices: str | None = None
    replicate: bool = False
    allow_mixed: bool = False

    def __post_init__(self) -> None:
        if self.devices is not None:
            device_indices(self.devices)  # its syntax, before any GPU is looked up


@dataclass(frozen=True)
class MultiResult:
    """A run spread over GPUs: its directory, the shards' run directories and the merged table
    (None for a replicated run, whose units are compared instead). The caller writes reports."""

    run_dir: Path
    shards: list[Path]
    frame: pd.DataFrame | None  # sharded: the merged table; replicated: None


# ----- which cases where ----------------------------------------------------------------------


def shard_dir(run_dir: Path, gpu: Gpu | int) -> Path:
    index = gpu.index if isinstance(gpu, Gpu) else gpu
    return Path(run_dir) / SHARDS_DIR / f"gpu{index}"


def unit_label(label: str, gpu: Gpu, replicate: bool, mixed: bool) -> str:
    """A shard's gpu_label: the run's; per unit where replicated; per model where mixed."""
    if replicate:
        return check_label(f"{label}-gpu{gpu.index}")
    if mixed:
        return label_from_gpu_name(gpu.name)
    return label


# ----- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A multi-GPU run as recorded in its env.json."""

    run_dir: Path
    label: str
    devices: list[Gpu]
    replicate: bool
    mixed: bool
    cases: Sequence[Case]
    stated: PlanFile | None = field(default=None, compare=False, repr=False)  # (plan.json's)
    # each shard's table as read while other shards still ran, and where its rows go in the
    # plan (run's `finished`): what the merge takes instead of reading and looking it up again
    read: dict[Path, tuple[pd.DataFrame, np.ndarray | None]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # when each shard's process began and said it was done, all had exited and every table was
    # read (seconds from run's start): env.json's shard_timeline_s (finish)
    timeline: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def order(self) -> PlanOrder:
        """The plan's ids as the merge orders the shards' rows by (made once, while they run)."""
        return PlanOrder(self.case_ids())

    def case_ids(self) -> list[str]:
        """The cases' ids in plan order (what the merged table is ordered by): from the plan's
        statement where there is one (a map's: its sizes' text; a full grid's 262,144 in ~0.2 s
        of CPU here, against ~1 s from each case)."""
        if self.stated is not None:
            return self.stated.case_ids()
        return [case.case_id for case in self.cases]


def start(options: SweepOptions, devices: Sequence[Gpu], replicate: bool) -> Plan:
    """A new run directory holding the whole plan and the devices it runs on."""
    label = options.gpu_label or label_from_gpu_name(devices[0].name)
    run_dir = (options.out or default_run_dir(label)).absolute()
    check_new_run_dir(run_dir)
    if not options.cases:
        raise AuditError("nothing to run: the plan has no case")
    mixed = len({gpu.name for gpu in devices}) > 1
    run_dir.mkdir(parents=True, exist_ok=True)
    stated = PlanFile.of(options.cases)
    plan_file.write(stated, run_dir / rundir.PLAN_FILE)
    if options.trace is not None:
        write_trace_record(options.trace, run_dir)
    rundir.write_env(
        run_dir,
        {
            "gpu_label": label,
            "gpu_name": devices[0].name if not mixed else "mixed",
            "devices": [gpu.to_json() for gpu in devices],
            "replicate": replicate,
            "allow_mixed": mixed,
            "phase": options.phase or Phase.time,
            "command": options.command,
            "tool_version": __version__,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )
    # (a plan made as its statement keeps its cases unmade: the shards make theirs)
    return Plan(run_dir, label, list(devices), replicate, mixed, options.cases, stated)


def recorded(run_dir: Path) -> Plan | None:
    """The multi-GPU plan a run directory records, or None for a single-GPU run."""
    env = EnvRecord.read(run_dir)
    if env.devices is None:
        return None
    try:
        devices = [Gpu(int(d["index"]), str(d["uuid"]), str(d["name"])) for d in env.devices]
    except (KeyError, TypeError, ValueError) as exc:
        raise AuditError(f"{run_dir / rundir.ENV_FILE}: its devices are not readable") from exc
    path = Path(run_dir) / rundir.PLAN_FILE
    return Plan(
        Path(run_dir).absolute(),
        env.gpu_label or "gpu",
        devices,
        env.replicate,
        env.allow_mixed,
        read_plan(path),
        plan_file.read(path),
    )


def check_devices_present(plan: Plan) -> None:
    """A resumed run finds each of its GPUs (by UUID) where it was: the shards stay pinned."""
    here = {gpu.uuid: gpu for gpu in list_gpus()}
    for gpu in plan.devices:
        if gpu.uuid not in here:
            raise AuditError(
                f"--resume: GPU {gpu.index} ({gpu.uuid}) of {plan.run_dir} is not on this host"
            )


def shard_options(options: SweepOptions, plan: Plan, gpu: Gpu, cases: list[Case]) -> SweepOptions:
    """The sweep of one GPU: a new shard, or the recorded one resumed (its own record then
    restores its settings, the pinning to its GPU included)."""
    where = shard_dir(plan.run_dir, gpu)
    if (where / rundir.PLAN_FILE).exists():
        return SweepOptions(resume=where, phase=options.phase)
    pinned = {**options.probe_env, "CUDA_VISIBLE_DEVICES": gpu.uuid}
    return replace(
        options,
        cases=cases,
        out=where,
        resume=None,
        gpu_label=unit_label(plan.label, gpu, plan.replicate, plan.mixed),
        device=gpu.index,
        probe_env=pinned,
        command=[*options.command, f"(shard: GPU {gpu.index})"],
    )


def run(
    options: SweepOptions,
    plan: Plan,
    progress_for: Callable[[Gpu], Progress] | None = None,
) -> list[Path]:
    """Every shard at once, a process each (shard_processes: their host work shares no
    interpreter lock). Ctrl-C stops them all; each keeps what it finished, and --resume of the
    run goes on."""
    began = time.perf_counter()
    jobs = _jobs(options, plan)
    # the merge's order made while the shards run (this process only relays their progress),
    # and each shard's table read and looked up in it as soon as the shard is done
    # (validation.read_table: parsed and checked once a process; a full map's shard ~0.75 s of
    # CPU here, the four read at once after the last shard 1.4 s; its 65,536 ids looked up in
    # the plan's 262,144 ~0.1 s), so that the merge reads the last one alone
    ahead = threading.Thread(target=lambda: plan.order, name="plan order", daemon=True)
    ahead.start()
    reads = concurrent.futures.ThreadPoolExecutor(max(1, len(jobs)), "shard table")

    def finished(index: int) -> None:
        if options.phase is not Phase.candidates:  # (a candidates run's: candidates.csv)
            reads.submit(_read_ahead, plan, shard_dir(plan.run_dir, jobs[index][0]))

    spawned = time.perf_counter() - began
    try:
        outcome = shard_processes.run_all(
            [job for _gpu, job in jobs],  # (each a SentJob)
            [progress_for(gpu) if progress_for else None for gpu, _job in jobs],
            finished,
        )
    finally:  # (a read that failed is read again by the merge, which says why)
        reads.shutdown(wait=True, cancel_futures=True)
    ahead.join()
    plan.timeline.update(_timeline(outcome.timeline, spawned, [gpu for gpu, _ in jobs]))
    plan.timeline["tables_read"] = round(time.perf_counter() - began, 2)
    failures = [(jobs[index][0], error) for index, error in sorted(outcome.failures.items())]
    if outcome.interrupted or any(isinstance(e, InterruptedSweepError) for _g, e in failures):
        raise InterruptedSweepError(
            f"interrupted: what the shards finished is saved in {plan.run_dir}; finish with: "
            f"--resume {plan.run_dir}"
        )
    if failures:
        gpu, error = failures[0]
        if not isinstance(error, AuditError):
            raise error
        kept = f"what the shards finished is kept: --resume {plan.run_dir} goes on"
        raise type(error)(f"GPU {gpu.index}: {error}; {kept}")
    return [shard_dir(plan.run_dir, gpu) for gpu, _job in jobs]


def _jobs(options: SweepOptions, plan: Plan) -> list[tuple[Gpu, shard_processes.SentJob]]:
    """Each GPU's job: the whole plan (replicated), else its shard. A shard of a stated plan
    (a map's grid) goes as its part of the statement and its process makes its cases (a full
    map's split and rows were ~0.6 s of CPU here, one shard after another, before the first
    started); a listed plan's, as rows. A GPU with no case (more GPUs than cases) has no job."""
    count = len(plan.devices)
    if not plan.replicate and plan.stated is not None and len(plan.cases) >= count:
        jobs = []
        for index, gpu in enumerate(plan.devices):
            sent = shard_options(options, plan, gpu, [])
            resumed = sent.resume is not None  # (its record holds its cases)
            part = None if resumed else PlanPart(ShardSpec(index + 1, count), plan.stated)
            jobs.append((gpu, shard_processes.SentJob.of(sent, part)))
        return jobs
    shards = (
        [list(plan.cases) for _ in plan.devices] if plan.replicate else shard(plan.cases, count)
    )
    return [
        (gpu, shard_processes.SentJob.of(shard_options(options, plan, gpu, cases)))
        for gpu, cases in zip(plan.devices, shards, strict=True)
        if cases
    ]


def merged_table(plan: Plan, shards: Sequence[Path]) -> pd.DataFrame:
    """The shards' tables as one, in plan order, written to the run's dispatch.csv."""
    frame = merged_frame(plan, shards)
    rundir.write_run_table(frame, plan.run_dir)
    return frame


def _timeline(said: dict[str, Any], spawned: float, gpus: Sequence[Gpu]) -> dict[str, Any]:
    """shard_processes' timeline of the shards (from its start) from run's start, by GPU."""
    shards = {
        shard_dir(Path(), gpu).name: {
            kind: round(spawned + said[kind][index], 2)
            for kind in ("began", "done")
            if index in said.get(kind, {})
        }
        for index, gpu in enumerate(gpus)
    }
    exited = said.get("exited")
    return {"jobs_made": round(spawned, 2), "shards": shards} | (
        {"exited": round(spawned + exited, 2)} if exited is not None else {}
    )


def _read_ahead(plan: Plan, path: Path) -> None:
    frame = read_table(path)
    plan.read[path] = (frame, plan.order.places(frame))


def merged_frame(plan: Plan, shards: Sequence[Path]) -> pd.DataFrame:
    """The shards' tables as one, in plan order (what merged_table writes): each as read while
    the others ran, or read now."""
    missing = [path for path in shards if path not in plan.read]
    now = dict(zip(missing, read_tables(missing), strict=True))
    frames = [now[path] if path in now else plan.read[path][0] for path in shards]
    places = [None if path in now else plan.read[path][1] for path in shards]
    return in_plan_order(plan.order, frames, places)


def merged_candidates(plan: Plan, shards: Sequence[Path]) -> pd.DataFrame:
    """The shards' candidate audits as one, in plan order, written to the run's candidates.csv
    (each problem was audited whole on one GPU: its ranks and gaps stand as they are)."""
    frame = in_plan_order(plan.cases, [candidates_table.read_candidates(path) for path in shards])
    candidates_table.write_candidates(frame, plan.run_dir / rundir.CANDIDATES_FILE)
    return frame


def finish(plan: Plan, shards: Sequence[Path], seconds: float) -> dict[str, Any]:
    """env.json of the run with its wall time, and each shard's own (what ran in parallel)."""
    env = rundir.read_env(plan.run_dir)
    env["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    env["sweep_seconds"] = round(seconds, 2)
    env["shard_seconds"] = {
        path.name: rundir.read_env(path).get("sweep_seconds") for path in shards
    }
    first = rundir.read_env(shards[0]) if shards else {}
    shared = ("driver_version", "cublas_version", "cuda_runtime", "cc", "sm_count", "observer")
    for key in (*shared, "candidate_limit", "candidate_threshold", "candidate_min_reps"):
        env.setdefault(key, first.get(key))
    env.setdefault("phase_seconds", {str(Phase.of(env.get("phase"))): round(seconds, 2)})
    if plan.timeline:  # (where the run's seconds beyond its shards' sweeps went)
        env["shard_timeline_s"] = plan.timeline
    rundir.write_env(plan.run_dir, env)
    return env


def on_devices(
    options: SweepOptions,
    spread: Spread,
    progress_for: Callable[[Gpu], Progress] | None = None,
) -> tuple[Plan, list[Path]]:
    """A new run on the GPUs `spread` names, or the recorded multi-GPU run options.resume is,
    to the end of its shards; the run's env.json then says how long it took."""
    if options.resume is not None:
        plan = recorded(options.resume)
        if plan is None:
            raise AuditError(f"--resume: {options.resume} is a single-GPU run: leave out --devices")
        check_devices_present(plan)
    else:
        if spread.devices is None:
            raise AuditError("--replicate and --allow-mixed go with --devices")
        picked = parse_devices(spread.devices, list_gpus())
        check_models(picked, spread.allow_mixed)
        if spread.replicate and len(picked) < 2:
            raise AuditError("--replicate compares units: give --devices with two GPUs or more")
        plan = start(options, picked, spread.replicate)
    started = time.perf_counter()
    shards = run(options, plan, progress_for)
    finish(plan, shards, time.perf_counter() - started)
    return plan, shards


def sweep_on_devices(
    options: SweepOptions,
    spread: Spread,
    progress_for: Callable[[Gpu], Progress] | None = None,
) -> MultiResult:
    """`sweep --devices`: the shards, then the merged table (sharded) or none (replicated: the
    units are compared)."""
    plan, shards = on_devices(options, spread, progress_for)
    if plan.replicate:
        return MultiResult(plan.run_dir, shards, None)
    return MultiResult(plan.run_dir, shards, merged_table(plan, shards))


def candidates_on_devices(
    options: SweepOptions,
    spread: Spread,
    progress_for: Callable[[Gpu], Progress] | None = None,
) -> MultiResult:
    """`candidates --devices`: the plan's problems sharded across the GPUs, each shard's audit in
    its probe pinned to its GPU, then the merged candidates.csv."""
    if spread.replicate:
        raise AuditError("--replicate: the candidate audit shards its problems; leave it out")
    # (a resumed run gives no cases: its record holds the plan)
    options = replace(options, cases=candidate_problems(options.cases), phase=Phase.candidates)
    plan, shards = on_devices(options, spread, progress_for)
    return MultiResult(plan.run_dir, shards, merged_candidates(plan, shards))
