"""The diff on tables with kernel-only times (schema 3): the kernels' time decides, the call's
time is reported apart, each against its own floor of the shipped noise model.

Real data: two CUPTI-traced reruns of the default batched grid from one start of the H100
(reports/h100/noise/kernel-b). In run-04 the host was disturbed: cublasSgemmStridedBatched 256^3
batch 16 took 0.066368 ms per call against 0.034608 in run-00 (+91.8 %), while its kernel took
0.017248 against 0.017409 ms (-0.9 %).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.judge import diff
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.table.inputs import Dataset, load_one_gpu

ROOT = Path(__file__).resolve().parents[1]
RUN_00 = ROOT / "reports/h100/noise/kernel-b/run-00"
RUN_04 = ROOT / "reports/h100/noise/kernel-b/run-04"


def row(result: diff.Diff, routine: str, shape: str, batch: int) -> dict[str, object]:
    m = result.matched
    found = m[(m["routine"] == routine) & (m["shape"] == shape) & (m["batch"] == batch)]
    assert len(found) == 1
    return found.iloc[0].to_dict()


def test_a_host_disturbed_rerun_is_neither_a_regression_nor_host_slower() -> None:
    result = diff.compare(load_one_gpu(RUN_00), load_one_gpu(RUN_04))
    assert result.rows("regression").empty and result.rows("improvement").empty
    case = row(result, "cublasSgemmStridedBatched", "256", 16)
    assert case["time_delta_pct"] == pytest.approx((0.066368 / 0.034608 - 1) * 100)
    # kernels unchanged; the call's time at 0.03 ms per launch is host-bound (its fitted floor
    # is over noise.HOST_BOUND_FLOOR), so between runs it can only be unsure
    assert (case["kernel_verdict"], case["call_verdict"], case["verdict"]) == (
        "same",
        "unsure",
        "same",
    )
    assert str(case["evidence"]).startswith("kernels -0.9 % (")
    assert "call +91.8 % (between runs, this time says nothing at this scale)" in str(
        case["evidence"]
    )
    assert result.host_slower.empty and not result.fails("any")


def with_slowdown(run: Dataset, case_id: str, factor: float, prefix: str) -> Dataset:
    """The run with one case's `<prefix>*_ms` columns (median, quartiles, min, max) scaled:
    `time` for the call's time, `kernel_time` for its kernels'."""
    frame = run.frame.copy()
    rows = frame["case_id"] == case_id
    columns = [c for c in frame.columns if c.startswith(prefix) and c.endswith("_ms")]
    frame.loc[rows, columns] = frame.loc[rows, columns].astype(float) * factor
    return Dataset(run.title, run.gpu_label, run.path, frame, run.env, None)


def test_a_slower_call_over_unchanged_kernels_is_the_host(tmp_path: Path) -> None:
    # 1024^3 batch 8 (0.37 ms): the call 50 % slower, its kernels untouched
    run = load_one_gpu(RUN_00)
    slowed = with_slowdown(run, "cublas.fp32.1024x1024x1024.b8.nn", 1.5, "time")
    result = diff.compare(run, slowed)
    assert result.rows("regression").empty
    (host,) = result.host_slower.to_dict("records")
    assert (host["shape"], host["batch"], host["kernel_verdict"]) == ("1024", 8, "same")
    assert result.fails("host") and not result.fails("regression")
    table = tmp_path / "slowed.csv"
    slowed.frame.to_csv(table, index=False)
    runner = CliRunner()
    args = ["diff", str(RUN_00 / "dispatch.csv"), str(table), "--fail-on"]
    assert runner.invoke(app, [*args, "regression"]).exit_code == 0
    gated = runner.invoke(app, [*args, "host"])
    assert gated.exit_code == 1
    text = gated.output  # the Markdown diff, printed before the gate's exit 1
    assert "## Call slower, kernels not" in text
    assert "kernels: smallest slowdown caught" in text and "host-bound" in text


def test_a_slower_dispatch_is_a_regression_even_when_the_call_time_hides_it() -> None:
    # 4096^3 batch 8 (20.6 ms): the kernels 8 % slower, the call's time untouched. The call's
    # floor there (8.2 %) would call +8 % noise; the kernels' floor (2.8 %) does not.
    run = load_one_gpu(RUN_00)
    slowed = with_slowdown(run, "cublas.fp32.4096x4096x4096.b8.nn", 1.08, "kernel_time")
    result = diff.compare(run, slowed)
    (regression,) = result.rows("regression").to_dict("records")
    assert (regression["shape"], regression["batch"]) == ("4096", 8)
    assert regression["kernel_verdict"] == "regression" and regression["call_verdict"] == "same"


def test_noise_model_reads_both_file_forms_and_falls_back_to_the_bounding_kind() -> None:
    first = NoiseModel.from_json({"edges_ms": [1.0, None], "floors": [0.3, 0.05]})
    assert first.floor(0.5, "kernel") == 0.3 and first.floor(5.0, "kernel_ratio") == 0.05
    shipped = json.loads((ROOT / "cublas_audit/data/noise_h100.json").read_text())
    model = NoiseModel.from_json(shipped)
    assert NoiseModel.from_json(model.to_json()) == model
    for t in (0.02, 0.2, 2.0, 20.0, 200.0):
        # kernels are steadier than calls, and a ratio measured interleaved steadier still
        assert model.floor(t, "kernel") <= model.floor(t, "call")
        assert model.floor(t, "kernel_ratio") <= model.floor(t, "kernel") + 1e-9
    with pytest.raises(ValueError):
        NoiseModel.from_json({"edges_ms": [None], "floors": {"kernel": [0.1]}})
    assert math.isinf(model.edges_ms[-1])
