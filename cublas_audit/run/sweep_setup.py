"""From what the user asked to a started sweep: every argument checked before the GPU is touched,
the environment found, a new run directory started or a recorded one resumed, then the run.

`--resume DIR` finishes the run DIR was: every recorded setting that decides what is measured
(interpreter, cuBLAS library, probe environment, clock control, profiling, reference, candidates,
repetitions) is restored from its env.json, and an explicit option that contradicts the record is
refused.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.judge import candidates
from cublas_audit.observe import environment
from cublas_audit.observe.ncu_command import CLOCK_CONTROLS
from cublas_audit.observe.observer import MAP_OBSERVERS, Observer
from cublas_audit.planning import plan_file
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.planning.grid import check_label, label_from_gpu_name
from cublas_audit.planning.plan_file import read_plan, write_plan
from cublas_audit.planning.shards import PlanPart
from cublas_audit.resources import package_view
from cublas_audit.run import probe_process
from cublas_audit.run.sweep import Progress, SweepConfig, run
from cublas_audit.table import candidates_table, rundir
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.trace_record import TraceRecord, write_trace_record
from cublas_audit.version import __version__
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


@dataclass(frozen=True)
class Measured:
    """A finished run: its directory and its table (dispatch.csv; candidates.csv for a candidates
    run). The caller writes the report (cublas_audit.jobs)."""

    run_dir: Path
    frame: pd.DataFrame
    phase: Phase


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


def sweep(options: SweepOptions, progress: Progress | None = None) -> Measured:
    """Checks, starts or resumes, runs, and writes the run's table; no report (that is the
    caller's: measuring returns data)."""
    began = time.perf_counter()
    options = checked(options)
    with package_view() as view:
        probe = _probe(options, view)
        # the probe's imports checked (a child importing CuPy: ~1-2 s) while this process
        # surveys the machine (nvidia-smi, CuPy, ncu: as long), not after it; its verdict after
        # the survey's, as before
        imports_checked = _begun(functools.partial(probe_process.check_probe_imports, probe))
        env = environment.collect(options.ncu, options.device)
        environment.require_gpu(env)
        check_fits_memory(options.cases, env.memory_gb)
        options = _observer_here(options, env, progress or Progress())
        ncu = environment.require_profiler(env) if options.profile else None
        imports_checked()
        config = _config(options, env, ncu, view)
        if options.resume is None:
            start_run(config, env, options)
            # what came before the probe (the checks, the survey, plan.json, env.json and the
            # roofline's measurement), which sweep_seconds leaves out
            record = rundir.read_env(config.run_dir)
            record["setup_seconds"] = round(time.perf_counter() - began, 2)
            rundir.write_env(config.run_dir, record)
        frame = run(config, progress)
    return Measured(config.run_dir, frame, config.phase)


def check_fits_memory(cases: Sequence[Case], memory_gb: float | None) -> None:
    """A plan none of whose cases fits the GPU (its memory as nvidia-smi reports it) is refused
    before any GPU work, naming the bytes: it would measure nothing (under ncu: "ncu wrote no
    report"). Where some fit, the probe records each case that runs out of memory as skipped and
    the sweep goes on."""
    if memory_gb is None or not cases:
        return
    # (the first case that fits ends the search: each case's bytes make its operands' layouts,
    # ~1 s of CPU for a full map's shard of 65,536 cases where all are looked at)
    if any(case.bytes_needed <= memory_gb * 1e9 for case in cases):
        return
    smallest = min(cases, key=lambda case: case.bytes_needed)
    if smallest.bytes_needed > memory_gb * 1e9:
        raise AuditError(
            f"{smallest.case_id} needs {smallest.bytes_needed / 1e9:,.1f} GB of operands; the "
            f"GPU has {memory_gb:g} GB of memory: no case of this plan fits"
        )


