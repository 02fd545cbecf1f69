"""`--ray auto|ADDRESS`: a plan's shards placed on a Ray cluster's GPUs, one Ray task each.

The engine boundary: the tool plans, runs one shard, merges and judges; Ray places and restarts.
Each task (`num_gpus=1`; Ray sets its CUDA_VISIBLE_DEVICES) runs the same sweep as
`--shard I/N` on its node (run.ray_task: sent its part of the plan as stated, never the cases).
A task on the driver's own node writes its shard in place, under `<run>/shards/shard-I/`; one
elsewhere sweeps into a node-local temporary run directory and returns it as bytes (a tar of its
compact files), which the driver unpacks there as it comes back: no shared filesystem is needed.
The driver then merges the shards (jobs.merge) into `<run>`.

Ray is joined in a background thread (`connect_soon`, from the command line before it plans:
starting a local instance takes ~5 s, most of it waiting on Ray's processes), and each phase's
time is recorded in env.json's `ray_timings` (seconds from the start of joining Ray on the
driver's clock; a task's steps from its node's clock): joining Ray, the tasks submitted, each
shard's start, sweep, fold, pack, return and unpack, the shards gathered, then (jobs.fleet) the
merge, judging and report.

    <run>/env.json          engine "ray", its address, the shard count, the settings every
                            shard runs with, each shard's node, host and GPU, ray_timings
    <run>/plan.json         the whole plan
    <run>/shards/shard-I/   shard I's run directory, as `--shard I/N` writes it
    <run>/shards/unit-I/    `--replicate`: unit I's run directory, the whole plan on one GPU
                            (run.ray_units; compared, not merged)

A task that fails (its worker or node lost, an error in its sweep) leaves its shard missing; the
others are kept, and `--resume <run>` re-runs only the missing shards through Ray. Ctrl-C while
they are gathered cancels the tasks not yet back; the shards gathered stay for `--resume`.

Ray is an optional extra: it is imported only inside functions (run.ray_connect), and its
absence is a ToolMissingError naming the install command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.observe.observer import Observer
from cublas_audit.planning import plan_file
from cublas_audit.planning.plan_file import PlanFile
from cublas_audit.planning.shards import PlanPart, ShardSpec
from cublas_audit.run import ray_connect, ray_units
from cublas_audit.run.multi_gpu import SHARDS_DIR
from cublas_audit.run.ray_task import Home, ShardDone, ShardSweep, run_shard
from cublas_audit.run.run_archive import unpack
from cublas_audit.run.sweep_options import SweepOptions, check_new_run_dir
from cublas_audit.run.sweep_setup import sweep
from cublas_audit.table import rundir, shard_merge
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.version import __version__
from cublas_audit.vocabulary import Phase

ENGINE = "ray"
# Told of each shard kept while the others still run (jobs.fleet reads it for the merge then).
ShardKept = Callable[[int, Path], None]
# A lost worker or node: Ray runs its task again this many times (on any GPU free) before the
# shard counts as missing.
DEFAULT_RETRIES = 2
# The SweepOptions every shard runs with, recorded so that a missing shard re-runs as it would
# have (it has no run directory of its own to resume from).
SETTINGS = (
    "gpu_label",
    "profile",
    "reference",
    "ncu",
    "clock_control",
    "probe_python",
    "cublas_lib",
    "probe_env",
    "min_reps",
    "candidate_limit",
    "candidate_threshold",
    "candidate_min_reps",
    "workspace_bytes",
    "observer",
    "phase",
)

# env.json's keys of the engine (engine_record), kept when the shards are merged over it
ENGINE_KEYS = (
    "engine",
    "ray_address",
    "shard_count",
    "ray_settings",
    "ray_shards",
    "replicate",
    "unit_label",
    "ray_timings",
)


@dataclass(frozen=True)
class FleetRun:
    """A Ray run as its env.json records it."""

    run_dir: Path
    address: str
    count: int
    plan: PlanFile  # the whole plan, as plan.json states it
    settings: SweepOptions
    command: list[str]
    # --replicate: `count` units, each the whole plan (its part 1/1), labelled from `label`
    replicate: bool = False
    label: str = ""

    def shard_dir(self, index: int) -> Path:
        name = ray_units.unit_name(index) if self.replicate else f"shard-{index}"
        return self.run_dir / SHARDS_DIR / name

    def spec(self, index: int) -> ShardSpec:
        return ShardSpec(1, 1) if self.replicate else ShardSpec(index, self.count)

    def name(self, index: int) -> str:
        """Shard I/N, or unit-I: its key in env.json's ray_shards and in messages."""
        return ray_units.unit_name(index) if self.replicate else str(self.spec(index))


# ----- the run's record ------------------------------------------------------------------------


