"""Judging a full 3-D dispatch map: `map_findings` and the map report on 262,144 problems (CPU).

    python benchmarks/judge_scale.py [--json FILE] [--step 64]

Target: judging (`map_findings`: rules.prepare, size-inversion, dispatch-cliff) under 60 s on
M, N, K each in 64..4096 step 64, one mode: 64^3 = 262,144 rows.

The workload is for speed only: its findings say nothing about cuBLAS, and no GPU ran it. Each
grid point takes the row of the nearest problem (Euclidean; ties to the first recorded) of the
real 10,000-case FP32 map of the H100 (benchmarks/results/map-10k-h100, whose M, N, K were
sampled from that grid), with its sizes and case id replaced and every time scaled by the
volume ratio: each point keeps its neighbour's kernel and throughput, so the map has a real
map's kernel regions, with inversions and cliffs where two regions meet. The recorded problems
keep their own rows. The report is written to a temporary directory and its sizes printed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cublas_audit.judge.map_audit import audit_map, map_findings  # noqa: E402
from cublas_audit.report import map_report  # noqa: E402
from cublas_audit.table.env_record import EnvRecord  # noqa: E402
from cublas_audit.table.inputs import Dataset  # noqa: E402
from cublas_audit.table.validation import read_table  # noqa: E402

MAP_10K = REPO / "benchmarks" / "results" / "map-10k-h100"
LOW, HIGH = 64, 4096
LIMIT_S = 60.0


def recorded_map(run_dir: Path = MAP_10K) -> pd.DataFrame:
    """The 10,000-case map's table (its dispatch.csv is committed gzipped)."""
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "dispatch.csv"
        table.write_bytes(gzip.decompress((run_dir / "dispatch.csv.gz").read_bytes()))
        return read_table(table)


def grid_points(step: int) -> np.ndarray:
    """Every (m, n, k) of LOW..HIGH in steps of `step`, m slowest."""
    if step % LOW:
        raise SystemExit(f"--step must be a multiple of {LOW} (the recorded map's grid)")
    axis = np.arange(LOW, HIGH + 1, step, dtype=np.int64)
    m, n, k = np.meshgrid(axis, axis, axis, indexing="ij")
    return np.stack([m.ravel(), n.ravel(), k.ravel()], axis=1)


def nearest(points: np.ndarray, recorded: np.ndarray) -> np.ndarray:
    """For each point, the position of the nearest recorded problem (Euclidean; ties to the
    first recorded). Both lie on the grid of step LOW: the recorded positions are laid on it, and
    each point looks at the cells around it shell by shell (offsets of one length at a time)
    until one holds a problem: a few shells, where all pairs would be 262,144 x 10,000."""
    cells, at = recorded // LOW, points // LOW
    side = int(max(cells.max(), at.max())) + 1
    none = len(recorded)
    owner = np.full((side, side, side), none, dtype=np.int64)
    np.minimum.at(owner, tuple(cells.T), np.arange(len(recorded)))
    found = np.full(len(points), none, dtype=np.int64)
    reach = np.arange(-side + 1, side)
    offsets = np.stack(np.meshgrid(reach, reach, reach, indexing="ij"), axis=-1).reshape(-1, 3)
    lengths = (offsets**2).sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    shells = np.split(offsets[order], np.flatnonzero(np.diff(lengths[order])) + 1)
    for shell in shells:
        open_ = np.flatnonzero(found == none)
        if not len(open_):
            break
        for offset in shell:
            cell = at[open_] + offset
            inside = ((cell >= 0) & (cell < side)).all(axis=1)
            seen = np.full(len(open_), none, dtype=np.int64)
            seen[inside] = owner[tuple(cell[inside].T)]
            found[open_] = np.minimum(found[open_], seen)
    return found


def full_grid(recorded: pd.DataFrame, step: int = 64) -> pd.DataFrame:
    """The speed workload: the grid's points, each the nearest recorded row rescaled."""
    points = grid_points(step)
    dims = recorded[["m", "n", "k"]].to_numpy(dtype=np.int64)
    source = nearest(points, dims)
    rows = recorded.iloc[source].reset_index(drop=True)
    scale = points.prod(axis=1).astype(float) / dims[source].prod(axis=1)
    for column in [c for c in rows.columns if c.endswith("_ms")]:
        rows[column] = rows[column].astype("Float64") * scale
    rows["tflops"] = rows["tflops"].astype("Float64")  # unchanged: the throughput is kept
    m, n, k = (pd.Series(points[:, i]).astype("Int64") for i in range(3))
    rows["m"], rows["n"], rows["k"] = m, n, k
    rows["case_id"] = ("cublas.fp32." + m.astype(str) + "x" + n.astype(str) + "x" + k.astype(str)
                       + ".b1.nn").astype("string")  # fmt: skip
    return rows


def cpu_model() -> str:
    """The CPU's model name where Linux tells it, else the architecture."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--step", type=int, default=64, help="grid step (64: 262,144 rows)")
    args = parser.parse_args(argv)
    build_s, frame = timed(lambda: full_grid(recorded_map(), args.step))
    judge_s, found = timed(lambda: map_findings(frame))
    dataset = Dataset("h100 (speed workload)", "h100", MAP_10K, frame, EnvRecord())
    with tempfile.TemporaryDirectory() as tmp:
        # the map judged as its run does (its prepared rows: the report's to render)
        render_s, _ = timed(
            lambda: map_report.write_map_report(Path(tmp), audit_map(dataset, found=found))
        )
        report_kib = (Path(tmp) / "report.md").stat().st_size / 1024
        findings_mib = (Path(tmp) / "findings.json").stat().st_size / 2**20
    rules = pd.Series([f.rule for f in found], dtype=object).value_counts().to_dict()
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": cpu_model(),
        "cpus": os.cpu_count(),
        "rows": len(frame),
        "workload_build_seconds": round(build_s, 2),
        "map_findings_seconds": round(judge_s, 2),
        "map_report_seconds": round(render_s, 2),
        "findings": {str(rule): int(count) for rule, count in rules.items()},
        "report_md_kib": round(report_kib, 1),
        "findings_json_mib": round(findings_mib, 1),
        "target_map_findings_seconds": LIMIT_S,
    }
    text = json.dumps(result, indent=2)
    print(text)
    verdict = "meets" if judge_s < LIMIT_S else "misses"
    print(f"map_findings on {len(frame)} rows: {judge_s:.1f} s ({verdict} < {LIMIT_S:.0f} s)")
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
