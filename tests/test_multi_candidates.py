"""`candidates --devices`: the cuBLASLt candidate audit sharded across GPUs, resumed per problem.

The machine is stood in for as in tests/test_multi_gpu.py (two H100s, made-up UUIDs); each shard's
probe is the fake interpreter of tests/fakeprobe.py, which audits its plan's problems one by one
with the rows the real audit recorded on an H100 (reports/h100/20261123-145452-batched: 18
problems, 126 candidates, one confirmed gap: 256x256x256 batch 8, the default 1.12x the time of
candidate #5, 1.17x in the second round, as that run's report.md says). What is real: which
problems go to which GPU, the pinning, the journal resume, the merged candidates.csv and report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.jobs import measure
from cublas_audit.judge import candidates
from cublas_audit.planning.cases import candidate_problems
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.run import multi_gpu, sweep
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.table import candidates_table, rundir
from tests.fakeprobe import H100_RUN, Recorded, call_records, deadline, fake_probe, seen
from tests.test_multi_gpu import DEADLINE_S, H100S, two_gpus  # noqa: F401 (a fixture)

RECORDED = candidates_table.read_candidates(H100_RUN / rundir.CANDIDATES_FILE)
CASES = read_plan(H100_RUN / rundir.PLAN_FILE)  # 54 batched cases: 18 problems


def auditing_probe(tmp_path: Path, crash_on: str | None = None) -> tuple[str, Path]:
    probe, calls = fake_probe(
        tmp_path,
        candidates=H100_RUN / rundir.CANDIDATES_FILE,
        candidates_per_problem=True,
        crash_on=crash_on,
        env_keys=("CUDA_VISIBLE_DEVICES", "CUBLAS_AUDIT_TAG"),
    )
    return probe.python, calls


def audit_options(tmp_path: Path, probe: str) -> SweepOptions:
    return SweepOptions(
        cases=CASES,
        out=tmp_path / "run",
        probe_python=probe,
        candidate_limit=32,
        command=["cublas-audit", "candidates", "--batched", "--devices", "all"],
    )


def audited(calls: Path) -> dict[str, list[str]]:
    """GPU UUID -> the problems its probe audited, in order."""
    found: dict[str, list[str]] = {}
    for call in call_records(calls):
        if "audited" in call:
            found.setdefault(call["gpu"], []).append(call["audited"])
    return found


def in_case_order(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows by case and candidate, without the GPU each was measured on."""
    measured = frame.drop(columns=["device_index", "gpu_uuid"])
    return measured.sort_values(["case_id", "candidate"]).reset_index(drop=True)


def test_the_problems_are_audited_once_each_on_their_gpu_and_merged(
    tmp_path: Path,
    two_gpus: Path,  # noqa: F811
) -> None:
    probe, calls = auditing_probe(tmp_path)
    progress = {gpu.index: Recorded() for gpu in H100S}
    with deadline(DEADLINE_S):
        result = measure.candidates_on_devices(
            audit_options(tmp_path, probe),
            multi_gpu.Spread("all"),
            lambda gpu: progress[gpu.index].progress(),
        )

    by_gpu = audited(calls)
    assert set(by_gpu) == {"GPU-aaaa-0", "GPU-bbbb-1"}  # each probe pinned to its own GPU
    ids = [case_id for problems in by_gpu.values() for case_id in problems]
    assert sorted(ids) == sorted(RECORDED["case_id"].unique())  # 18 problems, each audited once
    assert abs(len(by_gpu["GPU-aaaa-0"]) - len(by_gpu["GPU-bbbb-1"])) <= 6  # balanced by work
    for gpu in H100S:  # each bar counted its GPU's problems, and advanced on each
        assert progress[gpu.index].totals[-1] == len(by_gpu[gpu.uuid])
        assert progress[gpu.index].advanced == by_gpu[gpu.uuid]

    assert result.frame is not None
    merged = candidates_table.read_candidates(result.run_dir)
    pd.testing.assert_frame_equal(in_case_order(merged), in_case_order(RECORDED))
    order = [c.case_id for c in candidate_problems(CASES)]
    assert list(dict.fromkeys(merged["case_id"])) == order  # in plan order
    for gpu in H100S:  # every row says which GPU measured it
        rows = merged[merged["case_id"].isin(by_gpu[gpu.uuid])]
        assert rows["device_index"].eq(gpu.index).all() and rows["gpu_uuid"].eq(gpu.uuid).all()
    report = result.report.read_text()
    assert "fp32 256x256x256 batch 8" in report and "takes 1.17x" in report
    assert report.count("\n### better-candidate: ") == 1  # that one case, and no other
    env = rundir.read_env(result.run_dir)
    assert env["phase"] == "candidates" and env["candidate_threshold"] == pytest.approx(0.10)
    assert set(env["shard_seconds"]) == {"gpu0", "gpu1"} and set(env["phase_seconds"]) == {
        "candidates"
    }


