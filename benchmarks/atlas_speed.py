"""Speed of `atlas` on a full 3-D map: M, N, K each 64..4096 step 64 = 262,144 problems.

    python benchmarks/atlas_speed.py [--json FILE]

SPEED-ONLY WORKLOAD: no GPU has measured this grid here. The recorded H100 FP32 map of 3,000
random problems (reports/h100/maps/20261125-092546-fp32-random, with its follow-up) is tiled onto
the full grid: grid point i carries every column of recorded row i mod 3,000 (its kernel, times,
clocks, launch geometry) under its own m, n, k and case id, beside a plan.json of the 262,144
cases, the map's env.json, findings.json (their rows are the first tile's, which holds the
recorded rows unchanged) and follow-up/. Kernels and times therefore do not belong to the sizes
they stand at: the atlas's pictures and kernel regions of this map mean nothing; its size and
the time to write it are what is measured.

Timed in-process: the whole `atlas` job (read and check dispatch.csv and plan.json, the follow-up,
prepare, grid and kernel tables, pictures, atlas.md), then the atlas read back as a dispatch
table (what `diff` takes), then the job again into a second directory (grid.csv.gz must be the
same bytes).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from cublas_audit.jobs.atlas import AtlasJob
from cublas_audit.jobs.atlas import run as atlas
from cublas_audit.planning import plan_file
from cublas_audit.planning.cases import Case
from cublas_audit.table import dispatch, rundir
from cublas_audit.table.atlas_files import GRID_FILE
from cublas_audit.table.inputs import load_one_gpu
from cublas_audit.table.validation import read_table

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "reports" / "h100" / "maps" / "20261125-092546-fp32-random"
SIZES = range(64, 4097, 64)
LIMIT_S = 60.0  # "seconds, not minutes"
BUNDLE_MB = 5.0  # the atlas of one mode, pictures included, at most


def tiled_map(run: Path) -> int:
    """The recorded map tiled onto the full grid as a map run directory at `run`; its rows."""
    recorded = read_table(RECORDED)
    m, n, k = (a.ravel() for a in np.meshgrid(SIZES, SIZES, SIZES, indexing="ij"))
    shapes = zip(m.tolist(), n.tolist(), k.tolist(), strict=True)
    cases = [Case("cublas", "fp32", a, b, c, 1) for a, b, c in shapes]
    frame = recorded.iloc[np.arange(len(cases)) % len(recorded)].reset_index(drop=True)
    frame = frame.assign(m=m, n=n, k=k, case_id=[case.case_id for case in cases])
    run.mkdir(parents=True)
    dispatch.write_table(frame, run / rundir.TABLE_FILE)
    plan_file.write(cases, run / rundir.PLAN_FILE)
    env = rundir.read_env(RECORDED)
    grid = f"{SIZES.start}:{SIZES.stop - 1}:{SIZES.step}"
    command = ["cublas-audit", "map", "--m", grid, "--n", grid, "--k", grid, "--modes", "fp32"]
    rundir.write_env(run, {**env, "command": [*command, "--follow-up", "--out", str(run)]})
    shutil.copy(RECORDED / rundir.FINDINGS_FILE, run / rundir.FINDINGS_FILE)
    shutil.copytree(RECORDED / rundir.FOLLOW_UP_DIR, run / rundir.FOLLOW_UP_DIR)
    return len(frame)


def sizes(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json", type=Path, default=REPO / "benchmarks" / "results" / "atlas_speed.json"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = tiled_map(work / "map")
        dispatch_bytes = (work / "map" / rundir.TABLE_FILE).stat().st_size
        start = time.perf_counter()
        atlas(AtlasJob([work / "map"], work / "atlas"), print)
        atlas_s = time.perf_counter() - start
        start = time.perf_counter()
        read_back = load_one_gpu(work / "atlas" / "fp32")
        read_s = time.perf_counter() - start
        atlas(AtlasJob([work / "map"], work / "again"), lambda *_: None)
        same = (work / "atlas" / "fp32" / GRID_FILE).read_bytes() == (
            work / "again" / "fp32" / GRID_FILE
        ).read_bytes()
        written = sizes(work / "atlas" / "fp32")
    total = sum(written.values())
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "workload": "SPEED ONLY: the recorded 3,000-problem H100 FP32 map tiled onto 64..4096 "
        "step 64 in M, N and K (kernels and times do not belong to their sizes)",
        "problems": rows,
        "dispatch_csv_bytes": dispatch_bytes,
        "atlas_s": round(atlas_s, 2),
        "read_back_s": round(read_s, 2),
        "read_back_rows": len(read_back.frame),
        "bytes": written,
        "total_bytes": total,
        "grid_identical_on_rerun": same,
        "limit_s": LIMIT_S,
        "ok": atlas_s <= LIMIT_S and total <= BUNDLE_MB * 1e6 and same,
    }
    print(f"SPEED-ONLY WORKLOAD: a recorded 3,000-problem map tiled onto {rows} problems")
    print(f"dispatch.csv read: {dispatch_bytes / 1e6:.1f} MB")
    print(f"atlas job:        {atlas_s:.2f} s (limit {LIMIT_S:.0f} s)")
    print(f"read back:        {read_s:.2f} s ({len(read_back.frame)} rows)")
    for name, size in written.items():
        print(f"  {name}: {size} bytes")
    print(f"atlas total:      {total} bytes ({total / 1e6:.2f} MB; at most {BUNDLE_MB:g} MB)")
    print(f"grid.csv.gz identical on rerun: {same}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
