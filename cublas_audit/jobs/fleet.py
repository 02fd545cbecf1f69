"""`sweep|map|candidates --ray auto|ADDRESS`: the shards placed on a Ray cluster (run.ray_fleet),
then merged into the run's own directory and reported as `merge` does (jobs.merge); with
`--replicate` (sweep, map): a unit per GPU (run.ray_units), each reported, then compared as
`--devices --replicate` compares its units (units.md, units.json)."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from dataclasses import replace
from pathlib import Path

from cublas_audit.errors import AuditError
from cublas_audit.jobs.measure import REPORT_IMPORTS, SweepResult, import_ahead
from cublas_audit.jobs.merge import write_merged
from cublas_audit.jobs.run_reports import write_map_report, write_run_report, write_units_report
from cublas_audit.planning.cases import candidate_problems
from cublas_audit.run import ray_connect, ray_fleet
from cublas_audit.run.ray_task import ShardSweep
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import sweep
from cublas_audit.table import rundir, shard_merge
from cublas_audit.table.validation import read_table
from cublas_audit.vocabulary import Phase


def on_ray(
    options: SweepOptions,
    address: str | None,
    phase: Phase | None = None,
    run_sweep: ShardSweep = sweep,
    retries: int = ray_fleet.DEFAULT_RETRIES,
    replicate: bool = False,
) -> SweepResult:
    """The Ray run (new, or options.resume finished), merged and reported. `phase`: map or
    candidates for those commands (a resumed run keeps its recorded one); `run_sweep`: what a
    task runs (a stand-in for the GPU in tests); `retries`: Ray's reruns of a task whose worker
    or node was lost; `replicate`: a new run's units (a resumed run keeps what it was)."""
    phase = None if phase is None else Phase(phase)  # the API takes the word too ("candidates")
    if replicate and phase is Phase.candidates:
        raise AuditError("--replicate: the candidate audit shards its problems; leave it out")
    if options.resume is None and phase is not None:
        options = replace(options, phase=phase)
        if phase is Phase.candidates:  # the plan is the problems: each audited once, on one GPU
            options = replace(options, cases=candidate_problems(options.cases))
    early: dict[Path, shard_merge.ShardRun] = {}
    ahead = threading.Thread(target=import_ahead, args=(REPORT_IMPORTS,), daemon=True)
    ahead.start()  # (what a map's report imports to draw, while the shards run)
    fleet, shard_dirs = ray_fleet.run(
        options, address, run_sweep, retries, replicate, functools.partial(_read, early, replicate)
    )
    ahead.join()  # (before the report forks its pictures)
    # the shards swept in place have their probe records folded here, beside the merge, the
    # judging and the reports (ray_task; one returned as a tar was folded by its task)
    with rundir.folding(shard_dirs):
        if fleet.replicate:
            for unit in shard_dirs:
                if fleet.settings.phase is Phase.map:
                    write_map_report(unit)
                else:
                    write_run_report(unit)
            units = write_units_report(fleet.run_dir, shard_dirs)
            return SweepResult(fleet.run_dir, None, units, shard_dirs)
        began = time.perf_counter()
        shards = [early.get(path) or shard_merge.read_shard(path) for path in shard_dirs]
        record = rundir.read_env(fleet.run_dir)
        kept = {key: record[key] for key in (*ray_fleet.ENGINE_KEYS, "placed") if key in record}
        timings: dict[str, float] = {"read_shards_s": round(time.perf_counter() - began, 2)}
        result = write_merged(shards, fleet.run_dir, False, fleet.command, kept, timings)
    _add_timings(fleet.run_dir, timings)
    return result


def _read(
    early: dict[Path, shard_merge.ShardRun], replicate: bool, _index: int, path: Path
) -> None:
    """A shard read for the merge as soon as it is back, while the others still run (the first
    one read makes what all share: the whole plan's fingerprint, split, case ids and their
    order, shard_merge.plan_order), its table too (validation.read_table: parsed and checked
    once a process, which the merge's read then finds; a full map's shard ~0.75 s of CPU here,
    four after the last shard on the H100 x4 host most of a merge of 2.75 s); one that does not
    read is read again, and refused, where the merge reads the shards."""
    if not replicate:  # (units are compared, not merged)
        with contextlib.suppress(AuditError):
            shard = early[path] = shard_merge.read_shard(path)
            if shard.has_table:
                order = shard_merge.plan_order(shard.whole_plan)  # (the merge's, once)
                # its rows' places in the plan looked up now too (a full map's shard ~0.25 s
                # of CPU here, four after the last shard in the merge), as --devices does
                early[path] = replace(shard, places=order.places(read_table(path)))


def _add_timings(run_dir: Path, timings: dict[str, float]) -> None:
    """The merge's, judging's and the report's seconds into env.json's ray_timings, and when the
    run ended on its clock (ray_connect.since_start)."""
    env = rundir.read_env(run_dir)
    done = ray_connect.since_start(time.time())
    env["ray_timings"] = {**(env.get("ray_timings") or {}), **timings, "reported_at_s": done}
    rundir.write_env(run_dir, env)
