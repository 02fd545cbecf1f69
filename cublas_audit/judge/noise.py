"""The run-to-run noise model: how far the median time of the same call moves between two runs on
the same GPU, as a function of the time of one launch.

Run-to-run spread is larger than the spread within a run and depends on the time scale: a 20 us
launch is dominated by the host (launch, heuristic, the loop that issues it) and moves by 20-40 %
between runs, a 2 ms one by 1-2 %. The model is an upper envelope of that spread over bins of the
time per launch (the call's time divided by the kernels it launches: a loop of `batch` single
calls launches `batch`), measured on back-to-back reruns of the default batched grid
(benchmarks/noise.py) and shipped as package data with the device, date and versions it was
measured on. `floor(t)` is the relative change between two runs that noise alone can produce at
that scale; cublas_audit.judge.verdicts widens every timing comparison by it.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import LOOP_ROUTINE
from cublas_audit.planning.modes import pipe_name
from cublas_audit.table.dispatch import main_launches
from cublas_audit.vocabulary import FloorKind

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_MODEL = DATA_DIR / "noise_h100.json"
# Upper edges of the time-per-launch bins, ms: half decades from 30 us to 100 ms.
EDGES_MS = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, math.inf)
# The envelope is the largest spread seen in a bin times this margin: the fitting runs are a
# sample, and a gate must hold on runs it has not seen.
MARGIN = 1.25
# Below this floor a change is not believed whatever the data: clocks and power move by ~1 %.
MIN_FLOOR = 0.01
# A call time whose fitted floor reaches this is the host's (launch, heuristic, a busy CPU), not
# the GPU's: between runs it is judged not at all. Calls under 0.1 ms per launch on the H100;
# one held-out rerun from another machine start moved them by up to 2.5x with their kernels
# unchanged within 1 % (reports/h100/noise/kernel-b/run-04), beyond the 78 % the fit had seen.
HOST_BOUND_FLOOR = 0.5


# What a floor is the spread of. Between runs: `call` (a call's event time), `kernel` (its kernels'
# CUPTI time, FMA-pipe modes), `kernel_tensor` (the same for tensor-pipe modes: their kernels run
# at the power limit, and their time moves with the clock by up to 8 % between runs where FP32
# kernels move by 2 %). Within a run, for two contenders timed interleaved (the reference and the
# call): how far their ratio moves between runs, `call_ratio` / `kernel_ratio`.
BASE_KINDS = (
    FloorKind.call,
    FloorKind.kernel,
    FloorKind.kernel_tensor,
    FloorKind.call_ratio,
    FloorKind.kernel_ratio,
)
# A map (device.map_engine) times 5 calls of a problem back to back in queued chunks, over tens of
# thousands of problems. Its reruns on the H100 show what the sweep's reruns (about 100 cases)
# never reached: about one problem in a thousand shifted between runs, all 5 of its calls alike,
# by up to 18 % (FP32 kernels) and 36 % (BF16), at any time per launch below 1 ms (12.5 % at
# 0.45 ms, 14 % at 0.05 ms: tests/fixtures/h100-map-reruns). Its kinds are fitted on map
# reruns alone, pooled below POOLED_BELOW_MS (the largest shift anywhere there), and widen the
# base kinds wherever a map is compared (NoiseModel.for_maps).
MAP_KINDS = (FloorKind.map_call, FloorKind.map_kernel, FloorKind.map_kernel_tensor)
POOLED_BELOW_MS = 1.0
KINDS = BASE_KINDS + MAP_KINDS
# A kind a model lacks is judged with the floor of the kind that bounds it. The kernels' time and a
# ratio measured interleaved are never noisier than the call's event time between runs; tensor
# kernels have no bound but the call's; a map kind the model lacks widens nothing.
FALLBACK = {
    FloorKind.kernel: FloorKind.call,
    FloorKind.kernel_tensor: FloorKind.call,
    FloorKind.call_ratio: FloorKind.call,
    FloorKind.kernel_ratio: FloorKind.kernel,
    **{kind: kind.base for kind in MAP_KINDS},
}
# The between-run kinds a map measures too (FloorKind.on_map): a ratio is timed by no map.
ON_MAPS = tuple(kind.base for kind in MAP_KINDS)
# The table column each between-run kind reads, and the (numerator, denominator) of each ratio.
COLUMNS = {
    FloorKind.call: "time_ms",
    FloorKind.kernel: "kernel_time_ms",
    FloorKind.kernel_tensor: "kernel_time_ms",
}
RATIOS = {
    FloorKind.call_ratio: ("ref_time_ms", "time_ms"),
    FloorKind.kernel_ratio: ("ref_kernel_time_ms", "kernel_time_ms"),
}


@dataclass(frozen=True)
class NoiseModel:
    edges_ms: tuple[float, ...]
    floors: tuple[float, ...]  # the call's event time between runs, per bin: 0.3 = 30 %
    source: dict[str, Any] = field(default_factory=dict)
    others: dict[FloorKind, tuple[float, ...]] = field(default_factory=dict)  # kernel, ratios

    def floors_of(self, kind: str = FloorKind.call) -> tuple[float, ...]:
        """The floors of one kind (KINDS), or of the kind that bounds it where not measured."""
        kind = FloorKind(kind)
        while kind is not FloorKind.call and kind not in self.others:
            kind = FALLBACK[kind]
        return self.floors if kind is FloorKind.call else self.others[kind]

    def for_maps(self) -> NoiseModel:
        """The model of a comparison with a map on either side: each between-run kind's floors
        widened, bin by bin, by its map kind's (where this model has one)."""

        def widened(kind: str) -> tuple[float, ...]:
            base, mapped = self.floors_of(kind), _on_map(kind)
            if mapped is None or mapped not in self.others:
                return base
            return tuple(max(b, m) for b, m in zip(base, self.others[mapped], strict=True))

        others = {
            kind: widened(kind)
            for kind in BASE_KINDS[1:]
            if self.has(kind) or _on_map(kind) in self.others
        }
        call = widened(FloorKind.call)
        return NoiseModel(self.edges_ms, call, {**self.source, "for": "maps"}, others)

    def has(self, kind: str) -> bool:
        return kind == FloorKind.call or kind in self.others

    def floor(self, time_per_launch_ms: float, kind: str = FloorKind.call) -> float:
        """The relative change noise alone can make at this time per launch."""
        floors = self.floors_of(kind)
        return floors[self.bin(time_per_launch_ms)]

    def between_runs(self, time_per_launch_ms: float, kind: str = FloorKind.call) -> float:
        """The floor of a comparison of two runs: infinite for a host-bound call time (its
        fitted floor at least HOST_BOUND_FLOOR), which then can only be unsure."""
        floor = self.floor(time_per_launch_ms, kind)
        return math.inf if kind == FloorKind.call and floor >= HOST_BOUND_FLOOR else floor

    def bin(self, time_per_launch_ms: float) -> int:
        if not math.isfinite(time_per_launch_ms) or time_per_launch_ms <= 0:
            return 0
        index = bisect.bisect_left(self.edges_ms, time_per_launch_ms)
        return min(index, len(self.edges_ms) - 1)

    def to_json(self) -> dict[str, Any]:
        edges = [edge if math.isfinite(edge) else None for edge in self.edges_ms]
        floors = {FloorKind.call: list(self.floors), **{k: list(v) for k, v in self.others.items()}}
        return {"edges_ms": edges, "floors": floors, "source": self.source}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoiseModel:
        """Reads a model; `floors` is a mapping of KINDS, or (first models) the call's list."""
        edges = tuple(math.inf if e is None else float(e) for e in data["edges_ms"])
        raw = data["floors"]
        kinds = raw if isinstance(raw, dict) else {FloorKind.call: raw}
        unknown = set(kinds) - set(KINDS)
        if unknown or FloorKind.call not in kinds:
            raise ValueError(f"floors must be of {', '.join(KINDS)}, with call")
        parsed = {FloorKind(kind): tuple(float(f) for f in v) for kind, v in kinds.items()}
        for values in parsed.values():
            if len(values) != len(edges) or not all(math.isfinite(f) and f >= 0 for f in values):
                raise ValueError("edges_ms and floors must pair up, floors finite and >= 0")
        call = parsed.pop(FloorKind.call)
        return cls(edges, call, dict(data.get("source") or {}), parsed)


