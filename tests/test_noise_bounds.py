"""judge.noise's map widening and bins at their edges, pinned on the shipped H100 model.

The shipped model (cublas_audit/data/noise_h100.json, fitted on reports/h100/noise and the map
reruns of tests/fixtures/h100-map-reruns) gives the numbers: its call floor below 30 us is
0.7752 and its map_call floor there 11.7213; kernel 0.0283 against map_kernel 0.2195;
kernel_tensor 0.0971 against map_kernel_tensor 0.4552; from 1 to 3 ms kernel 0.0283 against
map_kernel 0.0144. The other tests of the module are tests/test_verdict_arithmetic.py's and
tests/test_map_noise.py's.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cublas_audit.judge import noise
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.planning.cases import LOOP_ROUTINE


@pytest.fixture(scope="module")
def shipped() -> NoiseModel:
    return noise.load()


def test_for_maps_widens_each_between_run_kind_by_its_map_kind(shipped: NoiseModel) -> None:
    maps = shipped.for_maps()
    first, three_ms = 0, shipped.bin(3.0)  # below 30 us; from 1 to 3 ms
    # the call's: max(0.7752, 11.7213) below 30 us; from 1 to 3 ms max(0.1039, 0.015) = 0.1039
    assert maps.floors[first] == 11.7213 and maps.floors[three_ms] == 0.1039
    # the kernels' by pipe: max(0.0283, 0.2195), max(0.0971, 0.4552); at 3 ms max(0.0283, 0.0144)
    assert maps.floors_of("kernel")[first] == 0.2195
    assert maps.floors_of("kernel")[three_ms] == 0.0283
    assert maps.floors_of("kernel_tensor")[first] == 0.4552
    # a ratio is timed interleaved by no map: its floors stand as they were
    assert maps.floors_of("kernel_ratio") == shipped.floors_of("kernel_ratio")
    assert maps.floors_of("call_ratio") == shipped.floors_of("call_ratio")
    assert maps.source["for"] == "maps" and maps.source["device"] == shipped.source["device"]


def test_for_maps_without_map_kinds_keeps_every_floor() -> None:
    # a model of sweeps alone (no map kind measured): nothing to widen by, nothing looked up
    model = NoiseModel((1.0, math.inf), (0.3, 0.1), others={"kernel": (0.05, 0.02)})
    maps = model.for_maps()
    assert maps.floors == (0.3, 0.1)
    assert maps.floors_of("kernel") == (0.05, 0.02)
    assert maps.others == {"kernel": (0.05, 0.02)}  # no kind the model lacks is made up


def test_for_maps_widens_a_kind_the_model_lacks_from_its_fallback() -> None:
    # no kernel floors, but a map_kernel: the kernels' floor is the call's (FALLBACK) widened
    model = NoiseModel((1.0, math.inf), (0.3, 0.1), others={"map_kernel": (0.2, 0.2)})
    assert model.for_maps().floors_of("kernel") == (0.3, 0.2)  # max(0.3, 0.2), max(0.1, 0.2)


def test_a_map_kind_of_other_length_is_refused_not_cut() -> None:
    # two bins, a map kind of one: zip would cut the widened floors to one bin
    model = NoiseModel((1.0, math.inf), (0.1, 0.1), others={"map_call": (0.2,)})
    with pytest.raises(ValueError):
        model.for_maps()


def test_a_time_beyond_a_finite_last_edge_is_in_the_last_bin() -> None:
    # a model read from JSON whose edges stop at 3 ms: 10 ms is past them, in the last bin (1)
    model = NoiseModel.from_json({"edges_ms": [1.0, 3.0], "floors": [0.2, 0.1]})
    assert model.bin(10.0) == 1 and model.floor(10.0) == 0.1
    assert model.bin(3.0) == 1 and model.bin(0.5) == 0


def test_from_json_needs_the_calls_floors() -> None:
    # only kernel floors: no call to fall back to, refused as a ValueError load() reports
    with pytest.raises(ValueError, match="with call"):
        NoiseModel.from_json({"edges_ms": [None], "floors": {"kernel": [0.1]}})


def test_pair_spreads_pairs_every_two_tables_by_case() -> None:
    # three runs of one case at 1, 2 and 4 ms: pairs (1, 2), (1, 4), (2, 4); per launch the
    # geometric mean sqrt(2), 2, sqrt(8); spread |log(b / a)| = log 2, log 4, log 2
    runs = [
        pd.DataFrame({"case_id": ["x"], "api": ["cublas"], "mode": ["fp32"], "time_ms": [t]})
        for t in (1.0, 2.0, 4.0)
    ]
    spreads = noise.pair_spreads(runs)
    assert list(spreads.index) == [0, 1, 2]  # one row per pair, numbered once
    assert spreads["per_launch"].tolist() == pytest.approx([math.sqrt(2), 2.0, math.sqrt(8)])
    assert spreads["log_ratio"].tolist() == pytest.approx([math.log(2), math.log(4), math.log(2)])


def test_a_ratio_spread_is_of_the_ratio_not_the_product() -> None:
    # one classic call timed interleaved with its reference in two runs: 1 / 1 ms, then 2 / 2 ms:
    # the ratio did not move (spread 0) where each time doubled (a product would move by log 4)
    def run(ms: float) -> pd.DataFrame:
        return pd.DataFrame(
            {"case_id": ["x"], "api": ["cublas"], "mode": ["fp32"], "routine": ["cublasSgemm"],
             "batch": [8], "time_ms": [ms], "ref_time_ms": [ms], "ref_time_n": [5]}
        )  # fmt: skip

    spreads = noise.pair_spreads([run(1.0), run(2.0)], "call_ratio")
    assert spreads["log_ratio"].tolist() == [0.0]
    assert spreads["per_launch"].tolist() == pytest.approx([math.sqrt(2)])


def test_a_loop_of_two_launches_is_not_interleaved_with_the_reference() -> None:
    # the loop companion of a batch-2 call launches 2 kernels (> 1): not timed with the reference
    rows = pd.DataFrame(
        {"api": ["cublas", "cublas"], "routine": [LOOP_ROUTINE, "cublasSgemm"], "batch": [2, 2],
         "ref_time_n": [5, 5]}
    )  # fmt: skip
    assert noise.interleaved_with_reference(rows).tolist() == [False, True]


def test_the_maps_pool_reaches_the_bin_that_ends_at_1_ms() -> None:
    # a 20 % shift at 0.05 ms and a 0.4 % one at 0.5 ms (the bin from 0.3 to 1 ms): the pool
    # up to 1 ms takes its largest, 20 % x 1.25 = 0.25, for the 0.5 ms bin too
    def pair(per_launch_ms: float, change: float) -> list[pd.DataFrame]:
        first = pd.DataFrame(
            {"case_id": ["x"], "api": ["cublas"], "mode": ["fp32"], "time_ms": [per_launch_ms]}
        )
        return [first, first.assign(time_ms=per_launch_ms * (1 + change))]

    floors = noise.map_floors([pair(0.05, 0.20), pair(0.5, 0.004)])["map_call"]
    assert floors[noise.EDGES_MS.index(1.0)] == 0.25


def test_the_top_bin_lifts_the_one_below_it() -> None:
    # two runs: a 50 ms case unchanged (bin 30-100 ms: 0 -> MIN_FLOOR 0.01) and a 200 ms one 10 %
    # slower (the last bin: 0.1 x 1.25 = 0.125); a shorter launch is never quieter, so the
    # 30-100 ms bin and every one below it get 0.125 too
    def run(slow: float) -> pd.DataFrame:
        return pd.DataFrame(
            {"case_id": ["a", "b"], "api": ["cublas"] * 2, "mode": ["fp32"] * 2,
             "time_ms": [50.0, 200.0 * slow]}
        )  # fmt: skip

    model = noise.fit([run(1.0), run(1.1)], {})
    assert model.floors == (0.125,) * len(noise.EDGES_MS)


def test_fitted_floors_are_kept_to_four_decimals() -> None:
    # one case, 1.0 then 1.1111 ms: spread 0.1111 x 1.25 = 0.138875 -> 0.1389 in every bin
    def run(ms: float) -> pd.DataFrame:
        return pd.DataFrame(
            {"case_id": ["x"], "api": ["cublas"], "mode": ["fp32"], "time_ms": [ms]}
        )

    assert noise.fit([run(1.0), run(1.1111)], {}).floors == (0.1389,) * len(noise.EDGES_MS)
