"""A `--ray` shard's task without Ray's processes (run.ray_task, run.ray_connect): what it is sent
(the plan as stated, no cases), where it writes its shard (in place on the driver's node, else a
tar), and Ray joined in a background thread while the command plans. Ray itself is stood in for
by a module object: these are the decisions around it; tests/test_ray_fleet.py runs them on a real
local Ray cluster."""

from __future__ import annotations

import pickle
import sys
import threading
import types
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.errors import AuditError
from cublas_audit.planning import map_grid, plan_file
from cublas_audit.planning.cases import Case
from cublas_audit.planning.plan_file import PlanFile
from cublas_audit.planning.shards import PlanPart, ShardSpec, shard
from cublas_audit.run import ray_connect, ray_fleet, ray_task, run_archive
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.table import rundir
from tests.conftest import planning_noted, stop_here


@cache
def grid() -> list[Case]:
    """A map's grid (M, N, K at 64..512 step 64): 512 cases."""
    problems = map_grid.Grid.parse("", "64:512:64", "64:512:64", "64:512:64").problems()
    return map_grid.plan(problems, [1], ["bf16"], ["cublas"])


def fake_ray(node: str, gpu: int = 2) -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.get_gpu_ids = lambda: [gpu]  # type: ignore[attr-defined]
    context = types.SimpleNamespace(get_node_id=lambda: node)
    ray.get_runtime_context = lambda: context  # type: ignore[attr-defined]
    return ray


class Recorder:
    """A shard's sweep stood in for: it writes a run directory's files and keeps its options."""

    def __init__(self) -> None:
        self.seen: list[SweepOptions] = []

    def __call__(self, options: SweepOptions) -> object:
        self.seen.append(options)
        assert options.out is not None and not options.out.exists()  # (sweep refuses one)
        options.out.mkdir(parents=True)
        plan_file.write(options.cases, options.out / rundir.PLAN_FILE)
        (options.out / rundir.TIME_RESULTS).write_text('{"event": "probe"}\n')
        return None


def test_a_part_is_sent_as_the_plan_stated_and_builds_the_cases_shard_gives() -> None:
    cases = grid()
    part = PlanPart.of(ShardSpec(2, 3), cases)
    sent = pickle.loads(pickle.dumps(part))
    # the grid's axes, not its cases (a full map's 262,144 took seconds a shard)
    assert len(pickle.dumps(part)) < 2_000 < len(pickle.dumps(cases)) / 10 and sent.given is None
    assert sent.cases() == part.cases() == shard(cases, 3)[1]
    assert sent.record() == part.record()
    assert sent == PlanPart.of(ShardSpec(2, 3), PlanFile.of(cases))


def test_the_shard_options_a_task_is_sent_hold_no_case(tmp_path: Path) -> None:
    cases = grid()
    options = SweepOptions(cases=cases, gpu_label="h100", out=tmp_path / "run", command=["x"])
    fleet = ray_fleet.start(options, "auto", 3)
    sent = ray_fleet.shard_options(fleet, 3)
    assert sent.cases == [] and fleet.settings.cases == []
    assert sent.part is not None and sent.part.cases() == shard(cases, 3)[2]
    assert fleet.plan.fingerprint() == rundir.read_env(tmp_path / "run")["plan_fingerprint"]


