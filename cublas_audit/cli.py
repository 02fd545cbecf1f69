"""The `cublas-audit` command line: parses arguments, calls the library, prints. Nothing else.

Exit codes (README): 0 done, 1 a regression found (the diff gate only), 2 bad input, 3 a tool or
permission missing, 4 an internal error (the traceback goes to a log file), 130 interrupted.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import traceback
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer

from cublas_audit.errors import AuditError
from cublas_audit.observe.observer import MAP_OBSERVERS, Observer

if TYPE_CHECKING:
    import pandas as pd

    from cublas_audit.planning.cases import Case
    from cublas_audit.planning.grid import Variants
    from cublas_audit.run.multi_gpu import Spread

app = typer.Typer(
    name="cublas-audit",
    help="Catch cuBLAS dispatching the wrong GEMM kernel: profile, tabulate, report, diff.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: real metavars, no <bool> or <list[Path]> type column
    add_completion=False,
)

P = ParamSpec("P")
R = TypeVar("R")
INTERNAL_ERROR = 4
INTERRUPTED = 130

# The problem grid, as `sweep` and `candidates` take it.
DEFAULT_SIZES = "256,512,1024,2048,4096,8192"
DEFAULT_BATCHES = "4,8,16"
Single = Annotated[
    bool | None,
    typer.Option(
        "--single/--no-single", help="Non-batched calls (default: both kinds).", show_default=False
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
Sizes = Annotated[
    str,
    typer.Option(
        metavar="N,N,...", help="Square sizes M=N=K, comma-separated; FIRST:LAST:STEP ranges too."
    ),
]
Shapes = Annotated[
    str, typer.Option(metavar="MxNxK,...", help="Extra non-square problems, e.g. 4096x1024x512.")
]
Batches = Annotated[
    str, typer.Option(metavar="N,N,...", help="Batch counts for the batched calls.")
]
Modes = Annotated[
    str, typer.Option(metavar="MODE,...", help="Compute modes: fp32, tf32, bf16x, fp16, bf16.")
]
Layouts = Annotated[
    str,
    typer.Option(
        metavar="nn,nt,tn,tt",
        help="Operand layouts in cuBLAS's column-major terms, transa then transb ('t': that "
        "operand is stored transposed). A row-major user's X @ W.T is cuBLAS's 'tn' on (W, X): "
        "see docs/schema.md.",
    ),
]
LdPad = Annotated[
    int, typer.Option(min=0, metavar="N", help="Pad every leading dimension by N elements.")
]
Broadcast = Annotated[
    str,
    typer.Option(metavar="a|b", help="Batched calls: this operand has batch stride 0 (shared)."),
]
Beta = Annotated[str, typer.Option(metavar="X", help="beta of C = op(A) op(B) + beta C.")]
Bias = Annotated[
    bool, typer.Option("--bias/--no-bias", help="cuBLASLt: the BIAS epilogue (a vector per row).")
]
Thresholds = Annotated[
    list[str] | None,
    typer.Option(
        "--threshold",
        metavar="NAME=VALUE",
        help="Override a threshold (repeatable; names in docs/report.md).",
    ),
]


GpuLabel = Annotated[
    str | None,
    typer.Option(
        metavar="LABEL", help="Label of this GPU in tables and paths (default: its name)."
    ),
]
RunDir = Annotated[
    Path | None,
    typer.Option(metavar="DIR", help="Run directory (default: reports/<label>/<timestamp>/)."),
]
Resume = Annotated[
    Path | None,
    typer.Option(
        metavar="DIR",
        help="Finish the interrupted run in this run directory, with its recorded settings.",
    ),
]
ProbePython = Annotated[
    str | None,
    typer.Option(metavar="PYTHON", help="Interpreter that runs the probe (default: this one)."),
]
CublasLib = Annotated[
    Path | None,
    typer.Option(metavar="DIR", help="Directory whose libcublas/libcublasLt the probe loads."),
]
ProbeEnv = Annotated[
    list[str] | None,
    typer.Option(metavar="KEY=VALUE", help="Environment for the probe (repeatable)."),
]
Devices = Annotated[
    str | None,
    typer.Option(
        metavar="all|0,1,...",
        help="Shard the cases across these GPUs of this host (nvidia-smi's numbering), one probe "
        "(and one ncu) per GPU, into one run directory (shards/gpu<i>/).",
    ),
]
Replicate = Annotated[
    bool,
    typer.Option(
        "--replicate",
        help="With --devices: run every case on every GPU and compare the units (units.md).",
    ),
]
AllowMixed = Annotated[
    bool,
    typer.Option("--allow-mixed", help="With --devices: GPUs of different models, per model."),
]


class TextOrJson(StrEnum):
    text = "text"
    json = "json"


class Format(StrEnum):
    md = "md"
    json = "json"


class FailOn(StrEnum):
    regression = "regression"
    kernel_change = "kernel-change"
    host = "host"
    any = "any"


def _variants(
    layouts: str, ld_pad: int, broadcast: str, beta: str, bias: bool, workspace_mib: int
) -> Variants:
    """The problem-description options, checked: each bad value is a one-line error."""
    from cublas_audit.planning.grid import Variants, parse_beta, parse_broadcast, parse_layouts

    return Variants(
        layouts=parse_layouts(layouts),
        ld_pad=ld_pad,
        broadcast=parse_broadcast(broadcast),
        beta=parse_beta(beta),
        bias=bias,
        workspace_mib=workspace_mib,
    )


def _listed_cases(
    shapes_file: Path | None, torch_trace: Path | None, modes: str, apis: str
) -> list[Case]:
    """The problems of a shape list or a PyTorch trace, as cases (one input, not both)."""
    from cublas_audit.observe.torch_trace import cases_of, read_trace
    from cublas_audit.planning.grid import parse_apis, parse_modes
    from cublas_audit.planning.shapes_file import read_shapes_file

    if shapes_file is not None and torch_trace is not None:
        raise AuditError("give --shapes-file or --torch-trace, not both")
    if shapes_file is not None:
        return read_shapes_file(shapes_file, parse_modes(modes), parse_apis(apis))
    assert torch_trace is not None
    found = cases_of(read_trace(torch_trace), parse_apis(apis))
    if not found:
        raise AuditError(f"{torch_trace}: no GEMM with recorded shapes in fp32, bf16 or fp16")
    return found


def _reference_problems(shapes_file: Path) -> list[tuple[int, int, int, int]]:
    """The rows of a shape list the reference kernel computes (FP32, nn, packed, beta 0)."""
    from cublas_audit.planning.shapes_file import read_shapes_file

    listed = read_shapes_file(shapes_file, ["fp32"], ["cublas"])
    found = [(c.m, c.n, c.k, c.batch) for c in listed if c.reference_computes]
    if not found:
        raise AuditError(
            f"--shapes-file {shapes_file}: no FP32, untransposed, packed, beta-0 problem, which "
            "is all the reference computes"
        )
    return list(dict.fromkeys(found))


def exit_codes(command: Callable[P, R]) -> Callable[P, R]:
    """The exit-code contract: an AuditError is its one-line message and code, Ctrl-C is 130, and
    anything else is an internal error (4) whose traceback goes to a log file, never a 1."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except AuditError as exc:
            _error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            _error("interrupted")
            raise typer.Exit(INTERRUPTED) from None
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as exc:
            log = _write_traceback(exc)
            _error(
                f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
                + f" (traceback: {log})"
            )
            raise typer.Exit(INTERNAL_ERROR) from None

    return wrapper


