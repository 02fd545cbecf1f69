"""Rules over a dense map of sizes (one series: the same call at many m, n, k): a problem slower
than a larger one (`size-inversion`), and a throughput drop where the dispatched kernel changes
between neighbouring sizes (`dispatch-cliff`). Kernel times only (CUPTI): across cases, the
host's share of a call's time is noise that can invert any two small calls."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from cublas_audit.forked import Forks
from cublas_audit.judge import noise
from cublas_audit.judge.dominance import fastest_dominating
from cublas_audit.judge.finding import Finding, of_rows
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.rules.frame import RuleContext, kept, measured, one_series
from cublas_audit.judge.timed_rows import (
    TIMES,
    column,
    floor_kind,
    judged_time,
    pair_verdict,
    time_words,
)
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.table.dispatch import cell_records
from cublas_audit.vocabulary import Severity

# A map's problems move between runs more than a sweep's cases (judge.noise, map kinds): a finding
# beyond the sweep's floors but within the map's is `info`, and the follow-up decides.
WITHIN_MAP_NOISE = (
    " Within the map's rerun noise (its 5 calls a problem): the follow-up's full-length"
    " measurement decides."
)

# A series with this many pairs to judge (a problem slower than a larger one beyond the margin),
# or this many cliffs, is judged in FORK_PARTS forked children at once: a full grid's ~130,000
# pairs took 4.6 s of CPU in one process (reports/h100/atlas/bf16), its ~30,000 cliffs 1.5 s;
# below this a fork saves nothing. Up to 8 parts, leaving a CPU to this process and one to
# dispatch-cliff's child (judge.map_audit): past 8 the findings pickled back (~1 s for the grid's
# 52,000) cost more than a part saves.
FORK_PAIRS = 20_000
FORK_PARTS = max(2, min(8, (os.cpu_count() or 1) - 2))

# The settings a map series shares: problems of one series differ only in m, n, k.
MAP_SERIES = [
    "gpu_label",
    "api",
    "routine",
    "mode",
    "batch",
    "transa",
    "transb",
    "broadcast",
    "beta",
]


def size_inversion(ctx: RuleContext) -> list[Finding]:
    """A problem slower than another of the same series that is no smaller in any dimension:
    the smaller problem's kernel is a poor pick, and padding it to the larger size is a
    workaround a user can apply today. The larger problem named is the fastest such one (the
    first in the table among equal times); the pair holds beyond the noise model or not at all,
    and where the rows' own floors are wider (ctx.model: a map's) one within them is `info`."""
    margin = ctx.thresholds.inversion_margin_pct / 100
    rows = _kernel_timed(ctx.rows)
    found = []
    for series in one_series(rows, MAP_SERIES):
        if len(series) < 2:
            continue
        on = judged_time(series)
        times = series[column(on)].astype(float).to_numpy()
        dims = series[["m", "n", "k"]].astype(np.int64).to_numpy()
        best = fastest_dominating(dims, times)
        slow = np.flatnonzero(best >= 0)
        # A pair under the margin is `same` whatever the noise (verdicts.judge), so it is not
        # judged one by one; the 1e-9: judge's ratio, exp(log(b / a)), may round off this one.
        slow = slow[times[slow] / times[best[slow]] >= (1 + margin) * (1 - 1e-9)]
        if not len(slow):
            continue  # no pair to judge: a series of a sweep or a trace mostly has none
        found += _judged_inversions(_Series(series, times, on, margin, ctx.model), slow, best[slow])
    return found


@dataclass(frozen=True)
class _Series:
    """A map series as its inversions are judged: its rows, each one's judged time (`on`), the
    margin under which a pair is `same`, and the rows' own floors (None: the sweep's)."""

    rows: pd.DataFrame
    times: np.ndarray
    on: str
    margin: float
    model: NoiseModel | None


def _judged_inversions(series: _Series, slow: np.ndarray, fast: np.ndarray) -> list[Finding]:
    """The pairs (positions in the series) judged against the noise, and the findings of those
    that hold, tier by tier; a series of FORK_PAIRS pairs or more in FORK_PARTS parts judged in
    forked children at once (forked.Forks: each pair's verdict and finding is Python, ~35 us, and
    a full map has ~130,000), their tiers joined in the pairs' order: the findings a single
    process makes, in its order."""
    parts = FORK_PARTS if len(slow) >= FORK_PAIRS else 1
    chunks = np.array_split(np.arange(len(slow)), parts)
    calls = [functools.partial(_inversion_tiers, series, slow[c], fast[c]) for c in chunks]
    tiers = Forks(calls, enabled=parts > 1).results()
    return [f for sure, _ in tiers for f in sure] + [f for _, unsure in tiers for f in unsure]


def _inversion_tiers(
    series: _Series, slow: np.ndarray, fast: np.ndarray
) -> tuple[list[Finding], list[Finding]]:
    """Some pairs' findings, as `_tiered` lists them: those beyond the map's own floors
    (`series.model`; all where it is None), then those within them (info)."""
    rows, on, margin, model = series.rows, series.on, series.margin, series.model
    held = _beyond_noise(rows, slow, fast, on, margin, noise.load())
    slow, fast = slow[held], fast[held]
    sure = _beyond_noise(rows, slow, fast, on, margin, model) if model else None
    found = _inversions(rows, slow, fast, series.times, on, sure)
    return (
        [f for f in found if f.severity != Severity.info],
        [f for f in found if f.severity == Severity.info],
    )


def _beyond_noise(
    series: pd.DataFrame,
    slow: np.ndarray,
    fast: np.ndarray,
    on: str,
    margin: float,
    model: NoiseModel | None,
) -> np.ndarray:
    """Which pairs (positions in the series) the noise model calls slower: only the columns
    the verdict reads, of only the rows in a pair, are read as records."""
    read = [c for c in series.columns if c == "mode" or c.startswith(TIMES[on] + "_")]
    involved = np.union1d(slow, fast)
    records = dict(zip(involved, cell_records(series[read].iloc[involved]), strict=True))
    return np.array(
        [
            pair_verdict(records[j], records[i], on, margin, model) is Verdict.slower
            for i, j in zip(slow, fast, strict=True)
        ],
        dtype=bool,
    )


def _inversions(
    series: pd.DataFrame,
    slow: np.ndarray,
    fast: np.ndarray,
    times: np.ndarray,
    on: str,
    sure: np.ndarray | None,
) -> list[Finding]:
    """The findings of the inversions (positions in the series: the slower, smaller problem
    and the faster, larger one)."""
    at = np.union1d(slow, fast)
    shape, kernel = _column_list(series, "shape", at), _column_list(series, "kernel_short", at)
    m, n, k = (_column_list(series, d, at) for d in ("m", "n", "k"))
    messages, works = [], []
    for i, j in zip(slow, fast, strict=True):
        messages.append(
            f"{shape[i]} takes {times[i] / times[j]:.2f}x the time of the larger "
            f"{shape[j]} ({kernel[i]} against {kernel[j]}), comparing {time_words(on)}."
        )
        works.append(f"Pad the problem to {m[j]}x{n[j]}x{k[j]} (with zeros): it runs sooner.")
    # effect: the share of the time padding saves (a cliff's is the throughput lost)
    effects = 1 - times[fast] / times[slow]
    return _tiered("size-inversion", series, slow, messages, works, fast, effects, sure)


def dispatch_cliff(ctx: RuleContext) -> list[Finding]:
    """Between neighbouring grid points (consecutive square sizes, or consecutive values of one
    dimension with the other two fixed): where the dispatched kernel changes and throughput drops
    by at least `cliff_drop_pct`, and by more than noise alone can make it (`_noise_drop`); where
    the rows' own floors are wider (ctx.model: a map's), one within them is `info`."""
    t = ctx.thresholds
    rows = _kernel_timed(ctx.rows)
    found = []
    for series in one_series(rows, MAP_SERIES):
        on = judged_time(series)
        dims = series[["m", "n", "k"]].astype(np.int64).to_numpy()
        flops = 2.0 * dims.prod(axis=1).astype(float) * series["batch"].astype(float).to_numpy()
        times = series[column(on)].astype(float).to_numpy()
        rate = flops / times
        # a code per distinct name: 1,000,000 names as Python strings only to compare them
        kernels = pd.factorize(series["kernel_short"].fillna("").astype(str))[0]
        before, after = _neighbours(dims)
        drop = 1 - rate[after] / rate[before]
        cliff = (kernels[after] != kernels[before]) & (drop * 100 >= t.cliff_drop_pct)
        if not cliff.any():
            continue
        kind = floor_kind(on, str(series["mode"].iloc[0]))
        cliff[cliff] = drop[cliff] > _noise_drop(noise.load(), kind, times[after[cliff]])
        sure = (
            drop[cliff] > _noise_drop(ctx.model, kind, times[after[cliff]]) if ctx.model else None
        )
        found += _judged_cliffs(series, Cliffs(before[cliff], after[cliff], drop[cliff], sure), on)
    return found


class Cliffs(NamedTuple):
    """A series' cliffs: positions of the neighbour before and the one after, the share of
    throughput lost between them, and whether each is beyond the map's own floors (None: no
    floors to judge against)."""

    before: np.ndarray
    after: np.ndarray
    drop: np.ndarray
    sure: np.ndarray | None

    def part(self, chosen: np.ndarray) -> Cliffs:
        sure = None if self.sure is None else self.sure[chosen]
        return Cliffs(self.before[chosen], self.after[chosen], self.drop[chosen], sure)


def _judged_cliffs(series: pd.DataFrame, cliffs: Cliffs, on: str) -> list[Finding]:
    """The cliffs' findings, tier by tier; a series of FORK_PAIRS cliffs or more in FORK_PARTS
    parts made in forked children at once, as size-inversion's pairs are (a full grid's ~30,000
    cliffs: ~1.5 s of CPU in one process, the rule's child of judge.map_audit, longer than
    size-inversion's parts), their tiers joined in the cliffs' order: the findings a single
    process makes, in its order."""
    parts = FORK_PARTS if len(cliffs.after) >= FORK_PAIRS else 1
    chunks = np.array_split(np.arange(len(cliffs.after)), parts)
    calls = [functools.partial(_cliff_tiers, series, cliffs.part(c), on) for c in chunks]
    tiers = Forks(calls, enabled=parts > 1).results()
    return [f for medium, _ in tiers for f in medium] + [f for _, info in tiers for f in info]


def _cliff_tiers(
    series: pd.DataFrame, cliffs: Cliffs, on: str
) -> tuple[list[Finding], list[Finding]]:
    """Some cliffs' findings, as `_tiered` lists them: beyond the map's own floors, then within."""
    found = _cliffs(series, cliffs, on)
    return (
        [f for f in found if f.severity != Severity.info],
        [f for f in found if f.severity == Severity.info],
    )


def _noise_drop(model: NoiseModel, kind: str, times_ms: np.ndarray) -> np.ndarray:
    """The largest throughput drop noise alone can make at these times: a time moved by the
    floor f between two problems is a throughput 1 / (1 + f) as high, a drop of f / (1 + f)."""
    floors = np.array([model.floor(float(ms), kind) for ms in times_ms], dtype=float)
    drops: np.ndarray = floors / (1 + floors)
    return drops


def _cliffs(series: pd.DataFrame, cliffs: Cliffs, on: str) -> list[Finding]:
    """The findings of the cliffs."""
    before, after, drop, sure = cliffs
    at = np.union1d(before, after)
    shape, kernel = _column_list(series, "shape", at), _column_list(series, "kernel_short", at)
    messages, works = [], []
    for b, a, lost in zip(before, after, drop, strict=True):
        messages.append(
            f"From {shape[b]} to {shape[a]} the kernel changes from {kernel[b]} to {kernel[a]} "
            f"and throughput drops by {100 * lost:.0f} %, comparing {time_words(on)}."
        )
        works.append(
            f"Pad to a size that keeps {kernel[b]}, or take it through cuBLASLt "
            "if its heuristic lists it."
        )
    return _tiered("dispatch-cliff", series, after, messages, works, before, drop, sure)


def _tiered(
    rule: str,
    series: pd.DataFrame,
    found: np.ndarray,
    messages: list[str],
    works: list[str],
    compared: np.ndarray,
    effects: np.ndarray,
    sure: np.ndarray | None,
) -> list[Finding]:
    """The findings (positions in the series: the row found, the row compared): `medium` where
    `sure` (None: all), else `info` and said to be within the map's rerun noise."""
    # without a noise model nothing was judged against a floor: no verdict to carry
    confirmed = Verdict.slower if sure is not None else None
    sure = np.ones(len(found), dtype=bool) if sure is None else sure
    tiers = []
    for severity, chosen in ((Severity.medium, sure), (Severity.info, ~sure)):
        if not chosen.any():
            continue  # a tier of no finding: no rows of a wide series to take
        said = [m + (WITHIN_MAP_NOISE if severity is Severity.info else "") for m, c in
                zip(messages, chosen, strict=True) if c]  # fmt: skip
        kept = [w for w, c in zip(works, chosen, strict=True) if c]
        rows, against = series.iloc[found[chosen]], series.index[compared[chosen]]
        verdict = Verdict.unsure if severity is Severity.info else confirmed
        tiers += of_rows(rule, severity, rows, said, kept, against, effects[chosen], verdict)
    return tiers