def start(
    options: SweepOptions,
    address: str,
    gpus: int,
    unit_base: str | None = None,
    plan: PlanFile | None = None,
) -> FleetRun:
    """A new Ray run directory: the whole plan, one shard per GPU (fewer where the plan has
    fewer cases), the settings each shard runs with; `unit_base` (--replicate): one unit per
    GPU instead, labelled from it; `plan`: options.cases as stated, where the caller has it."""
    if not options.cases:
        raise AuditError("nothing to run: the plan has no case")
    if options.out is None:
        raise AuditError("--ray: give --out DIR (the run directory the shards are gathered in)")
    run_dir = options.out.absolute()
    check_new_run_dir(run_dir)
    plan = plan or PlanFile.of(options.cases)
    fleet = FleetRun(
        run_dir,
        address,
        ray_units.unit_count(gpus) if unit_base is not None else min(gpus, plan.count),
        plan,
        replace(options, cases=[]),  # (the plan is `plan`: the shards are sent their parts)
        list(options.command),
        unit_base is not None,
        unit_base or "",
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_file.write(fleet.plan, run_dir / rundir.PLAN_FILE)
    rundir.write_env(run_dir, {**engine_record(fleet), "tool_version": __version__})
    return fleet


def engine_record(
    fleet: FleetRun, placed: dict[str, Any] | None = None, timings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What env.json says of the engine; kept in the merged env.json so the run resumes."""
    settings = {name: getattr(fleet.settings, name) for name in SETTINGS}
    settings["cublas_lib"] = str(settings["cublas_lib"]) if settings["cublas_lib"] else None
    settings["probe_env"] = dict(settings["probe_env"])
    return {
        "engine": ENGINE,
        "ray_address": fleet.address,
        "shard_count": fleet.count,
        "plan_fingerprint": fleet.plan.fingerprint(),
        "phase": fleet.settings.phase or Phase.time,
        "ray_settings": settings,
        "ray_shards": placed or {},
        "replicate": fleet.replicate,
        "unit_label": fleet.label or None,
        "command": fleet.command,
        "ray_timings": timings or {},
    }


def is_ray_run(run_dir: Path | None) -> bool:
    """Whether `run_dir` is the directory of a `--ray` run."""
    return run_dir is not None and run_dir.is_dir() and _engine(run_dir) == ENGINE


def _engine(run_dir: Path) -> str | None:
    return EnvRecord.read(run_dir).engine


def recorded(run_dir: Path, address: str | None) -> FleetRun:
    """The Ray run `run_dir` records (`address`: another cluster to finish it on)."""
    env = EnvRecord.read(run_dir)
    if env.engine != ENGINE:
        raise AuditError(f"--resume: {run_dir} is no Ray run: leave out --ray")
    try:
        settings = dict(env.raw["ray_settings"])
        settings["cublas_lib"] = Path(settings["cublas_lib"]) if settings["cublas_lib"] else None
        settings["observer"] = Observer(settings["observer"]) if settings["observer"] else None
        settings["phase"] = Phase(settings["phase"]) if settings.get("phase") else None
        options = SweepOptions(**settings)
        count = int(env.raw["shard_count"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AuditError(f"{run_dir / rundir.ENV_FILE}: its Ray record is not readable") from exc
    whole = plan_file.read(run_dir / rundir.PLAN_FILE)
    if whole.fingerprint() != env.plan_fingerprint:
        raise AuditError(f"{run_dir}: its plan.json is not the plan its env.json names")
    return FleetRun(
        Path(run_dir).absolute(),
        address or env.ray_address or "auto",
        count,
        whole,
        options,
        list(env.command or []),
        env.replicate,
        env.unit_label or "",
    )


# A task's steps (ray_task.ShardDone.times) as ray_timings records them: name, from, to.
STEPS = (
    ("sweep_s", "started", "swept"),
    ("fold_s", "swept", "folded"),
    ("pack_s", "folded", "packed"),
)


# ----- one shard, in a Ray task (run.ray_task) ------------------------------------------------


def shard_options(fleet: FleetRun, index: int) -> SweepOptions:
    """Shard I's sweep: exactly what `--shard I/N` runs (its part and whole plan recorded); a
    unit's: the whole plan as part 1/1. Its cases are left to the task (PlanPart.cases): what is
    sent is the plan as stated."""
    part = PlanPart.of(fleet.spec(index), fleet.plan)
    return replace(
        fleet.settings,
        cases=[],
        part=part,
        out=None,
        resume=None,
        command=[*fleet.command, f"(ray {'' if fleet.replicate else 'shard '}{fleet.name(index)})"],
    )


# ----- the driver ------------------------------------------------------------------------------


def pending(fleet: FleetRun) -> list[int]:
    """The shards still to run: those with no finished run directory (a new run: all)."""
    return [i for i in range(1, fleet.count + 1) if not _finished(fleet.shard_dir(i))]


def _finished(path: Path) -> bool:
    if not (path / rundir.ENV_FILE).is_file():
        return False
    try:
        return shard_merge.finished(shard_merge.read_shard(path))
    except AuditError:
        return False  # half written: run it again


def run(
    options: SweepOptions,
    address: str | None,
    run_sweep: ShardSweep = sweep,
    retries: int = DEFAULT_RETRIES,
    replicate: bool = False,
    kept: ShardKept | None = None,
) -> tuple[FleetRun, list[Path]]:
    """A new Ray run, or the recorded one options.resume is finished: each pending shard (or
    unit, `replicate`) a task, gathered under shards/ (`kept`: called with each one's index and
    directory as soon as it is there, while the others still run). Returns the run and its
    shard directories, all finished; a shard a task did not bring back is one AuditError naming
    it and the --resume command."""
    ray = ray_connect.require_ray()
    if options.resume is not None:
        fleet = recorded(options.resume, address)
        ray = ray_connect.connect(fleet.address)
    else:
        # (stated while Ray is still joined, where connect_soon started it)
        plan = PlanFile.of(options.cases) if options.cases else None
        ray = ray_connect.connect(address or "auto")
        gpus = ray_connect.cluster_gpus(ray, address or "auto")
        base = ray_units.base_label(options.gpu_label, ray.cluster_resources())
        fleet = start(options, address or "auto", gpus, base if replicate else None, plan)
    failures = _place(ray, fleet, pending(fleet), run_sweep, retries, kept)
    if failures:
        raise AuditError(missing_message(fleet, failures))
    ray_connect.release()  # (every shard back: Ray leaves while the merge goes on)
    return fleet, [fleet.shard_dir(i) for i in range(1, fleet.count + 1)]


def _place(
    ray: ModuleType,
    fleet: FleetRun,
    indices: Sequence[int],
    run_sweep: ShardSweep,
    retries: int,
    kept: ShardKept | None = None,
) -> dict[int, str]:
    """Each shard a task on one GPU; each one's directory kept as it comes back (written in
    place on this node, else unpacked), in the order they finish. Returns the shards that
    failed, with why. Ctrl-C: the tasks not yet back are cancelled (else they would keep their
    GPUs busy after the driver is gone), what came back is recorded, and the KeyboardInterrupt
    goes on to the CLI (exit 130)."""
    task = ray.remote(num_gpus=1, max_retries=retries)(run_shard)
    node = ray.get_runtime_context().get_node_id()
    futures = {
        # (fleet.label: a unit's base label; "" for a shard, which keeps the run's)
        task.remote(
            shard_options(fleet, i), i, run_sweep, fleet.label, Home(node, fleet.shard_dir(i))
        ): i
        for i in indices
    }
    placed = dict(rundir.read_env(fleet.run_dir).get("ray_shards") or {})
    submitted = ray_connect.since_start(time.time())
    timings = {**ray_connect.clock_record(), "submitted_at_s": submitted, "shards": {}}
    failures: dict[int, str] = {}
    waiting = list(futures)
    try:
        while waiting:
            ready, _ = ray.wait(waiting, num_returns=1)
            waiting.remove(ready[0])
            index = futures[ready[0]]
            try:
                done: ShardDone = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                failures[index] = _reason(exc)
                continue
            name = fleet.name(index)
            placed[name] = {"node_id": done.node_id, "host": done.host, "gpu": done.gpu}
            timings["shards"][name] = _gathered(fleet, index, done)
            if kept is not None:
                kept(index, fleet.shard_dir(index))
        timings["gathered_at_s"] = ray_connect.since_start(time.time())
    except KeyboardInterrupt:
        for future in waiting:
            ray.cancel(future, force=True)
        raise
    finally:
        _record(fleet, placed, timings)
    return failures


def _gathered(fleet: FleetRun, index: int, done: ShardDone) -> dict[str, Any]:
    """Shard `index` kept (unpacked where it came as a tar), and its steps' times."""
    returned = time.time()
    if not done.in_place:
        unpack(done.archive, fleet.shard_dir(index))
    steps = done.times
    return {
        "in_place": done.in_place,
        "started_at_s": ray_connect.since_start(steps["started"]) if "started" in steps else None,
        **{
            name: round(steps[step] - steps[before], 2)
            for name, before, step in STEPS
            if step in steps and before in steps
        },
        "returned_at_s": ray_connect.since_start(returned),
        "bytes": len(done.archive),
        "unpack_s": round(time.time() - returned, 2),
    }


def _record(fleet: FleetRun, placed: dict[str, Any], timings: dict[str, Any]) -> None:
    env = rundir.read_env(fleet.run_dir)
    env.update(engine_record(fleet, placed, timings))
    env["placed"] = datetime.now(UTC).isoformat(timespec="seconds")
    rundir.write_env(fleet.run_dir, env)


def _reason(error: Exception) -> str:
    """A failed task's cause in one line: the AuditError a shard's sweep raised, else Ray's."""
    cause = getattr(error, "cause", None)
    text = str(cause if isinstance(cause, AuditError) else error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(cause if isinstance(cause, AuditError) else error).__name__}: {first}"


def missing_message(fleet: FleetRun, failures: dict[int, str]) -> str:
    names = ", ".join(f"{fleet.name(i)} ({why})" for i, why in sorted(failures.items()))
    command = Phase.of(fleet.settings.phase).command
    plural = "s" if len(failures) > 1 else ""
    kind = "" if fleet.replicate else f"shard{plural} "  # (a unit's name says unit-I)
    return (
        f"--ray: {kind}{names} missing; the finished shards are kept in "
        f"{fleet.run_dir / SHARDS_DIR}; finish with: "
        f"cublas-audit {command} --resume {fleet.run_dir}"
    )