def _observer_here(
    options: SweepOptions, env: environment.Environment, progress: Progress
) -> SweepOptions:
    """The observer this sweep uses. Asked for ncu (or a resumed profiled run): ncu or exit 3.
    Not asked: ncu where it can run, else CUPTI, said in one line, never a stop."""
    if options.observer in MAP_OBSERVERS or options.phase in (Phase.map, Phase.candidates):
        return replace(options, profile=False)
    if options.observer is Observer.ncu or not options.profile or options.resume is not None:
        return options
    try:
        environment.require_profiler(env)
    except ToolMissingError as exc:
        why = str(exc).split(":")[0]
        progress.note(f"{why}: observing with CUPTI instead (kernel names and times, no counters)")
        return replace(options, profile=False)
    return options


def checked(options: SweepOptions) -> SweepOptions:
    """Every check that needs no GPU, and the resume record applied: one AuditError or options
    whose every setting is decided."""
    if options.resume is not None:
        options = resumed(options)
    elif options.out is not None:
        check_new_run_dir(options.out)
    if not options.cases:
        raise AuditError("nothing to run: the plan has no case")
    decided = {
        name: getattr(options, name) if getattr(options, name) is not None else default
        for name, (_key, default) in RECORDED.items()
    }
    options = replace(options, **decided)
    options = replace(options, phase=_phase(options.phase))
    if options.phase is Phase.map and options.observer is Observer.ncu:
        raise AuditError(
            "--observer ncu: a map observes with cupti or events; --follow-up takes the cases it "
            "flags to ncu"
        )
    if options.phase is Phase.candidates:  # the audit of cuBLASLt's algorithms and nothing else
        limit = options.candidate_limit or candidates_table.DEFAULT_LIMIT
        options = replace(options, candidate_limit=limit, profile=False, reference=False)
    if options.observer is Observer.events:  # the probe then times with CUDA events alone
        no_cupti = {probe_process.NO_CUPTI_ENV: "1"}
        options = replace(options, probe_env={**options.probe_env, **no_cupti})
    if options.clock_control not in CLOCK_CONTROLS:
        raise AuditError(
            f"--clock-control: {options.clock_control!r} is not one of {', '.join(CLOCK_CONTROLS)}"
        )
    probe_process.check_visible_devices(options.probe_env)
    python = probe_process.check_python(options.probe_python or sys.executable)
    if options.cublas_lib is not None:
        probe_process.cublas_preload(options.cublas_lib)
    if options.gpu_label:
        check_label(options.gpu_label)
    return replace(options, probe_python=python)


def _phase(given: str | None) -> Phase:
    """The phase as a member (a resumed run's is its env.json's word): one line for another."""
    try:
        return Phase(given or Phase.time)
    except ValueError:
        words = ", ".join(Phase)
        raise AuditError(f"phase {given!r} is not one of {words}") from None


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
            recorded = _phase(recorded)
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


def _begun(check: Callable[[], None]) -> Callable[[], None]:
    """`check` begun in a thread (it waits on a child process); the call returned waits for it
    and raises what it raised. Left unasked (an error came first), the thread ends on its own."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            check()
        except BaseException as exc:  # (handed to the one who asks)
            raised.append(exc)

    thread = threading.Thread(target=run, name="probe imports", daemon=True)
    thread.start()

    def outcome() -> None:
        thread.join()
        if raised:
            raise raised[0]

    return outcome


def _probe(options: SweepOptions, view: Path) -> probe_process.ProbeCommand:
    """The probe's command: its interpreter, environment and the package view it runs in."""
    child_env = probe_process.probe_environment(
        os.environ, options.probe_env, options.cublas_lib, view
    )
    return probe_process.ProbeCommand(options.probe_python or sys.executable, child_env, view)