def _column_list(series: pd.DataFrame, name: str, at: np.ndarray) -> dict[int, Any]:
    """A column's values at the positions `at` as Python objects (what a row's cell reads as),
    by position: the whole column as objects was 5 lists of 1,000,000 for a dense map."""
    return dict(zip(at.tolist(), series[name].iloc[at].tolist(), strict=True))


def _kernel_timed(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a measured kernel time (above zero: the rules divide by it)."""
    if "kernel_time_ms" not in rows.columns:
        return rows.iloc[0:0]
    return measured(kept(rows, ~rows["is_loop"]), "kernel_time_ms")


def _neighbours(dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions (before, after) of neighbouring problems among rows of (m, n, k): consecutive
    square sizes, and consecutive values of one dimension with the other two equal (consecutive
    among the observed values: in a sampled map, or a follow-up's pair)."""
    pairs = []
    square = np.flatnonzero((dims[:, 0] == dims[:, 1]) & (dims[:, 1] == dims[:, 2]))
    order = square[np.argsort(dims[square, 0], kind="stable")]
    pairs.append((order[:-1], order[1:]))
    for axis in range(3):
        fixed = [d for d in range(3) if d != axis]
        order = np.lexsort((dims[:, axis], dims[:, fixed[1]], dims[:, fixed[0]]))
        ordered = dims[order]
        same = (ordered[1:, fixed] == ordered[:-1, fixed]).all(axis=1)
        pairs.append((order[:-1][same], order[1:][same]))
    before = np.concatenate([p[0] for p in pairs]).astype(np.int64)
    after = np.concatenate([p[1] for p in pairs]).astype(np.int64)
    return before, after
