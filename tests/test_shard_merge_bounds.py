"""table/shard_merge.py pinned (issue 39 item 6) on the H100's recorded three-shard map
(reports/h100/checks/20261125-101230-shards: `--shard 1/3`, `2/3`, `3/3` of a 400-problem map,
and their `merge`): each shard read and checked against its own record, each check of the set
with one shard or one field changed, the merged env.json against the recorded one, and the plan
order of rows. The shards are read once per module; each test is pure calls on them."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning.shards import ShardSpec
from cublas_audit.table import candidates_table, shard_merge
from cublas_audit.table.shard_merge import ShardRun
from tests.conftest import REPORTS

CHECK = REPORTS / "h100" / "checks" / "20261125-101230-shards"


@pytest.fixture(scope="module")
def shards() -> list[ShardRun]:
    return [shard_merge.read_shard(CHECK / f"shard-{i}") for i in (1, 2, 3)]


def with_env(shard: ShardRun, **changes: object) -> ShardRun:
    return dataclasses.replace(shard, env={**shard.env, **changes})


def refusal(shards: list[ShardRun], allow_mixed: bool = False) -> str:
    with pytest.raises(AuditError) as caught:
        if allow_mixed:
            shard_merge.check_shards(shards, allow_mixed=True)
        else:
            shard_merge.check_shards(shards)  # mixed shards refused unless asked for
    return str(caught.value)


def test_the_recorded_shards_read_and_pass(shards: list[ShardRun]) -> None:
    assert [str(s.spec) for s in shards] == ["1/3", "2/3", "3/3"]
    assert sum(len(s.cases) for s in shards) == 400 == len(shards[0].whole)
    assert [s.has_table for s in shards] == [True] * 3
    assert [s.has_candidates for s in shards] == [False] * 3
    assert shard_merge.result_file(shards[0]) == "dispatch.csv" and shard_merge.finished(shards[0])
    shard_merge.check_shards(shards)
    shard_merge.check_shards(list(reversed(shards)))


def test_a_shard_whose_files_disagree_with_its_record(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    shutil.copytree(CHECK / "shard-2", shard, ignore=shutil.ignore_patterns("ncu", "plots"))
    env = json.loads((shard / "env.json").read_text())
    (shard / "env.json").write_text(json.dumps({**env, "plan_fingerprint": "f" * 64}))
    with pytest.raises(AuditError, match=r"plan-whole\.json is not the plan its env\.json names"):
        shard_merge.read_shard(shard)
    (shard / "env.json").write_text(json.dumps({**env, "shard": "1/3"}))  # its plan is part 2
    with pytest.raises(AuditError, match=r"plan\.json is not part 1/3 of its whole plan"):
        shard_merge.read_shard(shard)
    (shard / "env.json").write_text(json.dumps({**env, "shard": "4/3"}))
    with pytest.raises(AuditError, match=r"its env\.json.s shard"):
        shard_merge.read_shard(shard)
    (shard / "env.json").write_text(json.dumps({k: v for k, v in env.items() if k != "shard"}))
    with pytest.raises(AuditError, match="not a shard run"):
        shard_merge.read_shard(shard)
    with pytest.raises(AuditError, match=r"not a cublas-audit run directory \(no env\.json\)"):
        shard_merge.read_shard(tmp_path)
    (shard / "plan-whole.json").write_text("{")
    (shard / "env.json").write_text(json.dumps(env))
    with pytest.raises(AuditError, match=r"plan-whole\.json: not a cublas-audit plan"):
        shard_merge.read_shard(shard)


def test_out_goes_neither_into_a_shard_nor_onto_one(tmp_path: Path) -> None:
    run = tmp_path / "shard-1"
    for out in (run, run / "merged", run / "a" / "b"):
        with pytest.raises(AuditError, match="is inside the input"):
            shard_merge.check_out(out, [tmp_path / "other", run])
    shard_merge.check_out(tmp_path / "merged", [run, tmp_path / "shard-2"])
    shard_merge.check_out(tmp_path, [run])  # a parent of a shard: the shard is not mixed into it


def test_no_shards_and_unfinished_ones(shards: list[ShardRun], tmp_path: Path) -> None:
    assert refusal([]) == "merge: give the shard run directories"
    gone = dataclasses.replace(shards[2], path=tmp_path)
    assert refusal([*shards[:2], gone]) == (
        f"{tmp_path}: shard 3/3 is not finished (no dispatch.csv); finish it with --resume "
        f"{tmp_path}"
    )


def test_a_candidates_shard_is_finished_by_its_candidates(
    shards: list[ShardRun], tmp_path: Path
) -> None:
    run = dataclasses.replace(with_env(shards[0], phase="candidates"), path=tmp_path)
    assert shard_merge.result_file(run) == "candidates.csv" and not shard_merge.finished(run)
    (tmp_path / "candidates.csv").write_text("x\n")
    assert shard_merge.finished(run) and run.has_candidates


def test_one_plan_split_into_one_number_of_parts(shards: list[ShardRun]) -> None:
    other = dataclasses.replace(shards[2], plan_fingerprint="abcdef0123456789" * 4)
    assert refusal([*shards[:2], other]) == (
        f"{shards[0].path} and {other.path} are shards of different plans (fingerprints "
        f"0ac1a112bf45 and abcdef012345)"
    )
    second = dataclasses.replace(shards[1], plan_fingerprint="abcdef0123456789" * 4)
    assert "are shards of different plans" in refusal([shards[0], second, shards[2]])
    fourths = dataclasses.replace(shards[2], spec=ShardSpec(3, 4))
    assert refusal([*shards[:2], fourths]).endswith(
        "split the plan into different numbers of parts"
    )


def test_every_part_once(shards: list[ShardRun]) -> None:
    assert refusal([shards[0], shards[1], shards[0]]).startswith("shard 1/3 is given twice")
    relabelled = dataclasses.replace(shards[1], spec=ShardSpec(3, 3))
    assert refusal([shards[0], relabelled, shards[1]]).startswith(
        f"{shards[1].path}: shard 2/3 overlaps"
    )
    assert refusal([shards[1], shards[2]]) == "merge: shard 1/3 missing"
    assert refusal([shards[0]]) == "merge: shards 2/3, 3/3 missing"
    assert refusal([shards[1]]) == "merge: shards 1/3, 3/3 missing"


def test_versions_and_settings_agree_unless_mixed_is_allowed(shards: list[ShardRun]) -> None:
    newer = with_env(shards[1], cublas_version="13.2.0")
    assert refusal([shards[0], newer, shards[2]]) == (
        "shards differ in cublas_version (1/3: '13.1.0', 2/3: '13.2.0'); give --allow-mixed "
        "to merge them anyway"
    )
    assert refusal([*shards[:2], with_env(shards[2], min_reps=7)]).startswith(
        "shards differ in min_reps"
    )
    assert "differ in GPU models" in refusal([*shards[:2], with_env(shards[2], gpu_name="B200")])
    shard_merge.check_shards([shards[0], newer, shards[2]], allow_mixed=True)
    # the same settings written in another key order are the same settings
    ordered = [with_env(s, probe_env={"A": "1", "B": "2"}) for s in shards[:2]]
    flipped = with_env(shards[2], probe_env={"B": "2", "A": "1"})
    shard_merge.check_shards([*ordered, flipped])


def test_one_label_one_model(shards: list[ShardRun]) -> None:
    other = with_env(shards[2], gpu_name="NVIDIA B200")
    message = refusal([*shards[:2], other], allow_mixed=True)
    assert message.startswith(
        "gpu_label 'h100' names two GPU models (NVIDIA H100 80GB HBM3, NVIDIA B200)"
    )
    shard_merge.check_shards([*shards[:2], with_env(other, gpu_label="b200")], allow_mixed=True)


def test_the_merged_env_is_the_recorded_one(shards: list[ShardRun]) -> None:
    recorded = json.loads((CHECK / "merged" / "env.json").read_text())
    env = shard_merge.merged_env(shards, recorded["command"])
    for entry in (*env["shards"], *recorded["shards"]):
        entry.pop("run_dir")  # where the checkout stood
    assert {k: v for k, v in env.items() if k != "merged"} == {
        k: v for k, v in recorded.items() if k != "merged"
    }
    assert env["gpu_name"] == "NVIDIA H100 80GB HBM3" and env["allow_mixed"] is False
    assert env["mixed"] == [] and "started" not in env and "shard" not in env
    assert shard_merge.merged_env(shards[::-1], [])["roofline"] == shards[2].env["roofline"]


def test_a_mixed_merge_says_so(shards: list[ShardRun]) -> None:
    mixed = [shards[0], with_env(shards[1], gpu_name="NVIDIA B200", gpu_label="b200", min_reps=9)]
    env = shard_merge.merged_env(mixed, [])
    assert env["gpu_name"] == "mixed" and env["allow_mixed"] is True
    assert env["mixed"] == ["min_reps"]
    assert env["shards"][1]["gpu_name"] == "NVIDIA B200"


def test_merge_of_one_shard_is_its_table_under_the_whole_plan(
    shards: list[ShardRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    # its table as the shard's cases backwards (reading a table is validation's, tested there)
    backwards = [c.case_id for c in reversed(shards[1].cases)]
    monkeypatch.setattr(shard_merge, "read_table", lambda path: frame(*backwards))
    merged = shard_merge.merge([shards[1]], ["cublas-audit", "merge"])
    assert merged.candidates is None and merged.table is not None
    assert len(merged.whole) == 400 and merged.plan == shards[1].whole_plan
    part = {c.case_id for c in shards[1].cases}
    assert set(merged.table["case_id"]) == part
    order = [c.case_id for c in merged.whole if c.case_id in part]
    assert merged.table["case_id"].tolist() == order
    assert [s["shard"] for s in merged.env["shards"]] == ["2/3"]


def test_merge_of_one_candidates_shard(
    shards: list[ShardRun], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "candidates.csv").write_text("read by the stand-in below\n")
    ids = [c.case_id for c in shards[0].whole[:3]]
    monkeypatch.setattr(candidates_table, "read_candidates", lambda path: frame(*ids[::-1]))
    merged = shard_merge.merge([dataclasses.replace(shards[0], path=tmp_path)], [])
    assert merged.table is None and merged.candidates is not None
    assert merged.candidates["case_id"].tolist() == ids


def frame(*ids: str) -> pd.DataFrame:
    return pd.DataFrame({"case_id": list(ids), "row": range(len(ids))})


def test_rows_in_plan_order_the_unplanned_last() -> None:
    got = shard_merge.in_plan_order(["a", "b", "c"], [frame("c", "x", "a"), frame("b", "a")])
    assert got["case_id"].tolist() == ["a", "a", "b", "c", "x"]
    assert got["row"].tolist() == [2, 1, 0, 0, 1]  # a case's rows as they were
    assert list(got.columns) == ["case_id", "row"] and list(got.index) == [0, 1, 2, 3, 4]


def test_rows_in_plan_order_where_an_id_repeats() -> None:
    # a sweep's cases then their problems: an id's last position counts
    got = shard_merge.in_plan_order(["a", "b", "a"], [frame("a", "b"), frame("a")])
    assert got["case_id"].tolist() == ["b", "a", "a"]
    assert list(got.columns) == ["case_id", "row"] and list(got.index) == [0, 1, 2]


def test_two_audits_of_one_problem_keep_the_lower_shards(shards: list[ShardRun]) -> None:
    whole = shards[0].whole[:2]
    first, second = whole[0].case_id, whole[1].case_id
    lower = pd.DataFrame({"case_id": [second, second], "candidate": [0, 1], "shard": [1, 1]})
    upper = pd.DataFrame({"case_id": [second, first], "candidate": [0, 0], "shard": [2, 2]})
    got = shard_merge._merged_candidates(whole, [lower, upper])
    assert got["case_id"].tolist() == [first, second, second]
    assert got["shard"].tolist() == [2, 1, 1]
