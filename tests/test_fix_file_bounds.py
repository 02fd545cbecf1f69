"""table/fix_file.py pinned at its boundaries: a recorded fix.json read back and written again
unchanged, the problem <-> case round trip of every layout, broadcast and batch form, and each
check of a hand-edited file at and either side of its limits (issue 39 item 6). Pure calls on
one recorded file (reports/h100/fixes/20261125-092546, 23 pins) and the fixes of
tests/fix_examples.py; no GPU, no run."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import MAX_DIMENSION, Case
from cublas_audit.table import fix_file
from cublas_audit.table.fix_file import Fix, FixSet, Problem, Timed, from_json, to_json
from cublas_audit.vocabulary import FixKind
from tests import fix_examples
from tests.conftest import REPORTS

RECORDED = REPORTS / "h100" / "fixes" / "20261125-092546" / "fix.json"
NO_FIXES = REPORTS / "h100" / "traces" / "20261125-093616-block-v2" / "fix.json"
DATA: dict[str, Any] = json.loads(RECORDED.read_text())


def edited(**changes: Any) -> dict[str, Any]:
    """The recorded file with its first fix's fields changed ('problem.m': 0 sets a nested one)."""
    data = copy.deepcopy(DATA)
    data["fixes"] = data["fixes"][:1]
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        target = data["fixes"][0]
        for part in path:
            target = target[part]
        target[last] = value
    return data


def fault(data: Any) -> str:
    with pytest.raises(ValueError) as caught:
        from_json(data)
    return str(caught.value)


def test_a_recorded_fix_file_reads_back_and_writes_the_same_json(tmp_path: Path) -> None:
    fixes = fix_file.read_fix_file(RECORDED)
    assert len(fixes.fixes) == 23 and len(fixes.pins()) == 23
    assert fixes.workspace_bytes == 8_258_871  # the largest pin's workspace
    first = fixes.fixes[0]
    # 0.006528 / 0.003296 = 1.98058; confirmed 0.006496 / 0.00352 = 1.84545: the claim
    assert (round(first.speedup, 4), round(first.confirm_speedup or 0, 4)) == (1.9806, 1.8455)
    assert first.claimed == first.confirm_speedup
    # written before `claimed` was: every other key, each ratio to 4 decimals, is the same
    expected = copy.deepcopy(DATA)
    for fix in expected["fixes"]:
        fix["claimed"] = fix["confirm_speedup"]
    assert to_json(fixes) == expected
    out = fix_file.write_fix_file(fixes, tmp_path / "fix.json")
    assert out.read_text() == json.dumps(expected, indent=2) + "\n"
    empty = fix_file.read_fix_file(NO_FIXES)
    assert empty.fixes == () and to_json(empty)["workspace_bytes"] == 0


def test_claimed_is_the_confirmation_round_where_both_sides_had_one() -> None:
    made = fix_examples.pad_fix()  # kernel times: no confirmation round
    assert made.default.confirm_ms is None and made.confirm_speedup is None
    assert made.claimed == made.speedup == made.default.ms / made.fixed.ms
    one = dataclasses.replace(made, default=Timed("k", 2.0, 1.0), fixed=Timed("k", 1.0))
    assert one.confirm_speedup is None and one.claimed == 2.0
    other = dataclasses.replace(made, default=Timed("k", 2.0), fixed=Timed("k", 1.0, 0.5))
    assert other.confirm_speedup is None and other.claimed == 2.0
    both = dataclasses.replace(made, default=Timed("k", 3.0, 1.5), fixed=Timed("k", 1.0, 0.5))
    assert both.speedup == 3.0 and both.confirm_speedup == both.claimed == 3.0
    assert to_json(FixSet(fix_examples.stamp(), (both,)))["fixes"][0]["claimed"] == 3.0
    ratio = to_json(FixSet(fix_examples.stamp(), (one,)))["fixes"][0]
    assert ratio["speedup"] == 2.0 and ratio["confirm_speedup"] is None


def test_the_example_set_round_trips_with_its_pad_fix() -> None:
    made = fix_examples.fix_set()
    back = from_json(json.loads(json.dumps(to_json(made))))
    assert back == made
    assert [f.id for f in back.pins()] == ["pin-1856", "pin-2112"]
    assert back.fixes[2].instead is not None and back.fixes[2].pin is None


def test_problem_defaults_are_one_packed_nn_call() -> None:
    assert dataclasses.asdict(Problem("fp32", 2, 3, 4)) == {
        "mode": "fp32", "m": 2, "n": 3, "k": 4, "batch": 1, "transa": "n", "transb": "n",
        "lda": 0, "ldb": 0, "ldc": 0, "stride_a": 0, "stride_b": 0, "stride_c": 0,
        "beta": 0.0, "bias": False, "strided": False, "layout_known": True,
    }  # fmt: skip
    assert Problem.of_case(Case("cublasLt", "fp32", 2, 3, 4, 1)).layout_known is True


