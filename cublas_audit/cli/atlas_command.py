"""`atlas`: map runs summarised small enough to bundle (the full tables stay in the runs)."""

from __future__ import annotations

from pathlib import Path

import typer

from cublas_audit.cli.exit_codes import exit_codes


@exit_codes
def atlas_command(
    runs: list[Path] = typer.Argument(
        ..., metavar="MAP_RUN", help="Run directories of `map` (one mode each, or several)."
    ),
    out: Path = typer.Option(..., metavar="DIR", help="Write each mode's atlas to DIR/<mode>/."),
) -> None:
    """Each mode of each map as a few MB: every problem's kernel (id) and kernel time, the kernels
    and where each was chosen, the findings, pictures at K = 64, 512, 2048, 4096 and atlas.md."""
    from cublas_audit.jobs import atlas

    atlas.run(atlas.AtlasJob(list(runs), out), typer.echo)
