"""The run-to-run noise model: how far the median time of the same call moves between two runs on
the same GPU, as a function of the time of one launch.

Run-to-run spread is larger than the spread within a run and depends on the time scale: a 20 us
launch is dominated by the host (launch, heuristic, the loop that issues it) and moves by 20-40 %
between runs, a 2 ms one by 1-2 %. The model is an upper envelope of that spread over bins of the
time per launch (the call's time divided by the kernels it launches: a loop of `batch` single
calls launches `batch`), measured on back-to-back reruns of the default batched grid
(benchmarks/noise.py) and shipped as package data with the device, date and versions it was
measured on. `floor(t)` is the relative change between two runs that noise alone can produce at
that scale; cublas_audit.verdicts widens every timing comparison by it.
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

from cublas_audit.cases import LOOP_ROUTINE
from cublas_audit.errors import AuditError
from cublas_audit.table import main_launches

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_MODEL = DATA_DIR / "noise_h100.json"
# Upper edges of the time-per-launch bins, ms: half decades from 30 us to 100 ms.
EDGES_MS = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, math.inf)
# The envelope is the largest spread seen in a bin times this margin: the fitting runs are a
# sample, and a gate must hold on runs it has not seen.
MARGIN = 1.25
# Below this floor a change is not believed whatever the data: clocks and power move by ~1 %.
MIN_FLOOR = 0.01


@dataclass(frozen=True)
class NoiseModel:
    edges_ms: tuple[float, ...]
    floors: tuple[float, ...]  # relative spread per bin, e.g. 0.3 = 30 %
    source: dict[str, Any] = field(default_factory=dict)

    def floor(self, time_per_launch_ms: float) -> float:
        """The relative change noise alone can make at this time per launch."""
        if not math.isfinite(time_per_launch_ms) or time_per_launch_ms <= 0:
            return self.floors[0]
        return self.floors[
            min(bisect.bisect_left(self.edges_ms, time_per_launch_ms), len(self.floors) - 1)
        ]

    def to_json(self) -> dict[str, Any]:
        edges = [edge if math.isfinite(edge) else None for edge in self.edges_ms]
        return {"edges_ms": edges, "floors": list(self.floors), "source": self.source}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoiseModel:
        edges = tuple(math.inf if e is None else float(e) for e in data["edges_ms"])
        floors = tuple(float(f) for f in data["floors"])
        if len(edges) != len(floors) or not all(math.isfinite(f) and f >= 0 for f in floors):
            raise ValueError("edges_ms and floors must pair up, floors finite and >= 0")
        return cls(edges, floors, dict(data.get("source") or {}))


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


def pair_spreads(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """For every case timed in two of the tables: its time per launch and |log(t_i / t_j)|,
    one row per pair of tables."""
    timed = []
    for index, table in enumerate(tables):
        rows = main_launches(table)
        rows = rows[rows["time_ms"].notna()]
        timed.append(
            pd.DataFrame(
                {"case_id": rows["case_id"], "time_ms": rows["time_ms"].astype(float),
                 "per_launch": time_per_launch(rows), "run": index}
            )
        )  # fmt: skip
    pairs = []
    for left, right in itertools.combinations(timed, 2):
        both = left.merge(right, on="case_id", suffixes=("_a", "_b"))
        pairs.append(
            pd.DataFrame(
                {
                    "case_id": both["case_id"],
                    "per_launch": np.sqrt(both["per_launch_a"] * both["per_launch_b"]),
                    "log_ratio": np.abs(np.log(both["time_ms_b"] / both["time_ms_a"])),
                }
            )
        )
    return (
        pd.concat(pairs, ignore_index=True)
        if pairs
        else pd.DataFrame(columns=["case_id", "per_launch", "log_ratio"])
    )


def fit(
    tables: Sequence[pd.DataFrame], source: dict[str, Any], margin: float = MARGIN
) -> NoiseModel:
    """The envelope of the spread between every pair of the tables, by bin of time per launch,
    times `margin`, at least MIN_FLOOR, and never smaller at a shorter time than at a longer one
    (the longest bins' floor carries down to bins the runs left empty)."""
    spreads = pair_spreads(tables)
    if spreads.empty:
        raise AuditError("fitting a noise model needs at least two tables with a shared case")
    bins = np.searchsorted(np.array(EDGES_MS), spreads["per_launch"].to_numpy(), side="left")
    worst = [
        float(np.expm1(spreads["log_ratio"].to_numpy()[bins == i].max()))
        if (bins == i).any()
        else 0.0
        for i in range(len(EDGES_MS))
    ]
    floors = [max(MIN_FLOOR, w * margin) for w in worst]
    for i in range(len(floors) - 2, -1, -1):  # a shorter launch is never less noisy
        floors[i] = max(floors[i], floors[i + 1])
    return NoiseModel(EDGES_MS, tuple(round(f, 4) for f in floors), source)
