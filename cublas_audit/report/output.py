"""Where a report goes: the output path checked against the inputs before anything is read or
written (an output path never names an input: a report cannot overwrite the table it reads), and
the file a terminal report writes its full Markdown to (jobs.report chooses among them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cublas_audit.errors import AuditError
from cublas_audit.table.rundir import REPORT_FILE, TABLE_FILE

TERMINAL_REPORT = Path("cublas-audit-report") / REPORT_FILE


def check_output(out: Path, inputs: Sequence[Path]) -> None:
    """An output file that is an input, a file inside an input run directory other than its
    report, or a directory, is refused before anything is read or written."""
    target = out.resolve()
    if out.is_dir():
        raise AuditError(f"--out: {out} is a directory; name the report file")
    parent = next((p for p in target.parents if p.exists()), Path("/"))
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise AuditError(f"--out: {out} cannot be written here")
    for given in inputs:
        source = Path(given).resolve()
        table = source / TABLE_FILE if source.is_dir() else source
        inside_run = source.is_dir() and source in target.parents and target.name != REPORT_FILE
        if target in (table, source) or inside_run:
            raise AuditError(f"--out: {out} would overwrite the input {given}")
