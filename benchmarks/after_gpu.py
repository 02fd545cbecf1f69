"""After the GPUs (issue 40 item 3): merge four shards of a 262,144-problem map, judge it and
write its report, timed, and the size of the run directory that leaves.

    python benchmarks/after_gpu.py [--rows N] [--shards N] [--json FILE] [--keep DIR] [--serial]

The map is real rows tiled, as benchmarks/large_table.py tiles them: the 10,000-problem BF16 map
of the H100 (tests/fixtures/h100-map-reruns/bf16-s1, run a: every column of its dispatch.csv,
`map --m 64:4096:64 --n 64:4096:64 --k 64:4096:64 --sample 10000 --seed 1 --modes bf16`), tile i
with m increased by i % 64 and n by i // 64, its case ids renamed to match; nothing else
changes. Its whole plan is the tiled table's cases; it is split into `--shards` parts
(planning.shards, as `--shard I/N` and `--devices` split a plan), and each part written as a
shard's run directory by the project's own writers (plan.json, plan-whole.json, dispatch table,
env.json: the recorded run's, with the part's record), as a GPU run leaves it, with the probe's
record of each case: timing.jsonl of the H100's 10,000-problem FP32 map
(benchmarks/results/map-10k-h100: its `probe` record, then each case's `start` and `done`
records in turn, ids renamed to the shard's cases), ~1 KB a problem as a map run writes it.

Timed, in this process, with the CPU time beside the wall time (the machine may be shared; the
CPU time of forked children counted in):
`merge` of the shards into a new run directory (jobs.merge.run: read and check every shard, the
tables joined in plan order, the merged files written), split by wrapping the job's own calls
into its merge (reading, checking, joining, writing), its judging (the map's findings:
judge.map_audit) and its report (report.md, pictures, findings.json). Sizes: the merged run
directory, each file, and the shards as written (what `--devices all` keeps under shards/ and
what Ray ships back), and plan.json of the real full grid (`map --m 64:4096:64 ...` of one mode:
262,144 cases) as the project writes it. Each shard's raw streams are folded first
(rundir.compact_results, timed per shard: `--devices` folds a shard in its own thread as it
finishes, a Ray task before it ships, so only the last shard's fold follows the GPUs: the
largest is added to after_gpu_s).

The tiled map has fewer findings than a real full grid (its tiles are a random sample's rows,
not neighbours on the grid). So judging and the report are also timed on the real full grid:
the H100's BF16 atlas (reports/h100/atlas/bf16: all 262,144 problems of 64..4096 step 64, each
kernel and kernel time as the map measured it), read back as a dispatch table (table.atlas_files)
and judged and reported as `merge` does (`full_grid_atlas`).

This is a measurement, not a test: it takes a minute or more and some 1 GB of disk.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from judge_scale import cpu_model  # noqa: E402
from large_table import tile  # noqa: E402

from cublas_audit import forked  # noqa: E402
from cublas_audit.gc_pause import collector_paused  # noqa: E402
from cublas_audit.jobs import merge, run_reports  # noqa: E402
from cublas_audit.planning import plan_file  # noqa: E402
from cublas_audit.planning.cases import Case  # noqa: E402
from cublas_audit.planning.map_grid import Grid, grid_plan  # noqa: E402
from cublas_audit.planning.shards import PlanPart, ShardSpec  # noqa: E402
from cublas_audit.report import map_report  # noqa: E402
from cublas_audit.table import rundir  # noqa: E402

RECORDED = REPO / "tests" / "fixtures" / "h100-map-reruns" / "bf16-s1"
RECORDS = REPO / "benchmarks" / "results" / "map-10k-h100" / "timing.jsonl.gz"
ATLAS = REPO / "reports" / "h100" / "atlas" / "bf16"
ROWS = 262_144
SHARDS = 4
LIMIT_S = 15.0
LIMIT_MB = 100.0
FULL_GRID = "64:4096:64"


def tiled_map(rows: int) -> pd.DataFrame:
    """`rows` rows of tiles of the recorded map (large_table.tile)."""
    run = pd.read_parquet(RECORDED / "a.parquet")
    tiles = -(-rows // len(run))
    return pd.concat([tile(run, i) for i in range(tiles)], ignore_index=True).head(rows)


def cases_of(frame: pd.DataFrame) -> list[Case]:
    """The plan a table is the run of: each row's case (the map's classic nn calls)."""
    shapes = frame[["api", "mode", "m", "n", "k", "batch"]].itertuples(index=False, name=None)
    cases = [Case(api, mode, int(m), int(n), int(k), int(b)) for api, mode, m, n, k, b in shapes]
    if [c.case_id for c in cases] != frame["case_id"].tolist():
        raise SystemExit("the tiled table's case ids are not its cases' (a plan of other calls)")
    return cases


def write_shards(frame: pd.DataFrame, count: int, root: Path) -> list[Path]:
    """The table's plan in `count` parts, each a shard's run directory as a GPU run leaves it."""
    whole = cases_of(frame)
    env = json.loads((RECORDED / "a.env.json").read_text())
    by_id = frame.set_index("case_id", drop=False)
    paths = []
    for index in range(1, count + 1):
        part = PlanPart.of(ShardSpec(index, count), whole)
        cases = part.cases()
        path = root / f"gpu{index - 1}"
        path.mkdir(parents=True)
        plan_file.write(cases, path / rundir.PLAN_FILE)
        plan_file.write(whole, path / rundir.WHOLE_PLAN_FILE)
        rows = by_id.loc[[case.case_id for case in cases]].reset_index(drop=True)
        rundir.write_run_table(rows, path)  # as a shard's sweep writes it (run.run_table)
        rundir.write_env(path, {**env, **part.record(), "device_index": index - 1})
        write_records([case.case_id for case in cases], path / rundir.TIME_RESULTS)
        paths.append(path)
    return paths


def write_records(case_ids: list[str], path: Path) -> None:
    """The recorded map's probe records as a run of these cases would have written them."""
    lines = gzip.decompress(RECORDS.read_bytes()).decode().splitlines()
    records = [json.loads(line) for line in lines]
    probe = next(r for r in records if r.get("event") == "probe")
    starts = [r for r in records if r.get("event") == "start"]
    done = [r for r in records if r.get("event") == "done"]
    with path.open("w") as out:
        out.write(json.dumps(probe) + "\n")
        for i, case_id in enumerate(case_ids):
            for record in (starts[i % len(starts)], done[i % len(done)]):
                out.write(json.dumps({**record, "case_id": case_id}) + "\n")


