"""`candidates`: is cuBLASLt's default algorithm its fastest? Here, or sharded across GPUs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cublas_audit.cli.exit_codes import exit_codes
from cublas_audit.cli.options import (
    DEFAULT_BATCHES,
    DEFAULT_SIZES,
    AllowMixed,
    Batched,
    Batches,
    Beta,
    Bias,
    Broadcast,
    CublasLib,
    Devices,
    Fix,
    Format,
    FormatOption,
    Layouts,
    LdPad,
    Listed,
    Modes,
    Probe,
    ProbeEnv,
    ProbePython,
    RayAddress,
    Resume,
    Shapes,
    ShapesFile,
    Shard,
    Single,
    Sizes,
    TorchTrace,
    Warm,
    plan_cases,
    print_json,
    run_options,
    variants,
    write_fixes,
)
from cublas_audit.cli.progress import with_progress
from cublas_audit.cli.spread_options import is_shard_run, on_ray, sharded, spread
from cublas_audit.errors import AuditError
from cublas_audit.vocabulary import Phase

if TYPE_CHECKING:
    import pandas as pd

    from cublas_audit.planning.cases import Case
    from cublas_audit.run.multi_gpu import Spread


@exit_codes
def candidates_command(
    single: Single = None,
    batched: Batched = None,
    sizes: Sizes = DEFAULT_SIZES,
    shapes: Shapes = "",
    batches: Batches = DEFAULT_BATCHES,
    modes: Modes = "fp32",
    limit: int = typer.Option(32, min=1, metavar="N", help="Heuristic candidates per case."),
    threshold: list[str] | None = typer.Option(
        None,
        "--threshold",
        metavar="NAME=VALUE",
        help="candidate_gap_pct=PERCENT: flag a gap of at least this % (default 10), the "
        "threshold report and diff judge better-candidate by; no other name applies here. A bare "
        "fraction (0.2) is the older spelling.",
        show_default=False,
    ),
    min_reps: int = typer.Option(
        5, min=2, metavar="N", help="Timed calls per candidate, at least."
    ),
    workspace_mib: int = typer.Option(
        32, min=0, metavar="MIB", help="Workspace a candidate may use."
    ),
    format: FormatOption = Format.md,
    out: Path | None = typer.Option(
        None, metavar="DIR", help="Write candidates.csv and candidates.log here."
    ),
    layouts: Layouts = "nn",
    ld_pad: LdPad = 0,
    broadcast: Broadcast = "",
    beta: Beta = "0",
    bias: Bias = False,
    shapes_file: ShapesFile = None,
    torch_trace: TorchTrace = None,
    devices: Devices = None,
    allow_mixed: AllowMixed = False,
    resume: Resume = None,
    shard: Shard = None,
    probe_python: ProbePython = None,
    cublas_lib: CublasLib = None,
    probe_env: ProbeEnv = None,
    fix: Fix = False,
    ray: RayAddress = None,
    warm: Warm = False,
) -> None:
    """Time every algorithm cuBLASLt's heuristic offers: is its default the fastest?"""
    from cublas_audit.judge.candidates import judge_candidates
    from cublas_audit.planning.grid import plan_from_options
    from cublas_audit.report.candidates_report import render_markdown
    from cublas_audit.table.dispatch import frame_records

    gap = candidate_gap(threshold or [])

    def grid() -> list[Case]:
        problem = variants(layouts, ld_pad, broadcast, beta, bias)
        return plan_from_options(
            single, batched, sizes, shapes, batches, modes, "cublasLt", problem
        )

    listed = Listed(shapes_file, torch_trace, modes, "cublasLt")
    case_list = list(plan_cases(resume, listed, grid))  # (its grid: cases made, never stated)
    settings = {
        "candidate_limit": limit,
        "candidate_threshold": gap,
        "candidate_min_reps": min_reps,
        "workspace_bytes": workspace_mib * 1024 * 1024,
        "warm": warm or None,
    }
    probe = Probe(probe_python, cublas_lib, probe_env)
    placement = spread(devices, False, allow_mixed, resume)
    if fix and out is None and resume is None:
        raise AuditError("--fix needs --out DIR: the fixes are written beside the audit")
    engine = on_ray(ray, resume, devices, shard, False)
    if engine is not None:
        frame, gap = _on_ray(case_list, out, resume, probe, settings, engine.address)
    elif shard is not None or is_shard_run(resume):
        frame, gap = _as_shard(case_list, out, resume, probe, settings, shard, placement)
    elif placement is not None:
        frame, gap = _on_devices(case_list, out, resume, probe, settings, placement)
    elif resume is not None:
        raise AuditError(f"--resume: {resume} is not a run of `candidates --devices`")
    elif (given := probe.first_given()) is not None:
        raise AuditError(
            f"{given}: the audit runs in a probe process with --devices "
            "(e.g. --devices 0); without it, in this one"
        )
    else:
        frame = _here(case_list, out, settings)
    verdicts = judge_candidates(frame, gap)
    if format is Format.json:
        found = [finding.to_json() for finding in verdicts.flagged]
        print_json({"candidates": frame_records(frame), "findings": found})
    else:
        typer.echo(render_markdown(verdicts))
    if fix:
        written = resume or out
        assert written is not None
        machine = None if placement is not None else _machine()
        write_fixes(written, machine)


