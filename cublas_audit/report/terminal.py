"""The report as a person reads it in a terminal (rich): the findings first, then each GPU's
dispatch grid, size by batch, a cell the dispatched kernel with its pipe utilization and TFLOP/s.
Text from tables is printed as text, never as rich markup.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cublas_audit.judge.finding import SEVERITIES, Finding
from cublas_audit.judge.rules import audit, prepare
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.planning.modes import pipe_name
from cublas_audit.report.markdown import shorten
from cublas_audit.table.dispatch import plain
from cublas_audit.table.inputs import Dataset

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "info": "cyan"}
GRID_KEY = ["api", "routine", "mode"]


def show(
    datasets: Sequence[Dataset], thresholds: Thresholds, console: Console | None = None
) -> None:
    console = console or Console()
    found = [audit(d.frame, thresholds, d.candidates) for d in datasets]
    console.print(findings_table(datasets, found))
    for dataset in datasets:
        for table in dispatch_grids(dataset):
            console.print(table)


def findings_table(datasets: Sequence[Dataset], found: Sequence[list[Finding]]) -> Table:
    counts = {s: sum(f.severity == s for group in found for f in group) for s in SEVERITIES}
    title = "Findings: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    table = Table(title=title, title_justify="left", show_lines=True, expand=True)
    for column, ratio in (("severity", 1), ("GPU", 1), ("rule", 2), ("where", 2), ("what", 6)):
        table.add_column(column, overflow="fold", ratio=ratio)
    pairs = [(d, f) for d, group in zip(datasets, found, strict=True) for f in group]
    for dataset, f in sorted(pairs, key=lambda pair: SEVERITIES.index(pair[1].severity)):
        where = " ".join(p for p in (f.api, f.routine, f.mode) if p) + f", batch {f.batch}"
        table.add_row(
            Text(f.severity, style=SEVERITY_STYLE[f.severity]),
            Text(dataset.gpu_label),
            Text(f.rule),
            Text(where),
            Text(f.message),
        )
    return table


def dispatch_grids(dataset: Dataset) -> list[Table]:
    """One table per (api, routine, mode): size rows, batch columns."""
    rows = prepare(dataset.frame)
    rows = rows[~rows["is_loop"]]
    tables = []
    for (api, routine, mode), group in rows.groupby(GRID_KEY, sort=True):
        pipe = pipe_name(str(mode)).replace("-pipe", " %")
        title = f"{dataset.title} · {api} {routine} {mode} (kernel, {pipe}, TFLOP/s)"
        table = Table(title=Text(title), title_justify="left")
        batches = sorted(group["batch"].unique())
        table.add_column("size")
        for batch in batches:
            table.add_column(f"batch {batch}", overflow="fold")
        for (_size, shape), cells in group.groupby(["size", "shape"], sort=True):
            by_batch = {row["batch"]: cell(row) for _, row in cells.iterrows()}
            table.add_row(Text(str(shape)), *(Text(by_batch.get(b, "")) for b in batches))
        tables.append(table)
    return tables


def cell(row: pd.Series) -> str:
    status = plain(row.get("status"))
    if status not in (None, "ok"):
        return str(status)
    parts = [shorten(str(row["kernel_short"]), 28)] if plain(row["kernel_short"]) else ["—"]
    if plain(row["util"]) is not None:
        parts.append(f"{row['util']:.0f}%")
    if plain(row["tflops_shown"]) is not None:
        parts.append(f"{row['tflops_shown']:.1f}")
    return " ".join(parts)
