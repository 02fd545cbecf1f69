"""Roofline bounds: what a problem can reach at all on its GPU, so that a rule judges a GEMV by the
bytes it must move and a large GEMM by the math it must do, never by one yardstick for both.

For each row: the bytes the call must move at least (A and B read, a broadcast operand once, C
written, and read too when beta is not 0, the bias vector), its arithmetic intensity (FLOP per
byte), the roofline bound min(peak, bandwidth x intensity) in TFLOP/s, which side of the ridge it
sits on (memory- or compute-bound) and `roofline_pct`, the throughput attained (on the kernels'
time where traced, else the call's) over that bound.

The GPU's figures (`Machine`): a run's own measurement where env.json records one
(`roofline`: DRAM bandwidth from a copy kernel, each mode's peak), else derived: each mode's peak
from the SMs, the SM clock and the pipe's issue rate per SM and clock (whitepaper figures by
compute capability), the DRAM bandwidth from the GPU's data sheet by its name. A GPU none of these
know leaves the columns empty, and the rules say what they could not judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.planning.modes import MODES
from cublas_audit.table.dispatch import unshared
from cublas_audit.table.env_record import EnvRecord, as_record

# Dense math per SM and clock (FLOP): FP32 FMA lanes x 2, and the tensor cores per input type
# (NVIDIA's A100 and H100 whitepapers: 64 / 128 FP32 lanes per SM; 1024 / 2048 TF32 and 2048 /
# 4096 FP16 and BF16 FLOP per SM and clock).
FLOP_PER_SM_CLOCK: dict[str, dict[str, int]] = {
    "8.0": {"fp32": 128, "tf32": 1024, "bf16x": 2048, "fp16": 2048, "bf16": 2048},
    "8.6": {"fp32": 256},
    "8.9": {"fp32": 256},
    "9.0": {"fp32": 256, "tf32": 2048, "bf16x": 4096, "fp16": 4096, "bf16": 4096},
    "10.0": {"fp32": 256},
    "12.0": {"fp32": 256},
}
# DRAM bandwidth, GB/s, from each GPU's data sheet (nvidia-smi's name, matched in order).
DATA_SHEET_GBPS: tuple[tuple[str, float], ...] = (
    ("H200", 4800.0),
    ("H100 80GB HBM3", 3350.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100-SXM4-40GB", 1555.0),
    ("A100-PCIE-40GB", 1555.0),
    ("RTX 5090", 1792.0),
    ("RTX PRO 6000 Blackwell", 1792.0),
)
MEMORY, COMPUTE = "memory", "compute"
# A memory-bound call timed faster than DRAM allows found its operands in L2 (a warm time: bf16
# 4096x8x4096 tn read 133 % of the H100's DRAM bandwidth in a loop, 75 % in a model's decode step).
# Its throughput is no DRAM fraction: `roofline_pct` stays empty and `l2_resident` says why.
L2_RESIDENT = "L2-resident"


@dataclass(frozen=True)
class Machine:
    """A GPU's roofline: DRAM bandwidth (GB/s) and each mode's peak (TFLOP/s), with where each
    figure comes from."""

    name: str
    dram_gbps: float | None
    dram_source: str
    peaks: Mapping[str, float] = field(default_factory=dict)
    peak_source: str = ""

    def ridge(self, mode: str) -> float | None:
        """The intensity (FLOP/B) where the bandwidth's slope meets the mode's peak."""
        peak = self.peaks.get(mode)
        if peak is None or not self.dram_gbps:
            return None
        return peak * 1e12 / (self.dram_gbps * 1e9)


def machine_of(given: EnvRecord | Mapping[str, Any], frame: pd.DataFrame) -> Machine | None:
    """The GPU's figures: measured (env.json's `roofline`), else derived; None if unknown."""
    env = as_record(given)
    name = str(env.gpu_name or _first(frame, "gpu_name") or "")
    peaks = _derived_peaks(env, frame)
    peak_source = (
        "SMs x SM clock x issue rate per SM and clock (compute capability "
        f"{env.cc or _first(frame, 'cc')})"
    )
    measured = env.roofline
    if measured is not None and measured.get("dram_gbps"):
        recorded = {str(k): float(v) for k, v in (measured.get("peaks_tflops") or {}).items()}
        return Machine(
            name,
            float(measured["dram_gbps"]),
            str(measured.get("dram_source") or "measured"),
            recorded or peaks,
            str(measured.get("peak_source") or "measured") if recorded else peak_source,
        )
    sheet = next((gbps for key, gbps in DATA_SHEET_GBPS if key in name), None)
    if sheet is None and not peaks:
        return None
    return Machine(
        name,
        sheet,
        f"data sheet of the {name}" if sheet else "unknown",
        peaks,
        peak_source if peaks else "unknown",
    )


def _derived_peaks(env: EnvRecord, frame: pd.DataFrame) -> dict[str, float]:
    cc = str(env.cc or _first(frame, "cc") or "")
    sms = env.sm_count or _first(frame, "sm_count")
    clock = env.sm_clock_max_mhz
    rates = FLOP_PER_SM_CLOCK.get(cc, {})
    if not rates or not sms or not clock:
        return {}
    return {mode: int(sms) * rate * float(clock) * 1e6 / 1e12 for mode, rate in rates.items()}


def _first(frame: pd.DataFrame, column: str) -> Any:
    if column not in frame.columns:
        return None
    values = frame[column].dropna()
    return values.iloc[0] if len(values) else None


def bytes_moved(rows: pd.DataFrame) -> pd.Series:
    """The least the call must move to and from memory, bytes (NA for an unknown mode)."""
    item = rows["mode"].map({name: mode.element_bytes for name, mode in MODES.items()})
    batch = rows["batch"].astype(float)
    broadcast = _column(rows, "broadcast", "").fillna("").astype(str)
    beta = _column(rows, "beta", 0.0).astype(float).fillna(0.0)
    bias = _column(rows, "bias", 0).fillna(0).astype(float)
    m, n, k = (rows[c].astype(float) for c in ("m", "n", "k"))
    a = m * k * batch.where(broadcast != "a", 1.0)
    b = k * n * batch.where(broadcast != "b", 1.0)
    c = m * n * batch * (1.0 + (beta != 0).astype(float))
    return (item.astype(float) * (a + b + c + bias * m)).astype("Float64")


def with_roofline(rows: pd.DataFrame, machine: Machine | None) -> pd.DataFrame:
    """`rows` (prepared) with bytes_moved, intensity, bound_tflops, bound_side and roofline_pct;
    the bound columns empty where the GPU's figures are unknown."""
    out = unshared(rows)
    flops = 2.0 * out["m"].astype(float) * out["n"] * out["k"] * out["batch"]
    moved = bytes_moved(out)
    out["bytes_moved"] = moved
    out["intensity"] = (flops / moved).astype("Float64")
    bound = pd.Series(np.nan, index=out.index, dtype="Float64")
    side = pd.Series(pd.NA, index=out.index, dtype="string")
    if machine is not None and machine.dram_gbps:
        memory = out["intensity"].astype(float) * machine.dram_gbps / 1000.0  # TFLOP/s
        peak = out["mode"].map(machine.peaks).astype(float)
        bound = pd.concat([memory, peak], axis=1).min(axis=1, skipna=False).astype("Float64")
        side = side.mask(memory < peak, MEMORY).mask(memory >= peak, COMPUTE)
    out["bound_tflops"] = bound
    out["bound_side"] = side
    attained = (100.0 * attained_tflops(out) / bound).astype("Float64")
    beyond = (side.eq(MEMORY) & attained.gt(100.0)).fillna(False).astype(bool)
    out["l2_resident"] = beyond
    out["roofline_pct"] = attained.mask(beyond)
    return out


