"""The `cublas-audit` command line: argument checks and calls into the pipeline, nothing else."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

from cublas_audit.errors import AuditError

app = typer.Typer(
    name="cublas-audit",
    help="Catch cuBLAS dispatching the wrong GEMM kernel: profile, tabulate, report, diff.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

P = ParamSpec("P")
R = TypeVar("R")

# The problem grid, as `sweep` and `candidates` take it.
DEFAULT_SIZES = "256,512,1024,2048,4096,8192"
DEFAULT_BATCHES = "4,8,16"
Single = Annotated[
    bool | None,
    typer.Option(
        "--single/--no-single",
        help="Non-batched calls (batch 1) (default: both kinds).",
        show_default=False,
    ),
]
Batched = Annotated[
    bool | None,
    typer.Option(
        "--batched/--no-batched",
        help="Strided-batched calls (default: both kinds).",
        show_default=False,
    ),
]
Sizes = Annotated[str, typer.Option(help="Square sizes M=N=K, comma-separated.")]
Shapes = Annotated[str, typer.Option(help="Extra non-square problems, e.g. 4096x1024x512,...")]
Batches = Annotated[str, typer.Option(help="Batch counts for the batched calls.")]
Modes = Annotated[str, typer.Option(help="Compute modes: fp32, tf32, bf16x, fp16, bf16.")]


class TextOrJson(StrEnum):
    text = "text"
    json = "json"


class MdOrJson(StrEnum):
    md = "md"
    json = "json"


def one_line_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turns an AuditError into `error: ...` on stderr and the error's exit code."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except AuditError as exc:
            typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@app.command("env")
@one_line_errors
def env_command(
    format: TextOrJson = typer.Option(TextOrJson.text, "--format", help="Output format."),
) -> None:
    """Show the GPU, driver, CUDA, cuBLAS and ncu here, and whether ncu may read counters."""
    from cublas_audit import environment

    info = environment.collect()
    if format is TextOrJson.json:
        print_json(info.to_json())
    else:
        typer.echo(environment.describe(info))


@app.command("sweep")
@one_line_errors
def sweep_command(
    single: Single = None,
    batched: Batched = None,
    sizes: Sizes = DEFAULT_SIZES,
    shapes: Shapes = "",
    batches: Batches = DEFAULT_BATCHES,
    modes: Modes = "fp32",
    api: str = typer.Option(
        "cublas,cublasLt", "--api", help="cublas (classic calls), cublasLt, or both."
    ),
    gpu_label: str | None = typer.Option(
        None, help="Label of this GPU in tables and paths (default: from its name)."
    ),
    out: Path | None = typer.Option(
        None, help="Run directory (default: reports/<label>/<timestamp>/)."
    ),
    resume: Path | None = typer.Option(
        None, help="Finish an interrupted sweep in this run directory."
    ),
    profile: bool = typer.Option(
        True, "--profile/--no-profile", help="Profile under ncu (else only time)."
    ),
    reference: bool = typer.Option(
        True,
        "--reference/--no-reference",
        help="Time and profile the bundled reference kernel (FP32).",
    ),
    ncu: str | None = typer.Option(
        None, help="Path of the ncu binary (default: PATH, then /usr/local/cuda/bin)."
    ),
    clock_control: str = typer.Option(
        "none", help="ncu --clock-control: none (leave clocks alone) or base."
    ),
    probe_python: str = typer.Option(
        sys.executable, help="Python interpreter that runs the probe."
    ),
    cublas_lib: Path | None = typer.Option(
        None, help="Directory with the libcublas/libcublasLt to audit."
    ),
    probe_env: list[str] = typer.Option(
        [], help="KEY=VALUE for the probe, e.g. CUBLAS_WORKSPACE_CONFIG=:4096:8 (repeatable)."
    ),
    min_reps: int = typer.Option(20, min=20, help="Timed repetitions per call, at least."),
    candidates: bool = typer.Option(
        False, "--candidates/--no-candidates", help="Also time every cuBLASLt heuristic candidate."
    ),
    limit: int = typer.Option(32, min=1, help="Candidates per problem with --candidates."),
) -> None:
    """Run cuBLAS / cuBLASLt calls across sizes under ncu and write a dispatch table."""
    from cublas_audit import cases as plan
    from cublas_audit import environment, sweep
    from cublas_audit.profile import CLOCK_CONTROLS, ProbeCommand

    if clock_control not in CLOCK_CONTROLS:
        raise AuditError(
            f"--clock-control: {clock_control!r} is not one of {', '.join(CLOCK_CONTROLS)}"
        )
    extra_env = sweep.parse_probe_env(probe_env)
    candidate_limit = limit if candidates else None
    if resume is not None:
        # A resumed sweep finishes the run it was: same probe settings, same phases.
        case_list, recorded = sweep.resume_cases(resume)
        label, run_dir = str(recorded.get("gpu_label", "gpu")), resume
        extra_env = {**recorded.get("probe_env", {}), **extra_env}
        profile = bool(recorded.get("profiled", profile))
        reference = bool(recorded.get("reference", reference))
        candidate_limit = candidate_limit or recorded.get("candidate_limit")
    else:
        case_list = plan.plan_from_options(single, batched, sizes, shapes, batches, modes, api)
        label = plan.check_label(gpu_label) if gpu_label else ""
        if out is not None:
            sweep.check_new_run_dir(out)
    env = environment.collect(ncu)
    environment.require_gpu(env)
    ncu_path = environment.require_profiler(env) if profile else None
    if resume is None:
        label = label or plan.label_from_gpu_name(env.gpu_name or "")
        run_dir = out or sweep.default_run_dir(label)
    probe = ProbeCommand(probe_python, sweep.probe_environment(extra_env, cublas_lib))
    config = sweep.SweepConfig(
        cases=case_list,
        run_dir=run_dir,
        gpu_label=label,
        command=sweep.argv_for_record(),
        ncu=ncu_path,
        clock_control=clock_control,
        probe=probe,
        reference=reference,
        min_reps=min_reps,
        candidate_limit=candidate_limit,
    )
    if resume is None:
        sweep.start_run(config, env, extra_env)
    frame = _run_with_progress(config)
    _finish_sweep(config, frame)


def _run_with_progress(config: Any) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from cublas_audit import sweep

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("sweep", total=None)

        hooks = sweep.Progress(
            start=lambda total: bar.update(task, total=total),
            current=lambda case_id: bar.update(task, description=case_id),
            advance=lambda case_id: bar.advance(task),
            note=lambda message: console.print(f"[yellow]{message}"),
        )
        return sweep.run(config, hooks)


def _finish_sweep(config: Any, frame: Any) -> None:
    from cublas_audit.render import write_run_report
    from cublas_audit.summary import summary

    typer.echo(summary(frame))
    report = write_run_report(config.run_dir)
    typer.echo(f"\nrun directory: {config.run_dir}\nreport: {report}")


@app.command("candidates")
@one_line_errors
def candidates_command(
    single: Single = None,
    batched: Batched = None,
    sizes: Sizes = DEFAULT_SIZES,
    shapes: Shapes = "",
    batches: Batches = DEFAULT_BATCHES,
    modes: Modes = "fp32",
    limit: int = typer.Option(32, min=1, help="Heuristic candidates per case, at most."),
    threshold: float = typer.Option(
        0.10, min=0.0, help="Flag a case when the best candidate beats the default by this much."
    ),
    min_reps: int = typer.Option(
        5, min=2, help="Timed calls per candidate, at least (short calls get ~0.1 s worth)."
    ),
    workspace_mib: int = typer.Option(32, min=0, help="Workspace a candidate may use, MiB."),
    format: MdOrJson = typer.Option(MdOrJson.md, "--format", help="Output format."),
    out: Path | None = typer.Option(
        None, help="Directory for candidates.csv and candidates.log (default: none)."
    ),
) -> None:
    """Time every algorithm cuBLASLt's heuristic offers: is its default the fastest?"""
    from cublas_audit import candidates, environment
    from cublas_audit import cases as plan

    case_list = plan.plan_from_options(single, batched, sizes, shapes, batches, modes, "cublasLt")
    env = environment.collect()
    environment.require_gpu(env)
    frame = candidates.run_candidates(
        case_list,
        out,
        limit,
        threshold=threshold,
        min_reps=min_reps,
        workspace_bytes=workspace_mib * 1024 * 1024,
        gpu_label=plan.label_from_gpu_name(env.gpu_name or ""),
        progress=lambda line: typer.echo(line, err=True),
    )
    if format is MdOrJson.json:
        print_json(
            {
                "candidates": frame.astype(object).where(frame.notna(), None).to_dict("records"),
                "findings": candidates.find_better_candidates(frame, threshold),
            }
        )
    else:
        typer.echo(candidates.render_markdown(frame, threshold))


