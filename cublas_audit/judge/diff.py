"""Two dispatch tables -> matched cases, kernel changes, deltas, regressions, one-side-only cases.

Side A is the baseline, side B the candidate: a regression is B worse than A beyond the noise
thresholds. Whatever differs between the sides (GPU, driver, cuBLAS, a probe setting) is only
reported in the header, never assumed: the comparison itself is the same for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.judge import noise, timed_rows
from cublas_audit.judge.env_diff import EnvRow, env_differences
from cublas_audit.judge.finding import plain
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.judge.timed_rows import TIMES, between_runs, floor_kind, judge_sides, on_kernels
from cublas_audit.judge.verdicts import Judgement, Verdict, detectable_slowdown
from cublas_audit.table.dispatch import CASE_KEY, TableSource, cell_records
from cublas_audit.table.inputs import Dataset
from cublas_audit.vocabulary import Gate, Phase

SIDE_COLUMNS = ("kernel_name", "kernel_short", "util", "time_ms", "status")
# Evidence a timing verdict uses where the table has it: the distribution and clock (schema 2),
# the kernel-only time and its distribution (schema 3); the extremes (verdicts: both sides'
# calls apart).
EVIDENCE_COLUMNS = (
    "time_n",
    "time_q1_ms",
    "time_q3_ms",
    "time_min_ms",
    "time_max_ms",
    "sm_clock_mhz",
    "power_w",
    "kernel_time_ms",
    "kernel_time_n",
    "kernel_time_q1_ms",
    "kernel_time_q3_ms",
    "kernel_time_min_ms",
    "kernel_time_max_ms",
)
CLOCK_NOTE_PCT = 2.0  # SM clocks of the two sides further apart than this are said beside a verdict


@dataclass(frozen=True)
class Diff:
    a: str
    b: str
    env: list[EnvRow]
    matched: pd.DataFrame  # one row per case on both sides, with deltas and a verdict
    only_a: pd.DataFrame
    only_b: pd.DataFrame

    floors: pd.DataFrame = field(default_factory=pd.DataFrame)  # time scale -> detectable
    model: dict[str, Any] = field(default_factory=dict)  # the noise model's source, as judged

    def rows(self, verdict: str) -> pd.DataFrame:
        return self.matched[self.matched["verdict"] == verdict]

    @property
    def kernel_changes(self) -> pd.DataFrame:
        """Cases whose dispatched kernel differs, by its full name (sm80_ and sm90_, align1 and
        align4, stage and warp variants are other kernels even where the short names agree);
        the short name decides only where a side has no full name (a table from elsewhere, or a
        published one that gives short names: its name is its own short name)."""
        m = self.matched
        full = _full_name(m, "a") & _full_name(m, "b")
        by_name = m["kernel_name_a"].fillna("") != m["kernel_name_b"].fillna("")
        by_short = m["kernel_short_a"].fillna("") != m["kernel_short_b"].fillna("")
        return m[(full & by_name) | (~full & by_short)]

    @property
    def host_slower(self) -> pd.DataFrame:
        """Cases whose call got slower beyond its noise floor while their kernels did not: the
        host's share (launch, heuristic, a loop of launches) grew, or the host was busy."""
        m = self.matched
        if "call_verdict" not in m.columns:
            return m.iloc[0:0]
        kernel_judged = m["kernel_verdict"].notna() & (m["kernel_verdict"] != "regression")
        return m[kernel_judged & (m["call_verdict"] == "regression")]

    @property
    def has_regression(self) -> bool:
        return not self.rows("regression").empty

    def fails(self, gate: Gate | str) -> bool:
        """The diff gate: `regression` (a confident slowdown of the dispatched kernels, or of the
        call where kernels were not traced, or a call that broke), `kernel-change`, `host` (a call
        slower over unchanged kernels), or `any` of them. A gate it does not know is refused."""
        gate = Gate(gate)  # a ValueError for a word that is no gate, never read as `any`
        regression, changed = self.has_regression, not self.kernel_changes.empty
        host = not self.host_slower.empty
        gates = {Gate.regression: regression, Gate.kernel_change: changed, Gate.host: host}
        return gates[gate] if gate is not Gate.any else regression or changed or host


def _full_name(matched: pd.DataFrame, side: str) -> pd.Series:
    name, short = matched[f"kernel_name_{side}"], matched[f"kernel_short_{side}"]
    return name.notna() & (name.fillna("") != short.fillna(""))