def _error(message: str) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)


def _write_traceback(exc: BaseException) -> str:
    with tempfile.NamedTemporaryFile(
        "w", prefix="cublas-audit-error-", suffix=".log", delete=False
    ) as log:
        log.write("".join(traceback.format_exception(exc)))
        return log.name


def print_json(data: Any) -> None:
    """Strict JSON: NaN and infinities are null, never `NaN` / `Infinity`."""
    from cublas_audit.table.dispatch import json_ready

    typer.echo(json.dumps(json_ready(data), indent=2, default=str, allow_nan=False))


@app.command("env")
@exit_codes
def env_command(
    format: TextOrJson = typer.Option(
        TextOrJson.text, "--format", metavar="text|json", help="Output format."
    ),
) -> None:
    """Show the GPU, driver, CUDA, cuBLAS and ncu here, and whether ncu may read counters."""
    from cublas_audit.observe import environment

    info = environment.collect()
    if format is TextOrJson.json:
        print_json(info.to_json())
    else:
        typer.echo(environment.describe(info))


@app.command("sweep")
@exit_codes
def sweep_command(
    single: Single = None,
    batched: Batched = None,
    sizes: Sizes = DEFAULT_SIZES,
    shapes: Shapes = "",
    batches: Batches = DEFAULT_BATCHES,
    modes: Modes = "fp32",
    api: str = typer.Option(
        "cublas,cublasLt", metavar="API,...", help="cublas (classic calls), cublasLt, or both."
    ),
    gpu_label: GpuLabel = None,
    out: RunDir = None,
    resume: Resume = None,
    profile: bool | None = typer.Option(
        None, "--profile/--no-profile", help="Profile under ncu (default), or only time."
    ),
    observer: str | None = typer.Option(
        None,
        metavar="ncu|cupti|events",
        help="How launches are observed: ncu (counters, stalls), cupti (kernel names, times, "
        "grids; no counter permission), events (call times). Default: ncu where it can run, "
        "else cupti with a notice.",
    ),
    reference: bool | None = typer.Option(
        None, "--reference/--no-reference", help="Time and profile the reference kernel (FP32)."
    ),
    ncu: str | None = typer.Option(
        None, metavar="PATH", help="The ncu binary (default: PATH, then /usr/local/cuda/bin)."
    ),
    clock_control: str | None = typer.Option(
        None, metavar="none|base", help="ncu --clock-control (default: none, clocks left alone)."
    ),
    probe_python: ProbePython = None,
    cublas_lib: CublasLib = None,
    probe_env: ProbeEnv = None,
    min_reps: int | None = typer.Option(
        None, min=20, metavar="N", help="Timed repetitions per call, at least (default 20)."
    ),
    candidates: bool = typer.Option(
        False, "--candidates/--no-candidates", help="Also time every cuBLASLt heuristic candidate."
    ),
    limit: int = typer.Option(32, min=1, metavar="N", help="Candidates per problem."),
    layouts: Layouts = "nn",
    ld_pad: LdPad = 0,
    broadcast: Broadcast = "",
    beta: Beta = "0",
    bias: Bias = False,
    workspace_mib: int = typer.Option(
        -1, min=-1, metavar="MIB", help="cuBLASLt calls: workspace limit (default 32 MiB)."
    ),
    shapes_file: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Run the problems of a shape list (CSV or JSON: m, n, k and optional batch, layout, "
        "mode, api, lda, ldb, broadcast, beta, bias, workspace_mib, strided) instead of the grid.",
    ),
    torch_trace: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Run exactly the GEMMs of a PyTorch profiler trace (plain or .gz), not the grid.",
    ),
    devices: Devices = None,
    replicate: Replicate = False,
    allow_mixed: AllowMixed = False,
) -> None:
    """Run cuBLAS / cuBLASLt calls across sizes under ncu and write a dispatch table."""
    from cublas_audit.jobs import sweep
    from cublas_audit.planning import cases
    from cublas_audit.planning.grid import plan_from_options
    from cublas_audit.report.summary import summary
    from cublas_audit.run import probe_process
    from cublas_audit.run.sweep_setup import SweepOptions

    if resume is not None:
        planned: list[cases.Case] = []
    elif shapes_file is not None or torch_trace is not None:
        planned = _listed_cases(shapes_file, torch_trace, modes, api)
    else:
        planned = plan_from_options(
            single,
            batched,
            sizes,
            shapes,
            batches,
            modes,
            api,
            _variants(layouts, ld_pad, broadcast, beta, bias, workspace_mib),
        )
    options = SweepOptions(
        cases=planned,
        gpu_label=gpu_label,
        out=out,
        resume=resume,
        profile=profile,
        reference=reference,
        ncu=ncu,
        clock_control=clock_control,
        probe_python=probe_python,
        cublas_lib=cublas_lib,
        probe_env=probe_process.parse_probe_env(probe_env or []),
        min_reps=min_reps,
        candidate_limit=limit if candidates else None,
        command=["cublas-audit", *sys.argv[1:]],
        observer=Observer.parse(observer),
    )
    spread = _spread(devices, replicate, allow_mixed, resume)
    if spread is not None:
        from cublas_audit.jobs import sweep_on_devices

        multi = _with_progress(lambda bars: sweep_on_devices(options, spread, bars.for_gpu))
        if multi.frame is not None:
            typer.echo(summary(multi.frame))
        typer.echo(f"\nrun directory: {multi.run_dir}\nreport: {multi.report}")
        return
    result = _with_progress(lambda bars: sweep(options, bars.hooks()))
    if result.frame is not None:
        typer.echo(summary(result.frame))
    typer.echo(f"\nrun directory: {result.run_dir}\nreport: {result.report}")


