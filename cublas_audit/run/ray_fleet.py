"""`--ray auto|ADDRESS`: a plan's shards placed on a Ray cluster's GPUs, one Ray task each.

The engine boundary: the tool plans, runs one shard, merges and judges; Ray places and restarts.
Each task (`num_gpus=1`; Ray sets its CUDA_VISIBLE_DEVICES) runs the same sweep as
`--shard I/N` on its node, into a node-local temporary run directory, and returns that directory
as bytes (a tar of its compact files: the plans as stated, a large table columnar, the probe's
results gzipped: rundir.compact_results); the driver unpacks it under `<run>/shards/shard-I/`.
No shared filesystem is needed, and one node works alike. The driver then merges the shards
(jobs.merge) into `<run>`.

    <run>/env.json          engine "ray", its address, the shard count, the settings every
                            shard runs with, and each shard's node, host and GPU
    <run>/plan.json         the whole plan
    <run>/shards/shard-I/   shard I's run directory, as `--shard I/N` writes it
    <run>/shards/unit-I/    `--replicate`: unit I's run directory, the whole plan on one GPU
                            (run.ray_units; compared, not merged)

A task that fails (its worker or node lost, an error in its sweep) leaves its shard missing; the
others are kept, and `--resume <run>` re-runs only the missing shards through Ray. Ctrl-C while
they are gathered cancels the tasks not yet back; the shards gathered stay for `--resume`.

Ray is an optional extra: it is imported only inside functions, and its absence is a
ToolMissingError naming the install command.
"""

from __future__ import annotations

import importlib
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.observe.observer import Observer
from cublas_audit.planning.cases import Case, read_plan, write_plan
from cublas_audit.planning.shards import PlanPart, ShardSpec, fingerprint
from cublas_audit.run import ray_units
from cublas_audit.run.multi_gpu import SHARDS_DIR
from cublas_audit.run.run_archive import pack, unpack
from cublas_audit.run.sweep_setup import SweepOptions, check_new_run_dir, sweep
from cublas_audit.table import rundir, shard_merge
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.version import __version__
from cublas_audit.vocabulary import Phase

INSTALL_HINT = "pip install 'cublas-audit[ray]'"
ENGINE = "ray"
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
)

ShardSweep = Callable[[SweepOptions], object]  # sweep_setup.sweep; tests stand in for the GPU


@dataclass(frozen=True)
class ShardDone:
    """What a task hands back: its shard's run directory as a tar, and where it ran."""

    index: int
    archive: bytes
    node_id: str
    host: str
    gpu: str  # Ray's GPU id on that node (its CUDA_VISIBLE_DEVICES)


@dataclass(frozen=True)
class FleetRun:
    """A Ray run as its env.json records it."""

    run_dir: Path
    address: str
    count: int
    whole: list[Case]
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


# ----- Ray, optional ---------------------------------------------------------------------------


def require_ray() -> ModuleType:
    """The ray module, or exit 3 with the install command (checked before any GPU work)."""
    try:
        ray = importlib.import_module("ray")  # typed the same with the ray extra or without
    except ImportError as exc:
        raise ToolMissingError(f"--ray: Ray is not installed here; {INSTALL_HINT}") from exc
    return ray


