"""`env`: what this machine has for an audit."""

from __future__ import annotations

import typer

from cublas_audit.cli.exit_codes import exit_codes
from cublas_audit.cli.options import TextOrJson, print_json


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
