"""Every GPU of a node: sharding, pinning, merging, per-shard resume and the unit comparison.

The machine is stood in for (no GPU here): nvidia-smi's list of GPUs is two H100s with made-up
UUIDs, environment.collect is what it found on the H100 of a bundled run, and each shard's probe
is the fake interpreter of tests/fakeprobe.py replaying the H100's recorded FP32 map
(reports/h100/maps/20261123-235543-fp32-64-4096). What is real: the sharding, the
CUDA_VISIBLE_DEVICES each probe is started with, the run directory, resume and the merged table.
The unit comparison runs on two real reruns of one H100 (reports/h100/noise/kernel-a), which as
two "units" of one model must never be called different, and on a planted slowdown and a
planted kernel change in one of them.
"""

from __future__ import annotations

import functools
import gzip
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.device import dram_bandwidth
from cublas_audit.errors import AuditError, InterruptedSweepError, OperandMismatch, ToolMissingError
from cublas_audit.jobs import measure
from cublas_audit.judge import map_audit, units
from cublas_audit.judge.rules import prepare
from cublas_audit.observe import environment
from cublas_audit.observe.environment import Gpu
from cublas_audit.planning.plan_file import PlanFile, StatedCases
from cublas_audit.planning.shards import shard as split_plan
from cublas_audit.planning.shards import work as estimated_work
from cublas_audit.report import map_plots, units_report
from cublas_audit.run import dispatch_map, multi_gpu, shard_processes
from cublas_audit.run.sweep import Progress
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.table import inputs, rundir
from cublas_audit.table.inputs import load_run
from cublas_audit.table.validation import read_table
from cublas_audit.vocabulary import Phase
from tests.conftest import REPORTS, planning_noted, stop_here, without_map_pictures
from tests.fakeprobe import as_h100s, deadline, fake_probe, h100_environment, seen
from tests.test_map import MAP, map_cases
from tests.test_resume import stand_in_machine

H100S = [
    Gpu(0, "GPU-aaaa-0", "NVIDIA H100 80GB HBM3"),
    Gpu(1, "GPU-bbbb-1", "NVIDIA H100 80GB HBM3"),
]
RERUNS = Path(__file__).resolve().parents[1] / "reports/h100/noise/kernel-a"
DEADLINE_S = 60


def test_shards_are_disjoint_complete_balanced_and_in_plan_order() -> None:
    cases = map_cases()
    shards = multi_gpu.shard(cases, 2)
    ids = [c.case_id for shard in shards for c in shard]
    assert sorted(ids) == sorted(c.case_id for c in cases) and len(set(ids)) == len(ids)
    order = {c.case_id: i for i, c in enumerate(cases)}
    for shard in shards:
        assert [order[c.case_id] for c in shard] == sorted(order[c.case_id] for c in shard)
    work = [sum(map(estimated_work, shard)) for shard in shards]
    assert max(work) / min(work) < 1.05  # within 5 %: a 2-GPU map takes about half the time


def test_devices_are_checked_before_anything_runs() -> None:
    assert multi_gpu.parse_devices("all", H100S) == H100S
    assert multi_gpu.parse_devices("1", H100S) == [H100S[1]]
    with pytest.raises(AuditError, match="'2' is not a GPU of this host"):
        multi_gpu.parse_devices("0,2", H100S)
    with pytest.raises(AuditError, match="named twice"):
        multi_gpu.parse_devices("0,0", H100S)
    with pytest.raises(AuditError, match="no NVIDIA GPU found here"):
        multi_gpu.parse_devices("all", [])
    mixed = [H100S[0], Gpu(1, "GPU-cccc", "NVIDIA H200")]
    with pytest.raises(AuditError, match="--allow-mixed"):
        multi_gpu.check_models(mixed, allow_mixed=False)
    multi_gpu.check_models(mixed, allow_mixed=True)