@functools.lru_cache(maxsize=4)
def load(path: Path = DEFAULT_MODEL) -> NoiseModel:
    try:
        return NoiseModel.from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AuditError(f"{path}: not a cublas-audit noise model ({exc})") from exc


def launches(rows: pd.DataFrame) -> pd.Series:
    """Kernel launches per call: a loop companion issues `batch` single calls, others one."""
    if "routine" not in rows.columns:
        return pd.Series(1, index=rows.index)
    return rows["batch"].where(rows["routine"].fillna("") == LOOP_ROUTINE, 1).astype(int)


def time_per_launch(rows: pd.DataFrame, column: str = "time_ms") -> pd.Series:
    return rows[column].astype(float) / launches(rows)


def pair_spreads(tables: Sequence[pd.DataFrame], kind: str = FloorKind.call) -> pd.DataFrame:
    """For every case measured in two of the tables: its time per launch and the spread of this
    kind between them, |log(t_i / t_j)| (or of the ratio, for a ratio kind), one row per pair."""
    measured = [table for table in (_measured(t, kind) for t in tables) if not table.empty]
    pairs = []
    for left, right in itertools.combinations(measured, 2):
        both = left.merge(right, on="case_id", suffixes=("_a", "_b"))
        pairs.append(
            pd.DataFrame(
                {
                    "case_id": both["case_id"],
                    "per_launch": np.sqrt(both["per_launch_a"] * both["per_launch_b"]),
                    "log_ratio": np.abs(both["value_b"] - both["value_a"]),
                }
            )
        )
    return (
        pd.concat(pairs, ignore_index=True)
        if pairs
        else pd.DataFrame(columns=["case_id", "per_launch", "log_ratio"])
    )


