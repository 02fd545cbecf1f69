"""`cublas-audit merge`: shard run directories joined into one run.

The shards are cut in the test from real recorded runs, the way `--shard I/N` runs would have
written them: the H100's batched sweep with its candidate audit
(reports/h100/20261123-145452-batched) and its FP32 map (reports/h100/maps/20261123-235543-fp32-64-
4096). Each shard holds its part's recorded rows, its plan, the whole plan and the run's env.json
with its shard and the plan's fingerprint. No number is made up: merge must give back the run.
"""

from __future__ import annotations

import json
import os
import shutil
from functools import cache
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.jobs import fleet, merge
from cublas_audit.judge.map_audit import map_findings
from cublas_audit.planning import plan_file
from cublas_audit.planning.cases import Case, candidate_problems
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.planning.shards import PlanPart, ShardSpec
from cublas_audit.report import map_plots
from cublas_audit.table import candidates_table, dispatch, rundir, shard_merge
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.validation import read_table
from tests.conftest import without_map_pictures

REPORTS = Path(__file__).resolve().parents[1] / "reports/h100"
SWEEP = REPORTS / "20261123-145452-batched"
MAP = REPORTS / "maps/20261123-235543-fp32-64-4096"


@cache
def recorded(run: Path) -> tuple[list[Case], pd.DataFrame, pd.DataFrame | None]:
    found = run / rundir.CANDIDATES_FILE
    candidates = candidates_table.read_candidates(found) if found.exists() else None
    return read_plan(run / rundir.PLAN_FILE), read_table(run), candidates


def split(run: Path, count: int, where: Path) -> list[Path]:
    """The run cut into `count` shard run directories, as `--shard I/N` writes them."""
    whole, frame, candidates = recorded(run)
    env = rundir.read_env(run)
    shards = []
    for index in range(1, count + 1):
        part = PlanPart.of(ShardSpec(index, count), whole)
        path = where / f"shard-{index}"
        path.mkdir(parents=True)
        plan_file.write(part.cases(), path / rundir.PLAN_FILE)
        plan_file.write(whole, path / rundir.WHOLE_PLAN_FILE)
        ids = [case.case_id for case in part.cases()]
        dispatch.write_table(frame[frame["case_id"].isin(ids)], path / rundir.TABLE_FILE)
        if candidates is not None:  # a sweep --candidates shard audits its cases' problems
            problems = [p.case_id for p in candidate_problems(part.cases())]
            mine = candidates[candidates["case_id"].isin(problems)]
            candidates_table.write_candidates(mine, path / rundir.CANDIDATES_FILE)
        rundir.write_env(path, {**env, **part.record(), "host": f"node{index}"})
        shards.append(path)
    return shards


@pytest.fixture(scope="module")
def sweep_shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return split(SWEEP, 2, tmp_path_factory.mktemp("sweep"))


def test_merged_shards_are_the_run_rows_kernels_and_candidates(sweep_shards: list[Path]) -> None:
    shards = [shard_merge.read_shard(path) for path in reversed(sweep_shards)]  # any order given
    shard_merge.check_shards(shards)
    merged = shard_merge.merge(shards, ["cublas-audit", "merge"])
    whole, frame, candidates = recorded(SWEEP)
    assert [c.case_id for c in merged.whole] == [c.case_id for c in whole]
    assert merged.table is not None and merged.candidates is not None
    pd.testing.assert_frame_equal(merged.table, frame)  # same cases, kernels, rows, plan order
    # two shards' cases pose some problems alike, each shard audited them: kept once
    audited = sum(
        len((p / rundir.CANDIDATES_FILE).read_text().splitlines()) - 1 for p in sweep_shards
    )
    assert candidates is not None and audited > len(candidates)
    key = ["case_id", "candidate_index"] if "candidate_index" in candidates else ["case_id"]
    ordered = candidates.sort_values(key, kind="stable").reset_index(drop=True)
    got = merged.candidates.sort_values(key, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, ordered)
    assert [s["host"] for s in merged.env["shards"]] == ["node1", "node2"]
    assert merged.env["plan_fingerprint"] == shards[0].plan_fingerprint
    assert "shard" not in merged.env and merged.env["mixed"] == []


def test_a_merged_map_is_the_map(tmp_path: Path) -> None:
    shards = [shard_merge.read_shard(path) for path in split(MAP, 2, tmp_path)]
    shard_merge.check_shards(shards)
    merged = shard_merge.merge(shards, [])
    assert merged.table is not None
    pd.testing.assert_frame_equal(merged.table, recorded(MAP)[1])
    assert merged.candidates is None


