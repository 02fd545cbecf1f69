"""From what the user asked to a started sweep: every argument checked before the GPU is touched
(the options as run.sweep_options decides them, a resumed run's from its record), the environment
found, a new run directory started or a recorded one resumed, then the run.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.observe import environment
from cublas_audit.observe.ncu_command import CLOCK_CONTROLS
from cublas_audit.observe.observer import MAP_OBSERVERS, Observer
from cublas_audit.planning import plan_file
from cublas_audit.planning.cases import Case
from cublas_audit.planning.grid import check_label, label_from_gpu_name
from cublas_audit.planning.shards import PlanPart
from cublas_audit.resources import package_view
from cublas_audit.run import probe_process
from cublas_audit.run.sweep import Progress, SweepConfig, run
from cublas_audit.run.sweep_options import (
    DEFAULT_MIN_REPS,
    RECORDED,
    SweepOptions,
    check_new_run_dir,
    phase_of,
    resumed,
)
from cublas_audit.table import candidates_table, rundir
from cublas_audit.table.trace_record import write_trace_record
from cublas_audit.version import __version__
from cublas_audit.vocabulary import Phase


@dataclass(frozen=True)
class Measured:
    """A finished run: its directory and its table (dispatch.csv; candidates.csv for a candidates
    run). The caller writes the report (cublas_audit.jobs)."""

    run_dir: Path
    frame: pd.DataFrame
    phase: Phase


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
    options = replace(options, phase=phase_of(options.phase))
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
    plan_file.write(config.cases, config.run_dir / rundir.PLAN_FILE)
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