@pytest.mark.parametrize(
    "case",
    [
        Case("cublasLt", "fp32", 64, 32, 16, 1),
        Case("cublasLt", "fp32", 64, 32, 16, 1, transa="t"),  # lda = k packed
        Case("cublasLt", "bf16", 64, 32, 16, 1, transb="t"),  # ldb = n packed
        Case("cublasLt", "fp32", 64, 32, 16, 1, lda=80, ldb=24),  # padded
        Case("cublasLt", "fp32", 64, 32, 16, 1, transa="t", transb="t", lda=24, ldb=40),
        Case("cublasLt", "fp32", 64, 32, 16, 2),
        Case("cublasLt", "fp32", 64, 32, 16, 2, broadcast="a"),
        Case("cublasLt", "fp32", 64, 32, 16, 2, transa="t", broadcast="b"),
        Case("cublasLt", "fp32", 64, 32, 16, 1, strided=True, beta=1.0, bias=True),
    ],
)
def test_a_problem_runs_the_case_it_came_from(case: Case) -> None:
    problem = Problem.of_case(case)
    assert problem.case() == case  # broadcast, packed lda / ldb as 0, workspace -1 (default)
    assert problem.case(workspace_mib=8).workspace_mib == 8
    back = from_json(edited(problem=dataclasses.asdict(problem), pin=None, kind="pad",
                            instead=dataclasses.asdict(problem)))  # fmt: skip
    assert back.fixes[0].problem == problem


def test_only_a_batched_call_has_strides() -> None:
    single = Problem.of_case(Case("cublasLt", "fp32", 64, 32, 16, 1))
    assert (single.stride_a, single.stride_b, single.stride_c) == (0, 0, 0)
    # batch 2: a 64x16 A, a 16x32 B, a 64x32 C apart; a broadcast A shared (stride 0)
    two = Problem.of_case(Case("cublasLt", "fp32", 64, 32, 16, 2, broadcast="a"))
    assert (two.stride_a, two.stride_b, two.stride_c) == (0, 512, 2048)


def test_problem_names() -> None:
    base = Problem.of_case(Case("cublasLt", "bf16", 5952, 832, 5952, 1))
    assert base.name == "bf16 5952x832x5952 nn" and not base.batched
    assert base.layout == "nn"
    strided = Problem.of_case(Case("cublasLt", "fp32", 8, 8, 8, 1, transa="t", strided=True))
    assert strided.name == "fp32 8x8x8 tn batch 1" and strided.batched
    two = Problem.of_case(Case("cublasLt", "fp32", 8, 8, 8, 2, beta=0.5, bias=True))
    assert two.name == "fp32 8x8x8 nn batch 2 bias beta 0.5" and two.batched


def test_the_file_must_be_this_schema_and_version() -> None:
    assert fault([]) == f"'schema' is not {fix_file.SCHEMA!r}"
    assert fault({**DATA, "schema": "other"}) == "'schema' is not 'cublas-audit-fix'"
    assert fault({**DATA, "schema_version": 2}).startswith("schema_version 2 is not 1,")
    assert fault({"schema": "cublas-audit-fix", "schema_version": 1}) == (
        "the file: missing field 'stamp'"
    )


def test_a_fix_id_may_appear_once() -> None:
    data = copy.deepcopy(DATA)
    data["fixes"] = [data["fixes"][0], data["fixes"][1], data["fixes"][0]]
    assert fault(data) == "fix id 'fp32.192x256x64.b1.nn' appears twice"
    assert from_json({**data, "fixes": data["fixes"][:2]}).fixes[1].id == data["fixes"][1]["id"]


def test_each_fix_entry_is_checked() -> None:
    assert fault({**DATA, "fixes": [1]}) == "fixes[0] is not an object"
    assert fault(edited(kind="bogus")) == "fixes[0].kind 'bogus' is not one of pin, pad, layout"
    assert fault(edited(pin=None)) == "fixes[0]: a pin fix without its 'pin'"
    assert fault(edited(kind="pad")) == ("fixes[0]: a pad fix without the problem to run 'instead'")
    assert fault(edited(timing="wall")) == "fixes[0].timing 'wall' is not one of kernel, call"
    assert from_json(edited(timing="call")).fixes[0].timing == "call"
    got = from_json(edited(source=None, torch=None)).fixes[0]
    assert got.source == {} and got.torch is None


def test_split_k_up_to_the_problems_k() -> None:
    # the recorded first fix: k = 64; split-K -1 and 0 are cuBLASLt's "no split"
    for split_k in (-1, 0, 64):
        assert from_json(edited(**{"pin.split_k": split_k})).fixes[0].pin.split_k == split_k  # type: ignore[union-attr]
    assert fault(edited(**{"pin.split_k": 65})).startswith(
        "fixes[0].pin.split_k 65 is not in -1..64"
    )
    assert fault(edited(**{"pin.split_k": -2})).startswith("fixes[0].pin.split_k -2 is not in")