def _measured(table: pd.DataFrame, kind: str) -> pd.DataFrame:
    """case_id, time per launch and the log of the measured value, where this table has it."""
    rows, kind = main_launches(table), FloorKind(kind)
    if kind in RATIOS:
        numerator, column = RATIOS[kind]
    else:
        numerator, column = None, COLUMNS[kind]
    needed = [c for c in (numerator, column) if c]
    if not set(needed) <= set(rows.columns):
        return pd.DataFrame()
    rows = rows.dropna(subset=needed)
    if FloorKind(kind) in (FloorKind.kernel, FloorKind.kernel_tensor, FloorKind.kernel_ratio):
        # kernel floors are per pipe, ratios (FP32 reference) FMA
        rows = rows[on_tensor_pipe(rows) == (kind == FloorKind.kernel_tensor)]
    if numerator:  # the ratio of two contenders timed interleaved on the same row
        rows = rows[interleaved_with_reference(rows)]
        value = np.log(rows[numerator].astype(float) / rows[column].astype(float))
    else:
        value = np.log(rows[column].astype(float))
    return pd.DataFrame(
        {"case_id": rows["case_id"], "per_launch": time_per_launch(rows, column), "value": value}
    )


def on_tensor_pipe(rows: pd.DataFrame) -> pd.Series:
    """Whether each row's mode runs on the tensor pipe (modes.pipe_name)."""
    modes = rows["mode"] if "mode" in rows.columns else pd.Series("fp32", index=rows.index)
    return modes.map(lambda mode: pipe_name(str(mode)) == "tensor-pipe").astype(bool)


def kernel_kind(mode: str) -> FloorKind:
    """The noise model kind of a kernel time measured in this mode."""
    return FloorKind.kernel_tensor if pipe_name(mode) == "tensor-pipe" else FloorKind.kernel