def _spread(devices: str | None, replicate: bool, allow_mixed: bool, resume: Path | None) -> Any:
    """Over which GPUs the run spreads (a multi_gpu.Spread), or None for one GPU: --devices and
    its companions (multi_gpu checks they come together), or a resumed run that spread."""
    from cublas_audit.run.multi_gpu import Spread, recorded

    if devices is not None or replicate or allow_mixed:
        return Spread(devices, replicate, allow_mixed)
    if resume is not None and resume.is_dir() and recorded(resume) is not None:
        return Spread()
    return None


def _cases_per_second_column() -> Any:
    """A rich progress column: the cases finished per second (rich's own speed estimate)."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class CasesPerSecond(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(f"{task.speed:.1f} cases/s" if task.speed else "", style="cyan")

    return CasesPerSecond()


class _Bars:
    """The rich progress bars on stderr: one per GPU that works (`hooks(name)`), each with its
    cases per second. The display starts when the first starts its cases, so every check before
    that prints its error alone."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=True)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        self.bar = Progress(
            *columns, _cases_per_second_column(), TimeRemainingColumn(), console=self.console
        )

    def hooks(self, name: str = "") -> Any:
        from cublas_audit.run.sweep import Progress as Hooks

        prefix = f"{name} " if name else ""
        task = self.bar.add_task(prefix or "sweep", total=None, visible=False)

        def start(total: int) -> None:  # a map's follow-up starts a second count on one bar
            self.bar.start()
            self.bar.reset(task, total=total, visible=True)

        return Hooks(
            start=start,
            current=lambda case_id: self.bar.update(task, description=prefix + case_id),
            advance=lambda case_id: self.bar.advance(task),
            note=lambda message: self.console.print(prefix + message, style="yellow", markup=False),
        )

    def for_gpu(self, gpu: Any) -> Any:
        return self.hooks(f"gpu{gpu.index}")