def compare(
    a: Dataset, b: Dataset, thresholds: Thresholds | None = None, model: NoiseModel | None = None
) -> Diff:
    t = thresholds or Thresholds()
    model = model or noise.load()
    if is_map(a) or is_map(b):  # a map's problems shift between runs more than a sweep's
        model = model.for_maps()
    key = _case_key(a.frame, b.frame)
    left, right = _sided(a, key), _sided(b, key)
    # Joined on the key led by the order cases are listed in (size: of m, n and k, the same on
    # both sides, so it matches nothing the key does not): an outer merge sorts by its keys, and
    # its rows come out listed, with no sorted copy of them to make.
    on = [*LISTED_BY, *(c for c in key if c not in LISTED_BY)]
    merged = left.merge(right, on=on, how="outer", suffixes=("_a", "_b"), indicator=True)
    del left, right  # their derived columns (kernel names, shapes, layout) are the merge's now
    # Columns outside the key come in pairs: one value per case for the shared ones.
    shared = [c for c in ("shape", "size", "routine", "launches") if c not in key]
    pairs = {c: merged[f"{c}_a"].fillna(merged[f"{c}_b"]) for c in shared if c not in on}
    merged = merged.assign(**{c: merged.pop(c) if c in on else pairs[c] for c in shared})
    merged = merged.drop(columns=[f"{c}_{side}" for c in pairs for side in "ab"])
    parts = _sorted_parts(merged, LISTED_BY)
    both = parts["both"]
    return Diff(
        a=str(a.path),
        b=str(b.path),
        env=env_differences(a, b),
        matched=_judge(both, t, model),
        only_a=parts["left_only"],
        only_b=parts["right_only"],
        floors=_detectable(both, t, model),
        model=model.source,
    )


# The order cases are listed in (stable: the key's order after it).
LISTED_BY = ["api", "mode", "batch", "size", "m", "n", "k"]


def _sorted_parts(merged: pd.DataFrame, by: list[str]) -> dict[str, pd.DataFrame]:
    """The merge's rows on both sides and on each side only, each sorted by `by` (stable), as
    `merged.sort_values(by)[merged["_merge"] == part]` makes them; taken a column at a time and
    each column of the merge let go once taken (sorted whole, a 1,000,000-case merge was held
    twice). `merged` is emptied."""
    at = np.arange(len(merged))
    order = merged[by].assign(_at=at).sort_values(by, kind="stable")["_at"].to_numpy()
    side = merged["_merge"].to_numpy()[order]
    wanted = {part: order[side == part] for part in ("both", "left_only", "right_only")}
    # a part of every row, in order, is the merge's columns themselves
    whole = {part for part, rows in wanted.items() if np.array_equal(rows, at)}
    columns: dict[str, dict[str, pd.Series]] = {part: {} for part in wanted}
    for name in list(merged.columns):
        column = merged.pop(name)
        for part, rows in wanted.items():
            columns[part][name] = column if part in whole else column.take(rows)
    return {
        part: pd.DataFrame(columns[part], index=merged.index[rows], copy=False)
        for part, rows in wanted.items()
    }


def is_map(side: Dataset) -> bool:
    """Whether a side was measured by `cublas-audit map` (its env.json says so, or the one
    beside its dispatch.csv: table.inputs; a table with neither is judged as a sweep's)."""
    return side.env.phase is Phase.map


