"""Where a report goes: the output path checked against the inputs before anything is read or
written (an output path never names an input: a report cannot overwrite the table it reads), and
the file a terminal report writes its full Markdown to (jobs.report chooses among them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cublas_audit.errors import AuditError
from cublas_audit.files import check_target, inode_keys
from cublas_audit.table.rundir import (
    CANDIDATES_FILE,
    ENV_FILE,
    PLAN_FILE,
    PLOTS_DIR,
    REPORT_FILE,
    TABLE_COLUMNAR,
    TABLE_FILE,
    table_file,
)

TERMINAL_REPORT = Path("cublas-audit-report") / REPORT_FILE


def check_output(
    out: Path, inputs: Sequence[Path], plots: bool = False, option: str | None = "--out"
) -> None:
    """Refused before anything is read or written (one line, exit 2): an output that cannot be
    written (a name too long, under a file, a directory, a FIFO or a device, no permission), that
    is an input under any name (the same path, a symlink, a hard link), that lies inside an input
    run directory other than as its report; with `plots`, a plots/ beside it that is not a
    directory or that holds an input where a plot would go. `option` names where `out` came
    from (None: nobody gave it, the terminal report's own file), so the error says what to do."""
    said = option or "the full report"
    target = out.resolve()
    for given in inputs:
        source = Path(given).resolve()
        table = table_file(source) if source.is_dir() else source
        inside_run = source.is_dir() and source in target.parents and target.name != REPORT_FILE
        if target in (table, source) or inside_run:
            raise AuditError(f"{said}: {out} would overwrite the input {given}")
    read = inode_keys(input_files(inputs))
    if inode_keys([out]) & read:
        raise AuditError(f"{said}: {out} would overwrite an input (the same file, another name)")
    check_target(out)
    parent = next((p for p in target.parents if p.exists()), Path("/"))
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        if option is None:
            raise AuditError(
                f"cannot write the full report to {target}: {parent} is not writable; give --out "
                "FILE to write it elsewhere, or --format md for the Markdown on stdout"
            )
        raise AuditError(f"{option}: {out} cannot be written here")
    if plots:
        _check_plots(out.parent / PLOTS_DIR, read, said)


def check_output_dir(directory: Path, names: Sequence[str], inputs: Sequence[Path]) -> None:
    """A directory that several outputs go into (`fix`), refused before anything is read or
    written (one line, exit 2): an input, or another file, where the directory should be; one of
    its outputs `names` an input under any name, or not writable as a file."""
    read = inode_keys(input_files(inputs))
    if directory.exists() and not directory.is_dir():
        what = "is an input of fix, not" if inode_keys([directory]) & read else "is not"
        raise AuditError(f"--out: {directory} {what} a directory ({', '.join(names)} go there)")
    for name in names:
        check_target(directory / name, read)


def _check_plots(plots: Path, read: frozenset[tuple[int, int]], said: str) -> None:
    """plots/ beside the report: a directory (or nothing yet), none of its pictures an input."""
    if plots.exists() and not plots.is_dir():
        raise AuditError(f"{said}: {plots} is not a directory (the report's plots go there)")
    if plots.is_dir():
        for picture in sorted(plots.glob("*.png")):
            if inode_keys([picture]) & read:
                raise AuditError(f"{said}: the plot {picture} would overwrite an input")


def input_files(inputs: Sequence[Path]) -> list[Path]:
    """The files a report reads: each table given, and each run directory's table, env.json,
    plan.json and candidates.csv."""
    files: list[Path] = []
    for given in map(Path, inputs):
        if given.is_dir():
            names = (TABLE_FILE, TABLE_COLUMNAR, ENV_FILE, PLAN_FILE, CANDIDATES_FILE)
            files += [given / name for name in names]
        else:
            files.append(given)
    return files
