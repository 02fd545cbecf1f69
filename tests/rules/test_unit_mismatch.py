"""CA701 unit-mismatch: the H200 replicated run reports/h200/checks/20261124-004820-batched-
replicate (two units, the same 54 cases) dispatches alike on both units; judge.units compares
each unit with the first through the diff."""

from __future__ import annotations

from cublas_audit.judge.rules.registry import spec
from cublas_audit.judge.units import RULE, compare_units
from tests.rules.recorded import dataset

RUN = "h200/checks/20261124-004820-batched-replicate/shards"


def test_two_h200_units_dispatch_alike() -> None:
    assert spec("CA701").name == RULE and spec("CA701").check is None
    units = [dataset(f"{RUN}/gpu0"), dataset(f"{RUN}/gpu1")]
    found, spread = compare_units(units)
    assert [f for f in found if f.severity == "high"] == []  # no other kernel on a unit
    assert len(spread) == 2
    assert {f.rule for f in found} <= {RULE}