def _with_progress(work: Callable[[_Bars], R]) -> R:
    """Runs `work(bars)` and stops the display however it ends."""
    bars = _Bars()
    try:
        return work(bars)
    finally:
        bars.bar.stop()


@app.command("candidates")
@exit_codes
def candidates_command(
    single: Single = None,
    batched: Batched = None,
    sizes: Sizes = DEFAULT_SIZES,
    shapes: Shapes = "",
    batches: Batches = DEFAULT_BATCHES,
    modes: Modes = "fp32",
    limit: int = typer.Option(32, min=1, metavar="N", help="Heuristic candidates per case."),
    threshold: float = typer.Option(
        0.10, min=0.0, max=1.0, metavar="FRACTION", help="Flag a gap of at least this much."
    ),
    min_reps: int = typer.Option(
        5, min=2, metavar="N", help="Timed calls per candidate, at least."
    ),
    workspace_mib: int = typer.Option(
        32, min=0, metavar="MIB", help="Workspace a candidate may use."
    ),
    format: Format = typer.Option(Format.md, "--format", metavar="md|json", help="Output format."),
    out: Path | None = typer.Option(
        None, metavar="DIR", help="Write candidates.csv and candidates.log here."
    ),
    layouts: Layouts = "nn",
    ld_pad: LdPad = 0,
    broadcast: Broadcast = "",
    beta: Beta = "0",
    bias: Bias = False,
    shapes_file: Path | None = typer.Option(
        None, metavar="FILE", help="The problems of a shape list (as for sweep), not the grid."
    ),
    torch_trace: Path | None = typer.Option(
        None, metavar="FILE", help="The GEMMs of a PyTorch profiler trace, not the grid."
    ),
    devices: Devices = None,
    allow_mixed: AllowMixed = False,
    resume: Resume = None,
    probe_python: ProbePython = None,
    cublas_lib: CublasLib = None,
    probe_env: ProbeEnv = None,
) -> None:
    """Time every algorithm cuBLASLt's heuristic offers: is its default the fastest?"""
    from cublas_audit.judge.candidates import find_better_candidates
    from cublas_audit.planning import cases
    from cublas_audit.planning.grid import plan_from_options
    from cublas_audit.report.candidates_report import render_markdown
    from cublas_audit.table.dispatch import frame_records

    if resume is not None:
        case_list: list[cases.Case] = []
    elif shapes_file is not None or torch_trace is not None:
        case_list = _listed_cases(shapes_file, torch_trace, modes, "cublasLt")
    else:
        variants = _variants(layouts, ld_pad, broadcast, beta, bias, -1)
        case_list = plan_from_options(
            single, batched, sizes, shapes, batches, modes, "cublasLt", variants
        )
    settings = {
        "candidate_limit": limit,
        "candidate_threshold": threshold,
        "candidate_min_reps": min_reps,
        "workspace_bytes": workspace_mib * 1024 * 1024,
    }
    probe = {"probe_python": probe_python, "cublas_lib": cublas_lib, "probe_env": probe_env}
    spread = _spread(devices, False, allow_mixed, resume)
    if spread is not None:
        frame, threshold = _candidates_on_devices(
            case_list, out, resume, {**settings, **probe}, spread
        )
    elif resume is not None:
        raise AuditError(f"--resume: {resume} is not a run of `candidates --devices`")
    elif any(probe.values()):
        given = next(name for name, value in probe.items() if value)
        raise AuditError(
            f"--{given.replace('_', '-')}: the audit runs in a probe process with --devices "
            "(e.g. --devices 0); without it, in this one"
        )
    else:
        frame = _candidates_here(case_list, out, settings)
    if format is Format.json:
        found = find_better_candidates(frame, threshold)
        print_json({"candidates": frame_records(frame), "findings": found})
    else:
        typer.echo(render_markdown(frame, threshold))