def _config(
    options: SweepOptions, env: environment.Environment, ncu: str | None, view: Path
) -> SweepConfig:
    label = options.gpu_label or label_from_gpu_name(env.gpu_name or "")
    # Absolute: the probe and ncu run in the package view, not in the user's directory.
    run_dir = (options.resume or options.out or default_run_dir(label)).absolute()
    return SweepConfig(
        cases=list(options.cases),  # (a plan made as its statement: its cases made now)
        run_dir=run_dir,
        gpu_label=label,
        ncu=ncu,
        clock_control=options.clock_control or "none",
        probe=_probe(options, view),
        reference=bool(options.reference),
        min_reps=options.min_reps or DEFAULT_MIN_REPS,
        candidate_limit=options.candidate_limit,
        candidate_threshold=_setting(options, "candidate_threshold"),
        candidate_min_reps=_setting(options, "candidate_min_reps"),
        workspace_bytes=_setting(options, "workspace_bytes"),
        cublas_lib=options.cublas_lib,
        phase=options.phase or Phase.time,
        # a map's fast pass leaves its operands warm, whatever --warm says (its follow-up obeys)
        warm=bool(options.warm) or options.phase is Phase.map,
        fold=options.fold,
    )


def _observer_used(config: SweepConfig, options: SweepOptions) -> Observer | None:
    """How the run observes the planned calls; a candidates run observes none (it times
    cuBLASLt's algorithms with CUDA events)."""
    if not config.measures_calls:
        return None
    return Observer.ncu if config.ncu is not None else (options.observer or Observer.cupti)


def _setting(options: SweepOptions, name: str) -> Any:
    """An option as given, or its default (`checked` has filled in every RECORDED one)."""
    value = getattr(options, name)
    return value if value is not None else RECORDED[name][1]


def start_run(config: SweepConfig, env: environment.Environment, options: SweepOptions) -> None:
    """plan.json and env.json of a new run: the environment and every setting that decides what
    is measured, so that the run describes itself and --resume restores it."""
    config.run_dir.mkdir(parents=True, exist_ok=True)
    (config.run_dir / rundir.NCU_DIR).mkdir(exist_ok=True)
    write_plan(config.cases, config.run_dir / rundir.PLAN_FILE)
    if options.part is not None:
        plan_file.write(options.part.plan, config.run_dir / rundir.WHOLE_PLAN_FILE)
    if options.trace is not None:
        write_trace_record(options.trace, config.run_dir)
    rundir.write_env(
        config.run_dir,
        {
            "gpu_label": config.gpu_label,
            **env.to_json(),
            "probe_env": dict(options.probe_env),
            "probe_python": config.probe.python,
            "cublas_lib": str(config.cublas_lib) if config.cublas_lib else None,
            "ncu_clock_control": config.clock_control,
            "profiled": config.ncu is not None,
            "observer": _observer_used(config, options),
            "reference": config.reference,
            "min_reps": config.min_reps,
            "candidate_limit": config.candidate_limit,
            "candidate_threshold": config.candidate_threshold,
            "candidate_min_reps": config.candidate_min_reps,
            "workspace_bytes": config.workspace_bytes,
            "phase": config.phase,
            # --warm as asked (a map's fast pass is warm anyway; its follow-up obeys this)
            "warm": bool(options.warm),
            "roofline": measured_roofline(env),
            "command": options.command,
            "tool_version": __version__,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            **_shard_record(options.part),
        },
    )


def _shard_record(part: PlanPart | None) -> dict[str, Any]:
    """A shard run's part of its plan and the host it ran on (merge lists each shard's)."""
    return {} if part is None else {**part.record(), "host": socket.gethostname()}


def measured_roofline(env: environment.Environment) -> dict[str, Any] | None:
    """The GPU's DRAM bandwidth, measured once for the run's roofline (device.dram_bandwidth: well
    under a second); None where this interpreter has no CuPy (the probe's may, but the bound
    then comes from the data sheet, and the report says so)."""
    from cublas_audit.device.dram_bandwidth import measure_dram

    try:
        return measure_dram(env.device_index or 0)
    except ImportError:  # CuPy, imported by the measurement
        return None


def default_run_dir(label: str) -> Path:
    return Path("reports") / label / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
