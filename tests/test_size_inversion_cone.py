"""size-inversion by the dominance cone (judge.dominance) gives exactly the findings of the rule as
first written, a scan of every problem for each one, on real recorded maps of the H100:

- reports/h100/maps/20261125-092546-fp32-random and -bf16-random: 3,000 problems each, M, N, K
  sampled from 64..4096 (FP32) and 64..8192 (BF16) in steps of 64 (64 and 128 values per axis:
  the dense path);
- reports/h100/maps/20261123-235543-fp32-64-4096: the square sizes 64..4096, three series;
- the problems with K <= 320 of the 10,000-case FP32 map (benchmarks/results/map-10k-h100):
  there, 1792x640x192 is dominated by 2048x640x192 and 2176x640x192, both 0.017664 ms, and
  2304x512x64 by 2304x704x64 and 3136x512x64, both 0.008576 ms: a tie, the first in the table
  is named.

The pairwise path (beyond DENSE_CELLS) is forced on the same maps and must agree too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cublas_audit.judge import dominance
from cublas_audit.judge.finding import Finding, of_group, with_compared
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.frame import RuleContext, judged_columns, measured
from cublas_audit.judge.rules.maps import MAP_SERIES, size_inversion
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.judge.timed_rows import column, judged_time, pair_verdict, time_words
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.table.inputs import load_one_gpu
from cublas_audit.table.validation import read_table

REPO = Path(__file__).resolve().parents[1]
MAPS = REPO / "reports/h100/maps"
RANDOM_FP32 = MAPS / "20261125-092546-fp32-random"
RANDOM_BF16 = MAPS / "20261125-092546-bf16-random"
SQUARES = MAPS / "20261123-235543-fp32-64-4096"
MAP_10K = REPO / "benchmarks/results/map-10k-h100/dispatch.csv.gz"


def brute_force(ctx: RuleContext) -> list[Finding]:
    """The rule as first written: for each problem, every problem of its series that is no
    smaller in any dimension, larger in one and faster; the fastest of them (np.argmin: the
    first among equal times) if the noise model calls the pair slower."""
    rows = measured(ctx.rows[~ctx.rows["is_loop"]], "kernel_time_ms")
    found = []
    for _, series in rows.groupby(MAP_SERIES, dropna=False, sort=False):
        on = judged_time(series)
        times = series[column(on)].astype(float).to_numpy()
        dims = series[["m", "n", "k"]].astype(int).to_numpy()
        for i in range(len(series)):
            larger = (dims >= dims[i]).all(axis=1) & (dims > dims[i]).any(axis=1)
            faster = larger & (times < times[i])
            if not faster.any():
                continue
            j = int(np.argmin(np.where(faster, times, np.inf)))
            row, best = series.iloc[i], series.iloc[j]
            margin = ctx.thresholds.inversion_margin_pct / 100
            if pair_verdict(best, row, on, margin) is not Verdict.slower:
                continue
            message = (
                f"{row['shape']} takes {times[i] / times[j]:.2f}x the time of the larger "
                f"{best['shape']} ({row['kernel_short']} against {best['kernel_short']}), "
                f"comparing {time_words(on)}."
            )
            padded = f"{best['m']}x{best['n']}x{best['k']}"
            work = f"Pad the problem to {padded} (with zeros): it runs sooner."
            finding = of_group("size-inversion", "medium", series.iloc[[i]], message, work)
            found.append(with_compared(finding, best.name, 1 - times[j] / times[i]))
    return found


_SCANNED: dict[str, list[Finding]] = {}


def scanned(maps: dict[str, RuleContext], name: str) -> list[Finding]:
    """brute_force of a recorded map, once per process (two tests compare with it)."""
    if name not in _SCANNED:
        _SCANNED[name] = brute_force(maps[name])
    return _SCANNED[name]


def context(frame: pd.DataFrame) -> RuleContext:
    return RuleContext(judged_columns(prepare(frame)), Thresholds())


@pytest.fixture(scope="module")
def maps() -> dict[str, RuleContext]:
    return {
        path.name: context(load_one_gpu(path).frame) for path in (RANDOM_FP32, RANDOM_BF16, SQUARES)
    }


@pytest.fixture(scope="module")
def low_k(tmp_path_factory: pytest.TempPathFactory) -> RuleContext:
    """The problems with K <= 320 of the 10,000-case map, as its table recorded them."""
    text = pd.read_csv(MAP_10K, dtype=str, keep_default_na=False)
    table = tmp_path_factory.mktemp("map-10k") / "dispatch.csv"
    text[text["k"].astype(int) <= 320].to_csv(table, index=False)
    return context(read_table(table))


@pytest.mark.parametrize("name", [RANDOM_FP32.name, RANDOM_BF16.name, SQUARES.name])
def test_the_cone_finds_what_the_scan_finds(maps: dict[str, RuleContext], name: str) -> None:
    expected = scanned(maps, name)
    assert expected  # each map has inversions beyond the noise model
    assert size_inversion(maps[name]) == expected


@pytest.mark.parametrize("name", [RANDOM_FP32.name, SQUARES.name])
def test_the_pairwise_fallback_finds_the_same(
    maps: dict[str, RuleContext], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dominance, "DENSE_CELLS", 0)
    monkeypatch.setattr(dominance, "PAIRS_PER_BLOCK", 50_000)  # several blocks of rows
    monkeypatch.setattr(dominance, "_dense", _never)
    assert size_inversion(maps[name]) == scanned(maps, name)


def _never(*_: object) -> np.ndarray:
    raise AssertionError("the dense grid was built")


def test_a_tie_names_the_first_in_the_table_on_both_paths(
    low_k: RuleContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = measured(low_k.rows[~low_k.rows["is_loop"]], "kernel_time_ms")
    times = rows["kernel_time_ms"].astype(float).to_numpy()
    dims = rows[["m", "n", "k"]].astype(int).to_numpy()
    expected, ties = np.full(len(rows), -1), 0
    for i in range(len(rows)):
        faster = (dims >= dims[i]).all(axis=1) & (dims > dims[i]).any(axis=1) & (times < times[i])
        if faster.any():
            expected[i] = int(np.argmin(np.where(faster, times, np.inf)))
            ties += int((times[faster] == times[expected[i]]).sum() > 1)
    assert ties >= 2  # 1792x640x192 and 2304x512x64 (the module's docstring)
    assert (dominance.fastest_dominating(dims, times) == expected).all()
    assert size_inversion(low_k) == brute_force(low_k)
    monkeypatch.setattr(dominance, "DENSE_CELLS", 0)
    assert (dominance.fastest_dominating(dims, times) == expected).all()
    assert size_inversion(low_k) == brute_force(low_k)