def _candidates_here(
    case_list: list[Case], out: Path | None, settings: dict[str, Any]
) -> pd.DataFrame:
    """The candidate audit in this process, on the GPU CUDA shows it first."""
    from cublas_audit.device.candidate_audit import run_candidates
    from cublas_audit.observe import environment
    from cublas_audit.planning.grid import label_from_gpu_name

    env = environment.collect()
    environment.require_gpu(env)
    return run_candidates(
        case_list,
        out,
        settings["candidate_limit"],
        threshold=settings["candidate_threshold"],
        min_reps=settings["candidate_min_reps"],
        workspace_bytes=settings["workspace_bytes"],
        gpu_label=label_from_gpu_name(env.gpu_name or ""),
        progress=lambda line: typer.echo(line, err=True),
    )


def _candidates_on_devices(
    case_list: list[Case],
    out: Path | None,
    resume: Path | None,
    settings: dict[str, Any],
    spread: Spread,
) -> tuple[pd.DataFrame, float]:
    """The candidate audit sharded across GPUs (a probe pinned to each), into a run directory;
    with the threshold its gaps were confirmed at (a resumed run's: the recorded one)."""
    from cublas_audit.jobs import candidates_on_devices
    from cublas_audit.run.probe_process import parse_probe_env
    from cublas_audit.run.sweep_setup import SweepOptions
    from cublas_audit.table import rundir

    # A resumed run keeps its recorded settings; a probe option given then is checked against it.
    probe = ("probe_python", "cublas_lib")
    chosen = dict(settings) if resume is None else {key: settings[key] for key in probe}
    chosen["probe_env"] = parse_probe_env(settings.get("probe_env") or [])
    options = SweepOptions(
        cases=case_list, out=out, resume=resume, command=["cublas-audit", *sys.argv[1:]], **chosen
    )
    multi = _with_progress(lambda bars: candidates_on_devices(options, spread, bars.for_gpu))
    typer.echo(f"run directory: {multi.run_dir}\nreport: {multi.report}", err=True)
    assert multi.frame is not None  # a sharded run's merged table
    return multi.frame, float(rundir.read_env(multi.run_dir)["candidate_threshold"])


