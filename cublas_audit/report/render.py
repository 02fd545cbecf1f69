"""The Markdown report of what was judged (judge.audited: one `Audited` per GPU) -> one section
per GPU, plots beside it. Nothing here judges: findings, candidate verdicts and what could not be
judged arrive with each `Audited`.

Pure table-to-text functions feed a jinja2 template (templates/report.md.j2); the only I/O is
writing the report and its PNG plots. Every cell that holds user or kernel
text goes through `md_text` or `md_code`, so names with `<`, `>`, `|` and `::` render on GitHub.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.files import write_text_atomic
from cublas_audit.judge.audited import Audited, Unjudged
from cublas_audit.judge.finding import SEVERITIES, Finding, plain
from cublas_audit.judge.grouping import every_row, observed, where
from cublas_audit.judge.roofline import L2_RESIDENT
from cublas_audit.judge.rules.frame import CALL_KIND
from cublas_audit.judge.thresholds import LISTED_MAX
from cublas_audit.planning.modes import pipe_name
from cublas_audit.report import candidates_report, repro
from cublas_audit.report.env_header import env_rows, roofline_rows
from cublas_audit.report.markdown import (
    cut_line,
    md_code,
    md_number,
    md_table,
    md_text,
    shorten,
    template,
)
from cublas_audit.report.plots import plot
from cublas_audit.report.stalls import stall_tables
from cublas_audit.report.torch_trace_report import verdict_markdown
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.inputs import Dataset
from cublas_audit.table.rundir import PLOTS_DIR
from cublas_audit.vocabulary import Severity

# ----- report -----------------------------------------------------------------------------------


def findings_json(audited: Sequence[Audited]) -> list[dict[str, Any]]:
    return [f.to_json() for judged in audited for f in judged.findings]


def render_report(audited: Sequence[Audited], plots: Path | None = None) -> str:
    """The whole report of what was judged; with `plots` (a directory), one PNG per GPU is
    written there and linked."""
    datasets = [judged.dataset for judged in audited]
    sections = [_section(judged, plots) for judged in audited]
    counts = {s: sum(f.severity == s for j in audited for f in j.findings) for s in SEVERITIES}
    return template("report.md.j2").render(
        inputs=[md_code(_shown(path), in_table=False) for path in _unique_paths(datasets)],
        counts=counts,
        cut=_cut_summary([s["cut"] for s in sections]),
        side_by_side=side_by_side(audited) if len(audited) > 1 else [],
        sections=sections,
        kernel_names=_kernel_names(audited),
    )


def write_report(audited: Sequence[Audited], out: Path, appendix: str = "") -> Path:
    """Writes the report (and `appendix`, Markdown rendered elsewhere) to `out` and its plots to
    plots/ beside it."""
    out = Path(out)
    text = render_report(audited, out.parent / PLOTS_DIR)
    return write_text_atomic(out, text + appendix)


def _unique_paths(datasets: Sequence[Dataset]) -> list[Path]:
    return list(dict.fromkeys(d.path for d in datasets))


def _shown(path: Path) -> Path:
    """A path as the reader would type it: relative to the working directory when under it."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def _section(judged: Audited, plots: Path | None) -> dict[str, Any]:
    dataset, found, rows = judged.dataset, judged.findings, judged.rows
    flags = _flags(found)
    listed = {s: [f for f in found if f.severity == s] for s in SEVERITIES}
    highs = listed[Severity.high]
    stalls, stalls_cut = stall_tables(rows, judged.stalls)
    dispatch = _dispatch_tables(rows, flags)
    efficiency, efficiency_cut = _efficiency_table(rows)
    return {
        "title": md_text(dataset.title),
        "verdict": verdict_markdown(judged.trace) if judged.trace else "",  # a trace audit's
        "env": md_table(["", ""], [*env_rows(dataset), *roofline_rows(judged.machine)]),
        "findings": {s: [_finding_view(f) for f in listed[s][:LISTED_MAX]] for s in SEVERITIES},
        "findings_cut": {
            s: cut_line(len(listed[s]) - LISTED_MAX, f"{s} findings", JSON_HOLDS)
            for s in SEVERITIES
        },
        "dispatch": [block for block, _ in dispatch],
        "efficiency": efficiency,
        "stalls": stalls,
        "stalls_cut": cut_line(stalls_cut, "flagged cases' stall breakdowns", JSON_HOLDS),
        "command": _command(dataset.env),
        "scripts": [repro.script(f) for f in highs[:LISTED_MAX]],
        "scripts_cut": cut_line(len(highs) - LISTED_MAX, "high findings' scripts", JSON_HOLDS),
        "cut": {
            "findings": sum(max(len(f) - LISTED_MAX, 0) for f in listed.values()),
            "rows": sum(cut for _, cut in dispatch) + efficiency_cut,
        },
        "candidates": _candidates_section(judged),
        "unjudged": [_unjudged(need) for need in judged.unjudged],
        "plot": plot(dataset.title, rows, plots) if plots is not None else None,
    }


