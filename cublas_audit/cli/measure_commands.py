"""The commands that measure on this machine's GPUs: sweep, map and reference."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    GpuLabel,
    Layouts,
    LdPad,
    Listed,
    Modes,
    Probe,
    ProbeEnv,
    ProbePython,
    RayAddress,
    Replicate,
    Resume,
    RunDir,
    Shapes,
    ShapesFile,
    Shard,
    Single,
    Sizes,
    Thresholds,
    TorchTrace,
    Warm,
    plan_cases,
    print_json,
    run_options,
    trace_shares,
    variants,
    write_fixes,
)
from cublas_audit.cli.progress import with_progress
from cublas_audit.cli.spread_options import (
    is_shard_run,
    join_ray_soon,
    on_ray,
    sharded,
    spread,
    start_shards_soon,
)
from cublas_audit.errors import AuditError
from cublas_audit.observe.observer import MAP_OBSERVERS, Observer
from cublas_audit.vocabulary import Phase


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
        None,
        min=20,
        metavar="N",
        help="Timed repetitions per call, at least (default 20); a call over 0.1 s runs as "
        "many as fit N x 0.1 s, never under 5.",
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
    # None: no limit set, so the cases keep workspace_mib -1 (cuBLASLt gets 32 MiB); one
    # default in the help, not typer's -1 beside the 32 MiB it stands for
    workspace_mib: int | None = typer.Option(
        None,
        min=0,
        metavar="MIB",
        help="cuBLASLt calls: workspace limit (default: 32 MiB).",
        show_default=False,
    ),
    shapes_file: ShapesFile = None,
    torch_trace: TorchTrace = None,
    devices: Devices = None,
    replicate: Replicate = False,
    allow_mixed: AllowMixed = False,
    shard: Shard = None,
    ray: RayAddress = None,
    fix: Fix = False,
    warm: Warm = False,
) -> None:
    """Run cuBLAS / cuBLASLt calls across sizes under ncu and write a dispatch table."""
    from cublas_audit.jobs.measure import sweep
    from cublas_audit.planning.cases import Case, with_cause_removed_companions
    from cublas_audit.planning.grid import plan_from_options
    from cublas_audit.report.summary import summary

    def grid() -> list[Case]:
        limit = -1 if workspace_mib is None else workspace_mib
        problem = variants(layouts, ld_pad, broadcast, beta, bias, limit)
        return plan_from_options(single, batched, sizes, shapes, batches, modes, api, problem)

    engine = on_ray(ray, resume, devices, shard, replicate)
    join_ray_soon(engine, resume)  # (while the run is planned)
    start_shards_soon(devices)  # (likewise)
    planned = plan_cases(resume, Listed(shapes_file, torch_trace, modes, api), grid)
    # unaligned-operand's cause removed (padded, the other layout), measured beside each case
    planned = with_cause_removed_companions(planned)
    options = run_options(
        planned,
        out,
        resume,
        Probe(probe_python, cublas_lib, probe_env),
        gpu_label=gpu_label,
        profile=profile,
        reference=reference,
        ncu=ncu,
        clock_control=clock_control,
        min_reps=min_reps,
        candidate_limit=limit if candidates else None,
        observer=Observer.parse(observer),
        warm=warm or None,
        trace=trace_shares(torch_trace, planned),  # trace.json: each problem's share
    )
    placement = spread(devices, replicate, allow_mixed, resume)
    options = sharded(options, shard, placement)
    if fix and replicate:
        raise AuditError("--fix takes one run's fixes; a replicated run has one per unit")
    if engine is not None:
        from cublas_audit.jobs import fleet

        result = fleet.on_ray(options, engine.address, replicate=engine.replicate)
    elif placement is not None:
        from cublas_audit.jobs.measure import sweep_on_devices

        result = with_progress(lambda bars: sweep_on_devices(options, placement, bars.for_gpu))
    else:
        result = with_progress(lambda bars: sweep(options, bars.hooks()))
    if result.frame is not None:
        typer.echo(summary(result.frame))
    typer.echo(f"\nrun directory: {result.run_dir}\nreport: {result.report}")
    if fix:
        write_fixes(result.run_dir)


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
    shapes_file: ShapesFile = None,
    torch_trace: TorchTrace = None,
    threshold: Thresholds = None,
    devices: Devices = None,
    replicate: Replicate = False,
    allow_mixed: AllowMixed = False,
    shard: Shard = None,
    ray: RayAddress = None,
    fix: Fix = False,
    warm: Warm = False,
) -> None:
    """Map which kernel cuBLAS dispatches over a dense grid of shapes (CUPTI, no counters needed):
    kernel switches, dispatch cliffs and size inversions, pictures; --follow-up goes deep."""
    from cublas_audit.judge.thresholds import with_overrides
    from cublas_audit.planning import map_grid
    from cublas_audit.planning.cases import Case
    from cublas_audit.planning.grid import parse_apis, parse_int_list, parse_modes

    limits = with_overrides(threshold or [])
    observed = Observer.parse(observer, MAP_OBSERVERS)  # a map never runs ncu

    def grid_options() -> tuple[Any, ...]:
        """The grid's options parsed (cheap: bad ones exit 2 here, before any case is made)."""
        return (
            map_grid.Grid.parse(sizes, m, n, k),
            parse_int_list(batches, "--batches"),
            parse_modes(modes),
            parse_apis(api),
            variants(layouts, ld_pad, broadcast, beta),
        )

    def grid() -> Sequence[Case]:
        shape, batch, mode, apis, variant = grid_options()
        return map_grid.grid_plan(shape, batch, mode, apis, variant, sample, seed)

    listed = Listed(shapes_file, torch_trace, modes, api)
    engine = on_ray(ray, resume, devices, shard, replicate)
    if follow_up and (shard is not None or is_shard_run(resume) or engine is not None):
        raise AuditError("--follow-up judges the whole map: leave it out of a --shard or --ray run")
    if fix and not follow_up:
        raise AuditError("--fix needs --follow-up: a map's alternatives are measured there")
    if engine is not None and resume is None:  # bad input exits 2 before Ray is started
        if shapes_file is None and torch_trace is None:
            grid_options()
        if out is not None:
            from cublas_audit.run.sweep_options import check_new_run_dir

            check_new_run_dir(out)
    join_ray_soon(engine, resume)  # (while the map is planned: a full grid's cases take seconds)
    start_shards_soon(devices)  # (likewise)
    # (imported once Ray's head or the shards' fork server is starting: pandas and the judging,
    # ~0.7 s of the H100 x4 host's start-up that came before them)
    from cublas_audit.jobs import measure
    from cublas_audit.judge.map_audit import MAP_RULES

    planned = plan_cases(resume, listed, grid, map_grid.listed)
    options = run_options(
        planned,
        out,
        resume,
        Probe(probe_python, cublas_lib, probe_env),
        gpu_label=gpu_label,
        min_reps=None if resume is not None else reps,
        reference=False,
        observer=observed,
        warm=warm or None,  # the fast pass is warm whatever this says; the follow-up obeys it
    )
    limit = follow_up_limit if follow_up else None
    placement = spread(devices, replicate, allow_mixed, resume)
    options = sharded(options, shard, placement)
    if engine is not None:
        from cublas_audit.jobs import fleet

        result = fleet.on_ray(options, engine.address, Phase.map, replicate=engine.replicate)
    else:
        result = with_progress(
            lambda bars: measure.dispatch_map_run(
                options, limit, limits, bars.hooks(), placement, bars.for_gpu if placement else None
            )
        )
    if result.frame is None:
        typer.echo(f"\nrun directory: {result.run_dir}\nunits: {result.report}")
        return
    if engine is None:  # (a Ray run's findings are judged by its merged report, shown there)
        found = result.findings
        counts = {rule: sum(f.rule == rule for f in found) for rule in MAP_RULES}
        typer.echo(", ".join(f"{count} {rule}" for rule, count in counts.items()))
    typer.echo(f"\nrun directory: {result.run_dir}\nreport: {result.report}")
    if result.follow_up is not None:
        typer.echo(f"follow-up: {result.follow_up}")
        if fix:
            write_fixes(result.run_dir)


@exit_codes
def reference_command(
    sizes: Sizes = DEFAULT_SIZES,
    batches: str = typer.Option(
        "1,4,8,16", metavar="N,N,...", help="Batch counts (1 = the single call)."
    ),
    format: FormatOption = Format.md,
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
    listed = reference_problems(shapes_file) if shapes_file is not None else []

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


def reference_problems(shapes_file: Path) -> list[tuple[int, int, int, int]]:
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
