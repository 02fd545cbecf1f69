"""A large run's table is columnar (table.rundir.write_run_table; issue 40 item 3): from
COLUMNAR_ROWS rows dispatch.parquet, read back as the same table dispatch.csv gave, found by
every reader of a run directory (load, merge, the map's report); a smaller one stays CSV, and a
run directory holds one of them. Shown on a real 256-problem H100 map with the threshold
lowered (what a 262,144-problem map crosses)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.jobs import merge
from cublas_audit.planning import plan_file
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.planning.shards import PlanPart, ShardSpec
from cublas_audit.table import rundir, shard_merge
from cublas_audit.table.inputs import load_run
from cublas_audit.table.validation import read_table

MAP = Path(__file__).resolve().parents[1] / "reports/h100/maps/20261124-003639-fp32-64-8192"


@pytest.fixture
def columnar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rundir, "COLUMNAR_ROWS", 100)


def copied(where: Path) -> Path:
    """The map's run directory without its table, plots and report."""
    where.mkdir()
    for name in (rundir.ENV_FILE, rundir.PLAN_FILE):
        shutil.copy(MAP / name, where / name)
    return where


def test_a_large_table_is_written_columnar_and_reads_as_the_csv(
    columnar: None, tmp_path: Path
) -> None:
    run = copied(tmp_path / "run")
    (run / rundir.TABLE_FILE).write_text("left by an earlier write\n")
    written = rundir.write_run_table(read_table(MAP), run)
    assert written.name == rundir.TABLE_COLUMNAR and rundir.table_file(run) == written
    assert not (run / rundir.TABLE_FILE).exists()  # one table a run directory
    assert written.stat().st_size < (MAP / rundir.TABLE_FILE).stat().st_size
    pd.testing.assert_frame_equal(read_table(run), read_table(MAP))
    loaded, recorded = load_run(run), load_run(MAP)
    pd.testing.assert_frame_equal(loaded.frame, recorded.frame)
    assert loaded.env == recorded.env


def test_a_small_table_stays_csv(tmp_path: Path) -> None:
    run = copied(tmp_path / "run")
    assert rundir.write_run_table(read_table(MAP), run).name == rundir.TABLE_FILE
    assert rundir.table_file(run) == run / rundir.TABLE_FILE


