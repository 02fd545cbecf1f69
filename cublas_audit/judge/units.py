"""Do all units of a node dispatch alike? The replicated run's comparison (`--replicate`).

Every unit ran the same cases (multi_gpu); each is compared with the first through the diff and
its noise model (cublas_audit.judge.diff, cublas_audit.judge.noise): the same model and software
dispatching another kernel on one unit is `unit-mismatch` (high); one unit slower beyond the
noise floor of the time compared (the kernels' where traced) is `unit-mismatch` (medium), with
the SM clock and board power NVML read beside each measurement, which usually say why (a unit
that hits its power cap first). A same-GPU rerun never calls a unit slower: that is what the
noise model's floors are fitted to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from cublas_audit.judge import diff
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.inputs import Dataset
from cublas_audit.vocabulary import Severity

RULE = "unit-mismatch"


def compare_units(
    units: Sequence[Dataset], thresholds: Thresholds | None = None
) -> tuple[list[Finding], pd.DataFrame]:
    """unit-mismatch findings of every unit against the first, and the spread of unit speed."""
    base = units[0]
    found: list[Finding] = []
    spread = [_speed_row(base, None)]
    for unit in units[1:]:
        result = diff.compare(base, unit, thresholds)
        found += [_kernel_mismatch(base, unit, row) for _, row in result.kernel_changes.iterrows()]
        changed = set(result.kernel_changes.index)
        for verdict in ("regression", "improvement"):
            rows = result.rows(verdict)
            found += [
                _slower(base, unit, row, verdict) for i, row in rows.iterrows() if i not in changed
            ]
        spread.append(_speed_row(unit, result.matched))
    return found, pd.DataFrame(spread)


def _where(row: pd.Series) -> dict[str, Any]:
    return {
        "api": str(row["api"]),
        "routine": str(row.get("routine", "")),
        "mode": str(row["mode"]),
        "batch": int(row["batch"]),
        "sizes": [str(row["shape"])],
    }


def _kernel_mismatch(base: Dataset, unit: Dataset, row: pd.Series) -> Finding:
    message = (
        f"{unit.gpu_label} dispatches {row['kernel_short_b']} where {base.gpu_label} dispatches "
        f"{row['kernel_short_a']} at {row['shape']}: the same model, driver and cuBLAS choose "
        "differently on two units."
    )
    return Finding(
        rule=RULE,
        severity=Severity.high,
        gpu_label=unit.gpu_label,
        kernel=str(row["kernel_short_b"]),
        message=message,
        workaround="Compare the units' clocks, power limits and ECC/MIG settings "
        "(nvidia-smi -q); report the pair with both run directories.",
        **_where(row),
    )


def _slower(base: Dataset, unit: Dataset, row: pd.Series, verdict: str) -> Finding:
    slow, fast = (unit, base) if verdict == "regression" else (base, unit)
    side_slow, side_fast = ("b", "a") if verdict == "regression" else ("a", "b")
    on = "kernel_time_ms" if pd.notna(row.get("kernel_time_ms_a")) else "time_ms"
    ratio = float(row[f"{on}_{side_slow}"]) / float(row[f"{on}_{side_fast}"])
    state = ", ".join(
        f"{label} {_state(row, side)}" for label, side in ((slow.gpu_label, side_slow),
                                                            (fast.gpu_label, side_fast))
    )  # fmt: skip
    message = (
        f"{slow.gpu_label} takes {ratio:.2f}x the time of {fast.gpu_label} at {row['shape']} "
        f"(the {'kernels' if on == 'kernel_time_ms' else 'calls'}, beyond the noise floor; "
        f"{state})."
    )
    return Finding(
        rule=RULE,
        severity=Severity.medium,
        gpu_label=slow.gpu_label,
        kernel=str(row.get("kernel_short_b") or ""),
        message=message,
        workaround="Check the slower unit's clocks and power cap (nvidia-smi -q -d "
        "CLOCK,POWER,PERFORMANCE) and its cooling; rerun it alone to rule out a neighbour.",
        effect=round(1 - 1 / ratio, 4),
        **_where(row),
    )


def _state(row: pd.Series, side: str) -> str:
    clock, power = row.get(f"sm_clock_mhz_{side}"), row.get(f"power_w_{side}")
    parts = [f"{float(clock):.0f} MHz" if pd.notna(clock) else "clock not read"]
    parts += [f"{float(power):.0f} W"] if pd.notna(power) else []
    return " ".join(parts)


def _speed_row(unit: Dataset, matched: pd.DataFrame | None) -> dict[str, Any]:
    """A unit's speed against the first: the median, fastest and slowest ratio of its times
    over the cases both ran (the kernels' where traced), its median SM clock and power."""
    frame = unit.frame
    row: dict[str, Any] = {
        "unit": unit.gpu_label,
        "gpu_uuid": _first(frame, "gpu_uuid"),
        "cases": int(frame["status"].eq("ok").sum()) if "status" in frame else len(frame),
        "sm_clock_mhz": _median(frame, "sm_clock_mhz"),
        "power_w": _median(frame, "power_w"),
    }
    if matched is None:
        return {**row, "median_ratio": 1.0, "min_ratio": 1.0, "max_ratio": 1.0}
    on = "kernel_time_ms" if "kernel_time_ms_a" in matched.columns else "time_ms"
    ratios = (matched[f"{on}_b"].astype(float) / matched[f"{on}_a"].astype(float)).dropna()
    return {
        **row,
        "median_ratio": round(float(ratios.median()), 4) if len(ratios) else None,
        "min_ratio": round(float(ratios.min()), 4) if len(ratios) else None,
        "max_ratio": round(float(ratios.max()), 4) if len(ratios) else None,
    }


def _first(frame: pd.DataFrame, column: str) -> str:
    values = frame[column].dropna() if column in frame.columns else pd.Series(dtype=object)
    return str(values.iloc[0]) if len(values) else ""


def _median(frame: pd.DataFrame, column: str) -> float | None:
    if column not in frame.columns or frame[column].dropna().empty:
        return None
    return round(float(frame[column].astype(float).median()), 1)