@app.command("reference")
@exit_codes
def reference_command(
    sizes: Sizes = DEFAULT_SIZES,
    batches: str = typer.Option(
        "1,4,8,16", metavar="N,N,...", help="Batch counts (1 = the single call)."
    ),
    format: Format = typer.Option(Format.md, "--format", metavar="md|json", help="Output format."),
    tune: bool = typer.Option(
        False, "--tune", help="Search the tile space on this GPU and write its strategy table."
    ),
    out: Path | None = typer.Option(
        None, metavar="FILE", help="--tune: table path (default: the package's, for this GPU)."
    ),
    budget_s: float = typer.Option(
        180.0, "--budget-s", min=1, metavar="SECONDS", help="--tune: time budget."
    ),
    min_reps: int = typer.Option(20, min=20, metavar="N", help="Timed repetitions, at least."),
    shapes_file: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Also the FP32 problems of a shape list (as for sweep) that the reference computes: "
        "packed, untransposed, beta 0.",
    ),
) -> None:
    """Time the bundled reference SGEMM against cuBLAS (FP32), or tune its strategy table."""
    from cublas_audit.device.reference import bench
    from cublas_audit.planning.grid import parse_int_list

    size_list = parse_int_list(sizes, "--sizes")
    batch_list = parse_int_list(batches, "--batches")
    listed = _reference_problems(shapes_file) if shapes_file is not None else []

    def log(line: str) -> None:
        typer.echo(line, err=True)

    if tune:
        table = bench.tune(size_list, batch_list, budget_s, log)
        typer.echo(f"strategy table: {bench.write_table(table, out)}")
        return
    rows = bench.comparisons(size_list, batch_list, log, min_reps, listed)
    if format is Format.json:
        print_json([row.to_json() for row in rows])
    else:
        typer.echo(bench.markdown(rows))


@app.command("report")
@exit_codes
def report_command(
    inputs: list[Path] | None = typer.Argument(
        None,
        metavar="RUN_OR_TABLE",
        help="Run directories or dispatch tables (CSV/Parquet) (default: the bundled audits, "
        "each GPU's newest batched run).",
        show_default=False,
    ),
    out: Path | None = typer.Option(
        None, metavar="FILE", help="Write the Markdown here, plots/ beside it."
    ),
    format: Format | None = typer.Option(
        None,
        "--format",
        metavar="md|json",
        help="md or json on stdout (default: a summary in a terminal, Markdown in a pipe).",
        show_default=False,
    ),
    threshold: Thresholds = None,
    torch_trace: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="Audit the GEMMs of a PyTorch profiler trace instead (kernels and durations as "
        "recorded; findings weighted by their share of the trace's GEMM time).",
    ),
) -> None:
    """Findings, dispatch and efficiency tables, stalls and reproduce scripts, per GPU."""
    from cublas_audit.report import output as report

    if torch_trace is not None:
        from cublas_audit.judge.thresholds import with_overrides
        from cublas_audit.observe.torch_trace import read_trace
        from cublas_audit.report.torch_trace_report import report_markdown

        if inputs:
            raise AuditError("give run directories / tables or --torch-trace, not both")
        typer.echo(report_markdown(read_trace(torch_trace), with_overrides(threshold or [])))
        return
    job = report.ReportJob(inputs or [], out, format.value if format else None, threshold or [])
    report.run(job, terminal=sys.stdout.isatty(), echo=typer.echo)


