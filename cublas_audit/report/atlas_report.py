"""The atlas of one mode of a dispatch map: atlas.md beside its tables (table.atlas_files), the
map's findings in compact form (findings.json) and its pictures. It is what gets bundled of a map
whose own tables are too large to bundle (a 262,144-problem map's dispatch.csv is ~130 MB).

Nothing is judged here: the findings and the follow-up's verdicts arrive judged
(judge.map_audit); this module only renders them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.files import write_text_atomic
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.map_audit import MapAudit
from cublas_audit.judge.rules.maps import MAP_SERIES
from cublas_audit.report import map_plots
from cublas_audit.report.env_header import env_rows
from cublas_audit.report.map_report import finding_series, map_time, within_noise
from cublas_audit.report.markdown import md_code, md_fence, md_number, md_table, md_text, shorten
from cublas_audit.table.atlas_files import (
    ATLAS_REPORT,
    GRID_FILE,
    KERNELS_FILE,
    Grid,
    grid_of,
    kernel_table,
    start_atlas,
    write_atlas_json,
    write_atlas_tables,
)
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.rundir import FINDINGS_FILE, PLOTS_DIR, TIME_RESULTS, table_file
from cublas_audit.vocabulary import FollowUp

ATLAS_K = (64, 512, 2048, 4096)  # the K of the plane pictures' panels (or the nearest present)
KERNELS_SHOWN = 40  # rows of atlas.md's kernel table; kernels.csv has every kernel
FINDINGS_SHOWN = 20  # atlas.md's list, largest effect first
FINDINGS_KEPT = 2000  # findings.json's; the map run's own findings.json has every one


@dataclass(frozen=True)
class Atlas:
    """One mode's atlas as computed: its grid, kernel table and findings (largest effect first,
    each with the follow-up's verdict: HOLDS, NOT_CONFIRMED, or None where not followed up)."""

    judged: MapAudit
    rows: pd.DataFrame  # the map's prepared rows (rules.prepare) of this mode
    grid: Grid
    kernels: pd.DataFrame
    found: list[tuple[Finding, FollowUp | None]]
    command: Sequence[str]  # the atlas's own command line


def atlas_of(judged: MapAudit, rows: pd.DataFrame, command: Sequence[str]) -> Atlas:
    """The atlas of the prepared rows of one mode of a judged map."""
    grid = grid_of(rows)
    named = rows.dropna(subset=["kernel_name"])
    shorts = dict(zip(named["kernel_name"], named["kernel_short"].astype(str), strict=True))
    kernels = kernel_table(grid.frame, grid.kernels, shorts, map_plots.throughput(rows))
    mode = str(rows["mode"].iloc[0])
    found = [(f, said) for f, said in judged.with_verdicts() if f.mode == mode]
    found.sort(key=lambda pair: -pair[0].effect)
    return Atlas(judged, rows, grid, kernels, found, command)


def write_atlas(atlas: Atlas, target: Path) -> list[Path]:
    """grid.csv.gz, kernels.csv, findings.json, plots/, atlas.md and atlas.json into `target`,
    those two last (table.atlas_files: a directory without them is an atlas cut short)."""
    start_atlas(target)
    written = write_atlas_tables(target, atlas.grid, atlas.kernels)
    records = [_record(finding, verdict) for finding, verdict in atlas.found[:FINDINGS_KEPT]]
    text = json.dumps(json_ready(records), indent=1) + "\n"
    written.append(write_text_atomic(target / FINDINGS_FILE, text))
    flagged = {label for finding, _ in atlas.found for label in finding.rows}
    pictures = map_plots.draw(atlas.rows, target / PLOTS_DIR, flagged, ATLAS_K)
    written.append(write_text_atomic(target / ATLAS_REPORT, render(atlas, target, pictures)))
    written.append(write_atlas_json(target, atlas.grid, _meta(atlas)))
    return written


