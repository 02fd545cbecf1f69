"""How a command's run spreads: over this host's GPUs (--devices), as one part of a plan
(--shard) or over a Ray cluster (--ray), each checked against the others before any GPU work; and
what such a run starts while the command still plans (the fork server, the cluster's join)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cublas_audit.errors import AuditError

if TYPE_CHECKING:
    from cublas_audit.run.multi_gpu import Spread
    from cublas_audit.run.sweep_options import SweepOptions


def spread(
    devices: str | None, replicate: bool, allow_mixed: bool, resume: Path | None
) -> Spread | None:
    """Over which GPUs the run spreads, or None for one GPU: --devices and its companions
    (multi_gpu checks they come together), or a resumed run that spread."""
    from cublas_audit.run.multi_gpu import Spread, recorded

    if devices is not None or replicate or allow_mixed:
        return Spread(devices, replicate, allow_mixed)
    if resume is not None and resume.is_dir() and recorded(resume) is not None:
        return Spread()
    return None


def sharded(options: SweepOptions, shard: str | None, spread: Spread | None) -> SweepOptions:
    """--shard I/N: the options of that part of the plan (its part and whole plan recorded for
    merge); checked before any GPU work."""
    from dataclasses import replace

    from cublas_audit.planning.shards import PlanPart, ShardSpec

    if shard is None:
        return options
    if options.resume is not None:
        raise AuditError("--shard with --resume: a shard run knows its part; give --resume alone")
    if spread is not None:
        raise AuditError(
            "--shard splits a plan across machines, --devices across this host's GPUs: give one"
        )
    part = PlanPart.of(ShardSpec.parse(shard), options.cases)
    return replace(options, cases=part.cases(), part=part)


@dataclass(frozen=True)
class OnRay:
    """The run goes through Ray: at `address`, or (None) where the resumed run ran; `replicate`:
    every GPU runs the whole plan, a unit each, compared."""

    address: str | None
    replicate: bool = False


def on_ray(
    ray: str | None, resume: Path | None, devices: str | None, shard: str | None, replicate: bool
) -> OnRay | None:
    """--ray, or the resume of a Ray run: checked against the options it excludes, then whether
    Ray is installed (exit 3 naming the extra), all before any GPU work. None: no Ray."""
    from cublas_audit.run import ray_connect, ray_fleet

    resumed = ray_fleet.is_ray_run(resume)
    if ray is None and not resumed:
        return None
    if resume is not None and not resumed:
        raise AuditError(f"--resume: {resume} is no Ray run: leave out --ray")
    if devices is not None:
        raise AuditError(
            "--ray places shards on the cluster's GPUs, --devices on this host's: give one"
        )
    if shard is not None:
        raise AuditError("--ray splits the plan itself, one shard per GPU: leave out --shard")
    ray_connect.installed()
    return OnRay(ray, replicate)


def join_ray_soon(engine: OnRay | None, resume: Path | None) -> None:
    """A Ray run's cluster joined in the background from here on, while the command plans the
    run (run.ray_connect.connect_soon: a new local Ray instance takes ~5 s to start): at the
    address given, else where the resumed run ran, else `auto`."""
    if engine is None:
        return
    from cublas_audit.run import ray_connect
    from cublas_audit.table.env_record import EnvRecord

    recorded = EnvRecord.read(resume).ray_address if resume is not None else None
    ray_connect.connect_soon(engine.address or recorded or "auto")


def start_shards_soon(devices: str | None) -> None:
    """A --devices run's fork server started from here on, while the command plans the run
    (run.shard_processes.start_server): its interpreter's start-up and imports, ~1 s of CPU,
    pass beside the planning instead of before the first shard starts."""
    if devices is None:
        return
    from cublas_audit.run import shard_processes

    shard_processes.start_server()


def is_shard_run(resume: Path | None) -> bool:
    """Whether --resume names the run directory of a --shard run."""
    from cublas_audit.table.env_record import EnvRecord

    return resume is not None and resume.is_dir() and EnvRecord.read(resume).shard is not None
