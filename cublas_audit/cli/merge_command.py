"""`merge`: shard run directories (`--shard I/N`) joined into one run directory."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from cublas_audit.cli.exit_codes import exit_codes


@exit_codes
def merge_command(
    runs: list[Path] = typer.Argument(..., metavar="RUN", help="The shards' run directories."),
    out: Path = typer.Option(..., metavar="DIR", help="The merged run directory (new or empty)."),
    allow_mixed: bool = typer.Option(
        False,
        "--allow-mixed",
        help="Merge shards of different cuBLAS, driver or tool versions, probe settings or GPU "
        "models (reported per model).",
    ),
) -> None:
    """Join the run directories of `--shard I/N` runs of one plan into one run and its report."""
    from cublas_audit.jobs import merge

    job = merge.MergeJob(list(runs), out, allow_mixed, ["cublas-audit", *sys.argv[1:]])
    result = merge.run(job)
    typer.echo(f"run directory: {result.run_dir}\nreport: {result.report}")