def attained_tflops(rows: pd.DataFrame) -> pd.Series:
    """TFLOP/s on the kernels' time where traced, else the call's."""
    flops = 2.0 * rows["m"].astype(float) * rows["n"] * rows["k"] * rows["batch"]
    call = rows["time_ms"].astype("Float64")
    kernel = _column(rows, "kernel_time_ms", np.nan).astype("Float64")
    seconds = kernel.fillna(call) / 1e3
    return (flops / seconds / 1e12).astype("Float64")


def _column(rows: pd.DataFrame, name: str, default: Any) -> pd.Series:
    if name in rows.columns:
        return rows[name]
    return pd.Series(default, index=rows.index)


def attained_ms(rows: pd.DataFrame) -> pd.Series:
    """The time the attained throughput is taken on: the kernels' where traced, else the call's."""
    call = rows["time_ms"].astype("Float64")
    return _column(rows, "kernel_time_ms", np.nan).astype("Float64").fillna(call)


def memory_bound(rows: pd.DataFrame, min_bytes: float = 0.0) -> pd.Series:
    """Rows whose intensity is below the GPU's ridge point, of at least `min_bytes` moved (False
    where the bound is unknown)."""
    if "bound_side" not in rows.columns:
        return pd.Series(False, index=rows.index)
    side = rows["bound_side"].eq(MEMORY).fillna(False).astype(bool)
    return side & rows["bytes_moved"].ge(min_bytes).fillna(False).astype(bool)


def near_memory_bound(rows: pd.DataFrame, min_pct: float) -> pd.Series:
    """Memory-bound rows that move at least `min_pct` % of the GPU's DRAM bandwidth, or faster
    than DRAM allows (L2-resident): as fast as their bytes allow, whatever their pipe
    utilization (the right pick)."""
    near = rows["roofline_pct"].ge(min_pct).fillna(False).astype(bool)
    if "l2_resident" in rows.columns:
        near |= rows["l2_resident"].fillna(False).astype(bool)
    return memory_bound(rows) & near


def bound_words(rows: pd.DataFrame, machine: Machine | None) -> str:
    """Which bound applies to these rows (one call's), in a reader's words."""
    known = rows.dropna(subset=["bound_side"]) if "bound_side" in rows.columns else rows.iloc[0:0]
    if machine is None or known.empty:
        return "no roofline bound (this GPU's bandwidth and peak are not known here)"
    if known["roofline_pct"].isna().all():  # every row past DRAM's bound: no DRAM fraction
        return f"{L2_RESIDENT}: faster than this GPU's DRAM bandwidth allows (operands warm in L2)"
    known = known.dropna(subset=["roofline_pct"])
    intensity = _range(known["intensity"], ".1f")
    share = _range(known["roofline_pct"], ".0f") + " %"
    if (known["bound_side"] == MEMORY).all():
        return (
            f"memory-bound at {intensity} FLOP/B: {share} of the "
            f"{(machine.dram_gbps or 0) / 1000:.2f} TB/s this GPU moves ({machine.dram_source})"
        )
    mode = str(known["mode"].iloc[0])
    peak = machine.peaks.get(mode)
    return (
        f"compute-bound at {intensity} FLOP/B: {share} of the {peak:.1f} TFLOP/s {mode} peak "
        f"({machine.peak_source})"
        if peak is not None
        else f"compute-bound at {intensity} FLOP/B"
    )


def _range(values: pd.Series, spec: str) -> str:
    lo, hi = float(values.min()), float(values.max())
    low, high = format(lo, spec), format(hi, spec)
    return low if low == high else f"{low}-{high}"