@app.command("diff")
@exit_codes
def diff_command(
    a: Path = typer.Argument(..., metavar="RUN_A", help="Baseline: a run directory or a table."),
    b: Path = typer.Argument(..., metavar="RUN_B", help="Compared: a run directory or a table."),
    format: Format = typer.Option(Format.md, "--format", metavar="md|json", help="Output format."),
    fail_on: FailOn | None = typer.Option(
        None,
        "--fail-on",
        metavar="regression|kernel-change|host|any",
        help="Exit 1 when B has, against A: a confident regression (the dispatched kernels "
        "slower beyond their noise floor, or the call where kernels were not traced, or a call "
        "that broke), a kernel change, a call slower over unchanged kernels (host), or any of "
        "them (for CI).",
    ),
    threshold: Thresholds = None,
) -> None:
    """Kernel changes, FMA % and time deltas, regressions and one-side-only cases of two runs."""
    from cublas_audit.judge import diff
    from cublas_audit.judge.thresholds import with_overrides
    from cublas_audit.report import diff_report
    from cublas_audit.table.inputs import load_one_gpu

    limits = with_overrides(threshold or [])
    result = diff.compare(load_one_gpu(a), load_one_gpu(b), limits)
    if format is Format.json:
        print_json(diff_report.to_json(result))
    else:
        typer.echo(diff_report.to_markdown(result), nl=False)
    if fail_on is not None and result.matched.empty:
        raise AuditError(
            f"--fail-on {fail_on.value}: {a} and {b} share no case (api, routine, mode, shape, "
            "batch), so nothing was compared"
        )
    if fail_on is not None and result.fails(fail_on.value):
        raise typer.Exit(1)


@app.command("shapes")
@exit_codes
def shapes_command(
    torch_trace: Path = typer.Option(
        ...,
        metavar="FILE",
        help="A PyTorch profiler trace (Chrome JSON, plain or gzipped, record_shapes=True).",
    ),
    format: Format = typer.Option(Format.md, "--format", metavar="md|json", help="Output format."),
    out: Path | None = typer.Option(
        None, metavar="FILE", help="Write the output here instead of stdout."
    ),
) -> None:
    """The distinct GEMMs of a PyTorch trace: shapes in PyTorch's and cuBLAS's terms, calls, GPU
    time and share, the kernels they ran (through correlation ids), the copies around them."""
    from cublas_audit.files import write_text_atomic
    from cublas_audit.observe.torch_trace import problems, read_trace
    from cublas_audit.report.output import check_output
    from cublas_audit.report.torch_trace_report import problems_markdown
    from cublas_audit.table.dispatch import frame_records, json_ready

    if out is not None:
        check_output(out, [torch_trace])
    trace = read_trace(torch_trace)
    table = problems(trace)
    if format is Format.json:
        text = json.dumps(json_ready(frame_records(table)), indent=2, allow_nan=False) + "\n"
    else:
        text = problems_markdown(trace, table)
    if out is None:
        typer.echo(text, nl=False)
    else:
        typer.echo(f"shapes: {write_text_atomic(out, text)}")