@app.command("reference")
@one_line_errors
def reference_command(
    sizes: Sizes = DEFAULT_SIZES,
    batches: str = typer.Option("1,4,8,16", help="Batch counts (1 = the single call)."),
    format: MdOrJson = typer.Option(MdOrJson.md, "--format", help="Output format."),
    tune: bool = typer.Option(
        False, "--tune", help="Search the tile space on this GPU and write its strategy table."
    ),
    out: Path | None = typer.Option(
        None, help="--tune: table path (default: the package's table for this GPU)."
    ),
    budget_s: float = typer.Option(180.0, "--budget-s", min=1, help="--tune: time budget."),
    min_reps: int = typer.Option(20, min=20, help="Timed repetitions per contender, at least."),
) -> None:
    """Time the bundled reference SGEMM against cuBLAS (FP32), or tune its strategy table."""
    from cublas_audit import reference
    from cublas_audit.cases import parse_int_list

    size_list = parse_int_list(sizes, "--sizes")
    batch_list = parse_int_list(batches, "--batches")

    def log(line: str) -> None:
        typer.echo(line, err=True)

    if tune:
        table = reference.tune(size_list, batch_list, budget_s, log)
        typer.echo(f"strategy table: {reference.write_table(table, out)}")
        return
    rows = reference.comparisons(size_list, batch_list, log, min_reps)
    if format is MdOrJson.json:
        print_json([row.to_json() for row in rows])
    else:
        typer.echo(reference.markdown(rows))


