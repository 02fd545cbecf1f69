"""Markdown for the GEMMs of a PyTorch trace (`cublas-audit shapes`): every text through
cublas_audit.report.markdown's escaping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.grouping import observed
from cublas_audit.judge.impact import TraceVerdict
from cublas_audit.judge.impact import pct_text as _pct
from cublas_audit.judge.impact import us_text as _us
from cublas_audit.observe.torch_trace import Trace, problems
from cublas_audit.planning.grid import label_from_gpu_name
from cublas_audit.report.markdown import md_code, md_number, md_table, md_text
from cublas_audit.table.dispatch import from_records


def dispatch_table(trace: Trace, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """A dispatch table (the sweep's schema) from the trace alone: one row per distinct problem,
    in cuBLAS's terms, its first kernel as the dispatched one and the mean kernel time per call
    as both its time and its kernel time (the profiler recorded kernels, not calls); no counters,
    so utilization is empty. `share` carries each problem's part of the trace's GEMM time."""
    table = problems(trace) if table is None else table
    label = label_from_gpu_name(trace.gpu_name) if trace.gpu_name else "trace"
    records: list[dict[str, Any]] = []
    for r in table.to_dict("records"):
        batched = r["batch"] > 1 or r["op"] in ("aten::bmm", "aten::baddbmm")
        first_kernel = str(r["kernels"]).split(" + ")[0]
        records.append(
            {
                "gpu_label": label,
                "gpu_name": trace.gpu_name or None,
                "sm_count": trace.sm_count,
                "api": "cublas",
                "routine": r["op"],  # what PyTorch called: an addmm (bias) is not an mm
                "mode": r["mode"],
                "m": r["cublas_m"],
                "n": r["cublas_n"],
                "k": r["cublas_k"],
                "batch": r["batch"],
                "transa": r["cublas_transa"],
                "transb": r["cublas_transb"],
                "broadcast": r["cublas_broadcast"],
                "beta": r["cublas_beta"],
                "strided": int(batched and r["batch"] == 1),
                "kernel": first_kernel,
                "fma_pct": None,
                "time_ms": r["mean_gpu_ms"],
                "kernel_time_ms": r["mean_gpu_ms"],
                "traced_ctas": r["ctas"] or None,
                "traced_kernels": str(r["kernels"]),
                "status": "ok",
                "case_id": f"trace.{r['op'].removeprefix('aten::')}.{len(records)}",
                "share": r["share"],
                "calls": r["calls"],
            }
        )
    return from_records(records)


def report_markdown(
    trace: Trace,
    table: pd.DataFrame,
    frame: pd.DataFrame,
    found: Sequence[Finding],
    verdict: TraceVerdict | None = None,
) -> str:
    """The trace's GEMMs as audited (`found`: the rules' findings on `frame`, the trace as a
    dispatch table), opening with the verdict (judge.impact), each finding weighted by the share
    of the trace's GEMM time its problems took, largest first; then the problem table."""
    findings = sorted(((share(frame, f), f) for f in found), key=lambda item: -item[0])
    lines = [
        "# cublas-audit: a PyTorch trace",
        "",
        f"Trace: {md_code(str(trace.path), in_table=False)}"
        + (f" ({md_text(trace.gpu_name)})" if trace.gpu_name else ""),
        "",
        *([verdict_markdown(verdict), ""] if verdict is not None else []),
        "Kernel names and durations as the profiler recorded them; no counters (utilization "
        "rules need `cublas-audit sweep --torch-trace` on the GPU). Each finding carries the "
        "share of the trace's GEMM time of the problems it concerns.",
        "",
        f"## Findings ({len(findings)})",
        "",
    ]
    if not findings:
        lines.append("None: no rule fired on what the trace records.")
    for part, finding in findings:
        lines.append(
            f"- **{md_text(finding.severity)}** · `{md_text(finding.rule)}` · "
            f"{100 * part:.1f} % of GEMM time · {md_text(finding.message)}"
        )
        lines += [  # what else the finding's cause explains (judge.grouping)
            f"  - also `{md_text(rule)}` · {md_text(calls)}: {md_text(message)}"
            for rule, calls, message in observed(finding)
        ]
    gemms = problems_markdown(trace, table).split("\n", 1)[1].lstrip("\n")  # without its title
    lines += ["", "## GEMMs", "", gemms]
    return "\n".join(lines)


