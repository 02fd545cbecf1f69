"""Joins the sweep's pieces into the dispatch table: ncu launches, probe results, environment.

Pure: takes parsed records, returns a DataFrame. One row per kernel launch of a case (a split-K
reduction is a second row with role `aux`); a case with no profiled launch (skipped, failed, timed
only) still gets one row, so nothing the sweep learned is lost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from cublas_audit.observe.kernels import normalize
from cublas_audit.observe.ncu_export import METRIC_COLUMNS, Launch
from cublas_audit.planning.cases import Case
from cublas_audit.table import dispatch
from cublas_audit.table.distribution import distribution_columns

ProbeResults = Mapping[str, Mapping[str, Any]]


def build_table(
    cases: Sequence[Case],
    launches: Iterable[Launch],
    profile_results: ProbeResults,
    time_results: ProbeResults,
    context: Mapping[str, Any],
) -> pd.DataFrame:
    """`context` holds the per-run columns: gpu_label, gpu_name, cc, driver and cuBLAS versions."""
    calls: dict[str, list[Launch]] = defaultdict(list)
    refs: dict[str, list[Launch]] = defaultdict(list)
    for launch in launches:
        (refs if launch.is_reference else calls)[launch.case_id].append(launch)
    reference = _reference_by_problem(cases, refs, time_results)
    rows: list[dict[str, Any]] = []
    for case in cases:
        base = {
            **context,
            **_case_columns(case),
            **_result_columns(
                case, profile_results.get(case.case_id), time_results.get(case.case_id)
            ),
            **reference.get(_problem(case), {}),
        }
        rows.extend(_launch_rows(base, calls.get(case.case_id, [])))
    return dispatch.from_records(rows)


def _problem(case: Case) -> tuple[str, int, int, int, int]:
    return (case.mode, case.m, case.n, case.k, case.batch)


def _case_columns(case: Case) -> dict[str, Any]:
    return {
        "schema_version": dispatch.SCHEMA_VERSION,
        "case_id": case.case_id,
        "api": case.api,
        "routine": case.routine,
        "mode": case.mode,
        "m": case.m,
        "n": case.n,
        "k": case.k,
        "batch": case.batch,
        **dispatch.layout_columns(case),
        "workspace_mib": case.workspace_mib,
    }


def _result_columns(
    case: Case, profiled: Mapping[str, Any] | None, timed: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Status and time; a failure in either phase wins over an `ok` in the other."""
    statuses = [r for r in (profiled, timed) if r is not None]
    failed = next((r for r in statuses if r.get("status") != "ok"), None)
    out: dict[str, Any] = {
        "status": failed["status"] if failed else ("ok" if statuses else "not-run"),
        "status_detail": failed.get("detail") if failed else None,
    }
    if timed is not None and timed.get("time_ms") is not None:
        out["time_ms"] = timed["time_ms"]
        out["tflops"] = case.flops / (timed["time_ms"] * 1e-3) / 1e12
    if timed is not None:
        out["max_rel_err"] = timed.get("max_rel_err")
        out.update(_recorded(timed, CALL_EVIDENCE))
    return out


# The timing evidence the probe records beside each median: the call's distribution, its kernel-only
# time (CUPTI) and what was traced, the GPU's clocks and power around it; the reference's likewise.
CALL_EVIDENCE = (
    *distribution_columns("time"),
    "kernel_time_ms",
    *distribution_columns("kernel_time"),
    "kernel_time_status",
    "batched_time_ms",
    *distribution_columns("batched_time"),
    "batched_kernel_time_ms",
    *distribution_columns("batched_kernel_time"),
    "traced_kernels",
    "traced_launches",
    "traced_ctas",
    "traced_block",
    "traced_registers",
    "sm_clock_before_mhz",
    "sm_clock_mhz",
    "power_w",
    "clock_reasons",
)
REFERENCE_EVIDENCE = (
    "ref_time_ms",
    *distribution_columns("ref_time"),
    "ref_kernel_time_ms",
    *distribution_columns("ref_kernel_time"),
)


def _recorded(record: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {key: record[key] for key in keys if record.get(key) is not None}


def _reference_by_problem(
    cases: Sequence[Case], refs: Mapping[str, list[Launch]], time_results: ProbeResults
) -> dict[tuple[str, int, int, int, int], dict[str, Any]]:
    """The reference runs once per problem; its time and FMA % go on every row of the problem."""
    out: dict[tuple[str, int, int, int, int], dict[str, Any]] = {}
    for case in cases:
        timed = time_results.get(case.case_id, {})
        launches = refs.get(case.case_id, [])
        columns: dict[str, Any] = _recorded(timed, REFERENCE_EVIDENCE)
        if launches:
            main = max(launches, key=lambda launch: launch.duration_us or 0.0)
            columns["ref_fma_pct"] = main.metrics.get(METRIC_COLUMNS["fma_pct"])
            columns["ref_kernel"] = main.kernel
        if columns:
            out[_problem(case)] = columns
    return out


def _launch_rows(base: dict[str, Any], launches: list[Launch]) -> list[dict[str, Any]]:
    if not launches:
        return [{**base, "kernel": None}]
    ordered = sorted(launches, key=lambda launch: launch.ncu_id)
    main = max(ordered, key=lambda launch: launch.duration_us or 0.0)
    return [
        {
            **base,
            **_launch_columns(launch),
            "launch": index,
            "role": "main" if launch is main else "aux",
        }
        for index, launch in enumerate(ordered)
    ]


def _launch_columns(launch: Launch) -> dict[str, Any]:
    info = normalize(launch.kernel)
    return {
        "kernel": launch.kernel,
        "kernel_short": info.short,
        "family": info.family,
        "tile": info.tile or None,
        **{column: launch.metrics.get(metric) for column, metric in METRIC_COLUMNS.items()},
        "smem_bytes": launch.smem_bytes,
        "grid": launch.grid,
        "block": launch.block,
        "duration_us": launch.duration_us,
        **launch.stall_pct(),
    }
