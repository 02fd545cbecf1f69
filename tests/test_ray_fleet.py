"""`--ray`: a map's shards placed on a real local Ray cluster (three logical GPUs, no CUDA), one
task each, gathered as bytes, merged; a task whose worker dies leaves its shard missing and
`--resume` re-runs only that one; without Ray, `--ray` is exit 3 with the install command.

What stands in for the machine, inside each Ray worker: environment.collect (the H100 of a bundled
run, on the GPU Ray gave the task) and the probe (tests/fakeprobe.py replaying the H100's
recorded FP32 map). What is real: Ray's placement (`num_gpus=1`), CUDA_VISIBLE_DEVICES per task,
the tar of each shard's run directory, the merge and the report.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.jobs import fleet
from cublas_audit.jobs import measure as jobs
from cublas_audit.observe import environment
from cublas_audit.report import map_plots
from cublas_audit.run import ray_fleet
from cublas_audit.run.sweep_setup import SweepOptions, sweep
from cublas_audit.table import rundir
from cublas_audit.table.inputs import load_run
from tests.fakeprobe import fake_probe, h100_environment, seen
from tests.test_map import MAP, map_cases

REPO = Path(__file__).resolve().parents[1]
GPUS = 3
# what differs between a shard's rows and the same case measured unsharded: where it ran
WHERE = ["device_index", "gpu_uuid"]


@dataclass(frozen=True)
class StandIn:
    """A task's sweep with the machine stood in for (in the Ray worker's own process). Where
    `crash` exists, shard `crash_shard`'s worker dies as a lost node's would."""

    crash: Path | None = None
    crash_shard: int = 2

    def __call__(self, options: SweepOptions) -> object:
        def collect(ncu: str | None = None, device: int | None = None) -> environment.Environment:
            found = h100_environment(ncu)
            return replace(found, device_index=device, gpu_uuid=f"GPU-ray-{device}")

        environment.collect = collect  # this worker's module, never the test process's
        assert options.part is not None
        if self.crash and self.crash.exists() and options.part.spec.index == self.crash_shard:
            os._exit(1)
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
    monkeypatch.setattr(map_plots, "draw", lambda rows, plots, flagged=(): [])  # seconds saved
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

    starts = [s for s in seen(tmp_path) if "--only" in s["argv"]]
    assert sorted(s["env"]["CUDA_VISIBLE_DEVICES"] for s in starts) == ["0", "1", "2"]
    env = rundir.read_env(result.run_dir)
    assert env["engine"] == "ray" and env["shard_count"] == GPUS
    assert sorted(p["gpu"] for p in env["ray_shards"].values()) == ["0", "1", "2"]
    assert {s["shard"] for s in env["shards"]} == {"1/3", "2/3", "3/3"}
    frame = result.frame
    assert frame is not None and frame["status"].eq("ok").all()
    by_shard = [set(load_run(path).frame["case_id"]) for path in result.shards]
    assert sum(map(len, by_shard)) == len(frame) == len(set(frame["case_id"]))  # each case once
    assert all(p.parent == result.run_dir / "shards" for p in result.shards)

    # the same machine, unsharded, in this process
    monkeypatch.setattr(environment, "collect", lambda ncu=None, device=None: h100_environment(ncu))
    whole = jobs.dispatch_map_run(options(tmp_path, probe, "whole"))
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
    resumed = SweepOptions(resume=run_dir, command=["cublas-audit", "map", "--resume"])
    result = fleet.on_ray(resumed, None, None, StandIn(crash))

    again = [s for s in seen(tmp_path)[before:] if "--only" in s["argv"]]
    assert len(again) == 1  # one probe: shard 2's, the finished shards kept
    assert result.frame is not None and len(result.frame) == len(map_cases())
    assert set(rundir.read_env(run_dir)["ray_shards"]) == {"1/3", "2/3", "3/3"}


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


def test_ray_refuses_what_it_replaces(tmp_path: Path) -> None:
    from cublas_audit.cli.options import on_ray

    with pytest.raises(AuditError, match="--devices"):
        on_ray("auto", None, "all", None, False)
    with pytest.raises(AuditError, match="--shard"):
        on_ray("auto", None, None, "1/2", False)
    with pytest.raises(AuditError, match="--replicate"):
        on_ray("auto", None, None, None, True)
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
    from cublas_audit.planning.cases import read_plan
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
