"""End to end on a real GPU: cuBLAS under ncu, out-of-memory cases, Ctrl-C and --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cublas_audit.table import dispatch
from cublas_audit.table.validation import read_table

from .conftest import REPO

pytestmark = pytest.mark.gpu


def sweep(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cublas_audit", "sweep", "--gpu-label", "test", *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def test_tiny_sweep_profiles_every_call(tmp_path: Path) -> None:
    done = sweep(
        "--sizes", "256,1024", "--batches", "8", "--modes", "fp32,tf32", "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    frame = dispatch.main_launches(read_table(tmp_path))
    classic = frame[frame["api"] == "cublas"]
    profiled = classic[classic["routine"] != "sgemm-loop"]
    assert (profiled["status"] == "ok").all()
    assert profiled["kernel"].notna().all()
    assert (profiled["fma_pct"] > 0).any()
    assert (classic["time_ms"] > 0).all()
    assert (classic["max_rel_err"] < 1e-2).all()
    assert "batch 8" in done.stdout


def test_out_of_memory_case_is_skipped_and_the_sweep_goes_on(tmp_path: Path) -> None:
    done = sweep(
        "--sizes",
        "256",
        "--shapes",
        "200000x200000x8",
        "--single",
        "--api",
        "cublas",
        "--out",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    frame = dispatch.main_launches(read_table(tmp_path)).set_index("m")
    assert frame.loc[200000, "status"] == "skipped"
    assert "out of memory" in str(frame.loc[200000, "status_detail"])
    assert frame.loc[256, "status"] == "ok"


def test_interrupted_sweep_keeps_finished_cases_and_resumes(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "cublas_audit",
        "sweep",
        "--gpu-label",
        "test",
        "--api",
        "cublas",
        "--sizes",
        "1024,2048,4096",
        "--batches",
        "8,16",
        "--no-reference",
        "--out",
        str(tmp_path),
    ]
    child = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    timing = tmp_path / "timing.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and '"done"' not in (
        timing.read_text() if timing.exists() else ""
    ):
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert "finish with: cublas-audit sweep --resume" in err
    partial = read_table(tmp_path)
    assert (partial["status"] == "ok").sum() >= 1
    assert (partial["status"] == "not-run").any()
    done = sweep("--resume", str(tmp_path))
    assert done.returncode == 0, done.stderr
    final = read_table(tmp_path)
    assert (final["status"] == "ok").all()
    assert json.loads((tmp_path / "env.json").read_text())["gpu_label"] == "test"