def _on_map(kind: str) -> FloorKind | None:
    """The map kind of a between-run kind; None for a ratio (no map times one interleaved)."""
    return FloorKind(kind).on_map if kind in ON_MAPS else None


def interleaved_with_reference(rows: pd.DataFrame) -> pd.Series:
    """The rows whose call the probe timed interleaved with the reference (the classic cuBLAS
    call; the reference's columns are copied onto the problem's other rows, not timed with
    them)."""
    api = rows["api"] if "api" in rows.columns else pd.Series("", index=rows.index)
    loop = launches(rows) > 1
    # Only this tool's probe is known to interleave them; it records the reference's
    # distribution (schema 2 on): a table from elsewhere has none and gets no interleaved floor.
    if "ref_time_n" not in rows.columns:
        return pd.Series(False, index=rows.index)
    recorded = rows["ref_time_n"].notna()
    return ((api == "cublas") & ~loop & recorded).astype(bool)


def fit(
    tables: Sequence[pd.DataFrame],
    source: dict[str, Any],
    margin: float = MARGIN,
    maps: Sequence[Sequence[pd.DataFrame]] = (),
) -> NoiseModel:
    """For each kind the tables measure: the envelope of the spread between every pair of them,
    by bin of time per launch, times `margin`, at least MIN_FLOOR, and never smaller at a shorter
    time than at a longer one; a bin the runs left empty takes the floor of the bin below it
    (nothing was measured there to say it is quieter). `maps`: groups of reruns of one map each
    (paired within their group only), fitted into the map kinds, pooled below POOLED_BELOW_MS; a
    bin above that no map reached widens nothing."""
    fitted = {}
    for kind in BASE_KINDS:
        spreads = pair_spreads(tables, kind)
        if not spreads.empty:
            fitted[kind] = _envelope(spreads, margin)
    fitted.update(map_floors(maps, margin))
    if FloorKind.call not in fitted:
        raise AuditError("fitting a noise model needs at least two tables with a shared case")
    call = fitted.pop(FloorKind.call)
    return NoiseModel(EDGES_MS, call, source, fitted)


def map_floors(
    maps: Sequence[Sequence[pd.DataFrame]], margin: float = MARGIN
) -> dict[FloorKind, tuple[float, ...]]:
    """The map kinds' floors from groups of reruns of one map each (paired within a group)."""
    fitted = {}
    for kind in MAP_KINDS:
        found = [pair_spreads(group, kind.base) for group in maps]
        found = [spreads for spreads in found if not spreads.empty]
        if found:
            spreads = pd.concat(found, ignore_index=True)
            fitted[kind] = _envelope(spreads, margin, pooled_below_ms=POOLED_BELOW_MS)
    return fitted


def _envelope(
    spreads: pd.DataFrame, margin: float, pooled_below_ms: float | None = None
) -> tuple[float, ...]:
    bins = np.searchsorted(np.array(EDGES_MS), spreads["per_launch"].to_numpy(), side="left")
    worst = [
        float(np.expm1(spreads["log_ratio"].to_numpy()[bins == i].max()))
        if (bins == i).any()
        else 0.0
        for i in range(len(EDGES_MS))
    ]
    measured = [bool((bins == i).any()) for i in range(len(EDGES_MS))]
    if pooled_below_ms is not None:  # one floor for every bin up to it: the largest there
        pooled = [i for i, edge in enumerate(EDGES_MS) if edge <= pooled_below_ms]
        for i in pooled:
            worst[i], measured[i] = max(worst[j] for j in pooled), True
    floors = [max(MIN_FLOOR, w * margin) for w in worst]
    for i in range(1, len(floors)):  # a bin no run reached keeps the floor of the one below
        if not measured[i] and pooled_below_ms is None:
            floors[i] = floors[i - 1]
    for i in range(len(floors) - 2, -1, -1):  # a shorter launch is never less noisy
        floors[i] = max(floors[i], floors[i + 1])
    return tuple(round(f, 4) for f in floors)