def _unjudged(need: Unjudged) -> str:
    rules = " and ".join(md_code(rule, in_table=False) for rule in need.rules)
    return (
        f"{rules} judge {md_text(need.what)} ({md_code(need.column, in_table=False)}); "
        "this table has none"
    )


def _finding_view(finding: Finding) -> dict[str, Any]:
    """A finding's line, and a sub-point per observation its cause explains (judge.grouping)."""
    return {
        "rule": finding.rule,
        "where": md_text(where(finding)),
        "message": md_text(finding.message),
        "workaround": md_text(finding.workaround),
        "observations": [
            {"rule": rule, "where": md_text(said), "message": md_text(message)}
            for rule, said, message in observed(finding)
        ],
    }


def _flags(found: Sequence[Finding]) -> dict[int, list[str]]:
    flags: dict[int, list[str]] = {}
    for finding in found:
        for row in every_row(finding):  # each call the finding's cause explains
            flags.setdefault(row, []).append(finding.rule)
    return flags


def _command(env: EnvRecord) -> str:
    return shlex.join(env.command) if env.command else ""


# ----- tables -----------------------------------------------------------------------------------


def _heading(key: Sequence[Any]) -> str:
    api, routine, mode, batch = key
    return md_text(" · ".join(str(p) for p in (api, routine, mode, f"batch {batch}") if p))


# The columns table cells are made of: converting only these to records keeps 10,000-row
# tables fast (a run's table has 60 columns).
_CELL_COLUMNS = (
    "shape",
    "status",
    "kernel_short",
    "roofline_pct",
    "bound_side",
    "l2_resident",
    "util",
    "tflops_shown",
    "time_ms",
    "ref_time_ms",
)


def _records(rows: pd.DataFrame) -> list[dict[Hashable, Any]]:
    return rows[[c for c in _CELL_COLUMNS if c in rows.columns]].to_dict("records")


def _pipe_header(mode: str) -> str:
    return pipe_name(mode).replace("-pipe", " %")


def _kernel_cell(row: Mapping[Hashable, Any]) -> str:
    status = plain(row.get("status"))
    if status not in (None, "ok"):
        return md_text(status)
    kernel = plain(row.get("kernel_short"))
    return "—" if kernel is None else md_code(shorten(str(kernel)))


def _dispatch_tables(
    rows: pd.DataFrame, flags: Mapping[int, list[str]]
) -> list[tuple[dict[str, str], int]]:
    """A table per call kind, its first LISTED_MAX sizes, and how many rows were cut."""
    tables = []
    for key, group in _cells(rows).groupby(CALL_KIND, sort=True):
        group = group.sort_values(["size", "shape"])
        cut, group = len(group) - LISTED_MAX, group.head(LISTED_MAX)
        pipe = _pipe_header(str(key[2]))
        body = [
            (
                record["shape"],
                _kernel_cell(record),
                md_number(record["util"], 0),
                md_number(record["tflops_shown"], 1),
                _bound_cell(record),
                ", ".join(flags.get(int(index), [])),
            )
            for index, record in zip(group.index, _records(group), strict=True)
        ]
        headers = ["size", "kernel", pipe, "TFLOP/s", "of its bound", "findings"]
        table = _with_cut(md_table(headers, body), cut, "sizes")
        tables.append(({"heading": _heading(key), "table": table}, max(cut, 0)))
    return tables


# Where every finding of a list cut to LISTED_MAX is.
JSON_HOLDS = "`--format json` lists every finding"


def _cells(rows: pd.DataFrame) -> pd.DataFrame:
    """The columns the tables are made of: their rows sorted and cut without a copy of every
    column of the judged table."""
    wanted = [*CALL_KIND, "size", *_CELL_COLUMNS, "ref_fma_pct"]
    return rows[[c for c in dict.fromkeys(wanted) if c in rows.columns]]


def _with_cut(table: str, cut: int, what: str, order: str = "size") -> str:
    """A table and, where it was cut to LISTED_MAX rows, what was cut and where all are."""
    holds = f"the first {LISTED_MAX} by {order} are shown; the dispatch table holds every row"
    line = cut_line(cut, what, holds)
    return f"{table}\n\n{line}" if line else table


def _bound_cell(record: Mapping[Hashable, Any]) -> str:
    """'72 % (memory)': the throughput attained over the roofline bound that applies; 'L2-resident'
    where a memory-bound call ran faster than DRAM allows (judge.roofline); empty where the GPU's
    figures are unknown."""
    if plain(record.get("l2_resident")):
        return L2_RESIDENT
    pct, side = plain(record.get("roofline_pct")), plain(record.get("bound_side"))
    return "" if pct is None or side is None else f"{pct:.0f} % ({side})"