def connect(address: str) -> ModuleType:
    """Ray joined: `auto` is the cluster this machine is part of (`ray start`), else a new one
    on this machine; an address is that cluster's. Already joined (a caller's ray.init): kept."""
    ray = require_ray()
    if not ray.is_initialized():
        try:
            ray.init(
                address=None if address == "auto" else address,
                include_dashboard=False,
                log_to_driver=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise AuditError(f"--ray {address}: no Ray cluster joined ({exc})") from exc
    return ray


def cluster_gpus(ray: ModuleType, address: str) -> int:
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus < 1:
        raise ToolMissingError(f"--ray {address}: the Ray cluster has no GPU")
    return gpus


# ----- the run's record ------------------------------------------------------------------------


def start(options: SweepOptions, address: str, gpus: int, unit_base: str | None = None) -> FleetRun:
    """A new Ray run directory: the whole plan, one shard per GPU (fewer where the plan has
    fewer cases), the settings each shard runs with; `unit_base` (--replicate): one unit per
    GPU instead, labelled from it."""
    if not options.cases:
        raise AuditError("nothing to run: the plan has no case")
    if options.out is None:
        raise AuditError("--ray: give --out DIR (the run directory the shards are gathered in)")
    run_dir = options.out.absolute()
    check_new_run_dir(run_dir)
    fleet = FleetRun(
        run_dir,
        address,
        ray_units.unit_count(gpus) if unit_base is not None else min(gpus, len(options.cases)),
        list(options.cases),
        options,
        list(options.command),
        unit_base is not None,
        unit_base or "",
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_plan(fleet.whole, run_dir / rundir.PLAN_FILE)
    rundir.write_env(run_dir, {**engine_record(fleet), "tool_version": __version__})
    return fleet


def engine_record(fleet: FleetRun, placed: dict[str, Any] | None = None) -> dict[str, Any]:
    """What env.json says of the engine; kept in the merged env.json so the run resumes."""
    settings = {name: getattr(fleet.settings, name) for name in SETTINGS}
    settings["cublas_lib"] = str(settings["cublas_lib"]) if settings["cublas_lib"] else None
    settings["probe_env"] = dict(settings["probe_env"])
    return {
        "engine": ENGINE,
        "ray_address": fleet.address,
        "shard_count": fleet.count,
        "plan_fingerprint": fingerprint(fleet.whole),
        "phase": fleet.settings.phase or Phase.time,
        "ray_settings": settings,
        "ray_shards": placed or {},
        "replicate": fleet.replicate,
        "unit_label": fleet.label or None,
        "command": fleet.command,
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
    whole = read_plan(run_dir / rundir.PLAN_FILE)
    if fingerprint(whole) != env.plan_fingerprint:
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


# ----- one shard, in a Ray task ----------------------------------------------------------------


def shard_options(fleet: FleetRun, index: int) -> SweepOptions:
    """Shard I's sweep: exactly what `--shard I/N` runs (its part and whole plan recorded); a
    unit's: the whole plan as part 1/1."""
    part = PlanPart.of(fleet.spec(index), fleet.whole)
    return replace(
        fleet.settings,
        cases=part.cases(),
        part=part,
        out=None,
        resume=None,
        command=[*fleet.command, f"(ray {'' if fleet.replicate else 'shard '}{fleet.name(index)})"],
    )


def run_shard(
    options: SweepOptions, index: int, run_sweep: ShardSweep = sweep, unit_base: str = ""
) -> ShardDone:
    """In the task: the shard swept on the GPU Ray gave it, in a node-local temporary directory
    returned whole as a tar (so the driver needs no shared filesystem). `unit_base`: a unit's,
    labelled here, where its host and GPU are known."""
    ray = require_ray()
    gpu = [str(i) for i in ray.get_gpu_ids()]
    if unit_base:
        options = replace(
            options, gpu_label=ray_units.task_label(unit_base, socket.gethostname(), gpu)
        )
    # Ray's GPU id is the node's CUDA index, nvidia-smi's where CUDA_DEVICE_ORDER agrees (it does
    # on a node of one model); the probe sees only that GPU through CUDA_VISIBLE_DEVICES.
    device = int(gpu[0]) if gpu and gpu[0].isdigit() else None
    with tempfile.TemporaryDirectory(prefix="cublas-audit-shard-") as scratch:
        out = Path(scratch) / f"shard-{index}"
        run_sweep(replace(options, out=out, device=device))
        rundir.compact_results(out)  # the probe's raw streams gzipped: what travels is compact
        node = ray.get_runtime_context().get_node_id()
        return ShardDone(index, pack(out), node, socket.gethostname(), ",".join(gpu))


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
) -> tuple[FleetRun, list[Path]]:
    """A new Ray run, or the recorded one options.resume is finished: each pending shard (or
    unit, `replicate`) a task, gathered under shards/. Returns the run and its shard directories,
    all finished; a shard a task did not bring back is one AuditError naming it and the --resume
    command."""
    ray = require_ray()
    if options.resume is not None:
        fleet = recorded(options.resume, address)
        ray = connect(fleet.address)
    else:
        ray = connect(address or "auto")
        gpus = cluster_gpus(ray, address or "auto")
        base = ray_units.base_label(options.gpu_label, ray.cluster_resources())
        fleet = start(options, address or "auto", gpus, base if replicate else None)
    failures = _place(ray, fleet, pending(fleet), run_sweep, retries)
    if failures:
        raise AuditError(missing_message(fleet, failures))
    return fleet, [fleet.shard_dir(i) for i in range(1, fleet.count + 1)]


def _place(
    ray: ModuleType, fleet: FleetRun, indices: Sequence[int], run_sweep: ShardSweep, retries: int
) -> dict[int, str]:
    """Each shard a task on one GPU; each one's directory unpacked as it comes back. Returns
    the shards that failed, with why. Ctrl-C: the tasks not yet back are cancelled (else they
    would keep their GPUs busy after the driver is gone), what came back is recorded, and the
    KeyboardInterrupt goes on to the CLI (exit 130)."""
    task = ray.remote(num_gpus=1, max_retries=retries)(run_shard)
    # (fleet.label: a unit's base label; "" for a shard, which keeps the run's)
    futures = {task.remote(shard_options(fleet, i), i, run_sweep, fleet.label): i for i in indices}
    placed = dict(rundir.read_env(fleet.run_dir).get("ray_shards") or {})
    failures: dict[int, str] = {}
    waiting = list(futures)
    try:
        for future, index in futures.items():
            try:
                done: ShardDone = ray.get(future)
            except ray.exceptions.RayError as exc:
                waiting.remove(future)
                failures[index] = _reason(exc)
                continue
            waiting.remove(future)
            unpack(done.archive, fleet.shard_dir(index))
            where = {"node_id": done.node_id, "host": done.host, "gpu": done.gpu}
            placed[fleet.name(index)] = where
    except KeyboardInterrupt:
        for future in waiting:
            ray.cancel(future, force=True)
        raise
    finally:
        _record(fleet, placed)
    return failures


def _record(fleet: FleetRun, placed: dict[str, Any]) -> None:
    env = rundir.read_env(fleet.run_dir)
    env.update(engine_record(fleet, placed))
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
