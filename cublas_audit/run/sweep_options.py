"""What the user asked a run for (SweepOptions), and how it meets its run directory: a resumed
run takes every recorded setting that decides what is measured (interpreter, cuBLAS library, probe
environment, clock control, profiling, reference, candidates, repetitions) from its env.json, and
an explicit option that contradicts the record is refused; a new run starts in an empty
directory."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.judge import candidates
from cublas_audit.observe.observer import Observer
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.planning.shards import PlanPart
from cublas_audit.table import candidates_table, rundir
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.trace_record import TraceRecord
from cublas_audit.vocabulary import Phase

DEFAULT_MIN_REPS = 20


@dataclass(frozen=True)
class SweepOptions:
    """What the user asked for. None means "not given": the default, or on resume the record."""

    cases: Sequence[Case] = field(default_factory=list)
    gpu_label: str | None = None
    out: Path | None = None
    resume: Path | None = None
    profile: bool | None = None
    reference: bool | None = None
    ncu: str | None = None
    clock_control: str | None = None
    probe_python: str | None = None
    cublas_lib: Path | None = None
    probe_env: Mapping[str, str] = field(default_factory=dict)
    min_reps: int | None = None
    # The cuBLASLt candidate audit (sweep --candidates, the `candidates` phase): candidates per
    # problem, the gap a confirmation round checks, timed calls per candidate, workspace.
    candidate_limit: int | None = None
    candidate_threshold: float | None = None
    candidate_min_reps: int | None = None
    workspace_bytes: int | None = None
    # Operands left in L2 between timed calls (--warm); else L2 is flushed before each (device.l2)
    warm: bool | None = None
    command: list[str] = field(default_factory=list)
    # How the launches are observed (observe.observer); None: ncu where it can run, else CUPTI
    # with a notice (--no-profile means CUPTI).
    observer: Observer | None = None
    # time (a sweep), map (the dispatch map's fast pass: cupti or events, never ncu) or
    # candidates (the cuBLASLt candidate audit alone: `candidates --devices`).
    phase: Phase | None = None
    # The GPU (nvidia-smi's index) a shard of a sharded run measures on; its probe is pinned to
    # it through CUDA_VISIBLE_DEVICES in probe_env (cublas_audit.run.multi_gpu).
    device: int | None = None
    # `--shard I/N`: which part of which whole plan `cases` is (recorded for merge).
    part: PlanPart | None = None
    # `--torch-trace`: the trace's record of the whole plan (trace.json, table.trace_record).
    trace: TraceRecord | None = None
    # The probe's records folded once the run is done (rundir.compact_results); False where the
    # caller folds them itself (a map: beside its merge and judging, run.dispatch_map).
    fold: bool = True


# option -> (env.json key, default): the settings a resumed sweep takes from its record.
RECORDED: dict[str, tuple[str, Any]] = {
    "profile": ("profiled", True),
    "reference": ("reference", True),
    "clock_control": ("ncu_clock_control", "none"),
    "probe_python": ("probe_python", None),
    "cublas_lib": ("cublas_lib", None),
    "min_reps": ("min_reps", DEFAULT_MIN_REPS),
    "candidate_limit": ("candidate_limit", None),
    "candidate_threshold": ("candidate_threshold", candidates.DEFAULT_THRESHOLD),
    "candidate_min_reps": ("candidate_min_reps", candidates_table.DEFAULT_MIN_REPS),
    "workspace_bytes": ("workspace_bytes", DEFAULT_WORKSPACE_BYTES),
    "phase": ("phase", Phase.time),
    "device": ("device_index", None),
    "warm": ("warm", False),
}


def resumed(options: SweepOptions) -> SweepOptions:
    """The options of the recorded run, or an error naming the option that contradicts it."""
    assert options.resume is not None
    run_dir = options.resume
    if not (run_dir / rundir.PLAN_FILE).is_file() or not (run_dir / rundir.ENV_FILE).is_file():
        raise AuditError(
            f"--resume: {run_dir} is not a cublas-audit run directory (no plan.json/env.json)"
        )
    env = EnvRecord.read(run_dir)
    record = env.raw  # the settings by their keys (RECORDED), as the run recorded them
    restored: dict[str, Any] = {}
    for name, (key, _default) in RECORDED.items():
        recorded = record.get(key)
        if name == "cublas_lib" and recorded is not None:
            recorded = Path(recorded)
        if name == "phase" and recorded is not None:
            recorded = phase_of(recorded)
        given = getattr(options, name)
        # A recorded null is a setting too (the system's cuBLAS, no candidate audit); only a run
        # recorded before the key existed leaves the option free.
        if given is not None and key in record and given != recorded:
            raise AuditError(
                f"--resume: {run_dir} was recorded with {name.replace('_', '-')} {recorded!r}; "
                f"the command line says {given!r} (leave it out to resume)"
            )
        restored[name] = given if given is not None else recorded
    probe_env = dict(env.probe_env)
    clashing = {k: v for k, v in options.probe_env.items() if probe_env.get(k) != v}
    if clashing:
        raise AuditError(
            f"--resume: {run_dir} was recorded with another --probe-env for "
            f"{', '.join(sorted(clashing))}"
        )
    return replace(
        options,
        **restored,
        cases=read_plan(run_dir / rundir.PLAN_FILE),
        gpu_label=env.gpu_label or "gpu",
        probe_env={**probe_env, **options.probe_env},
    )


def check_new_run_dir(run_dir: Path) -> None:
    """A new sweep starts in an empty or absent directory: one holding an earlier run would have
    its plan and env.json overwritten and its finished cases counted as this sweep's."""
    if run_dir.exists() and not run_dir.is_dir():
        raise AuditError(f"--out: {run_dir} is a file, not a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise AuditError(
            f"--out: {run_dir} is not empty; finish an earlier sweep there with "
            f"--resume {run_dir}, or pick a new directory"
        )
    parent = next((p for p in (run_dir, *run_dir.parents) if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise AuditError(f"--out: cannot write under {parent}")


def phase_of(given: str | None) -> Phase:
    """The phase as a member (a resumed run's is its env.json's word): one line for another."""
    try:
        return Phase(given or Phase.time)
    except ValueError:
        words = ", ".join(Phase)
        raise AuditError(f"phase {given!r} is not one of {words}") from None