@pytest.fixture
def sent(tmp_path: Path) -> tuple[SweepOptions, Path]:
    """Shard 2 of 3 of a run whose directory the driver made (its plan.json)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan_file.write(grid(), run_dir / rundir.PLAN_FILE)
    part = PlanPart.of(ShardSpec(2, 3), PlanFile.of(grid()))
    options = SweepOptions(cases=[], part=part, gpu_label="h100", command=["x"])
    return options, run_dir / "shards" / "shard-2"


def test_on_the_drivers_node_a_task_writes_its_shard_in_place(
    sent: tuple[SweepOptions, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    options, target = sent
    target.mkdir(parents=True)
    (target / "left.by.a.lost.attempt").touch()
    monkeypatch.setitem(sys.modules, "ray", fake_ray("driver"))
    sweep = Recorder()

    done = ray_task.run_shard(options, 2, sweep, "", ray_task.Home("driver", target))

    assert done.in_place and done.archive == b"" and done.gpu == "2"
    ran = sweep.seen[0]
    assert ran.out == target and ran.device == 2 and ran.cases == shard(grid(), 3)[1]
    # left unfolded, and swept so: the driver folds it beside its merge (jobs.fleet)
    assert sorted(p.name for p in target.iterdir()) == ["plan.json", "timing.jsonl"]
    assert not ran.fold
    assert list(done.times) == ["started", "swept", "folded", "packed"]


@pytest.mark.parametrize(
    ("node", "visible"), [("another-node", True), ("driver", False)], ids=["node", "no-run-dir"]
)
def test_elsewhere_a_task_returns_its_shard_as_a_tar(
    sent: tuple[SweepOptions, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    node: str,
    visible: bool,
) -> None:
    options, target = sent
    if not visible:  # the same node id, but not the driver's filesystem (no run directory)
        target = tmp_path / "elsewhere" / "shards" / "shard-2"
    monkeypatch.setitem(sys.modules, "ray", fake_ray(node))

    done = ray_task.run_shard(options, 2, Recorder(), "", ray_task.Home("driver", target))

    assert not done.in_place and not target.exists()
    run_archive.unpack(done.archive, tmp_path / "unpacked")
    assert (tmp_path / "unpacked" / "timing.jsonl.gz").is_file()


def joining_a_fake_ray(
    monkeypatch: pytest.MonkeyPatch, init: Callable[..., None]
) -> tuple[types.ModuleType, list[object]]:
    """A stand-in `ray` whose ray.init is `init`, joined through ray_connect from a clean state
    (no join under way, no clock, no exit handler registered): the module, and the list of the
    Rays whose workers were readied."""
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: False  # type: ignore[attr-defined]
    ray.init = init  # type: ignore[attr-defined]
    warmed: list[object] = []
    monkeypatch.setattr(ray_connect, "warm_workers", warmed.append)
    monkeypatch.setattr(ray_connect, "require_ray", lambda: ray)
    monkeypatch.setattr(ray_connect, "_joining", None)
    monkeypatch.setattr(ray_connect, "_clock", {})
    monkeypatch.setattr(ray_connect.atexit, "register", lambda *_args: None)
    # no head of its own: a cluster on this machine, joined as it is (tests/test_ray_head.py
    # joins a head)
    monkeypatch.setattr(ray_connect, "_local_head", lambda _address: None)
    return ray, warmed


def test_ray_is_joined_in_the_background_and_waited_for_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[tuple[str | None, str]] = []
    intervals: list[float] = []
    before = sys.getswitchinterval()

    def init(address: str | None, **_options: object) -> None:
        calls.append((address, threading.current_thread().name))
        intervals.append(sys.getswitchinterval())
        started.set()
        release.wait(5)

    ray, warmed = joining_a_fake_ray(monkeypatch, init)

    ray_connect.connect_soon("auto")
    assert started.wait(5)  # joining while this thread goes on (plans)
    joining = ray_connect._joining
    assert joining is not None
    release.set()
    assert joining.ready.wait(5)  # (Ray up before the plan is made: its workers readied)
    assert ray_connect.connect("auto") is ray
    assert calls == [(None, "cublas-audit ray.init")] and warmed == [ray]  # its workers readied
    # the interpreter lock passed on often while Ray was joined, as before once it was
    assert intervals == [pytest.approx(ray_connect.JOIN_SWITCH_S)]
    assert sys.getswitchinterval() == before
    assert set(ray_connect.clock_record()) == {"clock", "connect_s", "connect_waited_s"}


def test_no_worker_is_readied_where_the_driver_already_waits_for_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the plan made before Ray is up: the shards are submitted at once, and a warm-up would
    # only hold each GPU from its shard's task
    started, release = threading.Event(), threading.Event()

    def init(**_options: object) -> None:
        started.set()
        release.wait(5)

    ray, warmed = joining_a_fake_ray(monkeypatch, init)

    ray_connect.connect_soon("auto")
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()  # (Ray up while connect waits)
    assert ray_connect.connect("auto") is ray
    assert warmed == []


def test_a_cluster_not_joined_in_the_background_is_one_line_where_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: False  # type: ignore[attr-defined]

    def init(address: str | None, **_options: object) -> None:
        raise ConnectionError("no cluster at 10.0.0.9:6379")

    ray.init = init  # type: ignore[attr-defined]
    monkeypatch.setattr(ray_connect, "require_ray", lambda: ray)
    monkeypatch.setattr(ray_connect, "_joining", None)
    monkeypatch.setattr(ray_connect.atexit, "register", lambda *_args: None)

    ray_connect.connect_soon("10.0.0.9:6379")
    with pytest.raises(AuditError, match=r"--ray 10.0.0.9:6379: no Ray cluster joined"):
        ray_connect.connect("10.0.0.9:6379")


def test_map_joins_ray_before_it_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cublas_audit.cli import app
    from cublas_audit.jobs import fleet

    order: list[str] = []
    monkeypatch.setattr(ray_connect, "installed", lambda: None)
    monkeypatch.setattr(ray_connect, "connect_soon", lambda address: order.append(address))
    planning_noted(monkeypatch, order)
    monkeypatch.setattr(fleet, "on_ray", stop_here)
    args = ["map", "--sizes", "64:256:64", "--ray", "auto", "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    assert order == ["auto", "plan"]
    follow = CliRunner().invoke(app, [*args, "--follow-up", "2"])
    assert follow.exit_code == 2 and order == ["auto", "plan"]  # refused before Ray is joined


def test_bad_map_input_with_ray_exits_2_before_ray_is_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a bad axis, --fix without --follow-up, a used --out: one line, exit 2, and no Ray started
    # (joining it takes 5-20 s, which an error must not wait for)
    from cublas_audit.cli import app

    joined: list[str] = []
    monkeypatch.setattr(ray_connect, "installed", lambda: None)
    monkeypatch.setattr(ray_connect, "connect_soon", joined.append)
    used = tmp_path / "used"
    used.mkdir()
    (used / "plan.json").write_text("{}")
    base = ["map", "--ray", "auto", "--out", str(tmp_path / "new")]
    cases = {
        "--m": [*base, "--m", "64:x:64", "--n", "64", "--k", "64"],
        "--fix": [*base, "--sizes", "64:256:64", "--fix"],
        "is not empty": ["map", "--ray", "auto", "--sizes", "64:256:64", "--out", str(used)],
    }
    for words, args in cases.items():
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and words in result.output, (args, result.output)
    assert joined == []


def test_each_gpu_gets_a_worker_readied_that_stays_for_its_shard() -> None:
    submitted: list[tuple[dict[str, object], object, tuple[object, ...]]] = []
    ray = types.ModuleType("ray")
    ray.cluster_resources = lambda: {"CPU": 64.0, "GPU": 4.0}  # type: ignore[attr-defined]

    def remote(**options: object) -> object:
        def wrap(function: object) -> object:
            submit = lambda *args: submitted.append((options, function, args))  # noqa: E731
            return types.SimpleNamespace(remote=submit)

        return wrap

    ray.remote = remote  # type: ignore[attr-defined]
    ray_connect.warm_workers(ray)
    # a GPU each (at once: a worker each); max_calls=0: the worker is not ended after it
    assert submitted == [({"num_gpus": 1, "max_calls": 0}, ray_task.warm_up, (0.5,))] * 4


def test_a_plan_is_stated_once_and_sent_without_what_was_made_from_it(tmp_path: Path) -> None:
    plan = PlanFile.of(grid()[::3])  # no product: its columns listed
    assert plan.listed is not None
    fresh = len(pickle.dumps(plan))
    plan.case_ids()
    plan_file.write(plan, tmp_path / rundir.PLAN_FILE)
    assert plan.to_json() is plan.to_json()  # (its fingerprint and its file: one statement)
    assert len(pickle.dumps(plan)) == fresh and pickle.loads(pickle.dumps(plan)) == plan


@pytest.mark.parametrize("callers", [False, True], ids=["joined-here", "a-caller-s"])
def test_ray_is_left_once_the_shards_are_back_only_where_joined_here(
    monkeypatch: pytest.MonkeyPatch, callers: bool
) -> None:
    stopped = threading.Event()
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: callers  # type: ignore[attr-defined]
    ray.init = lambda **_options: None  # type: ignore[attr-defined]
    ray.shutdown = stopped.set  # type: ignore[attr-defined]
    monkeypatch.setattr(ray_connect, "require_ray", lambda: ray)
    # (connect also looks at the ray module already imported: this one, whatever another test
    # of this worker process left there)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setattr(ray_connect, "_joining", None)
    monkeypatch.setattr(ray_connect, "_ours", [])
    monkeypatch.setattr(ray_connect, "_local_head", lambda _address: None)
    monkeypatch.setattr(ray_connect.atexit, "register", lambda *_args: None)
    # (the joining thread readies workers where it is done before connect waits: not this Ray's)
    monkeypatch.setattr(ray_connect, "warm_workers", lambda _ray: None)

    ray_connect.connect("auto")
    ray_connect.release()
    assert stopped.wait(0 if callers else 5) is not callers  # (in a thread of its own)


def test_a_local_instance_started_here_is_sized_to_the_gpus_not_every_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ray prestarts a Python worker per logical CPU as the driver joins: 64 on a 64-core host
    # for 4 shards; a cluster joined (`ray start`'s, or by address) is never sized here
    calls: list[dict[str, object]] = []
    started: list[bool] = [False]
    ray = types.ModuleType("ray")

    def init(**options: object) -> None:
        calls.append(options)
        if started[0] and options.get("num_cpus") is not None:
            raise ValueError("When connecting to an existing cluster, num_cpus and num_gpus ...")

    ray.init = init  # type: ignore[attr-defined]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setattr(ray_connect.os, "cpu_count", lambda: 64)
    ray_connect._connect_now(ray, "auto")
    assert [c["num_cpus"] for c in calls] == [4 + ray_connect.SPARE_CPUS]
    calls.clear()
    started[0] = True  # a cluster `ray start` began on this machine: joined as it is
    ray_connect._connect_now(ray, "auto")
    assert [c.get("num_cpus") for c in calls] == [6, None] and calls[1]["address"] is None
    calls.clear()
    ray_connect._connect_now(ray, "10.0.0.9:6379")
    assert calls == [
        {"address": "10.0.0.9:6379", "include_dashboard": False, "log_to_driver": False}
    ]
    monkeypatch.setattr(ray_connect.os, "cpu_count", lambda: 2)  # (never fewer than the GPUs)
    assert ray_connect.local_cpus() == 4
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(ray_connect, "NVIDIA_GPUS", "/nonexistent/gpus")
    assert ray_connect.local_cpus() is None  # (Ray's default)
