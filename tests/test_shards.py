"""`--shard I/N`: a plan's parts, on the plans of real recorded runs (the H100's FP32 map of 64 to
4096, its batched sweep). Every case in exactly one part, parts in plan order and balanced by
estimated work, the same split for the same plan, a fingerprint that tells plans apart, and the
option refused before the GPU."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import Case
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.planning.shards import PlanPart, ShardSpec, fingerprint, shard, work
from cublas_audit.run import multi_gpu

REPORTS = Path(__file__).resolve().parents[1] / "reports/h100"
MAP_PLAN = REPORTS / "maps/20261123-235543-fp32-64-4096/plan.json"
SWEEP_PLAN = REPORTS / "20261123-145452-batched/plan.json"


@cache
def plan(path: Path) -> tuple[Case, ...]:
    return tuple(read_plan(path))


@pytest.mark.parametrize("path", [MAP_PLAN, SWEEP_PLAN])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_every_case_is_in_exactly_one_part_in_plan_order(path: Path, count: int) -> None:
    cases = plan(path)
    parts = [ShardSpec(i, count).cases(cases) for i in range(1, count + 1)]
    ids = [c.case_id for part in parts for c in part]
    assert sorted(ids) == sorted(c.case_id for c in cases) and len(set(ids)) == len(cases)
    order = {c.case_id: i for i, c in enumerate(cases)}
    for part in parts:
        assert part, "no part is empty"
        positions = [order[c.case_id] for c in part]
        assert positions == sorted(positions)


def test_parts_are_balanced_by_estimated_work_not_by_position() -> None:
    cases = plan(MAP_PLAN)  # 64 to 4096 in plan order: FLOPs grow along the plan
    loads = [sum(map(work, part)) for part in shard(cases, 8)]
    assert max(loads) / min(loads) < 1.02
    size = -(-len(cases) // 8)  # equal runs of the plan, as a naive split would take them
    naive = [sum(map(work, cases[i : i + size])) for i in range(0, len(cases), size)]
    assert max(naive) / min(naive) > 10


def test_the_same_plan_splits_the_same_way_and_devices_shards_alike() -> None:
    again = tuple(read_plan(MAP_PLAN))  # read anew: another process, another machine
    first = [[c.case_id for c in part] for part in shard(plan(MAP_PLAN), 5)]
    assert [[c.case_id for c in part] for part in shard(again, 5)] == first
    assert fingerprint(again) == fingerprint(plan(MAP_PLAN))
    # --devices and --shard split one plan the same way: one function
    assert multi_gpu.shard is shard


def test_the_fingerprint_tells_plans_apart() -> None:
    cases = list(plan(MAP_PLAN))
    base = fingerprint(cases)
    assert len(base) == 64
    assert fingerprint(cases[::-1]) != base  # the order is the plan's
    assert fingerprint(cases[1:]) != base
    assert fingerprint([replace(cases[0], beta=1.0), *cases[1:]]) != base
    assert fingerprint(plan(SWEEP_PLAN)) != base


def test_a_part_records_its_shard_and_the_whole_plan() -> None:
    cases = plan(SWEEP_PLAN)
    part = PlanPart.of(ShardSpec.parse("2/3"), cases)
    assert part.cases() == shard(cases, 3)[1]
    assert part.record() == {
        "shard": "2/3",
        "plan_fingerprint": fingerprint(cases),
        "plan_cases": len(cases),
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0/4", "I counts from 1 to N"),
        ("5/4", "I counts from 1 to N"),
        ("1/0", "N must be 1 or more"),
        ("2", "is not I/N"),
        ("a/b", "is not I/N"),
        ("-1/4", "is not I/N"),
        ("1/4/2", "is not I/N"),
    ],
)
def test_a_bad_shard_is_one_line(text: str, message: str) -> None:
    with pytest.raises(AuditError, match=message) as raised:
        ShardSpec.parse(text)
    assert "\n" not in str(raised.value)


def test_more_parts_than_cases_is_refused() -> None:
    cases = plan(SWEEP_PLAN)
    assert ShardSpec.parse(" 3 / 8 ") == ShardSpec(3, 8)
    with pytest.raises(AuditError, match=f"the plan has {len(cases)} cases"):
        PlanPart.of(ShardSpec(1, len(cases) + 1), cases)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "--sizes", "256", "--shard", "0/4"], "I counts from 1 to N"),
        (["map", "--sizes", "64:256:64", "--shard", "two/4"], "is not I/N"),
        (["candidates", "--sizes", "256", "--shard", "3/2"], "I counts from 1 to N"),
        (["sweep", "--sizes", "256", "--shard", "1/2", "--devices", "all"], "give one"),
        (["map", "--sizes", "64:256:64", "--shard", "1/2", "--follow-up"], "--follow-up"),
        (["sweep", "--resume", str(SWEEP_PLAN.parent), "--shard", "1/2"], "give --resume alone"),
        (["sweep", "--sizes", "256", "--single", "--no-batched", "--shard", "9/9"], "fewer than"),
    ],
)
def test_shard_options_are_refused_before_the_gpu(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