def _efficiency_table(rows: pd.DataFrame) -> tuple[str, int]:
    """The reference against cuBLAS, its first LISTED_MAX rows, and how many were cut."""
    if "ref_time_ms" not in rows.columns:
        return "", 0
    timed = _cells(rows).dropna(subset=["time_ms", "ref_time_ms"])
    timed = timed.sort_values([*CALL_KIND, "size"])
    if timed.empty:
        return "", 0
    cut, timed = len(timed) - LISTED_MAX, timed.head(LISTED_MAX)
    ref_fma = timed["ref_fma_pct"] if "ref_fma_pct" in timed.columns else [None] * len(timed)
    body = [
        (
            _heading(key),
            record["shape"],
            _kernel_cell(record),
            md_number(record["time_ms"], 3),
            md_number(record["ref_time_ms"], 3),
            f"{record['time_ms'] / record['ref_time_ms']:.0%}",
            md_number(record["util"], 0),
            md_number(ref, 0),
        )
        for key, record, ref in zip(
            timed[CALL_KIND].itertuples(index=False, name=None),
            _records(timed),
            ref_fma,
            strict=True,
        )
    ]
    headers = ["call", "size", "cuBLAS kernel", "cuBLAS ms", "reference ms", "reference eff"]
    table = md_table([*headers, "cuBLAS FMA %", "reference FMA %"], body)
    return _with_cut(table, cut, "rows", "call and size"), max(cut, 0)


def side_by_side(audited: Sequence[Audited]) -> list[dict[str, str]]:
    """Per call kind present on two or more GPUs: size | A kernel | A % | B kernel | B % ..."""
    datasets = [judged.dataset for judged in audited]
    prepared = [judged.rows[~judged.rows["is_loop"]] for judged in audited]
    # Column names as short as the article's ("5090 kernel"): the label, unless two share it.
    labels = [d.gpu_label for d in datasets]
    names = [d.gpu_label if labels.count(d.gpu_label) == 1 else d.title for d in datasets]
    shared = Counter(
        key for rows in prepared for key in set(rows[CALL_KIND].itertuples(index=False, name=None))
    )
    tables = []
    for key in sorted(k for k, count in shared.items() if count > 1):
        columns = [_gpu_column(rows, key) for rows in prepared]
        present = [(name, c) for name, c in zip(names, columns, strict=True) if c is not None]
        merged = pd.concat([c for _, c in present], axis=1).sort_index()
        headers = ["size"]
        for name, _ in present:
            headers += [f"{md_text(name)} kernel", _pipe_header(str(key[2]))]
        cut, merged = len(merged) - LISTED_MAX, merged.head(LISTED_MAX)
        body = [
            [shape, *values]
            for (_, shape), values in zip(
                merged.index, merged.fillna("").values.tolist(), strict=True
            )
        ]
        table = _with_cut(md_table(headers, body), cut, "sizes")
        tables.append({"heading": _heading(key), "table": table})
    return tables


def _gpu_column(rows: pd.DataFrame, key: tuple[Any, ...]) -> pd.DataFrame | None:
    mask = pd.Series(True, index=rows.index)
    for column, value in zip(CALL_KIND, key, strict=True):
        mask &= rows[column] == value
    group = rows[mask]
    if group.empty:
        return None
    cells = pd.DataFrame(
        {
            "kernel": [_kernel_cell(r) for r in _records(group)],
            "util": [md_number(u, 0) for u in group["util"]],
        },
        index=pd.MultiIndex.from_arrays([group["size"], group["shape"]]),
    )
    return cells[~cells.index.duplicated()]


def _candidates_section(judged: Audited) -> str:
    """The candidate audit's summary, flagged cases and repros, under the GPU's section."""
    if judged.candidates is None:
        return ""
    return candidates_report.render_markdown(judged.candidates, level=3).rstrip()


# ----- kernel names and plots -------------------------------------------------------------------


def _kernel_names(audited: Sequence[Audited]) -> str:
    """Each full kernel name once, next to the short name the tables use."""
    pairs: dict[str, str] = {}
    for judged in audited:
        # each pair once, in the order of its first row (a map repeats a few dozen)
        rows = judged.rows[["kernel_short", "kernel"]].dropna(subset=["kernel"]).drop_duplicates()
        for short, full in zip(rows["kernel_short"], rows["kernel"], strict=True):
            if str(full) != str(short):
                pairs.setdefault(str(full), str(short))
    if not pairs:
        return ""
    body = sorted((md_code(shorten(short)), md_code(full)) for full, short in pairs.items())
    return md_table(["short", "full name as ncu prints it"], body)


def _cut_summary(cuts: Sequence[Mapping[str, int]]) -> str:
    """What the Markdown leaves out of a large table's report, said once at its top."""
    findings, rows = (sum(cut[what] for cut in cuts) for what in ("findings", "rows"))
    if not findings and not rows:
        return ""
    counted = ((findings, "findings"), (rows, "table rows"))
    left_out = " and ".join(f"{count:,} {what}" for count, what in counted if count)
    return (
        f"This report lists at most {LISTED_MAX} findings of each severity and {LISTED_MAX} rows "
        f"of each table: {left_out} are not shown. `cublas-audit report --format json` lists "
        "every finding; the dispatch table itself holds every row."
    )
