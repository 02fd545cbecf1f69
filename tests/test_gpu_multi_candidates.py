"""`candidates --devices all` on the real GPUs of this host: each problem audited on one of them by
a probe pinned to it, merged into one candidates.csv; then the audit cut short after its first
problem (as Ctrl-C leaves it) and resumed: the journaled problem is kept as it was measured, only
the other one is audited again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cublas_audit import candidates, multi_gpu, rundir
from cublas_audit.environment import list_gpus

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
    frame = candidates.read_candidates(out)
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
        in candidates.read_journal(s / rundir.CANDIDATE_RESULTS)
    )
    journal = shard / rundir.CANDIDATE_RESULTS
    kept = [line for line in journal.read_text().splitlines() if "256x256x256" in line]
    journal.write_text(kept[0] + "\n")
    for stale in (shard / rundir.CANDIDATES_FILE, out / rundir.CANDIDATES_FILE):
        stale.unlink()
    before = frame[frame["case_id"] == "cublasLt.fp32.256x256x256.b8.nn"].reset_index(drop=True)

    again = audit("--resume", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = candidates.read_candidates(out)
    assert set(resumed["case_id"]) == PROBLEMS
    kept_rows = resumed[resumed["case_id"] == "cublasLt.fp32.256x256x256.b8.nn"]
    assert kept_rows["time_ms"].tolist() == before["time_ms"].tolist()  # not measured again
    assert journal.read_text().splitlines()[0] == kept[0]