@app.command("map")
@exit_codes
def map_command(
    sizes: str = typer.Option(
        "", metavar="FIRST:LAST:STEP,...", help="Square problems M=N=K (values and ranges)."
    ),
    m: str = typer.Option(
        "", "--m", metavar="FIRST:LAST:STEP,...", help="M values (with --n, --k)."
    ),
    n: str = typer.Option("", "--n", metavar="FIRST:LAST:STEP,...", help="N values."),
    k: str = typer.Option("", "--k", metavar="FIRST:LAST:STEP,...", help="K values."),
    batches: str = typer.Option(
        "1", metavar="N,N,...", help="Batch counts (1: the single, non-batched call)."
    ),
    sample: int | None = typer.Option(
        None, min=1, metavar="N", help="Map N problems drawn at random from the grid."
    ),
    seed: int = typer.Option(0, metavar="N", help="Seed of --sample."),
    modes: Modes = "fp32",
    api: str = typer.Option("cublas", metavar="API,...", help="cublas, cublasLt, or both."),
    layouts: Layouts = "nn",
    ld_pad: LdPad = 0,
    broadcast: Broadcast = "",
    beta: Beta = "0",
    reps: int = typer.Option(5, min=2, metavar="N", help="Timed and traced calls per case."),
    observer: str | None = typer.Option(
        None, metavar="cupti|events", help="cupti (default: kernel names and times) or events."
    ),
    follow_up: bool = typer.Option(
        False,
        "--follow-up/--no-follow-up",
        help="Take the flagged cases and their faster neighbours to ncu, the reference and "
        "cuBLASLt's candidates (into follow-up/ of the run directory).",
    ),
    follow_up_limit: int = typer.Option(
        8, min=1, metavar="N", help="--follow-up: the N findings of largest effect."
    ),
    gpu_label: GpuLabel = None,
    out: RunDir = None,
    resume: Resume = None,
    probe_python: ProbePython = None,
    cublas_lib: CublasLib = None,
    probe_env: ProbeEnv = None,
    shapes_file: Path | None = typer.Option(
        None, metavar="FILE", help="Map the problems of a shape list (as for sweep)."
    ),
    torch_trace: Path | None = typer.Option(
        None, metavar="FILE", help="Map the GEMMs of a PyTorch profiler trace."
    ),
    threshold: Thresholds = None,
    devices: Devices = None,
    replicate: Replicate = False,
    allow_mixed: AllowMixed = False,
) -> None:
    """Map which kernel cuBLAS dispatches over a dense grid of shapes (CUPTI, no counters needed):
    kernel switches, dispatch cliffs and size inversions, pictures; --follow-up goes deep."""
    from cublas_audit import jobs
    from cublas_audit.judge.map_audit import MAP_RULES
    from cublas_audit.judge.thresholds import with_overrides
    from cublas_audit.planning import cases, map_grid
    from cublas_audit.planning.grid import parse_apis, parse_int_list, parse_modes
    from cublas_audit.run import probe_process
    from cublas_audit.run.sweep_setup import SweepOptions

    limits = with_overrides(threshold or [])
    observed = Observer.parse(observer, MAP_OBSERVERS)  # a map never runs ncu
    planned: list[cases.Case] = []
    if resume is None and (shapes_file is not None or torch_trace is not None):
        planned = map_grid.listed(_listed_cases(shapes_file, torch_trace, modes, api))
    elif resume is None:
        planned = map_grid.grid_plan(
            map_grid.Grid.parse(sizes, m, n, k),
            parse_int_list(batches, "--batches"),
            parse_modes(modes),
            parse_apis(api),
            _variants(layouts, ld_pad, broadcast, beta, False, -1),
            sample,
            seed,
        )
    options = SweepOptions(
        cases=planned,
        gpu_label=gpu_label,
        out=out,
        resume=resume,
        probe_python=probe_python,
        cublas_lib=cublas_lib,
        probe_env=probe_process.parse_probe_env(probe_env or []),
        min_reps=None if resume is not None else reps,
        reference=False,
        command=["cublas-audit", *sys.argv[1:]],
        observer=observed,
    )
    limit = follow_up_limit if follow_up else None
    spread = _spread(devices, replicate, allow_mixed, resume)
    result = _with_progress(
        lambda bars: jobs.dispatch_map_run(
            options, limit, limits, bars.hooks(), spread, bars.for_gpu if spread else None
        )
    )
    if result.frame is None:
        typer.echo(f"\nrun directory: {result.run_dir}\nunits: {result.report}")
        return
    found = result.findings
    counts = {rule: sum(f.rule == rule for f in found) for rule in MAP_RULES}
    typer.echo(", ".join(f"{count} {rule}" for rule, count in counts.items()))
    typer.echo(f"\nrun directory: {result.run_dir}\nreport: {result.report}")
    if result.follow_up is not None:
        typer.echo(f"follow-up: {result.follow_up}")
