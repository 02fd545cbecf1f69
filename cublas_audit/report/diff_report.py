"""A diff as it is read: Markdown (templates/diff.md.j2) and JSON, rendered from the comparison
judge.diff made; nothing here judges again."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import pandas as pd

from cublas_audit.judge import noise
from cublas_audit.judge.diff import Diff
from cublas_audit.judge.finding import plain
from cublas_audit.judge.thresholds import LISTED_MAX
from cublas_audit.report.markdown import md_code, md_table, md_text, template

_CASE_COLUMNS = ("api", "routine", "mode", "shape", "batch")


def to_json(diff: Diff) -> dict[str, Any]:
    return {
        "a": diff.a,
        "b": diff.b,
        "differs": [{"key": r.key, "a": r.a, "b": r.b} for r in diff.env if r.differs],
        "regressions": _records(diff.rows("regression")),
        "improvements": _records(diff.rows("improvement")),
        "unsure": _records(diff.rows("unsure")),
        "detectable": _records(diff.floors),
        "kernel_changes": _records(diff.kernel_changes),
        "host_slower": _records(diff.host_slower),
        "only_a": _records(diff.only_a),
        "only_b": _records(diff.only_b),
        "matched": len(diff.matched),
    }


def _records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    keep = [c for c in rows.columns if c not in ("_merge", "size")]
    return [
        {str(k): plain(v) for k, v in record.items()} for record in rows[keep].to_dict("records")
    ]


def to_markdown(diff: Diff) -> str:
    differs = [r for r in diff.env if r.differs]
    same = [r.key for r in diff.env if not r.differs]
    return template("diff.md.j2").render(
        a=md_code(diff.a, in_table=False),
        b=md_code(diff.b, in_table=False),
        env=md_table(["", "A", "B"], [(r.key, md_text(r.a), md_text(r.b)) for r in differs]),
        same=", ".join(same),
        matched=len(diff.matched),
        detectable=_detectable_table(diff.floors),
        model=diff.model or noise.load().source,
        sections=[
            _section("Regressions", diff.rows("regression"), _delta_table),
            _section("Improvements", diff.rows("improvement"), _delta_table),
            _section(
                "Unsure: changes the noise floor cannot tell from noise",
                diff.rows("unsure"),
                _delta_table,
            ),
            _section("Kernel changes", diff.kernel_changes, _delta_table),
            _section(
                "Call slower, kernels not: the host's share (informational unless --fail-on host)",
                diff.host_slower,
                lambda rows: _delta_table(rows, calls=True),
            ),
            _section("Only in A", diff.only_a, lambda rows: _case_table(rows, "_a")),
            _section("Only in B", diff.only_b, lambda rows: _case_table(rows, "_b")),
        ],
        counts={
            "regression": len(diff.rows("regression")),
            "improvement": len(diff.rows("improvement")),
            "unsure": len(diff.rows("unsure")),
            "kernel": len(diff.kernel_changes),
            "host": len(diff.host_slower),
        },
    )


def _section(
    title: str, rows: pd.DataFrame, table: Callable[[pd.DataFrame], str]
) -> dict[str, Any]:
    """A titled table of at most LISTED_MAX cases: the JSON output lists them all."""
    return {"title": title, "table": table(rows.head(LISTED_MAX)), "more": len(rows) - LISTED_MAX}


def _case_cells(record: Mapping[Hashable, Any]) -> list[str]:
    return [md_text(plain(record.get(c)) or "—") for c in _CASE_COLUMNS]


def _cell(value: Any, fmt: str) -> str:
    value = plain(value)
    return "—" if value is None else fmt.format(value)


def _delta_table(rows: pd.DataFrame, calls: bool = False) -> str:
    """The cases with the time their verdict judged (`time`: the kernels' or the call's, as
    judge.diff recorded it), or the call's time where the section is about calls (`calls`)."""
    if rows.empty:
        return ""
    body = [
        [
            *_case_cells(r),
            _kernel(r["kernel_short_a"], r.get("status_a")),
            _kernel(r["kernel_short_b"], r.get("status_b")),
            _cell(r["util_a"], "{:.0f}"),
            _cell(r["util_b"], "{:.0f}"),
            *_shown_times(r, calls),
            md_text(r.get("evidence") or _cell(r["time_delta_pct"], "{:+.1f} %")),
            md_text(r.get("note") or ""),
        ]
        for r in rows.to_dict("records")
    ]
    headers = [*_CASE_COLUMNS, "kernel A", "kernel B", "pipe % A", "pipe % B", "judged on", "ms A"]
    return md_table([*headers, "ms B", "time change (how sure)", "note"], body)


def _shown_times(record: Mapping[Hashable, Any], calls: bool) -> list[str]:
    """'kernels' or 'call', then that time on side A and side B."""
    if calls or record.get("judged_on") != "kernel":
        return ["call", _cell(record["time_ms_a"], "{:.4g}"), _cell(record["time_ms_b"], "{:.4g}")]
    a, b = (_cell(record[f"judged_ms_{side}"], "{:.4g}") for side in "ab")
    return ["kernels", a, b]


def _detectable_table(floors: pd.DataFrame) -> str:
    if floors.empty:
        return ""
    records = floors.to_dict("records")
    traced = any(r.get("kernel_cases") for r in records)
    body = []
    for r in records:
        scale = "longer" if not math.isfinite(r["up_to_ms"]) else f"up to {r['up_to_ms']:g} ms"
        host_bound = plain(r["floor_pct"]) is None
        call = (
            ("host-bound", "none")
            if host_bound
            else (f"{r['floor_pct']:.1f} %", f"{r['detectable_pct']:.1f} %")
        )
        row = [scale, str(r["cases"]), *call]
        if traced:
            row += [
                str(r["kernel_cases"]),
                f"{r['kernel_floor_pct']:.1f} %",
                f"{r['kernel_detectable_pct']:.1f} %",
            ]
        body.append(row)
    headers = ["time per launch", "cases", "call: noise floor", "call: smallest slowdown caught"]
    if traced:
        headers += ["kernels traced", "kernels: noise floor", "kernels: smallest slowdown caught"]
    return md_table(headers, body)


def _kernel(kernel: Any, status: Any) -> str:
    if plain(status) not in (None, "ok"):
        return md_text(status)
    return "—" if plain(kernel) is None else md_code(kernel)


def _case_table(rows: pd.DataFrame, side: str) -> str:
    if rows.empty:
        return ""
    body: Sequence[list[str]] = [
        [
            *_case_cells(r),
            _kernel(r[f"kernel_short{side}"], r.get(f"status{side}")),
            _cell(r[f"time_ms{side}"], "{:.4g}"),
        ]
        for r in rows.to_dict("records")
    ]
    return md_table([*_CASE_COLUMNS, "kernel", "ms"], body)
