"""What the commands share: the option aliases, the one way a command line becomes cases (a
resumed run's record, a shape list or a PyTorch trace, else the grid) and the one way it becomes
the run's options (SweepOptions), and strict JSON on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cublas_audit.errors import AuditError

if TYPE_CHECKING:
    from cublas_audit.planning.cases import Case
    from cublas_audit.planning.grid import Variants
    from cublas_audit.run.sweep_options import SweepOptions
    from cublas_audit.table.trace_record import TraceRecord

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
ShapesFile = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="The problems of a shape list (CSV or JSON: m, n, k and optional batch, layout, "
        "mode, api, lda, ldb, broadcast, beta, bias, workspace_mib, strided) instead of the grid.",
    ),
]
TorchTrace = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="Exactly the GEMMs of a PyTorch profiler trace (plain or .gz) instead of the grid.",
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
        help="With --devices (or --ray: every GPU of the cluster): run every case on every GPU "
        "and compare the units (units.md).",
    ),
]
Fix = Annotated[
    bool,
    typer.Option(
        "--fix",
        help="Then write the fixes of its confirmed findings into the run directory: fix.json, "
        "the TunableOp file (for the torch installed), fix.md (as `cublas-audit fix` does).",
    ),
]
Shard = Annotated[
    str | None,
    typer.Option(
        metavar="I/N",
        help="Run the I-th (from 1) of N parts of the plan, balanced by estimated work and the "
        "same for the same plan: one part per machine (a Slurm job array), a run directory each, "
        "joined by `cublas-audit merge`.",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="auto|ADDRESS",
        help="Place one shard per GPU of a Ray cluster (auto: the one this machine is part of, "
        "else a new one here), one Ray task each, gathered and merged into --out; "
        "needs `pip install 'cublas-audit[ray]'`.",
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


Warm = Annotated[
    bool,
    typer.Option(
        "--warm",
        help="Time with the operands left in L2 between calls, as a tight loop finds them. "
        "Default: cold, L2 flushed before every timed call, as a model's weights find it.",
    ),
]
FormatOption = Annotated[Format, typer.Option("--format", metavar="md|json", help="Output format.")]


def variants(
    layouts: str,
    ld_pad: int,
    broadcast: str,
    beta: str,
    bias: bool = False,
    workspace_mib: int = -1,
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


@dataclass(frozen=True)
class Listed:
    """A command's problems given as a list: --shapes-file or --torch-trace (one, not both)."""

    shapes_file: Path | None
    torch_trace: Path | None
    modes: str
    api: str


def plan_cases(
    resume: Path | None,
    listed: Listed,
    grid: Callable[[], Sequence[Case]],
    as_listed: Callable[[list[Case]], list[Case]] = list,
) -> Sequence[Case]:
    """The cases a command line asks for: none on --resume (the run directory records them), a
    shape list's or a trace's (through `as_listed`), else the grid's (its options checked only
    then)."""
    if resume is not None:
        return []
    if listed.shapes_file is not None or listed.torch_trace is not None:
        return as_listed(listed_cases(listed))
    return grid()


def listed_cases(listed: Listed) -> list[Case]:
    """The problems of a shape list or a PyTorch trace, as cases (one input, not both)."""
    from cublas_audit.observe.torch_trace import cases_of, read_trace
    from cublas_audit.planning.grid import parse_apis, parse_modes
    from cublas_audit.planning.shapes_file import read_shapes_file

    shapes_file, torch_trace = listed.shapes_file, listed.torch_trace
    if shapes_file is not None and torch_trace is not None:
        raise AuditError("give --shapes-file or --torch-trace, not both")
    if shapes_file is not None:
        return read_shapes_file(shapes_file, parse_modes(listed.modes), parse_apis(listed.api))
    assert torch_trace is not None
    found = cases_of(read_trace(torch_trace), parse_apis(listed.api))
    if not found:
        raise AuditError(f"{torch_trace}: no GEMM with recorded shapes in fp32, bf16 or fp16")
    return found


def trace_shares(torch_trace: Path | None, planned: list[Case]) -> TraceRecord | None:
    """--torch-trace: the trace's record of the planned cases (each problem's ops, calls and
    share of the trace's GEMM time; the cases the model never calls), which the run keeps as
    trace.json; None without a trace or on --resume (nothing planned: the run has its own)."""
    if torch_trace is None or not planned:
        return None
    from cublas_audit.observe.torch_trace import read_trace
    from cublas_audit.table.trace_record import trace_record

    return trace_record(read_trace(torch_trace), planned)


@dataclass(frozen=True)
class Probe:
    """The probe process's options: --probe-python, --cublas-lib, --probe-env."""

    python: str | None = None
    cublas_lib: Path | None = None
    env: list[str] | None = None

    def first_given(self) -> str | None:
        """The first of the options given, as its flag; None when none is."""
        given = [
            ("--probe-python", self.python),
            ("--cublas-lib", self.cublas_lib),
            ("--probe-env", self.env),
        ]
        return next((flag for flag, value in given if value), None)


def run_options(
    cases: Sequence[Case], out: Path | None, resume: Path | None, probe: Probe, **settings: Any
) -> SweepOptions:
    """The run's options (SweepOptions) of a command line: its cases, run directory, probe, the
    command itself (recorded in the run) and the command's own `settings`."""
    from cublas_audit.run.probe_process import parse_probe_env
    from cublas_audit.run.sweep_options import SweepOptions

    return SweepOptions(
        cases=cases,
        out=out,
        resume=resume,
        probe_python=probe.python,
        cublas_lib=probe.cublas_lib,
        probe_env=parse_probe_env(probe.env or []),
        command=["cublas-audit", *sys.argv[1:]],
        **settings,
    )


def print_json(data: Any) -> None:
    """Strict JSON: NaN and infinities are null, never `NaN` / `Infinity`."""
    from cublas_audit.table.dispatch import json_ready

    typer.echo(json.dumps(json_ready(data), indent=2, default=str, allow_nan=False))


def write_fixes(run_dir: Path, env: dict[str, Any] | None = None) -> None:
    """--fix: the finished run's fixes into its directory (`env`: the machine, where the run
    wrote no env.json)."""
    from cublas_audit.jobs import fix

    fix.run(fix.FixJob([run_dir], run_dir, env=env), typer.echo)