@pytest.mark.parametrize(
    ("name", "high"),
    [("algo_id", 2**31 - 1), ("cta_swizzling", 2**32 - 1), ("inner_shape", 2**16 - 1)],
)
def test_pin_numbers_within_their_limits(name: str, high: int) -> None:
    for value in (0, high):
        assert getattr(from_json(edited(**{f"pin.{name}": value})).fixes[0].pin, name) == value
    for value in (-1, high + 1):
        assert fault(edited(**{f"pin.{name}": value})) == (
            f"fixes[0].pin.{name} {value} is not in 0..{high}"
        )


def test_problem_sizes_from_one_to_max_dimension() -> None:
    where = "fixes[0].problem"
    assert fault(edited(**{"problem.m": 0})) == f"{where}.m 0 is not in 1..{MAX_DIMENSION}"
    assert fault(edited(**{"problem.batch": 0})) == f"{where}.batch 0 is not in 1..{MAX_DIMENSION}"
    too_many = MAX_DIMENSION + 1
    assert fault(edited(**{"problem.n": too_many})).startswith(f"{where}.n {too_many} is not in")
    # exactly 1 and exactly MAX_DIMENSION pass the range (m = 1: the pin's k 64 and split-K 1 hold)
    for m in (1, MAX_DIMENSION):
        problem = dataclasses.asdict(Problem.of_case(Case("cublasLt", "fp32", m, 256, 64, 1)))
        assert from_json(edited(problem=problem)).fixes[0].problem.m == m


def test_problem_mode_layout_and_strides_are_checked() -> None:
    where = "fixes[0].problem"
    assert fault(edited(**{"problem.mode": "fp8"})).startswith(f"{where}.mode 'fp8' is not one of")
    for side in ("transa", "transb"):
        assert fault(edited(**{f"problem.{side}": "x"})) == (
            f"{where}: transa / transb must be 'n' or 't'"
        )
    assert fault(edited(**{"problem.stride_a": 5, "problem.ldc": 200})) == (
        f"{where}: ldc, stride_a do not describe one cuBLAS call (expected 192, 0)"
    )
    assert fault(edited(**{"problem.lda": 10})).startswith(f"{where}: ")  # Case: lda < m


def test_torch_op_batch_and_share() -> None:
    op: dict[str, Any] = {"op": "aten::mm", "shape": "2048x5632x2048", "batch": 1, "share": 0.0}
    assert from_json(edited(torch=op)).fixes[0].torch == fix_file.TorchOp(
        "aten::mm", "2048x5632x2048", 1, 0.0
    )
    assert from_json(edited(torch={**op, "share": 1})).fixes[0].torch.share == 1  # type: ignore[union-attr]
    assert fault(edited(torch={**op, "batch": 0})) == (
        "fixes[0].torch.batch 0 is not a batch count"
    )
    for share in (-0.01, 1.01, 1.5):
        assert fault(edited(torch={**op, "share": share})) == (
            f"fixes[0].torch.share {share} is not in 0..1 (a share of GEMM time)"
        )


def test_times_are_positive_and_finite() -> None:
    assert from_json(edited(**{"default.confirm_ms": None})).fixes[0].default.confirm_ms is None
    assert from_json(edited(**{"fixed.ms": 0.5})).fixes[0].fixed.ms == 0.5
    for value in (0, -1.0, float("inf")):
        assert fault(edited(**{"fixed.ms": value})) == (
            f"fixes[0].fixed.ms {value!r} is not a positive time"
        )
    assert fault(edited(**{"default.confirm_ms": 0.0})) == (
        "fixes[0].default.confirm_ms 0.0 is not a positive time"
    )


def test_a_broken_file_is_one_audit_error(tmp_path: Path) -> None:
    path = tmp_path / "fix.json"
    with pytest.raises(AuditError, match="cannot read"):
        fix_file.read_fix_file(path)
    path.write_text('{"schema": NaN}')
    with pytest.raises(AuditError, match="NaN is not a number JSON allows"):
        fix_file.read_fix_file(path)
    path.write_text(json.dumps(edited(**{"problem.m": 0})))
    with pytest.raises(AuditError, match=r"not a valid fix file: fixes\[0\]\.problem\.m 0"):
        fix_file.read_fix_file(path)


def test_fix_kind_is_a_member_and_unknown_words_fail() -> None:
    made = fix_examples.pad_fix()
    assert dataclasses.replace(made, kind="layout").kind is FixKind.layout  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Fix(**{**{f.name: getattr(made, f.name) for f in dataclasses.fields(made)}, "kind": "x"})