def test_a_large_merged_map_is_written_in_a_fork_while_it_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map of WRITE_FORK_ROWS rows or more (a Ray run's, a `merge`'s): its merged table written
    by a fork of this process while this one judges it, then its report with those findings:
    the recorded map's table, its findings as judged from it, its hand-checked inversion."""
    paths = split(MAP, 2, tmp_path / "shards")
    for path in paths:  # (recorded before runs said their phase: a map's, as map says it now)
        rundir.write_env(path, {**rundir.read_env(path), "phase": "map"})
    shards = [shard_merge.read_shard(path) for path in paths]
    monkeypatch.setattr(map_plots, "drawing", without_map_pictures)  # (matplotlib's seconds)
    writer = tmp_path / "writer.pid"
    write = rundir.write_run_table
    monkeypatch.setattr(merge, "WRITE_FORK_ROWS", 1)
    monkeypatch.setattr(
        rundir,
        "write_run_table",
        lambda frame, run: writer.write_text(str(os.getpid())) and write(frame, run),
    )
    timings: dict[str, float] = {}
    forked = merge.write_merged(shards, tmp_path / "forked", False, [], None, timings).run_dir
    assert writer.exists() and int(writer.read_text()) != os.getpid()
    table = recorded(MAP)[1]
    pd.testing.assert_frame_equal(read_table(forked), table)
    judged = json_ready([finding.to_json() for finding in map_findings(table)])
    assert rundir.read_findings(rundir.findings_file(forked)) == judged
    assert "2112 takes 1.16x the time of the larger 2176" in (forked / "report.md").read_text()
    assert {"merge_s", "judge_s", "report_s"} <= set(timings)


def test_a_ray_shard_back_has_its_table_read_before_the_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --ray shard that came back is read for the merge at once, its table too (the merge then
    finds it read), while the others still run; a unit (replicated: compared) is not."""
    paths = split(MAP, 2, tmp_path)
    read: list[Path] = []
    monkeypatch.setattr(fleet, "read_table", lambda path: read.append(path) or read_table(path))
    early: dict[Path, shard_merge.ShardRun] = {}
    fleet._read(early, False, 1, paths[0])
    assert list(early) == [paths[0]] and read == [paths[0]]
    ((plan, order),) = shard_merge._ORDERS  # the merge's order of the whole plan made too
    assert plan is early[paths[0]].whole_plan and shard_merge.plan_order(plan) is order
    assert list(order.ids) == [case.case_id for case in recorded(MAP)[0]]
    fleet._read(early, True, 2, paths[1])
    assert list(early) == [paths[0]] and read == [paths[0]]


def test_a_ray_shards_rows_are_placed_in_the_plan_as_it_comes_back_not_in_the_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where each row of a --ray shard goes in the plan is looked up as the shard comes back
    (PlanOrder.places; a full map's four took ~1 s of CPU here in the merge after the last
    shard), and the merge that uses it is the merge of the shards read afresh."""
    paths = split(MAP, 2, tmp_path)
    fresh = shard_merge.merge([shard_merge.read_shard(path) for path in paths], [])
    early: dict[Path, shard_merge.ShardRun] = {}
    for index, path in enumerate(paths, 1):
        fleet._read(early, False, index, path)
    looked: list[int] = []
    places = shard_merge.PlanOrder.places
    monkeypatch.setattr(
        shard_merge.PlanOrder,
        "places",
        lambda order, frame: looked.append(len(frame)) or places(order, frame),
    )
    merged = shard_merge.merge([early[path] for path in paths], [])
    assert looked == []  # (each shard's found as it came back)
    assert fresh.table is not None and merged.table is not None
    pd.testing.assert_frame_equal(merged.table, fresh.table)
    assert merged.table["case_id"].tolist() == [c.case_id for c in recorded(MAP)[0]]