@pytest.fixture
def two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    stand_in_machine(monkeypatch)
    monkeypatch.setattr(multi_gpu, "list_gpus", lambda: list(H100S))

    def collect(ncu: str | None = None, device: int | None = None) -> environment.Environment:
        found = h100_environment(ncu)  # what nvidia-smi -i <device> says of that GPU
        return replace(found, device_index=device, gpu_uuid=H100S[device or 0].uuid)

    monkeypatch.setattr(environment, "collect", collect)
    # each shard runs in a process of its own (forked from the fork server), which sees none of
    # these patches
    uuids = [gpu.uuid for gpu in H100S]
    monkeypatch.setattr(shard_processes, "CHILD_SETUP", functools.partial(as_h100s, uuids))
    monkeypatch.setattr(dram_bandwidth, "measure_dram", no_gpu_work_here)
    # the pictures are tests/test_map.py's; here they would only cost seconds
    monkeypatch.setattr(map_plots, "drawing", without_map_pictures)
    probe, _calls = fake_probe(tmp_path, replay=MAP, env_keys=("CUDA_VISIBLE_DEVICES",))
    return Path(probe.python)


def no_gpu_work_here(device: int = 0) -> dict[str, object]:
    """The parent of --devices' shards never touches a GPU (no CUDA context: its shards are
    forked from the fork server, and a CUDA context does not survive a fork anyway)."""
    raise AssertionError("the parent process measured on a GPU")


def map_options(tmp_path: Path, probe: Path) -> SweepOptions:
    return SweepOptions(
        cases=map_cases(),
        gpu_label="h100",
        out=tmp_path / "run",
        probe_python=str(probe),
        min_reps=5,
        reference=False,
        command=["cublas-audit", "map", "--devices", "all"],
    )


