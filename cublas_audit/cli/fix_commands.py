"""The commands that turn findings into fixes and check them: fix and verify."""

from __future__ import annotations

from pathlib import Path

import typer

from cublas_audit.cli.exit_codes import exit_codes
from cublas_audit.cli.options import Thresholds, Warm


@exit_codes
def fix_command(
    inputs: list[Path] = typer.Argument(
        ...,
        metavar="RUN",
        help="Run directories with candidates (sweep --candidates, candidates), maps with "
        "--follow-up, or candidates tables.",
        show_default=False,
    ),
    out: Path | None = typer.Option(
        None,
        metavar="DIR",
        help="Write fix.json, the TunableOp file and fix.md here (default: the one run directory).",
    ),
    torch_version: str | None = typer.Option(
        None,
        metavar="VERSION",
        help="The PyTorch version the TunableOp file is for (TunableOp refuses a file of another "
        "version; default: the torch installed here).",
    ),
    torch_trace: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="The PyTorch trace the runs audited (a trace sweep keeps it as trace.json): fixes "
        "only for the model's calls, each naming its op and share of GEMM time.",
    ),
    threshold: Thresholds = None,
) -> None:
    """Fixes for every confirmed finding with a measured faster alternative: cuBLASLt pins
    (fix.json, a PyTorch TunableOp file, C snippets) and shape changes (pad, layout)."""
    from cublas_audit.jobs import fix

    job = fix.FixJob(inputs, out, torch_version, threshold or [], torch_trace=torch_trace)
    fix.run(job, typer.echo)


@exit_codes
def verify_command(
    fix_file: Path = typer.Argument(..., metavar="FIXFILE", help="A fix.json `fix` wrote."),
    out: Path | None = typer.Option(
        None, metavar="FILE", help="Write the verdicts here (default: verify.json beside FIXFILE)."
    ),
    fail_on: bool = typer.Option(
        False,
        "--fail-on",
        help="Exit 1 when a fix does not hold here or computes a wrong result (for CI).",
    ),
    torch: bool = typer.Option(
        False,
        "--torch",
        help="Also run each pin's problem through torch.mm / F.linear with the TunableOp file "
        "beside FIXFILE (torch 2.14+; an older torch: skipped, said in a line): kernel, result, "
        "time.",
    ),
    warm: Warm = False,
) -> None:
    """Re-measure each fix on this GPU: the pin rebuilt and checked by cuBLASLt, default and
    fixed interleaved in two rounds, each result against a float64 product."""
    from cublas_audit.jobs import verify

    code = verify.run(verify.VerifyJob(fix_file, out, fail_on, torch=torch, warm=warm), typer.echo)
    if code:
        raise typer.Exit(code)
