"""`candidates --devices all` on the real GPUs of this host: each problem audited on one of them by
a probe pinned to it, merged into one candidates.csv; then the audit cut short after its first
problem (as Ctrl-C leaves it) and resumed: the journaled problem is kept as it was measured, only
the other one is audited again."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cublas_audit.observe import environment
from cublas_audit.observe.environment import Gpu, list_gpus
from cublas_audit.planning.cases import candidate_problems
from cublas_audit.run import multi_gpu, shard_processes
from cublas_audit.table import candidates_table, rundir

pytestmark = pytest.mark.gpu
PROBLEMS = {"cublasLt.fp32.256x256x256.b8.nn", "cublasLt.fp32.512x512x512.b8.nn"}


def audit(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cublas_audit", "candidates", *args, "--format", "json"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_candidates_on_every_gpu_then_resumed_from_the_journal(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    pytest.importorskip("nvmath")
    out = tmp_path / "run"
    grid = ["--batched", "--sizes", "256,512", "--batches", "8", "--limit", "8"]
    done = audit(*grid, "--devices", "all", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout)
    frame = candidates_table.read_candidates(out)
    assert set(frame["case_id"]) == PROBLEMS and len(printed["candidates"]) == len(frame)
    defaults = frame[frame["is_default"] == 1]
    assert sorted(defaults["case_id"]) == sorted(PROBLEMS) and defaults["status"].eq("ok").all()
    used = {p.name for p in (out / multi_gpu.SHARDS_DIR).iterdir()}
    assert used == {f"gpu{gpu.index}" for gpu in list_gpus()[: len(PROBLEMS)]}

    # cut short: the shard holding the 256 problem journaled it, and nothing after it
    shard = next(
        s
        for s in (out / multi_gpu.SHARDS_DIR).iterdir()
        if "cublasLt.fp32.256x256x256.b8.nn"
        in candidates_table.read_journal(s / rundir.CANDIDATE_RESULTS)
    )
    journal = shard / rundir.CANDIDATE_RESULTS
    kept = [line for line in journal.read_text().splitlines() if "256x256x256" in line]
    journal.write_text(kept[0] + "\n")
    for stale in (shard / rundir.CANDIDATES_FILE, out / rundir.CANDIDATES_FILE):
        stale.unlink()
    before = frame[frame["case_id"] == "cublasLt.fp32.256x256x256.b8.nn"].reset_index(drop=True)

    again = audit("--resume", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = candidates_table.read_candidates(out)
    assert set(resumed["case_id"]) == PROBLEMS
    kept_rows = resumed[resumed["case_id"] == "cublasLt.fp32.256x256x256.b8.nn"]
    assert kept_rows["time_ms"].tolist() == before["time_ms"].tolist()  # not measured again
    assert journal.read_text().splitlines()[0] == kept[0]


def as_twins(index: int) -> None:
    """In a shard's process: environment.collect finds GPU `index` (what nvidia-smi says of it)
    under whichever name the shard gives it."""
    found = environment.collect(None, index)
    environment.collect = lambda ncu=None, device=None: replace(found, device_index=device)


def test_two_shards_of_one_gpu_audit_at_once_and_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two shards at the same time on the same GPU (two names for it, as the issue's single-GPU
    stand-in for a node): both real probes pinned to it by UUID, each problem audited once, one
    merged table in plan order that says which shard measured each row."""
    pytest.importorskip("cupy")
    pytest.importorskip("nvmath")
    from cublas_audit.planning.grid import plan_from_options
    from cublas_audit.run.sweep_options import SweepOptions

    gpu = list_gpus()[0]
    twins = [gpu, Gpu(gpu.index + 100, gpu.uuid, gpu.name)]  # one device, two shard names
    # each shard's process (spawned: it sees no patch of this one) finds that GPU under either name
    setup = functools.partial(as_twins, gpu.index)
    monkeypatch.setattr(shard_processes, "CHILD_SETUP", setup)
    cases = plan_from_options(False, True, "256,512", "", "4,8", "fp32", "cublasLt", None)
    options = SweepOptions(
        cases=candidate_problems(cases),
        out=tmp_path / "run",
        candidate_limit=8,
        phase="candidates",
        command=["test: two shards of one GPU"],
    )
    plan = multi_gpu.start(options, twins, replicate=False)
    shards = multi_gpu.run(options, plan)
    frame = multi_gpu.merged_candidates(plan, shards)
    order = [c.case_id for c in candidate_problems(cases)]
    assert list(dict.fromkeys(frame["case_id"])) == order and len(order) == 4
    per_shard = frame.groupby("case_id")["device_index"].nunique()
    assert per_shard.eq(1).all()  # each problem measured by one shard
    assert set(frame["device_index"]) == {twin.index for twin in twins}
    assert frame["gpu_uuid"].eq(gpu.uuid).all()
    assert frame[frame["is_default"] == 1]["status"].eq("ok").all()
