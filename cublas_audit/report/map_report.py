"""The dispatch map's report (report.md of a map run): what was mapped and how fast, the kernels
and where they switch, the pictures, the map rules' findings, and the follow-up's evidence for
each finding it took deep. findings.json beside it holds every finding, not only those shown
(findings.json.gz for a map of table.rundir.COMPACT_FINDINGS or more).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.files import write_text_atomic
from cublas_audit.forked import Forks
from cublas_audit.judge.candidates import LAYOUT_UNKNOWN, CandidateVerdicts
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.map_audit import FollowUpVerdicts, MapAudit, case_ids
from cublas_audit.judge.rules.frame import layout_fields
from cublas_audit.judge.rules.maps import MAP_SERIES
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.planning.cases import Case
from cublas_audit.report import map_plots
from cublas_audit.report.env_header import env_rows
from cublas_audit.report.markdown import md_code, md_number, md_table, md_text, shorten
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.rundir import (
    COMPACT_FINDINGS,
    FINDINGS_MEMBER,
    FOLLOW_UP_DIR,
    PLOTS_DIR,
    REPORT_FILE,
    findings_member,
    findings_name,
    write_compact_findings,
    write_findings,
)
from cublas_audit.vocabulary import Verdict

FINDINGS_SHOWN = 40  # per rule; findings.json has them all
KERNELS_SHOWN = 25
# at most: findings.json.gz's members are made in this many forks at once, each a run of them
# (a full map's 86,000 findings: ~3.5 s of CPU here, their records, cells, text and compression,
# under the plane picture's ~2 s in 4; each fork of this process, a full map's GBs, costs it
# ~60 ms here)
FINDINGS_FORKS = 4


def write_map_report(run_dir: Path, judged: MapAudit) -> Path:
    """run_dir/report.md, its pictures under plots/ and every finding in findings.json."""
    run_dir = Path(run_dir)
    found = judged.findings
    # a large map's pictures, its text and its findings' JSON made in forks at once, each fork
    # started once this process has read what it reads of every finding and row (after a fork,
    # each page this process touches is copied: a full map's flagged rows took ~1 s of CPU so)
    pictures = _pictures(judged, run_dir / PLOTS_DIR)
    members = _findings_members(found) if len(found) >= COMPACT_FINDINGS else None
    text = _joined(judged, pictures)
    if members is not None:
        write_compact_findings(run_dir, [m for made in members.results() for m in made])
    else:
        write_findings(run_dir, json_ready([finding.to_json() for finding in found]))
    return write_text_atomic(run_dir / REPORT_FILE, text)


def _findings_members(found: Sequence[Finding]) -> Forks[list[bytes]]:
    """findings.json.gz's gzip members (rundir.findings_member), made in forks at once, each fork
    a run of consecutive members: the file's bytes are the same however many forks made them."""
    starts = range(0, len(found), FINDINGS_MEMBER)
    count = max(1, min(FINDINGS_FORKS, len(starts), (os.cpu_count() or 1) - 2))  # (2: pictures)
    size = -(-len(starts) // count)
    runs = [starts[first : first + size] for first in range(0, len(starts), size)]
    return Forks([functools.partial(_members, found, run) for run in runs])


def _members(found: Sequence[Finding], starts: Sequence[int]) -> list[bytes]:
    made = []
    for start in starts:
        part = found[start : start + FINDINGS_MEMBER]
        records = json_ready([finding.to_json() for finding in part])
        made.append(findings_member(records, start, len(found)))
    return made


def render(judged: MapAudit, plots: Path | None) -> str:
    """The report's text, its pictures drawn under `plots` (none: no pictures)."""
    return _joined(judged, _pictures(judged, plots))


def _pictures(judged: MapAudit, plots: Path | None) -> Forks[map_plots.Picture] | None:
    """The pictures started (a large map's each in its own fork), the findings' rows ringed."""
    if plots is None:
        return None
    flagged = {label for f in judged.findings for label in f.rows}
    return map_plots.drawing(judged.rows, plots, flagged)


def _joined(judged: MapAudit, pictures: Forks[map_plots.Picture] | None) -> str:
    """The report's text (a large map's made in a fork while the pictures are drawn) with the
    pictures' links."""
    text = Forks([functools.partial(_text, judged)], len(judged.rows) >= map_plots.FORK_ROWS)
    shown = []
    if pictures is not None:
        drawn = pictures.results()
        shown = ["## Pictures", *(f"![{md_text(p.caption)}]({p.path})" for p in drawn)]
    ((parts, listed),) = text.results()
    return "\n\n".join(part for part in [*parts, *shown, *listed] if part) + "\n"


def _text(judged: MapAudit) -> tuple[list[str], list[str]]:
    """The report's parts before its pictures and after them."""
    dataset, found, thresholds = judged.dataset, judged.findings, judged.thresholds
    rows = judged.rows
    parts = [
        f"# Dispatch map: {md_text(dataset.title)}",
        md_table(["", ""], env_rows(dataset)),
        "## Summary",
        _summary(rows, dataset.env),
        "## Kernels",
        _kernels(rows),
        "## Kernel switches along the size axis",
        _switches(rows),
    ]
    listed = ["## Findings", _findings(rows, found, thresholds)]
    if judged.follow_up is not None:
        listed += ["## Follow-up", _follow_up(rows, judged, judged.follow_up)]
    return parts, listed


def map_time(env: EnvRecord) -> str:
    """The map's measuring time, over every run of a resumed map (env.json's `parts`)."""
    seconds, parts = env.time_seconds, env.parts
    if not seconds:
        return "not recorded"
    return f"{seconds:.1f} s" + (f" over {parts} runs (resumed)" if parts > 1 else "")


def _summary(rows: pd.DataFrame, env: EnvRecord) -> str:
    status = rows["status"].fillna("not-run").value_counts()
    seconds = env.time_seconds
    done = int(status.drop("not-run", errors="ignore").sum())
    rate = f"{done / seconds:.1f}" if seconds else "not recorded"
    calls = rows["time_n"].dropna() if "time_n" in rows.columns else pd.Series(dtype=float)
    items = [
        ("cases", ", ".join(f"{count} {name}" for name, count in status.items())),
        ("observer", env.observer or "not recorded"),
        ("timed calls per case", str(int(calls.median())) if len(calls) else "none"),
        ("kernels dispatched", str(rows["kernel_short"].dropna().nunique())),
        ("map time", map_time(env)),
        ("cases per second", rate),
    ]
    return md_table(["", ""], [(name, md_text(value)) for name, value in items])


def _kernels(rows: pd.DataFrame) -> str:
    """Each kernel: how many cases chose it, over which problems, at what throughput."""
    timed = rows[~rows["is_loop"]].assign(rate=map_plots.throughput(rows))
    timed = timed.dropna(subset=["kernel_short"])
    if timed.empty:
        return "No kernel was observed (an events-only map times calls, it names no kernel)."
    table = []
    for kernel, group in timed.groupby("kernel_short", sort=False):
        ordered = group.sort_values("size")["shape"]
        smallest, largest = ordered.iloc[0], ordered.iloc[-1]
        table.append(
            (len(group), md_code(shorten(str(kernel))), md_text(f"{smallest} .. {largest}"),
             md_number(group["rate"].median(), 1), md_number(group["rate"].max(), 1))
        )  # fmt: skip
    table.sort(key=lambda row: -int(row[0]))
    shown = md_table(
        ["cases", "kernel", "problems (smallest .. largest)", "median TFLOP/s", "best TFLOP/s"],
        table[:KERNELS_SHOWN],
    )
    more = len(table) - KERNELS_SHOWN
    return shown + (f"\n\n{more} more kernels in dispatch.csv." if more > 0 else "")


def _switches(rows: pd.DataFrame) -> str:
    """Per square series, every size where the kernel changes, with the throughput each side."""
    timed = rows[~rows["is_loop"]].assign(rate=map_plots.throughput(rows))
    squares = timed[(timed["m"] == timed["n"]) & (timed["n"] == timed["k"])]
    table = []
    for key, series in squares.groupby(MAP_SERIES, dropna=False, sort=True):
        rate = series.set_index("m")["rate"]
        for switch in map_plots.switches(series).itertuples():
            before, after = rate.get(switch.from_size), rate.get(switch.to_size)
            table.append(
                (md_text(map_plots.series_name(key)), f"{switch.from_size} -> {switch.to_size}",
                 md_code(shorten(str(switch.from_kernel))), md_code(shorten(str(switch.to_kernel))),
                 md_number(before, 1), md_number(after, 1))
            )  # fmt: skip
    if not table:
        return "No square series with a kernel switch."
    headers = ["series", "sizes", "kernel before", "kernel after", "TFLOP/s before", "after"]
    return md_table(headers, table)


def _findings(rows: pd.DataFrame, found: Sequence[Finding], thresholds: Thresholds) -> str:
    if not found:
        return (
            "No size inversion beyond the noise model and no dispatch cliff of "
            f"{thresholds.cliff_drop_pct:g} % or more."
        )
    parts = []
    for rule in dispatch_rules(found):
        listed = [f for f in found if f.rule == rule]
        table = [
            (md_text(finding_series(f)), md_text(f.message), md_text(f.workaround))
            for f in listed[:FINDINGS_SHOWN]
        ]
        parts.append(f"### {rule} ({len(listed)}{within_noise(listed, '; ')})")
        parts.append(md_table(["series", "finding", "workaround"], table))
        if len(listed) > FINDINGS_SHOWN:
            where = findings_name(len(found))
            parts.append(f"The {len(listed) - FINDINGS_SHOWN} smaller ones are in {where}.")
    return "\n\n".join(parts)


def within_noise(found: Sequence[Finding], lead: str) -> str:
    """How many findings are within the map's rerun noise (`unsure`), after `lead`; '' if none."""
    count = sum(f.verdict is Verdict.unsure for f in found)
    return (
        f"{lead}{count} within the map's rerun noise, for the follow-up to decide" if count else ""
    )


def dispatch_rules(found: Sequence[Finding]) -> list[str]:
    return list(dict.fromkeys(f.rule for f in found))


def finding_series(finding: Finding) -> str:
    """The call a finding is on: 'cublas cublasSgemm fp32 b1'."""
    return f"{finding.api} {finding.routine} {finding.mode} b{finding.batch}"


# ----- follow-up --------------------------------------------------------------------------------

_FOLLOW_UP_HEADERS = [
    "problem", "role", "map kernel", "map kernel ms", "follow-up kernel", "pipe %",
    "kernel ms", "call ms", "reference ms", "cuBLASLt default ms", "best candidate ms",
]  # fmt: skip


def _follow_up(rows: pd.DataFrame, judged: MapAudit, verdicts: FollowUpVerdicts) -> str:
    """For each finding the follow-up measured: both cases as the map saw them and as the deep
    tier did, whether the finding holds on the full-length measurement, and what cuBLASLt's
    candidates offered."""
    follow_up = verdicts.dataset
    deep = verdicts.rows
    offered = _candidates(verdicts.candidates)
    observer = follow_up.env.observer or "not recorded"
    parts = [
        f"The cases below were measured again in {md_code(FOLLOW_UP_DIR, in_table=False)} "
        f"(observer {md_text(observer)}; full-length timing, the reference kernel, cuBLASLt's "
        "candidates; its own report.md has the counters and stalls)."
    ]
    for finding, verdict in judged.with_verdicts():
        if verdict is None:
            continue
        labels = [*finding.rows, *finding.compared]
        ids = case_ids(rows, finding)
        parts.append(f"### {md_text(finding.rule)}: {md_text(finding.sizes[0])}, {verdict}")
        parts.append(md_text(finding.message))
        table = [
            _follow_up_row(_row(rows, label), _row(deep, case_id), role, offered)
            for label, case_id, role in zip(labels, ids, ("flagged", "compared"), strict=False)
        ]
        parts.append(md_table(_FOLLOW_UP_HEADERS, table))
    return "\n\n".join(parts)


def _row(frame: pd.DataFrame, label: Any) -> pd.Series:
    found = frame.loc[label]
    return found.iloc[0] if isinstance(found, pd.DataFrame) else found


def _follow_up_row(
    mapped: pd.Series,
    deep: pd.Series,
    role: str,
    offered: Mapping[str, pd.Series],
) -> tuple[str, ...]:
    audit = audit_of(mapped, offered)
    return (
        md_text(mapped["shape"]),
        role,
        md_code(shorten(str(mapped["kernel_short"]))),
        md_number(mapped.get("kernel_time_ms"), 4),
        md_code(shorten(str(deep["kernel_short"]))),
        md_number(deep.get("util"), 0),
        md_number(deep.get("kernel_time_ms"), 4),
        md_number(deep.get("time_ms"), 4),
        md_number(deep.get("ref_time_ms"), 4),
        md_number(audit["default_ms"], 4) if audit is not None else "",
        _best_candidate(audit),
    )


def audit_of(mapped: pd.Series, offered: Mapping[str, pd.Series]) -> pd.Series | None:
    """The candidate audit of a mapped case's problem: its cuBLASLt case, posed as the map posed
    it; or, from an audit that predates layouts, the packed nn problem of its shape (what such an
    audit timed, under that id, for every case of the shape)."""
    mode, m, n, k = str(mapped["mode"]), int(mapped["m"]), int(mapped["n"]), int(mapped["k"])
    batch = int(mapped["batch"])
    twin = Case("cublasLt", mode, m, n, k, batch, **layout_fields(mapped)).case_id
    if twin in offered:
        return offered[twin]
    audit = offered.get(Case("cublasLt", mode, m, n, k, batch).case_id)
    return audit if audit is not None and audit["layout"] == LAYOUT_UNKNOWN else None


def _best_candidate(audit: pd.Series | None) -> str:
    """The best candidate's time, its speedup over the default, and where the audit flagged it
    (both rounds faster by the better-candidate threshold), 'better' and what it is."""
    if audit is None or pd.isna(audit["best_ms"]):
        return ""
    gap = audit["left_on_table"]
    said = f"{float(gap):.2f}x" if pd.notna(gap) else ""
    if audit["flagged"]:
        said += f", better: #{int(audit['best_candidate'])} {audit['best_described']}"
    return md_number(audit["best_ms"], 4) + md_text(f" ({said})" if said else "")


def _candidates(verdicts: CandidateVerdicts | None) -> dict[str, pd.Series]:
    """The follow-up's candidate audit per problem, as judged (flagged, best described)."""
    if verdicts is None:
        return {}
    return {str(row["case_id"]): row for _, row in verdicts.summary.iterrows()}