def test_a_crashed_shard_resumes_at_its_first_unaudited_problem(
    tmp_path: Path,
    two_gpus: Path,  # noqa: F811
) -> None:
    problems = candidate_problems(CASES)
    gpu1 = multi_gpu.shard(problems, 2)[1]
    culprit = gpu1[len(gpu1) // 2].case_id
    probe, calls = auditing_probe(tmp_path, crash_on=culprit)
    crashed = r"GPU 1: the candidate audit failed .*; what the shards finished is kept: --resume"
    with deadline(DEADLINE_S), pytest.raises(AuditError, match=crashed):
        measure.candidates_on_devices(audit_options(tmp_path, probe), multi_gpu.Spread("all"))
    before = audited(calls)
    assert before["GPU-bbbb-1"] == [c.case_id for c in gpu1[: len(gpu1) // 2]]
    assert not (tmp_path / "run" / rundir.CANDIDATES_FILE).exists()

    auditing_probe(tmp_path)  # the same fake, no longer crashing
    with deadline(DEADLINE_S):
        result = measure.candidates_on_devices(
            SweepOptions(resume=tmp_path / "run"), multi_gpu.Spread()
        )

    after = audited(calls)
    assert after["GPU-aaaa-0"] == before["GPU-aaaa-0"]  # GPU 0 had finished: not started again
    resumed = after["GPU-bbbb-1"][len(before["GPU-bbbb-1"]) :]
    assert resumed == [c.case_id for c in gpu1[len(gpu1) // 2 :]]  # from the culprit on
    assert result.frame is not None
    pd.testing.assert_frame_equal(in_case_order(result.frame), in_case_order(RECORDED))


def test_an_interrupted_audit_keeps_the_problems_its_journal_holds(tmp_path: Path) -> None:
    problems = candidate_problems(CASES)
    journal = tmp_path / rundir.CANDIDATE_RESULTS
    with journal.open("w") as out:
        for case in problems[:2]:
            rows = RECORDED[RECORDED["case_id"] == case.case_id]
            records = [{k: v for k, v in r.items() if not pd.isna(v)} for r in _records(rows)]
            out.write(candidates_table.journal_line(case.case_id, records))
        out.write(
            candidates_table.journal_line(problems[3].case_id, [])
        )  # no rows: not a finished one
        out.write('{"case_id": "' + problems[2].case_id + '", "rows": [{"m"')  # torn mid-write
    config = sweep.SweepConfig(
        cases=CASES, run_dir=tmp_path, gpu_label="h100", ncu=None, phase="candidates"
    )
    finished = set(candidates_table.read_journal(journal))  # what a resumed audit does not measure
    assert finished == {c.case_id for c in problems[:2]}
    frame = sweep.write_outputs(config)
    assert list(dict.fromkeys(frame["case_id"])) == [c.case_id for c in problems[:2]]
    assert len(frame) == RECORDED["case_id"].isin([c.case_id for c in problems[:2]]).sum()
    assert not (tmp_path / rundir.CANDIDATES_FILE).exists()  # only a whole audit writes it


def _records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    return [row.to_dict() for _, row in rows.iterrows()]


def test_a_journal_line_holds_numpy_numbers_as_json_numbers() -> None:
    line = candidates_table.journal_line("c", [{"time_ms": np.float64(0.5), "reps": np.int64(7)}])
    assert '"time_ms": 0.5' in line and '"reps": 7' in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--allow-mixed"], "--replicate and --allow-mixed go with --devices"),
        (["--resume", "."], "is not a run of `candidates --devices`"),
        (["--probe-env", "A=1"], "--probe-env: the audit runs in a probe process with --devices"),
    ],
)
def test_candidates_spread_options_are_checked(argv: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["candidates", "--batched", "--sizes", "256", *argv])
    assert result.exit_code == 2 and message in result.output


def test_the_command_line_audits_on_every_gpu_with_the_probe_it_names(
    tmp_path: Path,
    two_gpus: Path,  # noqa: F811
) -> None:
    probe, _calls = auditing_probe(tmp_path)
    argv = ["candidates", "--batched", "--devices", "all", "--out", str(tmp_path / "run")]
    argv += ["--probe-python", probe, "--probe-env", "CUBLAS_AUDIT_TAG=first", "--format", "json"]
    with deadline(DEADLINE_S):
        result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert len(printed["candidates"]) == len(RECORDED)
    assert [f["sizes"] for f in printed["findings"]] == [["256x256x256"]]
    audits = [s for s in seen(tmp_path) if "candidates" in s["argv"]]
    assert {s["env"]["CUDA_VISIBLE_DEVICES"] for s in audits} == {"GPU-aaaa-0", "GPU-bbbb-1"}
    assert {s["env"]["CUBLAS_AUDIT_TAG"] for s in audits} == {"first"}


def test_a_resumed_run_is_judged_at_the_threshold_it_was_recorded_with(
    tmp_path: Path,
    two_gpus: Path,  # noqa: F811
) -> None:
    """The recorded gap (1.12x, confirmed 1.17x) is not a finding at --threshold
    candidate_gap_pct=20; resuming the run without the option must not judge it at the default
    (10 %) instead."""
    probe, _calls = auditing_probe(tmp_path)
    run = tmp_path / "run"
    argv = ["candidates", "--batched", "--devices", "all", "--out", str(run)]
    argv += ["--probe-python", probe, "--threshold", "candidate_gap_pct=20", "--format", "json"]
    with deadline(DEADLINE_S):
        first = CliRunner().invoke(app, argv)
        again = CliRunner().invoke(app, ["candidates", "--resume", str(run), "--format", "json"])
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    assert json.loads(first.stdout)["findings"] == []
    assert json.loads(again.stdout)["findings"] == []


def test_a_replicated_candidate_audit_is_refused() -> None:
    with pytest.raises(AuditError, match="shards its problems"):
        measure.candidates_on_devices(
            SweepOptions(cases=CASES), multi_gpu.Spread("all", replicate=True)
        )


def test_the_h100s_sharded_audit_finds_the_gap_its_single_gpu_audits_found() -> None:
    """The real `candidates --batched --devices all` run on the H100: its merged table is its
    shard's, and it flags exactly the case the single-GPU audits flag (256x256x256 batch 8)."""
    run = (
        Path(__file__).resolve().parents[1]
        / "reports/h100/checks/20261124-145242-candidates-devices"
    )
    merged = candidates_table.read_candidates(run)
    shard = candidates_table.read_candidates(multi_gpu.shard_dir(run, 0))
    pd.testing.assert_frame_equal(merged, shard)
    assert merged["case_id"].nunique() == 18
    found = candidates.find_better_candidates(merged)
    assert [f.sizes for f in found] == [["256x256x256"]] and found[0].batch == 8
    assert 1.10 <= found[0].evidence[0]["left_on_table"] <= 1.20  # 1.12 in 20261123-145452