def _meta(atlas: Atlas) -> dict[str, Any]:
    dataset = atlas.judged.dataset
    return {
        "source": str(dataset.path),
        "mode": str(atlas.rows["mode"].iloc[0]),
        "problems": len(atlas.rows),
        "kernels": len(atlas.grid.kernels),
        "findings": {"total": len(atlas.found), "written": min(len(atlas.found), FINDINGS_KEPT)},
        "command": list(atlas.command),
        "env": dict(dataset.env.raw),
    }


def _record(finding: Finding, verdict: str | None) -> dict[str, Any]:
    """A finding as the atlas keeps it: what and where, its effect, the follow-up's verdict."""
    return {
        "rule": finding.rule,
        "series": finding_series(finding),
        "sizes": finding.sizes,
        "kernel": finding.kernel,
        "effect": finding.effect,
        "message": finding.message,
        "workaround": finding.workaround,
        "follow_up": verdict,
    }


# ----- atlas.md ---------------------------------------------------------------------------------


def render(atlas: Atlas, target: Path, pictures: Sequence[map_plots.Picture]) -> str:
    dataset = atlas.judged.dataset
    mode = str(atlas.rows["mode"].iloc[0])
    parts = [
        f"# Dispatch atlas: {md_text(dataset.title)}, {md_text(mode)}",
        md_table(["", ""], env_rows(dataset)),
        "## Summary",
        _summary(atlas),
        "## Kernels and where each was chosen",
        _kernels(atlas.kernels),
        "## Findings",
        _findings(atlas.found),
        "## Pictures",
        *(f"![{md_text(p.caption)}]({p.path})" for p in pictures),
        "## What the atlas keeps and leaves out",
        _kept(atlas, target),
        "## Regenerate",
        _regenerate(atlas),
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


def _summary(atlas: Atlas) -> str:
    rows = atlas.rows
    status = rows["status"].fillna("not-run").value_counts()
    keys = rows[MAP_SERIES].drop_duplicates().itertuples(index=False, name=None)
    series = sorted({map_plots.series_name(key) for key in keys})
    more = f"; {len(series) - 5} more" if len(series) > 5 else ""
    items = [
        ("problems", f"{len(rows)} ({', '.join(f'{n} {s}' for s, n in status.items())})"),
        *((dim.upper(), _axis(rows[dim])) for dim in ("m", "n", "k")),
        ("series", "; ".join(series[:5]) + more),
        ("kernels dispatched", str(len(atlas.grid.kernels))),
        ("observer", atlas.judged.dataset.env.observer or "not recorded"),
        ("map time", map_time(atlas.judged.dataset.env)),
    ]  # fmt: skip
    return md_table(["", ""], [(name, md_text(value)) for name, value in items])


def _axis(values: pd.Series) -> str:
    distinct = values.nunique()
    return f"{int(values.min())} .. {int(values.max())} ({distinct} values)"


def _kernels(kernels: pd.DataFrame) -> str:
    """The kernels most often chosen: their share, throughput and the region they cover."""
    if kernels.empty:
        return "No kernel was observed (an events-only map times calls, it names no kernel)."
    table = [_kernel_row(row) for row in kernels.head(KERNELS_SHOWN).itertuples()]
    headers = ["id", "kernel", "problems", "share", "TFLOP/s median", "p10 .. p90", "M", "N", "K"]
    shown = md_table(headers, table)
    more = len(kernels) - KERNELS_SHOWN
    note = f"{more} more kernels, and each kernel's full name, in {KERNELS_FILE}."
    return shown + "\n\n" + (note if more > 0 else f"Each kernel's full name is in {KERNELS_FILE}.")


def _kernel_row(row: Any) -> tuple[str, ...]:
    return (
        str(row.id),
        md_code(shorten(str(row.short))),
        str(row.problems),
        f"{100 * row.share:.1f} %",
        md_number(row.tflops_median, 1),
        f"{md_number(row.tflops_p10, 1)} .. {md_number(row.tflops_p90, 1)}",
        *(f"{getattr(row, dim + '_min')} .. {getattr(row, dim + '_max')}" for dim in "mnk"),
    )


def _findings(found: Sequence[tuple[Finding, FollowUp | None]]) -> str:
    """How many of each rule and what the follow-up made of them, then the largest ones."""
    if not found:
        return "The map found no size inversion beyond its noise model and no dispatch cliff."
    rules = pd.Series([finding.rule for finding, _ in found]).value_counts()
    counted = ", ".join(f"{count} {md_text(rule)}" for rule, count in rules.items())
    followed = [verdict for _, verdict in found if verdict is not None]
    held = sum(verdict is FollowUp.holds for verdict in followed)
    tiers = within_noise([finding for finding, _ in found], " Of them ")
    lines = [f"{len(found)} findings: {counted}.{tiers}" + ("." if tiers else "")]
    if followed:
        lines.append(
            f"The follow-up measured {len(followed)} again at full length: {held} hold, "
            f"{len(followed) - held} not confirmed."
        )
    listed = [
        f"{i}. {_finding_item(finding, verdict)}"
        for i, (finding, verdict) in enumerate(found[:FINDINGS_SHOWN], start=1)
    ]
    kept = min(len(found), FINDINGS_KEPT)
    where = (
        f"All {len(found)} are in {FINDINGS_FILE}."
        if kept == len(found)
        else f"The largest {kept} are in {FINDINGS_FILE}; the map run's own has all {len(found)}."
    )
    return "\n\n".join([" ".join(lines), "\n".join(listed), where])


def _finding_item(finding: Finding, verdict: str | None) -> str:
    """'dispatch-cliff, 576x4096x3072 (cublas cublasGemmEx bf16 b1), effect 44 %: message.
    Follow-up: verdict.'"""
    said = (
        f"{finding.rule}, {finding.sizes[0]} ({finding_series(finding)}), effect "
        f"{100 * finding.effect:.0f} %: {finding.message}"
    )
    return md_text(said + (f" Follow-up: {verdict}." if verdict else ""))


def _kept(atlas: Atlas, target: Path) -> str:
    """The atlas's files and their sizes, and what of the map run is not in them."""
    run = atlas.judged.dataset.path
    columns = ["m", "n", "k", *atlas.grid.varying, "kernel id", "kernel time (ms, 4 digits)"]
    kept = [
        f"{GRID_FILE} ({_size(target / GRID_FILE)}): {', '.join(columns)}, status",
        f"{KERNELS_FILE} ({_size(target / KERNELS_FILE)}): each kernel's full name and region",
    ]
    width = len(atlas.judged.dataset.frame.columns)
    left = [
        f"{table_file(run).name} ({_size(table_file(run))}, {width} columns): the call times and "
        "their distributions, clocks and power, the launch geometry, the split-K reductions "
        "traced beside each kernel",
        f"{TIME_RESULTS} ({_size(run / TIME_RESULTS)}): the probe's record of each case",
        "the follow-up's run directory (its report.md has the counters, stalls and candidates)",
    ]
    return "\n\n".join(
        [
            "Kept, beside this file:",
            _bullets(kept),
            f"Left out, in the map's run directory {md_code(run, in_table=False)}:",
            _bullets(left),
        ]
    )


def _bullets(items: Sequence[str]) -> str:
    return "\n".join(f"- {md_text(item)}" for item in items)


def _size(path: Path) -> str:
    """A file's size in words; a gzipped copy's where only that is there."""
    for candidate in (path, path.with_name(path.name + ".gz")):
        if candidate.is_file():
            size = candidate.stat().st_size
            gz = " gzipped" if candidate != path else ""
            return f"{size / 1e6:.1f} MB{gz}" if size >= 1e5 else f"{size / 1e3:.1f} kB{gz}"
    return "not present"


def _regenerate(atlas: Atlas) -> str:
    command = atlas.judged.dataset.env.command
    mapped = shlex.join(command) if command is not None else "not recorded"
    return "\n\n".join(
        [
            "The map and its full tables (on the GPU):",
            md_fence(mapped, "sh"),
            "This atlas, from the map's run directory:",
            md_fence(shlex.join(atlas.command), "sh"),
        ]
    )
