"""`--ray`: a map's shards placed on a real local Ray cluster (three logical GPUs, no CUDA), one
task each, gathered as bytes, merged; a task whose worker dies leaves its shard missing and
`--resume` re-runs only that one; without Ray, `--ray` is exit 3 with the install command;
`--replicate`: every GPU runs the whole map, a unit each, and the units are compared; Ctrl-C while
gathering cancels the tasks not yet back.

What stands in for the machine, inside each Ray worker: environment.collect (the H100 of a bundled
run, on the GPU Ray gave the task) and the probe (tests/fakeprobe.py replaying the H100's
recorded FP32 map). What is real: Ray's placement (`num_gpus=1`), CUDA_VISIBLE_DEVICES per task,
each shard written in place on the driver's node (or, the units of --replicate, a tar of each
one's run directory as from another node), the merge and the report.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.jobs import fleet, measure
from cublas_audit.observe import environment
from cublas_audit.report import map_plots
from cublas_audit.run import ray_connect, ray_fleet, ray_task, run_archive
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import sweep
from cublas_audit.table import rundir
from cublas_audit.table.inputs import load_run
from tests.conftest import without_map_pictures
from tests.fakeprobe import fake_probe, h100_environment, seen
from tests.test_map import MAP, map_cases

REPO = Path(__file__).resolve().parents[1]
GPUS = 3
# what differs between a shard's rows and the same case measured unsharded: where it ran
WHERE = ["device_index", "gpu_uuid"]


@dataclass(frozen=True)
class StandIn:
    """A task's sweep with the machine stood in for (in the Ray worker's own process). Where
    `crash` exists, shard `crash_shard`'s worker (or the one on GPU `crash_gpu`, given) dies as a
    lost node's would; where `other_probe`
    is given, the task on GPU `other_gpu` runs it (a unit that measures otherwise)."""

    crash: Path | None = None
    crash_shard: int = 2
    crash_gpu: int | None = None
    other_probe: str | None = None
    other_gpu: int = 1

    def __call__(self, options: SweepOptions) -> object:
        def collect(ncu: str | None = None, device: int | None = None) -> environment.Environment:
            found = h100_environment(ncu)
            return replace(found, device_index=device, gpu_uuid=f"GPU-ray-{device}")

        environment.collect = collect  # this worker's module, never the test process's
        assert options.part is not None
        lost = (
            options.part.spec.index == self.crash_shard
            if self.crash_gpu is None
            else (options.device == self.crash_gpu)
        )
        if self.crash and self.crash.exists() and lost:
            os._exit(1)
        if self.other_probe and options.device == self.other_gpu:
            options = replace(options, probe_python=self.other_probe)
        return sweep(options)


@pytest.fixture(scope="module")
def cluster() -> object:
    """One local Ray cluster for the module: three logical GPUs, workers that import tests/."""
    ray = pytest.importorskip("ray")
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    ray.init(
        num_cpus=GPUS + 1,
        num_gpus=GPUS,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield ray
    ray.shutdown()


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(map_plots, "drawing", without_map_pictures)  # seconds saved
    script, _calls = fake_probe(tmp_path, replay=MAP, env_keys=("CUDA_VISIBLE_DEVICES",))
    return Path(script.python)


def options(tmp_path: Path, probe: Path, name: str = "run") -> SweepOptions:
    return SweepOptions(
        cases=map_cases(),
        gpu_label="h100",
        out=tmp_path / name,
        probe_python=str(probe),
        min_reps=5,
        reference=False,
        command=["cublas-audit", "map", "--ray", "auto"],
    )


@pytest.mark.slow
def test_each_shard_is_a_task_on_its_gpu_and_the_merge_is_the_unsharded_run(
    tmp_path: Path, cluster: object, probe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = fleet.on_ray(options(tmp_path, probe), None, "map", StandIn())

    starts = [s for s in seen(tmp_path) if "--phase" in s["argv"]]
    assert sorted(s["env"]["CUDA_VISIBLE_DEVICES"] for s in starts) == ["0", "1", "2"]
    env = rundir.read_env(result.run_dir)
    assert env["engine"] == "ray" and env["shard_count"] == GPUS
    assert sorted(p["gpu"] for p in env["ray_shards"].values()) == ["0", "1", "2"]
    assert {s["shard"] for s in env["shards"]} == {"1/3", "2/3", "3/3"}
    # each phase timed apart; on the driver's node each shard written in place (no tar)
    timings = env["ray_timings"]
    assert {t["in_place"] for t in timings["shards"].values()} == {True}
    assert all(t["bytes"] == 0 and t["sweep_s"] >= 0 for t in timings["shards"].values())
    assert timings["reported_at_s"] >= timings["gathered_at_s"] >= timings["submitted_at_s"]
    assert {"merge_s", "judge_s", "report_s", "read_shards_s"} <= set(timings)
    frame = result.frame
    assert frame is not None and frame["status"].eq("ok").all()
    by_shard = [set(load_run(path).frame["case_id"]) for path in result.shards]
    assert sum(map(len, by_shard)) == len(frame) == len(set(frame["case_id"]))  # each case once
    assert all(p.parent == result.run_dir / "shards" for p in result.shards)
    for shard in result.shards:  # left unfolded in place by its task, folded by the driver
        assert not (shard / rundir.TIME_RESULTS).exists()
        assert (shard / (rundir.TIME_RESULTS + ".gz")).is_file()

    # the same machine, unsharded, in this process
    monkeypatch.setattr(environment, "collect", lambda ncu=None, device=None: h100_environment(ncu))
    whole = measure.dispatch_map_run(options(tmp_path, probe, "whole"))
    merged, alone = (
        load_run(path).frame.drop(columns=WHERE) for path in (result.run_dir, whole.run_dir)
    )
    pd.testing.assert_frame_equal(merged, alone)  # both as read back from their dispatch.csv
    assert result.report.read_text().count("2112 takes 1.16x the time of the larger 2176") == 1


@pytest.mark.slow
def test_a_lost_worker_leaves_its_shard_missing_and_resume_runs_only_it(
    tmp_path: Path, cluster: object, probe: Path
) -> None:
    crash = tmp_path / "crash-shard-2"
    crash.touch()
    with pytest.raises(AuditError, match=r"shard 2/3 \(.*\) missing.*--resume") as failed:
        # no rerun by Ray (retries=0): the node stays lost, as one whose shard Ray gave up on
        fleet.on_ray(options(tmp_path, probe), None, "map", StandIn(crash), retries=0)
    run_dir = tmp_path / "run"
    assert f"cublas-audit map --resume {run_dir}" in str(failed.value)
    kept = sorted(p.name for p in (run_dir / "shards").iterdir())
    assert kept == ["shard-1", "shard-3"] and not (run_dir / rundir.TABLE_FILE).exists()
    before = len(seen(tmp_path))

    crash.unlink()
    stale = run_dir / "shards" / "shard-2"  # a lost attempt's, half written in place
    stale.mkdir()
    (stale / rundir.PLAN_FILE).write_text("[]")
    resumed = SweepOptions(resume=run_dir, command=["cublas-audit", "map", "--resume"])
    result = fleet.on_ray(resumed, None, None, StandIn(crash))

    again = [s for s in seen(tmp_path)[before:] if "--phase" in s["argv"]]
    assert len(again) == 1  # one probe: shard 2's, the finished shards kept
    assert result.frame is not None and len(result.frame) == len(map_cases())
    assert set(rundir.read_env(run_dir)["ray_shards"]) == {"1/3", "2/3", "3/3"}
    assert rundir.read_env(stale)["shard"] == "2/3"


def test_ray_missing_is_exit_3_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    args = ["map", "--sizes", "64:256:64", "--ray", "auto", "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3
    assert "pip install 'cublas-audit[ray]'" in result.output
    assert not (tmp_path / "r").exists()


def test_ray_refuses_what_it_replaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cublas_audit.cli.spread_options import OnRay, on_ray

    # what is judged here is the options, with or without the ray extra installed
    monkeypatch.setattr(ray_connect, "installed", lambda: None)

    with pytest.raises(AuditError, match="--devices"):
        on_ray("auto", None, "all", None, False)
    with pytest.raises(AuditError, match="--shard"):
        on_ray("auto", None, None, "1/2", False)
    assert on_ray("auto", None, None, None, True) == OnRay("auto", True)
    (tmp_path / rundir.ENV_FILE).write_text('{"phase": "map"}')
    with pytest.raises(AuditError, match="no Ray run"):
        on_ray("auto", tmp_path, None, None, False)
    assert on_ray(None, None, None, None, False) is None
    assert not ray_fleet.is_ray_run(tmp_path)


@pytest.mark.slow
def test_a_candidate_audit_through_ray_is_each_problem_once_merged(
    tmp_path: Path, cluster: object
) -> None:
    """`candidates --ray`: the batched run's 18 problems (from its 54 cases) shared among the
    cluster's three GPUs, each audited once by the fake probe replaying the H100's recorded
    candidates.csv, merged into one table equal to the recorded audit."""
    from cublas_audit.planning.plan_file import read_plan
    from cublas_audit.table import candidates_table
    from tests.fakeprobe import H100_RUN
    from tests.test_multi_candidates import RECORDED, in_case_order

    script, _calls = fake_probe(
        tmp_path,
        candidates=H100_RUN / rundir.CANDIDATES_FILE,
        candidates_per_problem=True,
        env_keys=("CUDA_VISIBLE_DEVICES",),
    )
    audit = SweepOptions(
        cases=read_plan(H100_RUN / rundir.PLAN_FILE),
        out=tmp_path / "run",
        probe_python=script.python,
        candidate_limit=32,
        command=["cublas-audit", "candidates", "--batched", "--ray", "auto"],
    )
    result = fleet.on_ray(audit, None, "candidates", StandIn())

    merged = candidates_table.read_candidates(result.run_dir)
    pd.testing.assert_frame_equal(in_case_order(merged), in_case_order(RECORDED))
    env = rundir.read_env(result.run_dir)
    assert env["engine"] == "ray" and env["phase"] == "candidates"
    assert sorted(p["gpu"] for p in env["ray_shards"].values()) == ["0", "1", "2"]
    assert "better-candidate" in result.report.read_text()


# ----- --replicate: a unit per GPU, compared ------------------------------------------------------

OTHER_KERNEL = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"


def other_unit(tmp_path: Path) -> str:
    """A fake probe replaying the recorded map with one case dispatched to another kernel and
    another case's kernel 30 % slower: the unit that differs."""
    records = [json.loads(line) for line in (MAP / rundir.TIME_RESULTS).read_text().splitlines()]
    planned = {case.case_id for case in map_cases()}
    # the record the probe replays for each case of the plan: its last
    done = {r["case_id"]: r for r in records if r.get("event") == "done"}
    traced = [r for case_id, r in done.items() if case_id in planned and r.get("kernel_time_ms")]
    changed, slower = traced[len(traced) // 2], traced[-1]
    changed["traced_kernels"] = OTHER_KERNEL
    for key in [k for k in slower if k.startswith("kernel_time_") and k.endswith("_ms")]:
        slower[key] = slower[key] * 1.3
    replay = tmp_path / "other-replay"
    replay.mkdir(parents=True)
    (replay / rundir.TIME_RESULTS).write_text("".join(json.dumps(r) + "\n" for r in records))
    (replay / rundir.PROFILE_RESULTS).touch()
    (tmp_path / "other").mkdir()
    script, _calls = fake_probe(tmp_path / "other", replay=replay)
    return script.python


@pytest.mark.slow
def test_replicate_runs_the_whole_map_on_each_gpu_and_names_the_unit_that_differs(
    tmp_path: Path, cluster: object, probe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each unit as from another node: returned as a tar, unpacked by the driver
    monkeypatch.setattr(ray_fleet, "Home", lambda _node, path: ray_task.Home("elsewhere", path))
    other = other_unit(tmp_path)
    result = fleet.on_ray(
        options(tmp_path, probe), None, "map", StandIn(other_probe=other), replicate=True
    )

    assert result.frame is None and result.report == result.run_dir / "units.md"
    assert [p.name for p in result.shards] == ["unit-1", "unit-2", "unit-3"]
    cases = {case.case_id for case in map_cases()}
    assert all(set(load_run(unit).frame["case_id"]) == cases for unit in result.shards)
    env = rundir.read_env(result.run_dir)
    assert env["engine"] == "ray" and env["replicate"] is True and env["unit_label"] == "h100"
    host = socket.gethostname().split(".")[0]
    assert set(env["ray_shards"]) == {"unit-1", "unit-2", "unit-3"}
    assert sorted(p["gpu"] for p in env["ray_shards"].values()) == ["0", "1", "2"]
    assert {p["host"] for p in env["ray_shards"].values()} == {socket.gethostname()}
    shipped = env["ray_timings"]["shards"].values()
    assert all(not t["in_place"] and t["bytes"] > 0 for t in shipped)

    units = json.loads((result.run_dir / "units.json").read_text())
    labels = {f"h100-{host}-gpu{i}" for i in range(GPUS)}
    assert {row["unit"] for row in units["spread"]} == labels
    odd = f"h100-{host}-gpu1"
    by_severity = {f["severity"]: f for f in units["findings"]}
    assert len(units["findings"]) == 2 and set(by_severity) == {"high", "medium"}
    assert all(f["gpu_label"] == odd for f in units["findings"])
    # (the kernel as the report shortens it)
    assert by_severity["high"]["message"].startswith(f"{odd} dispatches xmma_128x128x32 where")
    assert "MHz" in by_severity["medium"]["message"]  # the clocks said beside it
    report = result.report.read_text()
    assert all(label in report for label in labels)
    assert "## Kernel mismatches (1)" in report and "## Slower units (1)" in report


@pytest.mark.slow
def test_a_lost_unit_is_missing_and_resume_runs_only_it(
    tmp_path: Path, cluster: object, probe: Path
) -> None:
    crash = tmp_path / "crash-gpu-2"
    crash.touch()
    with pytest.raises(AuditError, match=r"--ray: unit-\d \(.*\) missing.*--resume"):
        stand_in = StandIn(crash, crash_gpu=2)
        fleet.on_ray(options(tmp_path, probe), None, "map", stand_in, retries=0, replicate=True)
    run_dir = tmp_path / "run"
    assert len(list((run_dir / "shards").iterdir())) == 2 and not (run_dir / "units.md").exists()
    before = len(seen(tmp_path))

    crash.unlink()
    resumed = SweepOptions(resume=run_dir, command=["cublas-audit", "map", "--resume"])
    result = fleet.on_ray(resumed, None, None, StandIn(crash, crash_gpu=2))

    assert len([s for s in seen(tmp_path)[before:] if "--phase" in s["argv"]]) == 1
    assert [p.name for p in result.shards] == ["unit-1", "unit-2", "unit-3"]
    units = json.loads((run_dir / "units.json").read_text())
    assert len(units["spread"]) == GPUS and units["findings"] == []  # three alike units


@dataclass
class Interrupted:
    """Ray stood in for: three tasks; the first comes back (as a tar: from another node), then
    waiting for the others is Ctrl-C (KeyboardInterrupt)."""

    archive: bytes
    cancelled: list[tuple[str, bool]]
    exceptions = type("Exceptions", (), {"RayError": RuntimeError})

    def is_initialized(self) -> bool:
        return True

    def cluster_resources(self) -> dict[str, float]:
        return {"GPU": float(GPUS)}

    def get_runtime_context(self) -> object:
        return type("Context", (), {"get_node_id": staticmethod(lambda: "driver-node")})

    def remote(self, **_options: object) -> object:
        refs = iter(f"ref-{i}" for i in range(1, GPUS + 1))
        task = type("Task", (), {"remote": staticmethod(lambda *_args: next(refs))})
        return lambda _function: task

    def wait(self, refs: list[str], num_returns: int = 1) -> tuple[list[str], list[str]]:
        if "ref-1" not in refs:
            raise KeyboardInterrupt
        return ["ref-1"], [r for r in refs if r != "ref-1"]

    def get(self, ref: str) -> ray_task.ShardDone:
        return ray_task.ShardDone(1, self.archive, "node-1", "host-1", "0")

    def cancel(self, ref: str, force: bool = False) -> None:
        self.cancelled.append((ref, force))


R = TypeVar("R", bound=Interrupted)


def stood_in(
    kind: type[R], marker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[R, SweepOptions]:
    """Ray stood in for by `kind`, each task handing back a tar of one shard holding `marker`,
    and the map run it places."""
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "marker").write_text(marker)
    ray = kind(run_archive.pack(tmp_path / "done"), [])
    monkeypatch.setattr(ray_connect, "require_ray", lambda: ray)
    monkeypatch.setattr(ray_connect, "_local_head", lambda _address: None)  # (its own Ray)
    monkeypatch.setattr(ray_connect.atexit, "register", lambda *_args: None)
    return ray, SweepOptions(cases=map_cases(), gpu_label="h100", out=tmp_path / "run")


def test_ctrl_c_while_gathering_cancels_the_tasks_not_back_and_keeps_what_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray, run = stood_in(Interrupted, "shard 1", tmp_path, monkeypatch)

    with pytest.raises(KeyboardInterrupt):
        ray_fleet.run(run, "auto", StandIn())

    assert ray.cancelled == [("ref-2", True), ("ref-3", True)]
    assert (tmp_path / "run" / "shards" / "shard-1" / "marker").read_text() == "shard 1"
    assert set(rundir.read_env(tmp_path / "run")["ray_shards"]) == {"1/3"}


@dataclass
class Finishing(Interrupted):
    """Ray stood in for: three tasks that finish in the order 3, 1, 2, each a tar."""

    events: list[str] = field(default_factory=list)

    def wait(self, refs: list[str], num_returns: int = 1) -> tuple[list[str], list[str]]:
        first = next(r for r in ("ref-3", "ref-1", "ref-2") if r in refs)
        self.events.append(f"wait {len(refs)}")
        return [first], [r for r in refs if r != first]

    def get(self, ref: str) -> ray_task.ShardDone:
        index = int(ref.split("-")[1])
        return ray_task.ShardDone(index, self.archive, "node-1", "host-1", str(index - 1))


def test_each_shard_is_kept_as_it_finishes_while_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray, run = stood_in(Finishing, "a shard", tmp_path, monkeypatch)

    def kept(index: int, path: Path) -> None:
        ray.events.append(f"kept {index}: {(path / 'marker').read_text()}")

    ray_fleet.run(run, "auto", StandIn(), kept=kept)

    assert ray.events == [
        "wait 3", "kept 3: a shard", "wait 2", "kept 1: a shard", "wait 1", "kept 2: a shard",
    ]  # fmt: skip
    timings = rundir.read_env(tmp_path / "run")["ray_timings"]
    assert list(timings["shards"]) == ["3/3", "1/3", "2/3"]  # (as they came back)