def verdict_markdown(verdict: TraceVerdict) -> str:
    """The verdict on a traced model (judge.impact.TraceVerdict) in words, what a trace report
    opens with: healthy or not, its problems, its GEMM time a step, the share of it whose
    default is within noise of its best cuBLASLt candidate, and what there is to gain."""
    step = (
        "a step" if verdict.steps > 1 else "in the trace (one step: it has no ProfilerStep marks)"
    )
    head = (
        "healthy"
        if verdict.healthy
        else f"{verdict.worth} finding{'s' if verdict.worth > 1 else ''} worth "
        f"{_pct(verdict.bar)} or more of the GEMM time"
    )
    said = [
        f"{verdict.problems} problem{'s' if verdict.problems != 1 else ''}, "
        f"{_us(verdict.gemm_us)} us of GEMM kernels {step}."
    ]
    if verdict.no_audit >= 1.0 - 1e-9 and verdict.within_noise == 0:
        said.append(
            "No cuBLASLt candidate audit: whether each default is its best is not measured "
            "(sweep --torch-trace with --candidates measures it)."
        )
    else:
        said.append(
            f"{_pct(verdict.within_noise)} of that time runs a default within noise of its best "
            "cuBLASLt candidate"
            + (f"; {_pct(verdict.no_audit)} has no candidate audit" if verdict.no_audit else "")
            + "."
        )
    if verdict.under_bar:
        gaps = "; ".join(
            f"{p.ops} {p.shape}: {p.gap:.2f}x on {_pct(p.share)}" for p in verdict.under_bar
        )
        said.append(
            f"A gap beyond noise but under the {_pct(verdict.candidate_bar)} bar, no finding: "
            f"{gaps}."
        )
    if verdict.unaudited_share >= 0.0005:
        said.append(f"{_pct(verdict.unaudited_share)} of it is in GEMMs no case poses.")
    gain = f"{_us(verdict.gain_us)} us {step.split(' (')[0]}, {_pct(verdict.gain_share)} of it"
    if verdict.healthy:
        worth = _pct(verdict.bar)
        said.append(f"No finding is worth {worth} of it; the findings give back {gain}.")
    elif verdict.gain_us:
        said.append(f"To gain: {gain}.")
    else:
        said.append(
            "To gain: not measured (no finding worth it has a measured faster alternative)."
        )
    return f"**Verdict: {md_text(head)}.** {md_text(' '.join(said))}"


def share(frame: pd.DataFrame, finding: Finding) -> float:
    """The part of the trace's GEMM time the finding's problems took."""
    rows = [r for r in finding.rows if r in frame.index]
    return float(frame.loc[rows, "share"].astype(float).sum()) if rows else 0.0


def problems_markdown(trace: Trace, table: pd.DataFrame) -> str:
    """The table for a person: every text through cublas_audit.report.markdown's escaping."""
    calls = int(table["calls"].sum()) if len(table) else 0
    total = float(table["total_gpu_ms"].sum()) if len(table) else 0.0
    aux = float(table["aux_gpu_ms"].sum()) if len(table) else 0.0
    gpu = f" ({md_text(trace.gpu_name)})" if trace.gpu_name else ""
    lines = [
        "# GEMMs of a PyTorch trace",
        "",
        f"Trace: {md_code(trace.path, in_table=False)}{gpu}",
        "",
        f"{len(table)} distinct problems, {calls} calls, {md_number(total, 3)} ms of GEMM kernels"
        f" (and {md_number(aux, 3)} ms of other GPU work launched inside the GEMM ops: copies,"
        " fills). Shapes in PyTorch's row-major terms (C = A @ B, M x K by K x N) and as cuBLAS"
        " runs them (column-major m x n x k, transa transb, leading dimensions, batch strides).",
        "",
    ]
    for notice in table.attrs.get("notices", ()):  # unreadable GEMM ops, 32-bit limits
        lines += [f"Note: {md_text(notice)}", ""]
    headers = ["op", "mode", "MxNxK", "batch", "cuBLAS call", "calls", "GPU ms", "ms per call",
               "share", "kernels", "aux"]  # fmt: skip
    rows = [
        [
            md_text(r["op"] + (f" (in {r['via']})" if r["via"] else "")),
            md_text(r["mode"]),
            md_text(f"{r['M']}x{r['N']}x{r['K']}"),
            md_text(r["batch"]),
            md_text(_cublas_text(r)),
            md_text(r["calls"]),
            md_number(r["total_gpu_ms"], 4),
            md_number(r["mean_gpu_ms"], 4),
            md_text(f"{100 * r['share']:.1f} %"),
            md_code(r["kernel_short"]) if r["kernel_short"] else "—",
            md_code(r["aux_kernels"]) if r["aux_kernels"] else "—",
        ]
        for r in table.to_dict("records")
    ]
    return "\n".join(lines) + "\n" + md_table(headers, rows) + "\n"


def _cublas_text(row: Mapping[Any, Any]) -> str:
    text = (
        f"{row['cublas_m']}x{row['cublas_n']}x{row['cublas_k']} "
        f"{row['cublas_transa']}{row['cublas_transb']} lda {row['cublas_lda']} "
        f"ldb {row['cublas_ldb']}"
    )
    if row["batch"] > 1:
        text += f" strides {row['cublas_stride_a']}/{row['cublas_stride_b']}"
    if row["cublas_beta"]:
        text += f" beta {row['cublas_beta']:g}"
    return text + (" bias" if row["cublas_bias"] else "")
