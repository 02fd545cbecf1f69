"""judge.rules.maps pinned: the neighbours of a grid by hand, the drop noise can make, the tiers
a model splits findings into, and size-inversion whichever problem the series lists first, on the
recorded map shard reports/h100/checks/20261125-101230-shards/shard-2 (FP32 on the H100):
1472x64x1408 takes 1.10x the kernel time of 1984x64x2048 (effect 0.087), and from 1792x192x576
to 1792x192x1920 the kernel changes with a 33.7 % throughput drop."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from cublas_audit.judge.noise import EDGES_MS, NoiseModel
from cublas_audit.judge.rules import maps
from cublas_audit.judge.rules.maps import WITHIN_MAP_NOISE, _neighbours, _noise_drop
from cublas_audit.judge.verdicts import Verdict
from tests.rules.recorded import dataset, judged, sliced

SHARD = "h100/checks/20261125-101230-shards/shard-2"
SLOW, FAST = "cublas.fp32.1472x64x1408.b1.nn", "cublas.fp32.1984x64x2048.b1.nn"
# a model whose every floor is 100 %: no recorded drop or inversion is beyond it
LOUD = NoiseModel(EDGES_MS, (1.0,) * len(EDGES_MS), others={"kernel": (1.0,) * len(EDGES_MS)})


def test_neighbours_by_hand() -> None:
    # three squares (64, 128, 192); K 64 -> 128 -> 192 at 64x64; M 64 -> 128 and N 64 -> 128 at
    # 64 in the other two; listed out of order. Neighbours: consecutive squares (64-128,
    # 128-192), and consecutive values of one dimension with the other two equal.
    dims = np.array(
        [[192, 192, 192], [64, 64, 192], [64, 64, 64], [64, 128, 64], [128, 128, 128],
         [64, 64, 128], [128, 64, 64]]
    )  # fmt: skip
    before, after = _neighbours(dims)
    pairs = sorted((tuple(dims[b]), tuple(dims[a])) for b, a in zip(before, after, strict=True))
    assert pairs == sorted(
        [
            ((64, 64, 64), (128, 128, 128)),
            ((128, 128, 128), (192, 192, 192)),
            ((64, 64, 64), (64, 64, 128)),
            ((64, 64, 128), (64, 64, 192)),
            ((64, 64, 64), (128, 64, 64)),
            ((64, 64, 64), (64, 128, 64)),
        ]
    )
    assert before.dtype == after.dtype == np.int64


def test_noise_drop_is_the_floor_over_one_plus_it() -> None:
    # a time moved by f is a throughput 1 / (1 + f) as high: 0.25 -> 0.2, 1.0 -> 0.5
    model = NoiseModel((1.0, math.inf), (0.9, 0.9), others={"kernel": (0.25, 1.0)})
    assert _noise_drop(model, "kernel", np.array([0.5, 2.0])).tolist() == [0.2, 0.5]


def test_a_cliff_beyond_the_models_floors_is_medium_and_slower() -> None:
    data = dataset(SHARD)
    (shipped,) = judged(data, "dispatch-cliff", model=NoiseModel(EDGES_MS, (0.01,) * 9))
    assert (shipped.severity, shipped.verdict) == ("medium", Verdict.slower)
    assert WITHIN_MAP_NOISE not in shipped.message
    assert shipped.message.startswith("From 1792x192x576 to 1792x192x1920 the kernel changes from ")
    assert "throughput drops by 34 %, comparing the kernels' time (CUPTI)." in shipped.message
    assert shipped.workaround.startswith("Pad to a size that keeps ")


def test_a_cliff_within_the_models_floors_is_info_and_unsure() -> None:
    (loud,) = judged(dataset(SHARD), "dispatch-cliff", model=LOUD)
    assert (loud.severity, loud.verdict) == ("info", Verdict.unsure)
    assert loud.message.endswith(WITHIN_MAP_NOISE) and round(loud.effect, 3) == 0.337


def test_an_inversion_within_the_models_floors_is_info() -> None:
    pair = sliced(SHARD, [SLOW, FAST])
    (loud,) = judged(pair, "size-inversion", model=LOUD)
    assert (loud.severity, loud.verdict) == ("info", Verdict.unsure)
    assert loud.message.endswith(WITHIN_MAP_NOISE)
    assert loud.workaround == "Pad the problem to 1984x64x2048 (with zeros): it runs sooner."


def test_an_inversion_whose_larger_problem_is_listed_first() -> None:
    # the faster, larger problem at position 0 of its series: still named
    pair = sliced(SHARD, [SLOW, FAST])
    frame = pair.frame.iloc[::-1]
    assert frame["case_id"].iloc[0] == FAST
    (finding,) = judged(replace(pair, frame=frame), "size-inversion")
    assert finding.sizes == ["1472x64x1408"] and round(finding.effect, 3) == 0.087
    assert "takes 1.10x the time of the larger 1984x64x2048" in finding.message


def test_the_inversion_margin_is_a_percentage() -> None:
    # 0.021282 / 0.019424 ms = 1.09565: it holds at a 9.5 % margin and not at 9.6 % (the margin
    # is percent / 100: 9.6 / 101 would be 0.09505, and hold)
    pair = sliced(SHARD, [SLOW, FAST])
    assert len(judged(pair, "size-inversion", inversion_margin_pct=9.5)) == 1
    assert judged(pair, "size-inversion", inversion_margin_pct=9.6) == []


def test_an_inversion_just_above_the_margin_is_judged() -> None:
    # the margin 2e-10 under the recorded ratio (1.09565...): the pair passes the cheap check
    # (ratio >= (1 + margin) x (1 - 1e-9), which leaves judge's rounding room, never more) and
    # is found; a check of (1 + margin) x (1 + 1e-9) would drop it
    pair = sliced(SHARD, [SLOW, FAST])
    times = pair.frame.set_index("case_id")["kernel_time_ms"].astype(float)
    ratio = times[SLOW] / times[FAST]
    margin_pct = ((ratio - 1) - 2e-10) * 100
    assert len(judged(pair, "size-inversion", inversion_margin_pct=margin_pct)) == 1


CLIFF = ("cublas.fp32.1792x192x576.b1.nn", "cublas.fp32.1792x192x1920.b1.nn")


def _recorded_drop() -> float:
    """The cliff's throughput drop, in the rule's own arithmetic (2 m n k batch / time)."""
    frame = dataset(SHARD).frame.set_index("case_id").loc[list(CLIFF)]
    dims = frame[["m", "n", "k"]].astype(np.int64).to_numpy()
    flops = 2.0 * dims.prod(axis=1).astype(float) * frame["batch"].astype(float).to_numpy()
    rate = flops / frame["kernel_time_ms"].astype(float).to_numpy()
    return float(1 - rate[1] / rate[0])


def _floor_at(drop: float) -> float:
    """A floor f whose noise drop f / (1 + f) is exactly `drop` (f = drop / (1 - drop), then
    the float beside it that rounds there)."""
    f = drop / (1 - drop)
    for _ in range(8):
        if f / (1 + f) == drop:
            return f
        f = float(np.nextafter(f, math.inf if f / (1 + f) < drop else 0.0))
    raise AssertionError("no floor rounds to the drop")


def test_a_cliff_exactly_at_the_drop_threshold_counts() -> None:
    drop = _recorded_drop()  # 0.337...
    assert round(drop, 3) == 0.337
    data = dataset(SHARD)
    assert len(judged(data, "dispatch-cliff", cliff_drop_pct=drop * 100)) == 1
    assert judged(data, "dispatch-cliff", cliff_drop_pct=34) == []  # 33.7 %: not 34 %


def test_a_cliff_exactly_at_the_models_noise_drop_is_within_it() -> None:
    # the model's floor makes noise alone drop throughput by exactly the recorded drop: the
    # drop must exceed it to be sure, so the cliff is info
    f = _floor_at(_recorded_drop())
    edge = NoiseModel(EDGES_MS, (f,) * len(EDGES_MS), others={"kernel": (f,) * len(EDGES_MS)})
    (finding,) = judged(dataset(SHARD), "dispatch-cliff", model=edge)
    assert (finding.severity, finding.verdict) == ("info", Verdict.unsure)


def test_a_cliff_exactly_at_the_shipped_noise_drop_is_no_cliff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the same edge as the shipped model: noise alone could make the drop, so no finding
    f = _floor_at(_recorded_drop())
    edge = NoiseModel(EDGES_MS, (f,) * len(EDGES_MS), others={"kernel": (f,) * len(EDGES_MS)})
    monkeypatch.setattr(maps.noise, "load", lambda: edge)
    assert judged(dataset(SHARD), "dispatch-cliff") == []


def test_a_table_without_kernel_times_has_no_map_findings() -> None:
    # the rules compare the kernels' time only: a table that did not trace them (no
    # kernel_time_ms column) gives neither rule a row
    data = dataset(SHARD)
    untraced = replace(data, frame=data.frame.drop(columns=["kernel_time_ms"]))
    assert judged(untraced, "dispatch-cliff") == []
    assert judged(untraced, "size-inversion") == []
