"""`--ray ... --replicate`: every GPU of a Ray cluster runs the whole plan, one unit each.

run.ray_fleet places them as it places shards: each unit is a task (`num_gpus=1`) sweeping the
whole plan as its part 1/1 (so a unit's directory reads back as a finished shard, and a resumed
run re-runs only the units with none), returned as a tar and unpacked under
`<run>/shards/unit-I/`. What differs from shards is said here: how many units, their names, and
each unit's gpu_label, which names its node's host and GPU so that the comparison
(judge.units, through jobs.run_reports.write_units_report) names the node that differs.
"""

from __future__ import annotations

from collections.abc import Mapping

from cublas_audit.errors import AuditError
from cublas_audit.observe.environment import Gpu
from cublas_audit.planning.grid import check_label
from cublas_audit.run.multi_gpu import unit_label

UNIT_PREFIX = "unit-"
# A gpu_label is at most 64 characters (check_label): a long host name is cut, its domain first.
HOST_CHARS = 24


def unit_count(gpus: int) -> int:
    """One unit per GPU of the cluster; a comparison needs two."""
    if gpus < 2:
        raise AuditError("--replicate compares units: the Ray cluster needs two GPUs or more")
    return gpus


def unit_name(index: int) -> str:
    """Unit I's directory under shards/ and its key in env.json's ray_shards."""
    return f"{UNIT_PREFIX}{index}"


def base_label(label: str | None, resources: Mapping[str, float]) -> str:
    """The units' label before host and GPU: --gpu-label, else the model Ray detected on the
    cluster (its `accelerator_type:<model>` resource, where it has one model), else "gpu"
    (the driver sees no GPU itself: each unit's env.json still records the GPU's name)."""
    if label:
        return check_label(label)
    models = [key.split(":", 1)[1] for key in resources if key.startswith("accelerator_type:")]
    return check_label(models[0].lower()) if len(models) == 1 else "gpu"


def task_label(base: str, host: str, gpu_ids: list[str]) -> str:
    """A unit's gpu_label, known only in its task: `<base>-<host>-gpu<I>` (--devices
    --replicate's `<base>-gpu<I>` with the node's host, since GPU 0 is on every node)."""
    short = "".join(c if c.isalnum() or c in "_-" else "-" for c in host.split(".")[0])
    index = int(gpu_ids[0]) if gpu_ids and gpu_ids[0].isdigit() else 0
    return unit_label(f"{base}-{short[:HOST_CHARS]}", Gpu(index, "", ""), True, False)