def fold(paths: list[Path]) -> list[float]:
    """Each shard's raw streams folded (rundir.compact_results): seconds each."""
    took = []
    for path in paths:
        start = time.perf_counter()
        rundir.compact_results(path)
        took.append(round(time.perf_counter() - start, 2))
    return took


def full_grid_atlas(work: Path) -> dict[str, Any]:
    """Judging and the map report on the real full grid (the BF16 atlas read back)."""
    from cublas_audit.judge.map_audit import audit_map
    from cublas_audit.table.inputs import load_one_gpu

    read, dataset = timed(lambda: load_one_gpu(ATLAS))
    out = work / "atlas-report"
    out.mkdir()
    with collector_paused():  # as jobs.run_reports.write_map_report judges and reports
        judge, judged = timed(lambda: audit_map(dataset))
        report, _ = timed(lambda: map_report.write_map_report(out, judged))
    return {
        "source": str(ATLAS.relative_to(REPO)),
        "problems": len(dataset.frame),
        "findings": len(judged.findings),
        **{f"{name}_s": took[0] for name, took in (("read", read), ("judge", judge))},
        "report_s": report[0],
        **{f"{name}_cpu_s": took[1] for name, took in (("read", read), ("judge", judge))},
        "report_cpu_s": report[1],
        "judge_report_cpu_s": round(judge[1] + report[1], 2),
        "findings_mb": round(rundir.findings_file(out).stat().st_size / 1e6, 2),
    }


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children waited for: a large map's report draws
    its pictures and makes its findings' JSON in forks (cublas_audit.forked)."""
    return sum(os.times()[:4])


