"""The diff gate's decisions that the mutation audit (benchmarks/results/mutation_cpu.json) found
untested: a call that broke is a regression, `--fail-on any` includes the host's share, and the
utilization verdict's noise band is "within", on both sides of it.

Real data only: the two CUPTI-traced reruns of reports/h100/noise/kernel-b (see
tests/test_diff_kernel_time.py) and the recorded H100 batched run against the article's published
H200 table (untimed there, so FMA % decides).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cublas_audit.judge import diff
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.dispatch import write_table
from cublas_audit.table.inputs import Dataset, load_one_gpu
from cublas_audit.table.validation import read_table
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
RUN_00 = ROOT / "reports/h100/noise/kernel-b/run-00"
BATCHED = FIXTURES / "h100-batched-cublas"
CASE = "cublas.fp32.1024x1024x1024.b8.nn"


def _verdict(result: diff.Diff, case_id: str) -> str:
    """The verdict of the classic call of `case_id` (cublas.fp32.MxNxK.bB.nn)."""
    shape, batch = case_id.split(".")[2], int(case_id.split(".")[3][1:])
    m = result.matched
    size = shape.split("x")[0] if len(set(shape.split("x"))) == 1 else shape
    (verdict,) = m.loc[
        (m["api"] == "cublas")
        & (m["shape"] == size)
        & (m["batch"] == batch)
        & (m["routine"] != "sgemm-loop"),
        "verdict",
    ]
    return str(verdict)


def test_a_call_that_went_from_ok_to_error_is_a_regression() -> None:
    run = load_one_gpu(RUN_00)
    # B: the same run with four cases' statuses changed, their times untouched, so every number
    # says "same": only a failing status makes a regression, a missing one is ok.
    statuses = {
        CASE: "error",
        "cublas.fp32.2048x2048x2048.b8.nn": "wrong",
        "cublas.fp32.4096x4096x4096.b8.nn": "skipped",
        "cublas.fp32.256x256x256.b8.nn": None,
    }
    frame = run.frame.copy()
    for case_id, status in statuses.items():
        assert (frame["case_id"] == case_id).sum() == 1
        frame.loc[frame["case_id"] == case_id, "status"] = status
    broke = Dataset(run.title, run.gpu_label, run.path, frame, run.env, None)
    result = diff.compare(run, broke)
    assert [_verdict(result, case_id) for case_id in statuses] == [
        "regression",
        "regression",
        "regression",
        "same",
    ]
    assert len(result.rows("regression")) == 3
    assert result.fails("regression") and result.fails("any")
    assert not result.fails("kernel-change")
    # the converse (failed on A, ok on B) is no regression: the times decide, and they agree
    fixed = diff.compare(broke, run)
    assert _verdict(fixed, CASE) == "same" and not fixed.fails("regression")


def test_fail_on_any_includes_a_slower_call_over_unchanged_kernels() -> None:
    # 1024^3 batch 8 (0.37 ms): the call's time columns 1.5x, its kernels untouched
    run = load_one_gpu(RUN_00)
    frame = run.frame.copy()
    rows = frame["case_id"] == CASE
    times = [c for c in frame.columns if c.startswith("time") and c.endswith("_ms")]
    frame.loc[rows, times] = frame.loc[rows, times].astype(float) * 1.5
    slowed = Dataset(run.title, run.gpu_label, run.path, frame, run.env, None)
    result = diff.compare(run, slowed)
    assert not result.host_slower.empty
    assert not result.has_regression and result.kernel_changes.empty
    assert result.fails("host") and result.fails("any")
    assert not result.fails("regression") and not result.fails("kernel-change")
    # a word that is no gate is refused, not read as `any` (which this diff fails)
    with pytest.raises(ValueError, match="is not a valid Gate"):
        result.fails("regresion")


def _h200(tmp_path: Path) -> Path:
    table = read_table(FIXTURES / "published_article_b8.csv")
    path = tmp_path / "h200.csv"
    write_table(table[table["gpu_label"] == "h200"], path)
    return path


def _by_size(result: diff.Diff) -> dict[int, str]:
    m = result.matched
    return {int(r["m"]): str(r["verdict"]) for _, r in m.iterrows()}


def test_utilization_changes_within_the_band_are_noise_on_both_sides(tmp_path: Path) -> None:
    # FMA % at batch 8, H100 (A, recorded) -> H200 (B, published):
    #   256: 33.3562 -> 33 (-0.3562)   512: 68.663 -> 69 (+0.337)   1024: 78.539 -> 78 (-0.539)
    #   2048: 79.5855 -> 79 (-0.5855)  4096: 81.7574 -> 82 (+0.2426) 8192: 82.1128 -> 82 (-0.1128)
    a, b = load_one_gpu(BATCHED), load_one_gpu(_h200(tmp_path))
    # A drop of exactly the band is within it; one just wider is a regression.
    drop = 79.5855 - 79.0
    at = _by_size(diff.compare(a, b, Thresholds(diff_util_noise_pts=drop)))
    assert at[2048] == "same"
    below = _by_size(diff.compare(a, b, Thresholds(diff_util_noise_pts=math.nextafter(drop, 0))))
    assert below[2048] == "regression" and below[1024] == "same"
    # The same for a rise: 82 - 81.7574 at 4096.
    rise = 82.0 - 81.7574
    assert _by_size(diff.compare(a, b, Thresholds(diff_util_noise_pts=rise)))[4096] == "same"
    wider = _by_size(diff.compare(a, b, Thresholds(diff_util_noise_pts=math.nextafter(rise, 0))))
    assert wider[4096] == "improvement" and wider[512] == "improvement"
    assert wider[256] == "regression"  # -0.3562: beyond 0.2426