def candidate_gap(items: list[str]) -> float:
    """The gap (a fraction) the audit flags, of `--threshold NAME=VALUE` as report and diff take
    it: candidate_gap_pct, the one threshold this audit judges by (any other known name is an
    error, not ignored). A bare number, which has no `=` to be mistaken for a name, is the older
    spelling: the fraction itself. The last one given counts."""
    from cublas_audit.judge.thresholds import Thresholds, with_overrides

    gap = Thresholds().candidate_gap_pct / 100
    for item in items:
        if "=" not in item:
            try:
                fraction = float(item)
            except ValueError:
                raise AuditError(f"--threshold {item!r}: expected NAME=VALUE") from None
            if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
                raise AuditError(
                    f"--threshold {item}: a bare number is a fraction from 0 to 1 (or give "
                    "candidate_gap_pct=PERCENT)"
                )
            gap = fraction
            continue
        name = item.partition("=")[0].strip().replace("-", "_")
        limits = with_overrides([item])  # an unknown name or a bad value: its one-line error
        if name != "candidate_gap_pct":
            raise AuditError(
                f"--threshold {name}: candidates judges by candidate_gap_pct alone "
                "(report and diff take the others)"
            )
        gap = limits.candidate_gap_pct / 100
    return gap


def _machine() -> dict[str, Any]:
    """This process's GPU, cuBLAS and driver: the stamp of an audit run here (no env.json)."""
    from cublas_audit.observe import environment

    return environment.collect().to_json()


def _here(case_list: list[Case], out: Path | None, settings: dict[str, Any]) -> pd.DataFrame:
    """The candidate audit in this process, on the GPU CUDA shows it first."""
    from cublas_audit.device.candidate_audit import run_candidates
    from cublas_audit.judge.candidates import ScreenJudge
    from cublas_audit.observe import environment
    from cublas_audit.planning.grid import label_from_gpu_name

    env = environment.collect()
    environment.require_gpu(env)
    return run_candidates(
        case_list,
        out,
        settings["candidate_limit"],
        screen=ScreenJudge(settings["candidate_threshold"]),
        min_reps=settings["candidate_min_reps"],
        workspace_bytes=settings["workspace_bytes"],
        cold=not settings["warm"],
        gpu_label=label_from_gpu_name(env.gpu_name or ""),
        progress=lambda line: typer.echo(line, err=True),
    )


def _as_shard(
    case_list: list[Case],
    out: Path | None,
    resume: Path | None,
    probe: Probe,
    settings: dict[str, Any],
    shard: str | None,
    spread: Spread | None,
) -> tuple[pd.DataFrame, float]:
    """--shard I/N: that part of the plan's problems audited in a probe on this machine's GPU,
    into a run directory of its own (resumable, joined by merge); with its recorded threshold."""
    from cublas_audit.jobs.measure import sweep
    from cublas_audit.planning.cases import candidate_problems

    # the whole plan is the problems: every shard audits each of its problems once
    chosen = settings if resume is None else {}
    problems = candidate_problems(case_list)
    options = run_options(problems, out, resume, probe, phase=Phase.candidates, **chosen)
    options = sharded(options, shard, spread)
    result = with_progress(lambda bars: sweep(options, bars.hooks()))
    typer.echo(f"run directory: {result.run_dir}\nreport: {result.report}", err=True)
    assert result.frame is not None  # a candidates run's table: candidates.csv
    return result.frame, _recorded_threshold(result.run_dir)


def _recorded_threshold(run_dir: Path) -> float:
    """The gap a finished candidates run confirmed at (its env.json: the run just wrote it)."""
    from cublas_audit.table.env_record import EnvRecord

    threshold = EnvRecord.read(run_dir).candidate_threshold
    assert threshold is not None  # every candidates run records it
    return float(threshold)


def _on_ray(
    case_list: list[Case],
    out: Path | None,
    resume: Path | None,
    probe: Probe,
    settings: dict[str, Any],
    address: str | None,
) -> tuple[pd.DataFrame, float]:
    """--ray: the problems sharded over a Ray cluster's GPUs (jobs.fleet), merged into one
    candidates.csv and its report; with the threshold the run recorded."""
    from cublas_audit.jobs import fleet
    from cublas_audit.table.candidates_table import read_candidates

    chosen = settings if resume is None else {}
    options = run_options(case_list, out, resume, probe, **chosen)
    result = fleet.on_ray(options, address, Phase.candidates)
    typer.echo(f"run directory: {result.run_dir}\nreport: {result.report}", err=True)
    threshold = _recorded_threshold(result.run_dir)
    return read_candidates(result.run_dir), threshold


def _on_devices(
    case_list: list[Case],
    out: Path | None,
    resume: Path | None,
    probe: Probe,
    settings: dict[str, Any],
    spread: Spread,
) -> tuple[pd.DataFrame, float]:
    """The candidate audit sharded across GPUs (a probe pinned to each), into a run directory;
    with the threshold its gaps were confirmed at (a resumed run's: the recorded one)."""
    from cublas_audit.jobs.measure import candidates_on_devices

    # A resumed run keeps its recorded settings; a probe option given then is checked against it.
    chosen = settings if resume is None else {}
    options = run_options(case_list, out, resume, probe, **chosen)
    multi = with_progress(lambda bars: candidates_on_devices(options, spread, bars.for_gpu))
    typer.echo(f"run directory: {multi.run_dir}\nreport: {multi.report}", err=True)
    assert multi.frame is not None  # a sharded run's merged table
    return multi.frame, _recorded_threshold(multi.run_dir)
