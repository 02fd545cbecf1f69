"""Shape fixes (judge.fixes: pad from unaligned-operand, layout from layout-penalty) on the H100's
bf16 1024x1024x140 batch 8 runs, and the fix.json they make: its stamp, read back whole.

reports/h100/checks/20261125-092057-k140-layouts measured the nn call through cuBLAS and
cuBLASLt (0.020832 ms on tensorop_s16816gemm_256x128_64x3), the same problem padded to K = 144
and in layout nt: both APIs' findings name the same problem and the same change, one fix each.
reports/h100/checks/20261125-074637-k140 measured cuBLAS alone, with and without ldb 144.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.jobs.fix import collect
from cublas_audit.judge.audited import audit_dataset
from cublas_audit.judge.fixes import FIXED_BY_SHAPE, fix_set, shape_fixes, stamp_of
from cublas_audit.judge.grouping import members
from cublas_audit.table.fix_file import FixSet, read_fix_file, write_fix_file
from cublas_audit.table.inputs import load_run
from tests.conftest import REPORTS

LAYOUTS = REPORTS / "h100/checks/20261125-092057-k140-layouts"
K140 = REPORTS / "h100/checks/20261125-074637-k140"


@pytest.fixture(scope="module")
def both_apis() -> FixSet:
    return collect([LAYOUTS])


def test_one_fix_per_problem_and_change_the_cublaslt_calls(both_apis: FixSet) -> None:
    """Both APIs' findings make one pad and one layout fix, measured on the cuBLASLt call
    (what verify rebuilds), never whichever came last."""
    assert [(f.id, f.kind) for f in both_apis.fixes] == [
        ("bf16.1024x1024x140.b8.nn.pad", "pad"),
        ("bf16.1024x1024x140.b8.nn.layout", "layout"),
    ]
    assert {f.source["case_id"] for f in both_apis.fixes} == {"cublasLt.bf16.1024x1024x140.b8.nn"}
    pad, layout = both_apis.fixes
    assert (pad.source["rule"], layout.source["rule"]) == ("unaligned-operand", "layout-penalty")
    assert (pad.instead and pad.instead.k, layout.instead and layout.instead.layout) == (144, "nt")
    assert pad.change == "pad to 1024x1024x144 with zeros and take the 1024x1024 slice"
    assert pad.timing == "kernel" and pad.default.ms == 0.020832


def test_shape_fixes_whatever_order_the_findings_come_in() -> None:
    audited = audit_dataset(load_run(LAYOUTS))
    calls = [m for f in audited.findings for m in members(f)]
    assert (
        sorted(f.api for f in calls if f.rule in FIXED_BY_SHAPE)
        == ["cublas"] * 2 + ["cublasLt"] * 2
    )
    for findings in (audited.findings, audited.findings[::-1]):
        fixes = shape_fixes(audited.rows, findings, {}, "run")
        assert sorted(f.id for f in fixes) == [
            "bf16.1024x1024x140.b8.nn.layout",
            "bf16.1024x1024x140.b8.nn.pad",
        ]
        assert {f.source["case_id"] for f in fixes} == {"cublasLt.bf16.1024x1024x140.b8.nn"}


def test_a_run_of_one_api_keeps_its_own_fixes() -> None:
    fixes = collect([K140])
    assert [f.id for f in fixes.fixes] == [
        "bf16.1024x1024x140.b8.nn.pad",
        "bf16.1024x1024x140.b8.nn.ldb144.pad",
    ]
    assert {f.source["case_id"].split(".")[0] for f in fixes.fixes} == {"cublas"}


def test_fix_set_refuses_an_id_made_twice_by_one_run(both_apis: FixSet) -> None:
    pad, layout = both_apis.fixes
    twice = [layout, pad, replace(pad, verdict="other")]  # the repeated one named, not the first
    with pytest.raises(ValueError, match=r"fix id 'bf16\.1024x1024x140\.b8\.nn\.pad' made twice"):
        fix_set([(both_apis.stamp, twice, "run")])
    # the same problem from two runs: the later run's fix
    later = replace(pad, verdict="later")
    merged = fix_set([(both_apis.stamp, [pad], "a"), (both_apis.stamp, [later], "b")])
    assert merged.fixes == (later,) and merged.sources == ("a", "b")


def test_the_stamp_without_env_json(tmp_path: Path, both_apis: FixSet) -> None:
    """A run directory without env.json: the machine from its table's columns."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("dispatch.csv", "plan.json"):
        shutil.copy(LAYOUTS / name, run / name)
    recorded = json.loads((LAYOUTS / "env.json").read_text())
    fixes = collect([run])
    assert replace(fixes.stamp, gpu_label="") == replace(both_apis.stamp, gpu_label="")
    assert (fixes.stamp.gpu_name, fixes.stamp.cublas_version) == (
        recorded["gpu_name"],
        recorded["cublas_version"],
    )
    assert [f.id for f in fixes.fixes] == [f.id for f in both_apis.fixes]
    # nothing recorded anywhere: said as unknown, never guessed
    assert stamp_of({}).words() == "unknown (cc unknown), cuBLAS unknown, driver unknown"


def test_pad_and_layout_fixes_read_back_whole(tmp_path: Path, both_apis: FixSet) -> None:
    written = write_fix_file(both_apis, tmp_path / "fix.json")
    assert read_fix_file(written) == both_apis


def test_a_confirmation_time_of_zero_is_refused_on_reading(
    tmp_path: Path, both_apis: FixSet
) -> None:
    """to_json divides by confirm_ms: a 0 there is refused when the file is read, in one line."""
    data = json.loads(write_fix_file(both_apis, tmp_path / "fix.json").read_text())
    for side in ("default", "fixed"):
        broken = json.loads(json.dumps(data))
        broken["fixes"][1][side]["confirm_ms"] = 0
        path = tmp_path / f"{side}.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(AuditError) as refused:
            read_fix_file(path)
        message = str(refused.value)
        assert message.endswith(f"fixes[1].{side}.confirm_ms 0 is not a positive time")
        assert "\n" not in message and refused.value.exit_code == 2
