"""`cublas-audit map` on the real GPU: one probe process, CUPTI kernel names and times for every
case, the quick check, the report and its pictures; and the map pass's two times agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cublas_audit.table import rundir
from cublas_audit.table.inputs import load_one_gpu

pytestmark = pytest.mark.gpu


def test_a_small_map_traces_every_case(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    pytest.importorskip("cupti")
    out = tmp_path / "map"
    argv = [sys.executable, "-m", "cublas_audit", "map", "--sizes", "64:512:64"]
    argv += ["--batches", "1,4", "--modes", "fp32,bf16", "--gpu-label", "gpu", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    frame = load_one_gpu(out).frame
    assert len(frame) == 32 and frame["status"].eq("ok").all()
    assert frame["traced_kernels"].notna().all()
    assert (frame["time_n"] == 5).all() and (frame["kernel_time_n"] == 5).all()
    # a kernel never lasts longer than the call that launched it
    assert (frame["kernel_time_min_ms"] <= frame["time_max_ms"]).all()
    # within each storage's rounding: FP32 ~1e-7, BF16 ~1e-3 (device.operands' tolerances)
    tolerance = frame["mode"].map({"fp32": 1e-5, "bf16": 1e-2})
    assert frame["max_rel_err"].lt(tolerance).all()
    assert (out / rundir.REPORT_FILE).read_text().startswith("# Dispatch map")
    assert list((out / rundir.PLOTS_DIR).glob("*size-axis.png"))
    records = rundir.read_results(out / rundir.TIME_RESULTS).values()
    assert all(r["phase"] == "map" and r["case_s"] > 0 for r in records)
    # the probe's start-up and engine stayed light: no cupyx (and SciPy with it), no pandas
    engine = [r for r in rundir.records(out / rundir.TIME_RESULTS) if r.get("event") == "engine"]
    assert engine and all(r["heavy_modules"] == [] for r in engine)