def test_merge_writes_one_run_directory_and_its_report(
    sweep_shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[Path] = []
    monkeypatch.setattr(merge, "write_run_report", lambda out: reported.append(out) or out)
    out = tmp_path / "merged"
    result = merge.run(merge.MergeJob(sweep_shards, out, command=["merge"]))
    assert reported == [out] and result.run_dir == out
    assert [c.case_id for c in read_plan(out / rundir.PLAN_FILE)] == [
        c.case_id for c in recorded(SWEEP)[0]
    ]
    pd.testing.assert_frame_equal(result.frame, recorded(SWEEP)[1])
    assert (out / rundir.TABLE_FILE).is_file() and (out / rundir.CANDIDATES_FILE).is_file()
    assert len(rundir.read_env(out)["shards"]) == 2


def refused(args: list[str], out: Path) -> str:
    result = CliRunner().invoke(app, ["merge", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert not out.exists() or not any(out.iterdir())  # nothing written
    return lines[0]


@pytest.fixture
def shards(sweep_shards: list[Path], tmp_path: Path) -> list[Path]:
    """Copies of the sweep's shards, for a test to spoil."""
    copies = []
    for path in sweep_shards:
        shutil.copytree(path, tmp_path / path.name)
        copies.append(tmp_path / path.name)
    return copies


def edit_env(path: Path, **changes: object) -> None:
    env = json.loads((path / rundir.ENV_FILE).read_text())
    rundir.write_env(path, {**env, **changes})


def test_a_missing_shard_is_named(shards: list[Path], tmp_path: Path) -> None:
    line = refused([str(shards[1])], tmp_path / "out")
    assert "shard 1/2 missing" in line


def test_a_shard_given_twice_is_refused(shards: list[Path], tmp_path: Path) -> None:
    again = tmp_path / "again"
    shutil.copytree(shards[1], again)
    line = refused([*map(str, shards), str(again)], tmp_path / "out")
    assert "shard 2/2 is given twice" in line
    assert "given twice" in refused([*map(str, shards), str(shards[0])], tmp_path / "out")


def test_shards_of_another_plan_are_refused(shards: list[Path], tmp_path: Path) -> None:
    other = split(MAP, 2, tmp_path / "map")
    line = refused([str(shards[0]), str(other[1])], tmp_path / "out")
    assert "shards of different plans" in line


def test_another_cublas_is_refused_unless_mixed_is_allowed(
    shards: list[Path], tmp_path: Path
) -> None:
    edit_env(shards[1], cublas_version="13.0.2")
    line = refused(list(map(str, shards)), tmp_path / "out")
    assert "cublas_version" in line and "--allow-mixed" in line
    ordered = [shard_merge.read_shard(path) for path in shards]
    shard_merge.check_shards(ordered, allow_mixed=True)
    assert shard_merge.merged_env(ordered, [])["mixed"] == ["cublas_version"]


def test_a_run_that_is_no_shard_is_refused(shards: list[Path], tmp_path: Path) -> None:
    line = refused([str(shards[0]), str(SWEEP)], tmp_path / "out")
    assert "not a shard run" in line


def test_out_inside_an_input_is_refused(shards: list[Path], tmp_path: Path) -> None:
    line = refused(list(map(str, shards)), shards[0] / "merged")
    assert "inside the input" in line
    onto = CliRunner().invoke(app, ["merge", *map(str, shards), "--out", str(shards[1])])
    assert onto.exit_code == 2 and "inside the input" in onto.output


def test_an_unfinished_shard_is_refused(shards: list[Path], tmp_path: Path) -> None:
    (shards[1] / rundir.TABLE_FILE).unlink()
    line = refused(list(map(str, shards)), tmp_path / "out")
    assert "not finished" in line and "--resume" in line


def test_a_map_merged_from_three_shards_on_the_h100_is_the_whole_map() -> None:
    """Recorded on the H100 (reports/h100/checks/20261125-101230-shards): the same 400-problem
    map run whole and as `--shard 1/3`, `2/3`, `3/3`, then `merge`d: the same cases in the same
    order, the same kernels everywhere, kernel times within the run-to-run noise (0.975-1.041x)."""
    from cublas_audit.table.validation import read_table

    recorded = REPORTS / "checks/20261125-101230-shards"
    whole = read_table(recorded / "whole").set_index("case_id")
    merged = read_table(recorded / "merged").set_index("case_id")
    assert list(merged.index) == list(whole.index) and len(whole) == 400
    assert (merged["traced_kernels"] == whole["traced_kernels"]).all()
    ratio = (merged["kernel_time_ms"] / whole["kernel_time_ms"]).astype(float)
    assert ratio.between(0.95, 1.05).all()


def test_the_same_map_through_ray_on_the_h100_is_the_whole_map() -> None:
    """Recorded on the H100 (reports/h100/checks/20261125-103316-ray): the 400-problem map of
    the shards check run with `--ray auto` (Ray 2.60, one node, one GPU: one shard), gathered
    and merged by the driver: the whole run's 400 cases in order and its kernels everywhere, and
    env.json says which engine placed the shard where."""
    from cublas_audit.table.rundir import read_env
    from cublas_audit.table.validation import read_table

    checks = REPORTS / "checks"
    whole = read_table(checks / "20261125-101230-shards/whole").set_index("case_id")
    through_ray = read_table(checks / "20261125-103316-ray").set_index("case_id")
    assert list(through_ray.index) == list(whole.index)
    assert (through_ray["traced_kernels"] == whole["traced_kernels"]).all()
    env = read_env(checks / "20261125-103316-ray")
    assert env["engine"] == "ray" and list(env["ray_shards"]) == ["1/1"]
    assert env["shards"][0]["gpu_name"] == "NVIDIA H100 80GB HBM3"