def test_a_sharded_map_pins_each_probe_and_merges_one_table(
    tmp_path: Path, two_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spread = multi_gpu.Spread("all")
    read: list[Path] = []  # what the run's reports read back (inputs.load_run's read_table)
    monkeypatch.setattr(inputs, "read_table", lambda path: read.append(path) or read_table(path))
    prepared: list[int] = []  # the merged table prepared for its rules: once, not again to report
    monkeypatch.setattr(
        map_audit, "prepare", lambda frame: prepared.append(len(frame)) or prepare(frame)
    )
    monkeypatch.setattr(
        dispatch_map, "prepare", lambda frame: prepared.append(len(frame)) or prepare(frame)
    )
    monkeypatch.setattr(dispatch_map, "WRITE_FORK_ROWS", 1)  # the merged table's writer: its pid
    write = rundir.write_run_table
    writer = tmp_path / "writer.pid"
    monkeypatch.setattr(
        rundir,
        "write_run_table",
        lambda frame, run: writer.write_text(str(os.getpid())) and write(frame, run),
    )
    folded: list[Path] = []  # (this process's folds: a shard's process sees none of its patches)
    fold = rundir.compact_results
    monkeypatch.setattr(rundir, "compact_results", lambda run: folded.append(run) or fold(run))
    with deadline(DEADLINE_S):
        result = measure.dispatch_map_run(map_options(tmp_path, two_gpus), spread=spread)
    assert result.run_dir not in read  # the merged table judged and reported as it was written
    assert prepared == [128]
    # the merged table written by a fork of this process while it was judged here, whole
    assert int(writer.read_text()) != os.getpid()
    pd.testing.assert_frame_equal(read_table(result.run_dir), result.frame)
    # each shard's probe records folded by this process, beside its merge and judging, once
    shards = [multi_gpu.shard_dir(result.run_dir, gpu) for gpu in H100S]
    assert sorted(folded) == shards
    for shard in shards:
        assert not (shard / rundir.TIME_RESULTS).exists()
        assert rundir.read_results(shard / rundir.TIME_RESULTS)  # (from timing.jsonl.gz)

    starts = [s for s in seen(tmp_path) if "--phase" in s["argv"]]
    # a fresh shard's probe runs its whole plan: no list of its case ids to write and look up
    assert starts and not any("--only" in s["argv"] for s in starts)
    pinned = {s["env"]["CUDA_VISIBLE_DEVICES"]: s["ppid"] for s in starts}
    assert set(pinned) == {"GPU-aaaa-0", "GPU-bbbb-1"}  # one probe per GPU, each pinned to its own
    # each shard in a process of its own (not this one): its probe's parent, its roofline's
    assert len(set(pinned.values())) == 2 and os.getpid() not in pinned.values()
    frame = result.frame
    assert frame is not None and len(frame) == 128 and frame["status"].eq("ok").all()
    by_device = frame.groupby("device_index")["case_id"].apply(set)
    assert set(by_device.index) == {0, 1} and not (by_device[0] & by_device[1])
    for gpu in H100S:  # each shard's rows carry its GPU, and its probe measured exactly them
        shard_ids = set(load_run(multi_gpu.shard_dir(result.run_dir, gpu)).frame["case_id"])
        assert shard_ids == by_device[gpu.index]
        assert (frame.loc[frame["device_index"] == gpu.index, "gpu_uuid"] == gpu.uuid).all()
    assert "2112 takes 1.16x the time of the larger 2176" in result.report.read_text()
    env = rundir.read_env(result.run_dir)
    assert [d["uuid"] for d in env["devices"]] == ["GPU-aaaa-0", "GPU-bbbb-1"]
    after = env["after_gpu_seconds"]  # (and each shard's setup_seconds: before its probe)
    assert set(after) == {"merge", "judge", "fold_wait", "report_load", "report"}
    assert all(rundir.read_env(shard)["setup_seconds"] >= 0 for shard in shards)
    assert set(env["shard_seconds"]) == {"gpu0", "gpu1"}
    # when each shard's process began and was done, all exited and every table was read
    timeline = env["shard_timeline_s"]
    assert set(timeline["shards"]) == {"gpu0", "gpu1"}
    for said in timeline["shards"].values():
        assert timeline["jobs_made"] <= said["began"] <= said["done"] <= timeline["exited"]
    assert timeline["exited"] <= timeline["tables_read"] <= env["sweep_seconds"]
    for gpu in H100S:
        shard_env = rundir.read_env(multi_gpu.shard_dir(result.run_dir, gpu))
        assert shard_env["roofline"]["measured_by_pid"] == pinned[gpu.uuid]


def test_a_resumed_sharded_map_redoes_only_each_shards_missing_cases(
    tmp_path: Path, two_gpus: Path
) -> None:
    spread = multi_gpu.Spread("all")
    with deadline(DEADLINE_S):
        first = measure.dispatch_map_run(map_options(tmp_path, two_gpus), spread=spread)
    shard = multi_gpu.shard_dir(first.run_dir, 1)
    results = shard / rundir.TIME_RESULTS
    folded = shard / (rundir.TIME_RESULTS + ".gz")  # (a finished shard's, rundir.compact_results)
    lines = gzip.decompress(folded.read_bytes()).decode().splitlines()
    folded.unlink()
    results.write_text("\n".join(lines[: len(lines) // 2]) + "\n")  # GPU 1 stopped halfway
    done = set(rundir.read_results(results))
    (tmp_path / "probe-seen.jsonl").unlink()

    with deadline(DEADLINE_S):
        again = measure.dispatch_map_run(
            SweepOptions(resume=first.run_dir), spread=multi_gpu.Spread()
        )

    starts = [s for s in seen(tmp_path) if "--only" in s["argv"]]
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in starts] == ["GPU-bbbb-1"]
    argv = starts[0]["argv"]
    only = set(Path(argv[argv.index("--only") + 1]).read_text().split())
    shard_plan = {c.case_id for c in load_plan(shard)}
    assert only == shard_plan - done
    assert again.frame is not None and again.frame["status"].eq("ok").all()


def load_plan(run_dir: Path) -> list:  # type: ignore[type-arg]
    from cublas_audit.planning.plan_file import read_plan

    return read_plan(run_dir / rundir.PLAN_FILE)


def test_replicate_needs_two_gpus_and_devices(tmp_path: Path, two_gpus: Path) -> None:
    with pytest.raises(AuditError, match="two GPUs or more"):
        multi_gpu.on_devices(map_options(tmp_path, two_gpus), multi_gpu.Spread("0", replicate=True))
    with pytest.raises(AuditError, match="go with --devices"):
        multi_gpu.on_devices(map_options(tmp_path, two_gpus), multi_gpu.Spread(replicate=True))


# ----- the unit comparison, on two real reruns of one H100 ---------------------------------------


def as_unit(run: Path, tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(run, copy)
    return copy


def test_two_reruns_of_one_gpu_are_never_called_different(tmp_path: Path) -> None:
    a, b = (load_run(RERUNS / f"run-0{i}") for i in (0, 1))
    found, spread = units.compare_units([a, b])
    assert found == []
    assert spread.loc[1, "median_ratio"] == pytest.approx(1.0, abs=0.02)


def test_a_slower_unit_and_another_kernel_are_unit_mismatches(tmp_path: Path) -> None:
    a, b = (load_run(RERUNS / f"run-0{i}") for i in (0, 1))
    frame = b.frame.copy()
    slow = frame.index[(frame["case_id"] == "cublas.fp32.4096x4096x4096.b8.nn")][0]
    timed = [c for c in frame.columns if c.startswith("kernel_time_") and c.endswith("_ms")]
    frame.loc[slow, timed] = frame.loc[slow, timed] * 1.3  # one unit 30 % slower on one case
    other = frame.index[frame["case_id"] == "cublas.fp32.1024x1024x1024.b8.nn"][0]
    frame.loc[other, "kernel"] = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"
    frame.loc[other, "traced_kernels"] = frame.loc[other, "kernel"]
    b = type(b)(b.title, "h100-gpu1", b.path, frame.assign(gpu_label="h100-gpu1"), b.env)

    found, _spread = units.compare_units([a, b])

    by_severity = {f.severity: f for f in found}
    assert set(by_severity) == {"high", "medium"} and len(found) == 2
    assert "h100-gpu1 dispatches" in by_severity["high"].message
    assert by_severity["high"].sizes == ["1024"]
    before = a.frame.set_index("case_id").loc["cublas.fp32.4096x4096x4096.b8.nn", "kernel_time_ms"]
    after = frame.loc[slow, "kernel_time_ms"]  # 1.3 x run-01's, itself 1 % off run-00's
    assert (
        f"h100-gpu1 takes {after / before:.2f}x the time of h100" in by_severity["medium"].message
    )
    assert "MHz" in by_severity["medium"].message  # the clocks said beside it
    report = units_report.render([a, b], found, _spread)
    assert "## Kernel mismatches (1)" in report and "## Slower units (1)" in report


def test_a_table_of_mixed_models_loads_per_model(tmp_path: Path) -> None:
    run = as_unit(RERUNS / "run-00", tmp_path, "mixed")
    frame = pd.read_csv(run / rundir.TABLE_FILE)
    half = frame.index[: len(frame) // 2]
    frame.loc[half, "gpu_label"] = "h200"
    frame.to_csv(run / rundir.TABLE_FILE, index=False)
    env = rundir.read_env(run)
    rundir.write_env(run, {**env, "allow_mixed": True})
    from cublas_audit.table.inputs import load_inputs

    assert sorted(d.gpu_label for d in load_inputs([run])) == ["h100", "h200"]


# ----- the shards' processes: progress, errors and Ctrl-C across the process boundary -----------


@pytest.mark.parametrize(
    "error",
    [
        AuditError("bad input"),
        ToolMissingError("no ncu here"),
        InterruptedSweepError("interrupted: 3 of 64 cases are saved"),
        OperandMismatch("operand a: float16, built for float32"),
    ],
)
def test_a_shards_audit_error_reaches_the_parent_whole(error: AuditError) -> None:
    copy = shard_processes.portable(error)
    assert type(copy) is type(error) and str(copy) == str(error)
    assert isinstance(copy, AuditError) and copy.exit_code == error.exit_code


class Unpicklable(AuditError):
    def __init__(self, message: str, detail: object) -> None:  # pickle calls it with one arg
        super().__init__(message)
        self.detail = detail


def test_an_error_that_does_not_pickle_keeps_its_text_and_exit_code() -> None:
    wrong = Unpicklable("no GPU in the probe", object())
    wrong.exit_code = 3
    copy = shard_processes.portable(wrong)
    assert type(copy) is AuditError and str(copy) == "no GPU in the probe" and copy.exit_code == 3
    try:
        raise ZeroDivisionError("a bug")
    except ZeroDivisionError as bug:
        crashed = shard_processes.portable(bug)
    assert isinstance(crashed, ZeroDivisionError)  # an internal error, exit 4, with where it was
    assert "in the shard's process" in crashed.__notes__[0] and "a bug" in crashed.__notes__[0]


@pytest.mark.heavy  # two shard processes, one slowed down on purpose
def test_ctrl_c_stops_every_shard_process_and_each_error_crosses_whole(
    tmp_path: Path, two_gpus: Path
) -> None:
    """GPU 0's shard is at work (its probe slow) when Ctrl-C comes to this process, on its first
    finished case; GPU 1's shard has already failed (its probe would see no GPU: exit 3). The
    parent forwards the interrupt, GPU 0's shard stops, keeps what it finished and says so as an
    InterruptedSweepError; GPU 1's ToolMissingError arrives as itself."""
    fake_probe(tmp_path, replay=MAP, env_keys=("CUDA_VISIBLE_DEVICES",), pause_s=0.3)
    options = replace(map_options(tmp_path, two_gpus), phase=Phase.map)
    plan = multi_gpu.start(options, H100S, replicate=False)
    cases = multi_gpu.shard(plan.cases, 2)
    measure = [
        multi_gpu.shard_options(options, plan, gpu, part)
        for gpu, part in zip(H100S, cases, strict=True)
    ]
    measure[1] = replace(measure[1], probe_env={"CUDA_VISIBLE_DEVICES": "none"})
    seen_here: list[str] = []

    def advance(case_id: str) -> None:
        seen_here.append(case_id)
        raise KeyboardInterrupt  # as SIGINT does, in this process's main thread

    bar = Progress(advance=advance)
    with deadline(DEADLINE_S):
        outcome = shard_processes.run_all(measure, [bar, None])

    assert outcome.interrupted and set(outcome.failures) == {0, 1}
    stopped, failed = outcome.failures[0], outcome.failures[1]
    assert type(stopped) is InterruptedSweepError and "finish with: cublas-audit map" in str(
        stopped
    )
    assert type(failed) is ToolMissingError and failed.exit_code == 3
    kept = rundir.read_results(multi_gpu.shard_dir(plan.run_dir, 0) / rundir.TIME_RESULTS)
    assert seen_here[0] in kept and 1 <= len(kept) < len(cases[0])  # stopped, not finished


@pytest.mark.parametrize(
    ("outcome", "raised", "message"),
    [
        (
            shard_processes.Outcome({}, interrupted=True),
            InterruptedSweepError,
            "finish with: --resume",
        ),
        (
            shard_processes.Outcome({0: InterruptedSweepError("stopped")}, interrupted=False),
            InterruptedSweepError,
            "finish with: --resume",
        ),
        (
            shard_processes.Outcome({1: ToolMissingError("no GPU")}, interrupted=False),
            ToolMissingError,
            "GPU 1: no GPU; what the shards finished is kept: --resume .* goes on",
        ),
    ],
)
def test_how_the_shards_ended_is_the_runs_one_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    outcome: shard_processes.Outcome,
    raised: type[AuditError],
    message: str,
) -> None:
    monkeypatch.setattr(shard_processes, "run_all", lambda measure, progress, finished: outcome)
    plan = multi_gpu.start(replace(SweepOptions(cases=map_cases()), out=tmp_path), H100S, False)
    with pytest.raises(raised, match=message):
        multi_gpu.run(SweepOptions(), plan)


def test_a_shard_is_sent_its_cases_as_rows_and_gets_them_back_whole() -> None:
    """The H100's batched sweep (loop companions, strided batches, cuBLASLt) with each case's
    cause removed beside it (other layouts, padded leading dimensions): what a --devices shard's
    process is sent holds no Case object, and makes the same cases again."""
    from cublas_audit.planning.cases import with_cause_removed_companions
    from cublas_audit.planning.plan_file import read_plan

    batched = REPORTS / "h100" / "20261123-145452-batched" / "plan.json"
    cases = with_cause_removed_companions(read_plan(batched))
    options = SweepOptions(cases=cases, gpu_label="h100", command=["x"])
    sent = shard_processes.SentJob.of(options)
    assert sent.options.cases == [] and all(type(row) is tuple for row in sent.rows)
    assert sent.received() == options and len({c.routine for c in cases}) >= 3


def test_a_shard_of_a_stated_plan_is_sent_as_its_part_and_makes_its_cases(tmp_path: Path) -> None:
    """A run's shards are sent their part of the plan's statement, no rows (the parent neither
    splits the plan nor makes rows, one shard after another, before the first starts): each
    makes the cases `shard` gives it; a plan without its statement, and a replicated run, go as
    rows; a shard resumed, as its record."""
    cases = map_cases()
    options = replace(map_options(tmp_path, tmp_path / "probe"), cases=cases)
    plan = multi_gpu.start(options, H100S, False)
    jobs = multi_gpu._jobs(options, plan)
    assert [gpu for gpu, _ in jobs] == H100S
    for (gpu, sent), expected in zip(jobs, split_plan(cases, 2), strict=True):
        assert sent.part is not None and sent.rows == [] and sent.options.cases == []
        got = sent.received()
        assert got.cases == expected and got.probe_env["CUDA_VISIBLE_DEVICES"] == gpu.uuid
    # a plan made as its statement (a grid map's): the parent never makes its cases
    made = StatedCases(PlanFile.of(cases))
    again = multi_gpu.start(replace(options, cases=made, out=tmp_path / "again"), H100S, False)
    assert [s.received().cases for _, s in multi_gpu._jobs(options, again)] == split_plan(cases, 2)
    assert again.cases is made and made._made is None
    unstated = replace(plan, stated=None)
    assert all(sent.part is None and sent.rows for _, sent in multi_gpu._jobs(options, unstated))
    both = replace(plan, replicate=True)
    assert all(sent.received().cases == cases for _, sent in multi_gpu._jobs(options, both))
    (multi_gpu.shard_dir(plan.run_dir, H100S[0]) / rundir.PLAN_FILE).parent.mkdir(parents=True)
    (multi_gpu.shard_dir(plan.run_dir, H100S[0]) / rundir.PLAN_FILE).write_text("[]")
    resumed, fresh = (sent for _, sent in multi_gpu._jobs(options, plan))
    assert resumed.part is None and resumed.options.resume is not None
    assert fresh.part is not None


def test_a_devices_run_starts_its_fork_server_before_it_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """map and sweep --devices start the shards' fork server first (its interpreter's imports,
    ~1 s of CPU, beside the planning); a run on one GPU starts none."""
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    order: list[str] = []
    monkeypatch.setattr(shard_processes, "start_server", lambda: order.append("server"))
    planning_noted(monkeypatch, order)
    monkeypatch.setattr(measure, "dispatch_map_run", stop_here)
    monkeypatch.setattr(measure, "sweep_on_devices", stop_here)
    grid = ["--sizes", "64:256:64"]
    for command, devices in (("map", ["--devices", "all"]), ("sweep", ["--devices", "0,1"])):
        args = [command, *grid, *devices, "--out", str(tmp_path / command)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "stop here" in result.output, result.output
        assert order == ["server", "plan"]
        order.clear()
    alone = CliRunner().invoke(app, ["map", *grid, "--out", str(tmp_path / "one")])
    assert alone.exit_code == 2 and order == ["plan"]


def test_the_fork_server_started_ahead_is_running_at_once() -> None:
    import multiprocessing.forkserver

    shard_processes.start_server()
    server = multiprocessing.forkserver._forkserver
    assert (
        server._forkserver_pid is not None
        and os.waitpid(server._forkserver_pid, os.WNOHANG)[0] == 0
    )
    shard_processes.start_server()  # once: the same server
    assert server._forkserver_pid == multiprocessing.forkserver._forkserver._forkserver_pid


def test_the_merge_order_is_the_plans_statement_made_while_the_shards_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merged table's order (the whole plan's case ids, indexed) is made from plan.json's
    statement while the shards run, not from each case after them; the same ids as the cases';
    each shard's table is read and looked up in it as soon as that shard is done, and the merge
    takes it so."""
    plan = multi_gpu.start(replace(SweepOptions(cases=map_cases()), out=tmp_path), H100S, False)
    assert plan.stated is not None
    made_while_running: list[bool] = []

    read: list[Path] = []  # (each shard's table read as soon as that shard is done)
    ids = [case.case_id for case in map_cases()]

    def read_table(path: Path) -> pd.DataFrame:
        read.append(path)
        return pd.DataFrame({"case_id": [ids[5], ids[2], "not planned"], "row": [0, 1, 2]})

    monkeypatch.setattr(multi_gpu, "read_table", read_table)

    def run_all(
        jobs: object, progress: object, finished: Callable[[int], None]
    ) -> shard_processes.Outcome:
        finished(1)  # (GPU 1's shard done first)
        for _ in range(500):  # (10 s at most)
            if "order" in vars(plan) and plan.read:
                break
            time.sleep(0.02)
        made_while_running.append("_ids" in vars(plan.stated) and "order" in vars(plan))
        assert read == [multi_gpu.shard_dir(plan.run_dir, 1)]
        return shard_processes.Outcome({}, False)

    monkeypatch.setattr(shard_processes, "run_all", run_all)
    multi_gpu.run(SweepOptions(), plan)
    assert made_while_running == [True]
    shard = multi_gpu.shard_dir(plan.run_dir, 1)
    _frame, places = plan.read[shard]
    assert places is not None and places.tolist() == [5, 2, len(ids)]
    monkeypatch.setattr(multi_gpu, "read_tables", lambda paths: [] if not paths else 1 / 0)
    assert multi_gpu.merged_frame(plan, [shard])["row"].tolist() == [1, 0, 2]
    assert plan.case_ids() == [case.case_id for case in map_cases()]
    assert multi_gpu.recorded(plan.run_dir) == plan  # (a resumed run's: from its plan.json)
    resumed = multi_gpu.recorded(plan.run_dir)
    assert resumed is not None and resumed.case_ids() == plan.case_ids()


def _imported(name: str) -> bool:
    """Whether module `name` ran to its end (a module is in sys.modules from its first line: the
    thread importing it may still be running it)."""
    import sys

    return hasattr(sys.modules.get(name), "THREAD")


def test_a_maps_report_imports_are_made_while_it_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the map's report imports only to draw (pyplot) is imported in a thread while the map
    runs (its GPUs at work), not after; an import that fails is left to the report."""
    import sys

    (tmp_path / "drawn_ahead.py").write_text(
        "import threading, time\ntime.sleep(0.2)\nTHREAD = threading.current_thread()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(measure, "REPORT_IMPORTS", ("no_such_module_here", "drawn_ahead"))
    seen: list[bool] = []

    def run(*_args: object) -> object:
        for _ in range(500):  # (10 s at most)
            if _imported("drawn_ahead"):
                break
            time.sleep(0.02)
        seen.append(_imported("drawn_ahead"))
        raise AuditError("stop here")

    monkeypatch.setattr(dispatch_map, "run", run)
    with pytest.raises(AuditError, match="stop here"):
        measure.dispatch_map_run(SweepOptions())
    assert seen == [True]
    assert sys.modules["drawn_ahead"].THREAD is not threading.main_thread()
    monkeypatch.delitem(sys.modules, "drawn_ahead")


def test_each_shard_that_ends_well_is_handed_on_at_once() -> None:
    """The parent hands each shard that ended well to `finished` as its last word comes (the
    merge then reads its table while the others still run); one that failed is not."""
    import queue

    events: queue.Queue[tuple[int, str, object]] = queue.Queue()
    for word in [(1, "done", None), (0, "done", AuditError("no GPU")), (2, "done", None)]:
        events.put(word)

    class Running:
        def is_alive(self) -> bool:
            return True

    ended: dict[int, BaseException | None] = {}
    handed: list[int] = []
    shard_processes._relay(events, [Running()] * 3, [None] * 3, ended, handed.append)
    assert handed == [1, 2] and isinstance(ended[0], AuditError)
