"""Atomic file writers: every file a stage leaves behind (plan.json, the tables, reports, env.json)
is written through a temporary file and a rename, so a crash or a Ctrl-C never leaves half a file
that a later `report`, `diff` or `--resume` would read back.

A bottom-level module (beside errors.py), so that the plan and the table stages both write
through it without either importing the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # for the annotation only: planning/cases.py, which the probe child imports at start-up,
    # writes plan.json through this module and must not pull pandas in
    import pandas as pd


def write_text_atomic(path: Path, text: str) -> Path:
    """Writes through a temporary file and a rename: a crash never leaves half a file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def write_csv_atomic(frame: pd.DataFrame, path: Path) -> Path:
    """A table as CSV (or Parquet for a .parquet path), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".parquet":
        frame.to_parquet(tmp, index=False)
    else:
        frame.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(path)
    return path