def timed(action: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """(wall seconds, CPU seconds) of `action`, and its result."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = action()
    return (round(time.perf_counter() - wall, 2), round(cpu_seconds() - cpu, 2)), result


class Clock:
    """Wall and CPU seconds spent inside wrapped calls, per stage (nested calls count once)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._depth = 0

    def wrap(self, stage: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            wall, cpu = time.perf_counter(), cpu_seconds()
            try:
                return call(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.wall[stage] = self.wall.get(stage, 0) + time.perf_counter() - wall
                    self.cpu[stage] = self.cpu.get(stage, 0) + cpu_seconds() - cpu

        return timed


@contextmanager
def patched(clock: Clock) -> Iterator[None]:
    """The merge job's own calls wrapped: judging (audit_map) and the report's rendering and
    writing; what is left of the job is its merge."""
    targets = [
        (run_reports, "audit_map", "judge"),
        (map_report, "write_map_report", "report"),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in targets]
    for module, name, stage in targets:
        setattr(module, name, clock.wrap(stage, getattr(module, name)))
    try:
        yield
    finally:
        for module, name, call in saved:
            setattr(module, name, call)


def sizes(path: Path) -> dict[str, float]:
    """MB (10^6 bytes) of each top-level entry of a directory (folders whole)."""
    found = {}
    for entry in sorted(path.iterdir()):
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        found[entry.name] = round(sum(p.stat().st_size for p in files) / 1e6, 2)
    return found


def full_grid_plan_kb(root: Path) -> float:
    """plan.json of the real full grid of one mode, as the project writes it (KB)."""
    grid = Grid.parse("", FULL_GRID, FULL_GRID, FULL_GRID)
    path = root / "full-grid-plan.json"
    plan_file.write(grid_plan(grid, [1], ["bf16"], ["cublas"]), path)
    return round(path.stat().st_size / 1e3, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="problems of the map")
    parser.add_argument("--shards", type=int, default=SHARDS, help="parts it is merged from")
    parser.add_argument(
        "--json", type=Path, default=REPO / "benchmarks" / "results" / "after_gpu_cpu.json"
    )
    parser.add_argument("--keep", type=Path, help="write the run directories here; keep them")
    parser.add_argument(
        "--serial", action="store_true", help="no forks: the report made in this process alone"
    )
    args = parser.parse_args()
    if args.serial:  # (the figures before the report's forks, on the same host)
        forked.can_fork = lambda: False
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.keep or Path(tmp)).absolute()
        work.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        load_before = os.getloadavg()[0]
        frame = tiled_map(args.rows)
        shard_dirs = write_shards(frame, args.shards, work / "shards")
        built = time.perf_counter() - start
        print(f"{len(frame):,} rows in {args.shards} shards written in {built:.1f} s")
        del frame
        raw_shards_mb = sum(sum(sizes(path).values()) for path in shard_dirs)
        folds = fold(shard_dirs)
        out = work / "merged"
        clock = Clock()
        job = merge.MergeJob([*shard_dirs], out, command=["after_gpu.py"])
        with patched(clock):
            wall, cpu = time.perf_counter(), cpu_seconds()
            merge.run(job)
            total_s, total_cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        stages = {
            "merge": total_s - sum(clock.wall.values()),
            "judge": clock.wall.get("judge", 0.0),
            "report": clock.wall.get("report", 0.0),
        }
        stages_cpu = {
            "merge": total_cpu - sum(clock.cpu.values()),
            "judge": clock.cpu.get("judge", 0.0),
            "report": clock.cpu.get("report", 0.0),
        }
        merged_files = sizes(out)
        shard_files = sizes(shard_dirs[0])
        shards_mb = sum(sum(sizes(path).values()) for path in shard_dirs)
        grid_plan_kb = full_grid_plan_kb(work)
        atlas = full_grid_atlas(work)
        found = rundir.read_env(shard_dirs[0])
    run_dir_mb = sum(merged_files.values()) + shards_mb
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "machine": cpu_model(),
        "cpus": os.cpu_count(),
        # a machine shared with other work: wall times swell with its load, CPU times less
        "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "rows": args.rows,
        "shards": args.shards,
        "forks": not args.serial and forked.can_fork(),
        "source": str(RECORDED.relative_to(REPO)) + "/a.parquet (tiled)",
        "gpu": found.get("gpu_name"),
        "after_gpu_s": round(total_s + max(folds), 2),
        "after_gpu_cpu_s": round(total_cpu + max(folds), 2),
        "merge_judge_report_s": round(total_s, 2),
        "fold_s": folds,
        "stages_s": {name: round(value, 2) for name, value in stages.items()},
        "stages_cpu_s": {name: round(value, 2) for name, value in stages_cpu.items()},
        "merged_mb": merged_files,
        "shard_mb": shard_files,
        "shards_mb": round(shards_mb, 2),
        "shards_before_fold_mb": round(raw_shards_mb, 2),
        "run_dir_mb": round(run_dir_mb, 2),
        "full_grid_plan_json_kb": grid_plan_kb,
        "full_grid_atlas": atlas,
        "limit_s": LIMIT_S,
        "limit_mb": LIMIT_MB,
        "ok": total_s + max(folds) <= LIMIT_S and run_dir_mb <= LIMIT_MB,
    }
    text = json.dumps(result, indent=2)
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
