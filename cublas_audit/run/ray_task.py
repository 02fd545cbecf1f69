"""One shard of a `--ray` run, in its Ray task (run.ray_fleet places the tasks and gathers them).

The task is sent its settings and its part of the plan as plan.json states it (planning.shards'
PlanPart: a full map's grid is its axes), never the cases: cloudpickling a full map's 262,144
cases took seconds a shard on the driver, one shard after the other, and more to load in each
task. The task builds its part's cases, sweeps them on the GPU Ray gave it, folds the probe's
raw streams (rundir.compact_results), then hands its run directory back:

- on the driver's own node (the same Ray node, and the run directory there: its plan.json),
  written in place, straight into `<run>/shards/shard-I/` where the driver wants it: nothing
  travels;
- elsewhere, swept into a node-local temporary directory and returned as a tar of its compact
  files (run.run_archive), unpacked by the driver: no shared filesystem is needed.

Each step's time is recorded (epoch seconds on the task's node) for the run's `ray_timings`.
"""

from __future__ import annotations

import importlib
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from cublas_audit.run import ray_units
from cublas_audit.run.run_archive import pack
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import sweep
from cublas_audit.table import rundir

ShardSweep = Callable[[SweepOptions], object]  # sweep_setup.sweep; tests stand in for the GPU


@dataclass(frozen=True)
class Home:
    """Where the driver wants shard I: its Ray node and the shard's directory on it."""

    node_id: str
    shard_dir: Path

    def here(self, node_id: str) -> bool:
        """Whether a task on `node_id` can write the shard in place: the driver's node, and its
        run directory seen there (a node id is one raylet's, on one machine)."""
        run_dir = self.shard_dir.parent.parent
        return node_id == self.node_id and (run_dir / rundir.PLAN_FILE).is_file()


@dataclass(frozen=True)
class ShardDone:
    """What a task hands back: its shard's run directory as a tar (empty where `in_place`: it
    wrote it where the driver wanted it), where it ran, and when each step ended."""

    index: int
    archive: bytes
    node_id: str
    host: str
    gpu: str  # Ray's GPU id on that node (its CUDA_VISIBLE_DEVICES)
    in_place: bool = False
    # epoch seconds on the task's node: started (the task's function entered), swept, folded,
    # packed (in place: = folded)
    times: dict[str, float] = field(default_factory=dict)


def run_shard(
    options: SweepOptions,
    index: int,
    run_sweep: ShardSweep = sweep,
    unit_base: str = "",
    home: Home | None = None,
) -> ShardDone:
    """In the task: the shard's cases built from its part, swept on the GPU Ray gave it, in place
    on the driver's node (`home`) or else into a node-local temporary directory returned whole as
    a tar. `unit_base`: a unit's, labelled here, where its host and GPU are known."""
    times = {"started": time.time()}
    ray = importlib.import_module("ray")  # (in a Ray worker: installed)
    gpu = [str(i) for i in ray.get_gpu_ids()]
    if unit_base:
        options = replace(
            options, gpu_label=ray_units.task_label(unit_base, socket.gethostname(), gpu)
        )
    if options.part is not None and not options.cases:
        options = replace(options, cases=options.part.cases())
    # Ray's GPU id is the node's CUDA index, nvidia-smi's where CUDA_DEVICE_ORDER agrees (it does
    # on a node of one model); the probe sees only that GPU through CUDA_VISIBLE_DEVICES.
    device = int(gpu[0]) if gpu and gpu[0].isdigit() else None
    node = ray.get_runtime_context().get_node_id()
    done = ShardDone(index, b"", node, socket.gethostname(), ",".join(gpu), True, times)
    if home is not None and home.here(node):
        if home.shard_dir.exists():  # an earlier attempt's, half written (a lost worker, Ctrl-C)
            shutil.rmtree(home.shard_dir)
        home.shard_dir.parent.mkdir(parents=True, exist_ok=True)
        # (its records folded by the driver, beside its merge: jobs.fleet)
        in_place = replace(options, out=home.shard_dir, device=device, fold=False)
        _swept(run_sweep, in_place, times)
        times["packed"] = times["folded"]
        return done
    with tempfile.TemporaryDirectory(prefix="cublas-audit-shard-") as scratch:
        out = Path(scratch) / f"shard-{index}"
        _swept(run_sweep, replace(options, out=out, device=device), times)
        archive = pack(out)
        times["packed"] = time.time()
        return replace(done, archive=archive, in_place=False)


def warm_up(hold_s: float) -> None:
    """A Ray worker readied for a shard while the driver still plans (ray_connect): unpickling
    this function imported this module, the sweep's and pandas (seconds in a fresh worker,
    four at once), then it holds its GPU a moment so that each GPU's warm-up runs in a worker of
    its own. Submitted with max_calls=0, the worker stays for the shard's task."""
    time.sleep(hold_s)


def _swept(run_sweep: ShardSweep, options: SweepOptions, times: dict[str, float]) -> None:
    """The sweep, then the probe's raw streams gzipped (what travels is compact; what stays in
    place, options.fold False, the driver folds)."""
    run_sweep(options)
    times["swept"] = time.time()
    assert options.out is not None
    if options.fold:
        rundir.compact_results(options.out)
    times["folded"] = time.time()