def test_columnar_shards_merge_into_a_columnar_run(
    columnar: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two shards of the map, each table columnar (as a shard of a full map writes it): merged,
    the map's table in plan order, written columnar, its report given the merged run."""
    whole, frame = read_plan(MAP / rundir.PLAN_FILE), read_table(MAP)
    shards = []
    for index in (1, 2):
        part = PlanPart.of(ShardSpec(index, 2), whole)
        path = tmp_path / f"shard-{index}"
        path.mkdir()
        plan_file.write(part.cases(), path / rundir.PLAN_FILE)
        plan_file.write(whole, path / rundir.WHOLE_PLAN_FILE)
        ids = {case.case_id for case in part.cases()}
        assert rundir.write_run_table(frame[frame["case_id"].isin(ids)], path).suffix == ".parquet"
        rundir.write_env(path, {**rundir.read_env(MAP), **part.record()})
        shards.append(path)
    assert all(shard_merge.finished(shard_merge.read_shard(path)) for path in shards)
    reported: list[Path] = []
    monkeypatch.setattr(merge, "write_map_report", lambda out, **_: reported.append(out) or out)
    out = tmp_path / "merged"
    merge.run(merge.MergeJob(shards, out, command=["merge"]))
    assert reported == [out] and (out / rundir.TABLE_COLUMNAR).is_file()
    pd.testing.assert_frame_equal(load_run(out).frame, frame)


def test_a_large_maps_findings_are_gzipped_and_read_back_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From COMPACT_FINDINGS findings a map's findings go to findings.json.gz (compact JSON):
    read back, the findings the H100's 10,000-problem map recorded, every field."""
    from cublas_audit.judge.map_audit import recorded_findings
    from cublas_audit.table.dispatch import json_ready

    recorded_run = MAP.parents[3] / "benchmarks/results/map-10k-h100"
    found = recorded_findings(recorded_run)
    assert found is not None and len(found) > 300
    monkeypatch.setattr(rundir, "COMPACT_FINDINGS", 300)
    (tmp_path / rundir.FINDINGS_FILE).write_text("[]\n")  # an earlier report's
    written = rundir.write_findings(tmp_path, json_ready([f.to_json() for f in found]))
    assert written.name == rundir.FINDINGS_COMPACT == rundir.findings_file(tmp_path).name
    assert not (tmp_path / rundir.FINDINGS_FILE).exists()
    assert written.stat().st_size * 5 < (recorded_run / rundir.FINDINGS_FILE).stat().st_size
    assert recorded_findings(tmp_path) == found


def test_a_finished_runs_results_fold_and_still_read(tmp_path: Path) -> None:
    """compact_results: the probe's records of the H100's 256-problem map gzipped (the plain file
    and the probe's case lists gone), read back as they were; a record appended after (a resumed
    run) reads after them."""
    recorded = MAP.parent / "20261123-235543-fp32-64-4096" / rundir.TIME_RESULTS
    results = tmp_path / rundir.TIME_RESULTS
    shutil.copy(recorded, results)
    (tmp_path / "timing.cases").write_text("cublas.fp32.64x64x64.b1.nn\n")
    before = rundir.read_results(results)
    rundir.compact_results(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [rundir.TIME_RESULTS + ".gz"]
    assert (tmp_path / (rundir.TIME_RESULTS + ".gz")).stat().st_size * 3 < recorded.stat().st_size
    assert rundir.read_results(results) == before and len(before) == 256
    rundir.append_record(results, {"event": "done", "case_id": "later"})
    rundir.compact_results(tmp_path)  # a second member after the first
    assert list(rundir.read_results(results)) == [*before, "later"]


def test_the_plane_draws_only_the_markers_seen() -> None:
    """map_plots._on_top: at each (M, N) of a panel the one marker the full drawing shows (each
    kernel drawn in turn, each in row order: the last row of the last kernel drawn there), on the
    real 3,000-problem BF16 map of the H100 taken as one band of K."""
    from cublas_audit.judge.rules import prepare
    from cublas_audit.report import map_plots

    rows = prepare(read_table(MAP.parent / "20261125-092546-bf16-random"))
    labels = rows["kernel_short"].fillna("(none)").astype(str)
    rows = rows.assign(m=rows["m"] // 512, n=rows["n"] // 512)  # coarse: ~11 rows a place
    drawn = list(dict.fromkeys(labels))
    top = map_plots._on_top(rows, labels, drawn)
    seen = {}
    places = list(zip(rows["m"], rows["n"], rows.index, labels, strict=True))
    for kernel in drawn:  # the full drawing, marker by marker
        for m, n, label, _ in (place for place in places if place[3] == kernel):
            seen[(m, n)] = label
    assert sorted(top.index) == sorted(seen.values()) and len(top) < len(rows) / 10
    assert (top == labels[top.index]).all()


def test_a_map_is_judged_and_reported_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """jobs.run_reports.write_map_report: judging and the report run without Python's cyclic
    collector (a third of a full map's time), which is back on after."""
    import gc

    from cublas_audit.jobs import run_reports

    seen: list[bool] = []
    monkeypatch.setattr(run_reports, "audit_map", lambda *args: seen.append(gc.isenabled()))
    monkeypatch.setattr(
        run_reports.map_report, "write_map_report", lambda run, judged: seen.append(gc.isenabled())
    )
    assert gc.isenabled()
    run_reports.write_map_report(MAP)
    assert seen == [False, False] and gc.isenabled()


def test_a_devices_map_is_judged_for_its_follow_up_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run.dispatch_map.run judges the map once (for the follow-up and the report) without
    Python's cyclic collector too, as jobs do: a --devices map is judged there, not in jobs."""
    import gc

    from cublas_audit.run import dispatch_map
    from cublas_audit.run.sweep_options import SweepOptions
    from cublas_audit.run.sweep_setup import Measured
    from cublas_audit.vocabulary import Phase

    seen: list[bool] = []
    measured = Measured(MAP, read_table(MAP), Phase.map)
    monkeypatch.setattr(dispatch_map, "sweep", lambda options, progress: measured)
    monkeypatch.setattr(dispatch_map, "map_findings", lambda *args: seen.append(gc.isenabled()))
    dispatch_map.run(SweepOptions(resume=MAP))
    assert seen == [False] and gc.isenabled()