class FailOn(StrEnum):
    regression = "regression"


THRESHOLD_HELP = "Override a threshold, NAME=VALUE (repeatable; names in docs/report.md)."


@app.command("report")
@one_line_errors
def report_command(
    inputs: list[Path] | None = typer.Argument(
        None,
        help="Run directories or dispatch tables (CSV/Parquet) (default: the audits bundled in "
        "reports/, each GPU's newest batched run).",
        show_default=False,
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Write the Markdown here, plots/ beside it (default: stdout, no plots)."
    ),
    format: MdOrJson = typer.Option(MdOrJson.md, "--format", help="Output format."),
    threshold: list[str] = typer.Option([], "--threshold", help=THRESHOLD_HELP),
) -> None:
    """Findings, dispatch and efficiency tables, stalls and reproduce scripts, per GPU."""
    from cublas_audit import render
    from cublas_audit.thresholds import with_overrides

    limits = with_overrides(threshold)
    datasets = render.load_inputs(inputs or render.bundled_runs())
    if format is MdOrJson.json:
        print_json(render.findings_json(datasets, limits))
    elif out is not None:
        typer.echo(f"report: {render.write_report(datasets, out, limits)}")
    else:
        typer.echo(render.render_report(datasets, limits), nl=False)


@app.command("diff")
@one_line_errors
def diff_command(
    a: Path = typer.Argument(..., help="Baseline: a run directory or a dispatch table."),
    b: Path = typer.Argument(..., help="Compared: a run directory or a dispatch table."),
    format: MdOrJson = typer.Option(MdOrJson.md, "--format", help="Output format."),
    fail_on: FailOn | None = typer.Option(
        None, "--fail-on", help="Exit 1 when B has a regression against A (for CI)."
    ),
    threshold: list[str] = typer.Option([], "--threshold", help=THRESHOLD_HELP),
) -> None:
    """Kernel changes, FMA % and time deltas, regressions and one-side-only cases of two runs."""
    from cublas_audit import diff, render
    from cublas_audit.thresholds import with_overrides

    limits = with_overrides(threshold)
    result = diff.compare(render.load_one_gpu(a), render.load_one_gpu(b), limits)
    if format is MdOrJson.json:
        print_json(diff.to_json(result))
    else:
        typer.echo(diff.to_markdown(result), nl=False)
    if fail_on is FailOn.regression and result.has_regression:
        raise typer.Exit(1)