def _case_key(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """CASE_KEY, without routine when either table lacks it (tables from elsewhere may)."""
    if "routine" in a.columns and "routine" in b.columns:
        return list(CASE_KEY)
    return [c for c in CASE_KEY if c != "routine"]


def _sided(dataset: Dataset, key: list[str]) -> pd.DataFrame:
    rows = prepare(dataset.frame)
    if "routine" not in key:
        # Matched without routine, a loop companion has the key of its batched call; a table
        # without a routine column cannot hold loops, so they have nothing to match there.
        rows = rows[~rows["is_loop"]]
    if "status" not in rows.columns:
        rows["status"] = pd.Series(pd.NA, index=rows.index, dtype="string")
    duplicated = rows.duplicated(subset=key, keep="first")
    if duplicated.any():
        index = rows.index[duplicated][0]
        position = list(dataset.frame.index).index(index) + 1
        raise TableSource(dataset.path).error(
            f"case {', '.join(str(rows.at[index, c]) for c in key)} appears twice",
            position,
            key[-1],
        )
    rows["launches"] = noise.launches(rows)
    evidence = [c for c in EVIDENCE_COLUMNS if c in rows.columns]
    columns = list(
        dict.fromkeys([*key, "routine", "shape", "size", "launches", *SIDE_COLUMNS, *evidence])
    )
    return rows[columns].astype({"size": float})


def _judge(both: pd.DataFrame, t: Thresholds, model: NoiseModel) -> pd.DataFrame:
    """Time decides where both sides are timed: the kernels' time (CUPTI) and the call's time
    (events), each judged by verdicts.judge against its own noise floor (`_combine` says how the
    two make one verdict); otherwise pipe utilization; a call that stops working (status ok ->
    error / wrong) is a regression whatever the numbers say."""
    out = both.drop(columns=["_merge"])
    time_pct = (out["time_ms_b"] / out["time_ms_a"] - 1) * 100
    util_pts = out["util_b"] - out["util_a"]
    out = out.assign(time_delta_pct=time_pct, util_delta=util_pts)
    # the three words as three objects every row points to (as text, 1,000,000 copies)
    words = np.array(["same", "regression", "improvement"], dtype=object)
    by_util = words[
        np.select(
            [
                (util_pts < -t.diff_util_noise_pts).fillna(False),
                (util_pts > t.diff_util_noise_pts).fillna(False),
            ],
            [1, 2],
            0,
        )
    ]
    judged = _judged_rows(out, t, model)
    verdict = pd.Series(
        [combined or util for combined, util in zip(judged["verdict"], by_util, strict=True)],
        index=out.index,
        dtype=object,
    )
    broke = (out["status_a"].fillna("ok") == "ok") & (out["status_b"].fillna("ok") != "ok")
    verdict[broke.astype(bool)] = "regression"
    return out.assign(
        **_judged_times(out, judged["by_kernels"]),
        verdict=verdict,
        kernel_verdict=pd.Series(judged["kernel_verdict"], out.index, object),
        call_verdict=pd.Series(judged["call_verdict"], out.index, object),
        evidence=judged["evidence"],
        note=judged["note"],
    )


# The columns a matched case's verdict reads: both sides' times and distributions, clocks.
_JUDGED_COLUMNS = ("launches", "mode")
_JUDGED_PREFIXES = (*(f"{time}_" for time in TIMES.values()), "sm_clock_mhz_")
_CHUNK_ROWS = 10_000


def _judged_rows(out: pd.DataFrame, t: Thresholds, model: NoiseModel) -> dict[str, Any]:
    """Each matched case judged on its kernels' time and its call's time (`_judge_time`), as
    lists a row each: the verdict the two make (`_combine`), each one's word, whether the
    kernels' was judged, the evidence and the clock note. Read a chunk of rows at a time, of
    only the columns judged: the records of every column of a 1,000,000-case diff took 4 GB."""
    read = [c for c in out.columns if c in _JUDGED_COLUMNS or c.startswith(_JUDGED_PREFIXES)]
    names = ("verdict", "kernel_verdict", "call_verdict", "by_kernels", "note")
    lists: dict[str, list[Any]] = {name: [] for name in names}
    # a chunk's evidence stored as pandas stores text once the chunk is judged: a Python
    # string a case is 180 MB of a 1,000,000-case diff
    evidence: list[pd.Series] = []
    for start in range(0, len(out), _CHUNK_ROWS):
        said = []
        for row in cell_records(out[read].iloc[start : start + _CHUNK_ROWS]):
            kernel, call = (_judge_time(row, t, model, kind) for kind in ("kernel", "call"))
            lists["verdict"].append(_combine(kernel, call))
            lists["kernel_verdict"].append(_VERDICT_WORDS[kernel.verdict] if kernel else None)
            lists["call_verdict"].append(_VERDICT_WORDS[call.verdict] if call else None)
            lists["by_kernels"].append(kernel is not None)
            said.append(_evidence(kernel, call))
            lists["note"].append(_clock_note(row))
        evidence.append(pd.Series(said))
    return {**lists, "evidence": pd.concat(evidence, ignore_index=True).array if evidence else []}


def _judged_times(out: pd.DataFrame, by_kernels: Sequence[bool]) -> dict[str, pd.Series]:
    """The time each verdict judged, so that a row shows it: `judged_on` ('kernel' where the
    kernels' time decided, else 'call'), `judged_ms_a` and `judged_ms_b` (that time's medians)."""
    kernels = pd.Series(by_kernels, index=out.index, dtype=bool)
    on = np.array(["call", "kernel"], dtype=object)[kernels.to_numpy(dtype=int)]  # 2 strings
    columns: dict[str, pd.Series] = {"judged_on": pd.Series(on, index=out.index, dtype=object)}
    for side in "ab":
        call = out[timed_rows.column("call", suffix=f"_{side}")].astype("Float64")
        kernel = out.get(timed_rows.column("kernel", suffix=f"_{side}"))
        judged = call if kernel is None else kernel.astype("Float64").where(kernels, call)
        columns[f"judged_ms_{side}"] = judged
    return columns


_VERDICT_WORDS = {
    Verdict.slower: "regression",
    Verdict.faster: "improvement",
    Verdict.same: "same",
    Verdict.unsure: "unsure",
}


def _combine(kernel: Judgement | None, call: Judgement | None) -> str | None:
    """One verdict per case: the kernels' time where both sides traced their kernels (the
    kernels' judgement exists where timed_rows.on_kernels chooses them), else the call's; a call
    slower beyond its own floor over unchanged kernels is reported apart (`Diff.host_slower`).
    None where neither time was judged."""
    judged = kernel if kernel is not None else call
    return None if judged is None else _VERDICT_WORDS[judged.verdict]


def _evidence(kernel: Judgement | None, call: Judgement | None) -> str:
    """'kernels +1.2 % (interval ...); call +9.0 % (interval ...)': each time that was judged."""
    parts = [f"{name} {j.describe()}" for name, j in (("kernels", kernel), ("call", call)) if j]
    return "; ".join(parts)


def _judge_time(
    row: Mapping[str, Any], t: Thresholds, model: NoiseModel, kind: str = "call"
) -> Judgement | None:
    """One time (`kind`: 'kernel' or 'call') of a matched case, B against A, at the between-run
    floor of that time; None where either side lacks it."""
    launches = float(row.get("launches") or 1)
    floor = between_runs(model, floor_kind(kind, str(row.get("mode"))), launches)
    threshold = t.diff_time_noise_pct / 100
    return judge_sides(row, row, kind, threshold, floor, suffixes=("_a", "_b"))


def _clock_note(row: Mapping[str, Any]) -> str:
    """'SM clock 1980 / 1755 MHz' where the two sides' recorded clocks differ."""
    a, b = plain(row.get("sm_clock_mhz_a")), plain(row.get("sm_clock_mhz_b"))
    if a is None or b is None or abs(b / a - 1) * 100 <= CLOCK_NOTE_PCT:
        return ""
    return f"SM clock {a:.0f} / {b:.0f} MHz"


def _detectable(both: pd.DataFrame, t: Thresholds, model: NoiseModel) -> pd.DataFrame:
    """Per time-scale bin of the matched cases: each time's floor and the smallest slowdown the
    gate can call a regression there (the kernels' where both sides traced them)."""
    timed = both[both["time_ms_a"].notna()]
    if timed.empty:
        return pd.DataFrame(columns=["up_to_ms", "cases", "floor_pct", "detectable_pct"])
    per_launch = timed["time_ms_a"].astype(float) / timed["launches"].astype(float)
    traced = _traced(timed)
    bins = np.array([model.bin(float(v)) for v in per_launch.to_numpy()])
    threshold = t.diff_time_noise_pct / 100
    rows = []
    for index in sorted(set(bins.tolist())):
        floor = model.floors_of("call")[index]
        host_bound = floor >= noise.HOST_BOUND_FLOOR  # call times not judged: None below
        in_bin = bins == index
        # the noisier pipe among the traced cases of this bin: what the gate can promise for all
        kinds = {noise.kernel_kind(str(mode)) for mode in timed["mode"][in_bin & traced]}
        kernel_floor = max((model.floors_of(kind)[index] for kind in kinds), default=0.0)
        rows.append(
            {
                "up_to_ms": model.edges_ms[index],
                "cases": int(in_bin.sum()),
                "floor_pct": None if host_bound else floor * 100,
                "detectable_pct": None
                if host_bound
                else detectable_slowdown(floor, threshold) * 100,
                "kernel_cases": int((in_bin & traced).sum()),
                "kernel_floor_pct": kernel_floor * 100,
                "kernel_detectable_pct": detectable_slowdown(kernel_floor, threshold) * 100,
            }
        )
    return pd.DataFrame(rows)


def _traced(rows: pd.DataFrame) -> np.ndarray:
    """Which rows carry the kernels' time on both sides."""
    return on_kernels(rows, suffixes=("_a", "_b")).to_numpy(dtype=bool)
