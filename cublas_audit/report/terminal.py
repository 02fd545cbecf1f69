"""The report as a person reads it in a terminal (rich): the findings first, then each GPU's
dispatch grid, size by batch, a cell the dispatched kernel with its pipe utilization and TFLOP/s.
The utilization is of the pipe the kernel computes on (report.summary.kernel_pipe: tensor % for a
tensor-core kernel, FMA % for an FFMA one), and the grid's heading names that pipe.
Text from tables is printed as text, never as rich markup, and through `safe_text` alone: a
table's label or kernel name holding escape sequences (clear the screen, set the window title)
reaches the terminal written out, as Markdown gets it (markdown.visible).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

import pandas as pd
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from cublas_audit.judge.audited import Audited
from cublas_audit.judge.finding import SEVERITIES, Finding
from cublas_audit.judge.grouping import observed, where
from cublas_audit.judge.thresholds import LISTED_MAX
from cublas_audit.report.markdown import cut_line, shorten, visible
from cublas_audit.report.summary import kernel_pipe, pipe_heading, pipe_util
from cublas_audit.table.dispatch import plain
from cublas_audit.table.inputs import Dataset

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "info": "cyan"}
GRID_KEY = ["api", "routine", "mode"]


def safe_text(value: object, style: str = "") -> Text:
    """The one way table text reaches the terminal: control characters written out."""
    return Text(visible(value), style=style)


def show(audited: Sequence[Audited], console: Console | None = None) -> None:
    console = console or Console()
    datasets = [judged.dataset for judged in audited]
    found = [judged.findings for judged in audited]
    listed, cut = _listed(found)
    if console.width >= WIDE:
        console.print(findings_table(datasets, listed, counted=found))
    else:  # a table's columns would split words: one finding a paragraph instead
        console.print(findings_list(datasets, listed, counted=found))
    if cut:
        console.print(safe_text(cut_line(cut, "findings", "`--format json` lists every one")))
    for judged in audited:
        for table in dispatch_grids(judged.dataset, judged.rows):
            console.print(table)


def _listed(found: Sequence[list[Finding]]) -> tuple[list[list[Finding]], int]:
    """Each input's findings, at most LISTED_MAX of each severity over all of them (a dense
    map has tens of thousands), and how many were left out."""
    taken = dict.fromkeys(SEVERITIES, 0)
    listed = []
    for group in found:
        kept = []
        for finding in group:
            if taken[finding.severity] < LISTED_MAX:
                taken[finding.severity] += 1
                kept.append(finding)
        listed.append(kept)
    cut = sum(len(group) for group in found) - sum(len(group) for group in listed)
    return listed, cut


def findings_table(
    datasets: Sequence[Dataset],
    found: Sequence[list[Finding]],
    counted: Sequence[list[Finding]] | None = None,
) -> Table:
    """The findings, a row each; the title counts `counted` (the findings before a cut)."""
    title = _counts_title(found if counted is None else counted)
    table = Table(title=title, title_justify="left", show_lines=True, expand=True)
    pairs = [(d, f) for d, group in zip(datasets, found, strict=True) for f in group]
    rows = [
        (f.severity, dataset.gpu_label, f.rule, where(f), _what(f))
        for dataset, f in sorted(pairs, key=lambda pair: SEVERITIES.index(pair[1].severity))
    ]
    for column, ratio in FINDING_COLUMNS:
        table.add_column(column, overflow="fold", ratio=ratio)
    for row in rows:
        table.add_row(safe_text(row[0], SEVERITY_STYLE[row[0]]), *map(safe_text, row[1:4]), row[4])
    return table


def findings_list(
    datasets: Sequence[Dataset],
    found: Sequence[list[Finding]],
    counted: Sequence[list[Finding]] | None = None,
) -> Group:
    """The findings for a narrow terminal: a heading line and the message, wrapped at spaces."""
    pairs = [(d, f) for d, group in zip(datasets, found, strict=True) for f in group]
    parts: list[Text] = [Text(_counts_title(found if counted is None else counted))]
    for dataset, f in sorted(pairs, key=lambda pair: SEVERITIES.index(pair[1].severity)):
        head = safe_text(f.severity, SEVERITY_STYLE[f.severity])
        head.append_text(safe_text(f" · {dataset.gpu_label} · {f.rule} · {where(f)}"))
        parts += [Text(""), head, _what(f)]
    return Group(*parts)


WIDE = 100  # columns from which the findings read well as a table
FINDING_COLUMNS = (("severity", 1), ("GPU", 1), ("rule", 2), ("where", 2), ("what", 6))


def _counts_title(found: Sequence[list[Finding]]) -> str:
    counts = {s: sum(f.severity == s for group in found for f in group) for s in SEVERITIES}
    return "Findings: " + ", ".join(f"{n} {s}" for s, n in counts.items())


def _what(finding: Finding) -> Text:
    """The message, then a line per observation its cause explains (judge.grouping); each line
    through `safe_text` (a newline inside one is written out)."""
    what = safe_text(finding.message)
    for rule, calls, message in observed(finding):
        what.append("\n")
        what.append_text(safe_text(f"+ also {rule} · {calls}: {message}"))
    return what


def dispatch_grids(dataset: Dataset, rows: pd.DataFrame) -> list[Table]:
    """One table per (api, routine, mode): size rows, batch columns (`rows`: the prepared
    table, as judged)."""
    rows = rows[~rows["is_loop"]]
    tables = []
    for (api, routine, mode), group in rows.groupby(GRID_KEY, sort=True):
        # a row's pipe is its kernel's: the heading's from each distinct kernel's first row
        named = group[group["kernel_short"].notna()]
        kernels = named.drop_duplicates([c for c in PIPE_OF if c in named.columns])
        with_kernel = {_pipe(row) for _, row in kernels.iterrows()}
        heading = pipe_heading(with_kernel or {kernel_pipe(None, mode)})
        title = f"{dataset.title} · {api} {routine} {mode} (kernel, {heading}, TFLOP/s)"
        sizes = group.groupby(["size", "shape"], sort=True)
        cut = cut_line(sizes.ngroups - LISTED_MAX, "sizes", "the dispatch table holds every row")
        table = Table(title=safe_text(title), title_justify="left", caption=cut or None)
        batches = sorted(group["batch"].unique())
        table.add_column("size")
        for batch in batches:
            table.add_column(f"batch {batch}", overflow="fold")
        for (_size, shape), cells in islice(sizes, LISTED_MAX):  # the first, smallest sizes
            by_batch = {row["batch"]: cell(row, _pipe(row)) for _, row in cells.iterrows()}
            table.add_row(safe_text(shape), *(safe_text(by_batch.get(b, "")) for b in batches))
        tables.append(table)
    return tables


# The columns a row's pipe is read from (`_pipe`).
PIPE_OF = ("kernel_name", "kernel_short", "mode")


def _pipe(row: pd.Series) -> str:
    """The pipe of the row's kernel (its full name, else its short one), else of its mode."""
    name = row.get("kernel_name")
    return kernel_pipe(name if plain(name) else row.get("kernel_short"), row["mode"])


def cell(row: pd.Series, pipe: str | None = None) -> str:
    """`kernel util% TFLOP/s`: the utilization of `pipe` (by default the kernel's own), none
    where the table lacks that pipe's column."""
    status = plain(row.get("status"))
    if status not in (None, "ok"):
        return str(status)
    parts = [shorten(str(row["kernel_short"]), 28)] if plain(row["kernel_short"]) else ["—"]
    util = pipe_util(row, pipe or _pipe(row))
    if util is not None:
        parts.append(f"{util:.0f}%")
    if plain(row["tflops_shown"]) is not None:
        parts.append(f"{row['tflops_shown']:.1f}")
    return " ".join(parts)
