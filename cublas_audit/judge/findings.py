"""Rules over a dispatch table -> `Finding` records: what is wrong, where, evidence, workaround.

Every rule reads the prepared table (`prepare`): main launches only, so a split-K reduction is never
judged as the GEMM, with the derived columns the rules share (short kernel name, utilization of the
pipe that matters for the mode, linear size). Rules are plain functions registered in `RULES`;
`better-candidate` also reads the run's cuBLASLt candidate audit (`RuleContext.candidates`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

import numpy as np
import pandas as pd

from cublas_audit.judge import noise
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.judge.verdicts import Timed, Verdict, judge
from cublas_audit.observe.kernels import LEGACY_FAMILIES, normalize
from cublas_audit.planning.cases import LOOP_ROUTINE, Case
from cublas_audit.planning.modes import mode as mode_spec
from cublas_audit.planning.modes import pipe_name
from cublas_audit.table.dispatch import LAYOUT_DEFAULTS, main_launches, with_layout_defaults
from cublas_audit.table.dispatch import plain as table_plain

SEVERITIES = ("high", "medium", "info")
EVIDENCE_DIGITS = 4
# One dispatcher decision: the sizes of a series are what the heuristic chooses a kernel over.
SERIES = ["gpu_label", "api", "routine", "mode", "batch"]
# One kind of call: a report's tables and plots have one per GPU.
CALL_KIND = ["api", "routine", "mode", "batch"]
EVIDENCE_COLUMNS = (
    "m",
    "n",
    "k",
    "batch",
    "kernel_short",
    "util",
    "time_ms",
    "ref_time_ms",
    "loop_time_ms",
)


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    gpu_label: str
    api: str
    routine: str
    mode: str
    batch: int
    sizes: list[str]
    kernel: str
    message: str
    workaround: str
    kernel_name: str = ""
    # The judged table rows (index labels of the prepared table) and their key figures.
    rows: list[int] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    # Rows the judged ones were compared with (a map's faster neighbour, the size before a
    # cliff): the follow-up measures them too. `effect`: the size of the problem for ranking
    # (a time ratio, a throughput drop as a fraction); 0 where a rule does not rank.
    compared: list[int] = field(default_factory=list)
    effect: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RuleContext:
    rows: pd.DataFrame
    thresholds: Thresholds
    candidates: pd.DataFrame | None = None


Rule = Callable[[RuleContext], list[Finding]]


def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """Main launches with kernel_short, family, util, size, shape and is_loop filled in."""
    rows = with_layout_defaults(main_launches(frame))
    names = rows["kernel"].fillna("").astype(str)
    if "traced_kernels" in rows.columns:
        # Without ncu (--no-profile, no counter permission) CUPTI still named the kernels: the
        # first one a call launched is its GEMM (a split-K reduction comes after it).
        traced = rows["traced_kernels"].fillna("").astype(str).str.split(" + ", regex=False).str[0]
        names = names.where(names != "", traced)
    # Normalize each distinct name once: a 10,000-row table holds a few dozen kernels.
    infos = {name: normalize(name) for name in names.unique() if name}
    for column, attr in (("kernel_short", "short"), ("family", "family")):
        derived = names.map(lambda name, a=attr: getattr(infos[name], a) if name else pd.NA)
        known = rows[column] if column in rows.columns else pd.Series(pd.NA, index=rows.index)
        rows[column] = known.fillna(derived).astype("string")
    if "routine" not in rows.columns:
        rows["routine"] = pd.Series("", index=rows.index, dtype="string")
    rows["routine"] = rows["routine"].fillna("")
    rows["util"] = _utilization(rows)
    volume = (rows["m"] * rows["n"] * rows["k"]).astype(float)
    rows["size"] = np.round(np.cbrt(volume.to_numpy(dtype=float)), 3)
    rows["shape"] = _shape_labels(rows)
    rows["is_loop"] = rows["routine"] == LOOP_ROUTINE
    rows["tflops_shown"] = _tflops(rows)
    return rows


def _tflops(rows: pd.DataFrame) -> pd.Series:
    """The table's TFLOP/s, or the one its time gives where it has none (a foreign table)."""
    flops = 2.0 * rows["m"] * rows["n"] * rows["k"] * rows["batch"]
    computed = (flops / rows["time_ms"] / 1e9).astype("Float64")
    if "tflops" in rows.columns:
        return rows["tflops"].astype("Float64").fillna(computed)
    return computed


def _utilization(rows: pd.DataFrame) -> pd.Series:
    """FMA-pipe % for FP32 compute, tensor-pipe % for the tensor modes (NA if not measured)."""
    fma = rows["fma_pct"].astype("Float64")
    on_fma = rows["mode"].map(pipe_name).eq("FMA-pipe")
    if "tensor_pct" not in rows.columns:
        return fma.where(on_fma)
    return fma.where(on_fma, rows["tensor_pct"].astype("Float64"))


def _shape_labels(rows: pd.DataFrame) -> pd.Series:
    """'4096', '4096x1024x512', and how the problem is posed where not packed nn: '256 tn lda7'."""
    m, n, k = (rows[c].astype(str) for c in ("m", "n", "k"))
    square = (rows["m"] == rows["n"]) & (rows["n"] == rows["k"])
    shape = m.where(square, m + "x" + n + "x" + k)
    variants = [_variant(record) for record in rows[list(LAYOUT_DEFAULTS)].to_dict("records")]
    suffix = pd.Series(variants, index=rows.index, dtype="string")
    return shape.where(suffix == "", shape + " " + suffix)


def _variant(record: Mapping[Hashable, Any]) -> str:
    """Case.variant of a row's layout columns (a cuBLASLt case: it may carry every setting)."""
    if all(record[c] == default for c, default in LAYOUT_DEFAULTS.items()):
        return ""  # the common case, without building a Case
    fields = {str(c): table_plain(v) for c, v in record.items()}
    for flag in ("strided", "bias"):
        fields[flag] = bool(fields[flag])
    return Case("cublasLt", "fp32", 1, 1, 1, 1, **fields).variant


# Columns no rule reads (the stall breakdown, the other counters, provenance): the report shows
# them, the rules would only copy them through every filter and group of a table.
_UNJUDGED = (
    "schema_version", "status_detail", "driver_version", "cublas_version", "gpu_name", "cc",
    "fma_inst_pct", "ipc", "cycles_active", "issue_active_pct", "warps_active_pct", "dram_pct",
    "registers", "smem_bytes", "ref_kernel",
)  # fmt: skip


def _judged_columns(rows: pd.DataFrame) -> pd.DataFrame:
    unjudged = [c for c in rows.columns if c in _UNJUDGED or str(c).startswith("stall_")]
    return rows.drop(columns=unjudged)


def audit(
    frame: pd.DataFrame,
    thresholds: Thresholds | None = None,
    candidates: pd.DataFrame | None = None,
    rules: Collection[str] | None = None,
) -> list[Finding]:
    """The findings of a table (of every rule, or of the rules named), most severe first."""
    context = RuleContext(_judged_columns(prepare(frame)), thresholds or Thresholds(), candidates)
    chosen = [rule for rule in RULES if rules is None or rule_name(rule) in rules]
    found = [finding for rule in chosen for finding in rule(context)]
    return sorted(found, key=_order)


def rule_name(rule: Rule) -> str:
    """A rule's name in findings and docs: its function's, dashed (size-inversion)."""
    return rule.__name__.replace("_", "-")


def _order(finding: Finding) -> tuple[int, str, str, str, str, int, str]:
    return (
        SEVERITIES.index(finding.severity),
        finding.gpu_label,
        finding.rule,
        finding.api,
        finding.mode,
        finding.batch,
        finding.kernel,
    )


# ----- rules ------------------------------------------------------------------------------------


def no_escalation(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    found = []
    for run in _kernel_runs(_dispatched(ctx.rows), t.escalation_min_range):
        lo, hi = float(run["size"].min()), float(run["size"].max())
        if hi / lo < t.escalation_min_range or hi < t.escalation_min_size:
            continue
        large = run.loc[run["size"] >= t.escalation_min_size, "util"]
        if large.isna().any() or bool((large >= t.escalation_max_pct).any()):
            continue
        kernel, mode = str(run["kernel_short"].iloc[0]), str(run["mode"].iloc[0])
        message = (
            f"cuBLAS dispatches {kernel} at every size from {run['shape'].iloc[0]} to "
            f"{run['shape'].iloc[-1]} ({hi / lo:.0f}x in linear size) and never escalates to a "
            f"larger tile; {pipe_name(mode)} utilization stays at {_pct_range(run['util'])} "
            f"(below {t.escalation_max_pct:.0f} % from {t.escalation_min_size:.0f} up)."
        )
        workaround = (
            "Time the alternatives for these shapes: a loop of single calls, cuBLASLt with a "
            "heuristic candidate of a larger tile, or TF32 / BF16x compute where the precision "
            "allows; send NVIDIA the reproduce script below."
        )
        found.append(_finding("no-escalation", "high", run, message, workaround))
    return found


def legacy_kernel(ctx: RuleContext) -> list[Finding]:
    legacy = _dispatched(ctx.rows)
    legacy = legacy[legacy["family"].isin(LEGACY_FAMILIES)]
    # A matrix-vector problem (M or N = 1) is what gemv and dot kernels are for.
    vector = (legacy["family"] == "gemv") & (legacy[["m", "n"]].min(axis=1) == 1)
    legacy = legacy[~vector]
    found = []
    for group in _by_kernel(legacy):
        kernel, family = str(group["kernel_short"].iloc[0]), str(group["family"].iloc[0])
        mode = str(group["mode"].iloc[0])
        message = (
            f"{kernel} (family {family}) is dispatched at {_size_list(group)}: a code path older "
            f"than this GPU, at {_pct_range(group['util'])} {pipe_name(mode)} utilization."
        )
        workaround = (
            "Reshape or re-batch the problem so it leaves the legacy path, or call cuBLASLt and "
            "take a heuristic candidate of a current family."
        )
        found.append(_finding("legacy-kernel", "medium", group, message, workaround))
    return found


def low_utilization(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    rows = _dispatched(ctx.rows).dropna(subset=["util"])
    found = []
    for _, same_pipe in rows.groupby(["gpu_label", "mode"], sort=True):
        best = same_pipe.sort_values("util", kind="stable").iloc[-1]
        fills = same_pipe["m"] * same_pipe["n"] * same_pipe["batch"] >= t.fill_min_elements
        low = same_pipe[fills & (same_pipe["util"] < t.low_util_fraction * best["util"])]
        for group in _by_kernel(low):
            found.append(_low_utilization_finding(group, best))
    return found


def _low_utilization_finding(group: pd.DataFrame, best: pd.Series) -> Finding:
    mode = str(group["mode"].iloc[0])
    worst = float(group["util"].min())
    message = (
        f"{group['kernel_short'].iloc[0]} reaches only {_pct_range(group['util'])} "
        f"{pipe_name(mode)} utilization at {_size_list(group)}, {worst / best['util']:.0%} of the "
        f"{best['util']:.0f} % this GPU reaches in {mode} with {best['kernel_short']} "
        f"({best['routine'] or best['api']}, {best['shape']}, batch {best['batch']})."
    )
    workaround = (
        "Compare with the call that reaches the best utilization: a different batch split, a loop "
        "of single calls, or a cuBLASLt heuristic candidate may dispatch the better kernel."
    )
    return _finding("low-utilization", "medium", group, message, workaround)


def reference_faster(ctx: RuleContext) -> list[Finding]:
    if "ref_time_ms" not in ctx.rows.columns:
        return []
    t = ctx.thresholds
    rows = ctx.rows.dropna(subset=["time_ms", "ref_time_ms"])
    rows = rows[~rows["is_loop"]]
    # The kernels' times where CUPTI traced both: the reference is one kernel, and the dispatch is
    # what this rule judges. The classic call was timed interleaved with the reference, so its
    # ratio has the (smaller) interleaved floor; the other rows of the problem were not.
    kernels = _both_traced(rows, "kernel_time_ms", "ref_kernel_time_ms")
    interleaved = noise.interleaved_with_reference(rows)
    rows = rows.assign(
        ratio=_ratio(
            rows, kernels, ("kernel_time_ms", "ref_kernel_time_ms"), ("time_ms", "ref_time_ms")
        ),
        judged_on=np.where(kernels, "kernel", "call"),
        floor_kind=np.where(kernels, "kernel", "call") + np.where(interleaved, "_ratio", ""),
    )
    rows = rows.assign(verdict=_verdicts(rows, "ref_time", "time", t.reference_margin_pct))
    found = _unsure(rows, "reference-faster", "the bundled reference kernel faster than cuBLAS")
    for group in _by_kernel(rows[rows["verdict"] == Verdict.slower]):
        ratio = float(group["ratio"].max())
        message = (
            f"The bundled reference kernel is {_ratio_range(group['ratio'])} faster than cuBLAS "
            f"({_kernel_of(group) or 'kernel not recorded'}) at {_size_list(group)}, "
            f"{_judged_on(group)}."
        )
        workaround = (
            "cuBLAS leaves speed on the table here: a hand-written kernel such as the bundled "
            "reference, or a cuBLASLt candidate with a larger tile, is faster for these shapes."
        )
        severity = "high" if ratio >= t.high_ratio else "medium"
        found.append(_finding("reference-faster", severity, group, message, workaround))
    return found


def batched_slower_than_loop(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    timed = ctx.rows.dropna(subset=["time_ms"])
    if "kernel_time_ms" not in timed.columns:
        timed = timed.assign(kernel_time_ms=np.nan)
    key = ["gpu_label", "api", "mode", "m", "n", "k", "batch"]
    loop_rows = timed.loc[timed["is_loop"]]
    loops = loop_rows[key].assign(
        loop_time_ms=loop_rows["time_ms"], loop_kernel_time_ms=loop_rows["kernel_time_ms"]
    )
    loops = loops.assign(**{c: loop_rows.get(c.replace("loop_", "", 1)) for c in _LOOP_EVIDENCE})
    batched = timed[~timed["is_loop"] & (timed["batch"] > 1)]
    paired = batched.reset_index().merge(loops, on=["gpu_label", "api", "mode", "m", "n", "k"])
    paired = paired[paired["batch_x"] == paired["batch_y"]].rename(columns={"batch_x": "batch"})
    paired = paired.set_index("index")
    # Where the sweep re-measured the pair interleaved (the batched call timed inside the loop
    # case), that measurement decides, against the interleaved floor.
    paired = _with_interleaved_recheck(paired, loop_rows)
    # Kernels against kernels where both were traced (the dispatch of the batched call against
    # that of the single call), else call against call; two cases, so between-run floors.
    kernels = _both_traced(paired, "kernel_time_ms", "loop_kernel_time_ms")
    paired = paired.assign(
        ratio=_ratio(
            paired, kernels, ("kernel_time_ms", "loop_kernel_time_ms"), ("time_ms", "loop_time_ms")
        ),
        judged_on=np.where(kernels, "kernel", "call"),
        floor_kind=np.where(kernels, "kernel", "call")
        + np.where(paired["interleaved"], "_ratio", ""),
    )
    paired = paired.assign(verdict=_verdicts(paired, "loop_time", "time", t.loop_margin_pct))
    found = _unsure(paired, "batched-slower-than-loop", "the batched call slower than the loop")
    for group in _by_kernel(paired[paired["verdict"] == Verdict.slower]):
        message = (
            f"{group['routine'].iloc[0] or 'The batched call'} "
            f"({_kernel_of(group) or 'kernel not recorded'}) "
            f"takes {_ratio_range(group['ratio'])} the time of a loop of {group['batch'].iloc[0]} "
            f"single calls at {_size_list(group)}, {_judged_on(group)}."
        )
        workaround = "Call the single GEMM in a loop for these shapes until the dispatch is fixed."
        severity = "high" if float(group["ratio"].max()) >= t.high_ratio else "medium"
        found.append(_finding("batched-slower-than-loop", severity, group, message, workaround))
    return found


# The loop companion's evidence, renamed beside the batched call's own on a paired row.
_LOOP_EVIDENCE = tuple(
    f"loop_{prefix}_{field}"
    for prefix in ("time", "kernel_time")
    for field in ("n", "q1_ms", "q3_ms")
)


def _judged_on(group: pd.DataFrame) -> str:
    """Which time a timing finding compared: its readers must know whether launches count."""
    on = set(group["judged_on"]) if "judged_on" in group.columns else {"call"}
    if on == {"kernel"}:
        return "comparing the kernels' time (CUPTI)"
    if on == {"call"}:
        return "comparing the calls' time (CUDA events)"
    return "comparing the kernels' time (CUPTI) where traced, else the calls' time"


def _with_interleaved_recheck(paired: pd.DataFrame, loop_rows: pd.DataFrame) -> pd.DataFrame:
    """The batched call's time as re-measured inside its loop companion's case (columns
    `batched_*` of the loop row), in place of its own row's, where the sweep made one."""
    paired = paired.assign(interleaved=False)
    if "batched_time_ms" not in loop_rows.columns:
        return paired
    key = ["gpu_label", "api", "mode", "m", "n", "k", "batch"]
    columns = [c for c in loop_rows.columns if c.startswith(("batched_time", "batched_kernel"))]
    again = loop_rows[key + columns].dropna(subset=["batched_time_ms"])
    own = paired.drop(columns=[c for c in columns if c in paired.columns])  # empty on its rows
    merged = own.reset_index().merge(again, on=key, how="left").set_index("index")
    found = merged["batched_time_ms"].notna()
    for column in columns:
        target = column.removeprefix("batched_")
        if target in merged.columns:
            merged[target] = merged[column].where(found, merged[target])
    return merged.drop(columns=columns).assign(interleaved=found.astype(bool))


def _both_traced(rows: pd.DataFrame, a: str, b: str) -> pd.Series:
    if a not in rows.columns or b not in rows.columns:
        return pd.Series(False, index=rows.index)
    return (rows[a].notna() & rows[b].notna()).astype(bool)


def _ratio(
    rows: pd.DataFrame, kernels: pd.Series, kernel: tuple[str, str], call: tuple[str, str]
) -> pd.Series:
    """slow / fast on the time each row is judged on."""
    by_call = rows[call[0]].astype(float) / rows[call[1]].astype(float)
    if kernels.any():
        by_kernel = rows[kernel[0]].astype(float) / rows[kernel[1]].astype(float)
        return by_kernel.where(kernels, by_call)
    return by_call


# The rules whose verdict compares two timed calls: an unsure one is worth measuring again.
TIMING_RULES = ("reference-faster", "batched-slower-than-loop")


def unsure_case_ids(frame: pd.DataFrame, thresholds: Thresholds | None = None) -> list[str]:
    """The cases behind every unsure timing comparison of this table (the call of an unsure
    reference-faster, the batched call and its loop companion of an unsure
    batched-slower-than-loop): what the sweep re-measures, interleaved, before its verdict."""
    prepared = prepare(frame)
    wanted: list[str] = []
    for finding in audit(frame, thresholds):
        if finding.rule not in TIMING_RULES or finding.severity != "info":
            continue
        for row in finding.rows:
            case_id = str(prepared.at[row, "case_id"])
            wanted.append(case_id)
            if finding.rule == "batched-slower-than-loop":
                wanted.append("loop." + case_id.split(".", 1)[1])
    return list(dict.fromkeys(wanted))


def _verdicts(rows: pd.DataFrame, fast: str, slow: str, margin_pct: float) -> pd.Series:
    """verdicts.judge of the slow side against the fast one on each row, on the time in its
    `judged_on` column (`<fast>` / `<slow>` are the call's prefixes; the kernels' are
    `..kernel_time`), widened by the noise floor of its `floor_kind` at the time of one launch
    of the slower side: `slower` is a confident finding."""
    model = noise.load()
    # the records hold only what is judged: the call's and the kernels' times of both sides
    sides = tuple(f"{s}_" for p in (fast, slow) for s in (p, p.replace("time", "kernel_time")))
    read = [c for c in rows.columns if c in ("judged_on", "floor_kind") or c.startswith(sides)]
    judged = []
    for record in rows[read].to_dict("records"):
        on_kernels = record.get("judged_on") == "kernel"
        fast_prefix = fast.replace("time", "kernel_time") if on_kernels else fast
        slow_prefix = slow.replace("time", "kernel_time") if on_kernels else slow
        a, b = Timed.from_row(record, fast_prefix), Timed.from_row(record, slow_prefix)
        if a is None or b is None:
            judged.append(Verdict.same)
            continue
        floor = model.floor(b.median_ms, str(record.get("floor_kind") or "call"))
        judged.append(judge(a, b, floor, margin_pct / 100).verdict)
    return pd.Series(judged, index=rows.index, dtype=object)


def _unsure(rows: pd.DataFrame, rule: str, claim: str) -> list[Finding]:
    """One info finding per kernel whose gap the noise floor cannot confirm: shown, never medium
    or high."""
    found = []
    claimed = (rows["verdict"] == Verdict.unsure) & (rows["ratio"] > 1)  # the claim's direction
    for group in _by_kernel(rows[claimed]):
        message = (
            f"Unsure: the measurements put {claim} by {_ratio_range(group['ratio'])} at "
            f"{_size_list(group)}, within the run-to-run noise at that time scale "
            "(the noise model in docs/report.md); a rerun or a longer measurement would tell."
        )
        workaround = "None needed on this evidence."
        found.append(_finding(rule, "info", group, message, workaround))
    return found


def better_candidate(ctx: RuleContext) -> list[Finding]:
    """cuBLASLt's heuristic offers a faster algorithm than its own default (a run's
    candidates.csv): flagged on the table's cuBLASLt row of the same problem."""
    if ctx.candidates is None:
        return []
    from cublas_audit.judge.candidates import find_better_candidates

    gap = ctx.thresholds.candidate_gap_pct / 100
    label = str(ctx.rows["gpu_label"].iloc[0]) if len(ctx.rows) else ""
    found = []
    for item in find_better_candidates(ctx.candidates, gap):
        case = item["evidence"][0]
        same = ctx.rows[
            (ctx.rows["api"] == "cublasLt")
            & (ctx.rows["mode"] == item["mode"])
            & (ctx.rows["batch"] == case["batch"])
            & (ctx.rows["m"] == case["m"])
            & (ctx.rows["n"] == case["n"])
            & (ctx.rows["k"] == case["k"])
        ]
        rows = [int(index) for index in same.index]
        found.append(Finding(**{**item, "gpu_label": item["gpu_label"] or label, "rows": rows}))
    return found


def layout_penalty(ctx: RuleContext) -> list[Finding]:
    """The same problem, mode and call in several layouts: one is confidently at least
    `layout_penalty_ratio` slower than the best (kernels' time where traced, else the call's)."""
    t = ctx.thresholds
    rows = ctx.rows[~ctx.rows["is_loop"]].dropna(subset=["time_ms"])
    on = _time_columns(rows)
    key = ["gpu_label", "api", "routine", "mode", "m", "n", "k", "batch", "broadcast", "beta"]
    layouts = rows["transa"].astype(str).str.cat(rows["transb"].astype(str))
    posed = layouts.groupby([rows[c] for c in key], dropna=False).transform("nunique")
    rows = rows[posed >= 2]  # a problem posed in one layout has nothing to compare (most maps)
    found = []
    for _, group in rows.groupby(key, dropna=False, sort=False):
        best = group.iloc[int(np.argmin(group[on].to_numpy(dtype=float)))]
        slow = group.assign(ratio=group[on].astype(float) / float(best[on]))
        slow = slow[slow["ratio"] >= t.layout_penalty_ratio]
        for index, row in slow.iterrows():
            verdict = _pair_verdict(best, row, on, t.layout_penalty_ratio - 1)
            if verdict is not Verdict.slower:
                continue
            layout = f"{row['transa']}{row['transb']}"
            message = (
                f"In layout {layout} the call takes {row['ratio']:.2f}x the time of layout "
                f"{best['transa']}{best['transb']} ({row['kernel_short']} against "
                f"{best['kernel_short']}) at {row['shape']}, comparing {_time_words(on)}."
            )
            work = (
                f"Store the operands as layout {best['transa']}{best['transb']} expects (transpose "
                "once, outside the hot loop), or take that layout's algorithm through cuBLASLt."
            )
            severity = "high" if row["ratio"] >= t.high_ratio * t.layout_penalty_ratio else "medium"
            found.append(_finding("layout-penalty", severity, slow.loc[[index]], message, work))
    return found


def broadcast_slower_than_folded(ctx: RuleContext) -> list[Finding]:
    """A batched call whose A is shared (batch stride 0) against the single GEMM it folds into,
    C = A @ [B_1 .. B_batch] (m x n*batch), timed in the same run."""
    t = ctx.thresholds
    rows = ctx.rows[~ctx.rows["is_loop"]].dropna(subset=["time_ms"])
    on = _time_columns(rows)
    shared = rows[(rows["broadcast"] == "a") & (rows["transb"] == "n")]
    single = rows[(rows["batch"] == 1) & (rows["broadcast"] == "")]
    found = []
    for index, row in shared.iterrows():
        folded = single[
            (single["gpu_label"] == row["gpu_label"])
            & (single["api"] == row["api"])
            & (single["mode"] == row["mode"])
            & (single["m"] == row["m"])
            & (single["k"] == row["k"])
            & (single["n"] == row["n"] * row["batch"])
            & (single["transa"] == row["transa"])
            & (single["transb"] == "n")
        ]
        if folded.empty:
            continue
        fold = folded.iloc[0]
        ratio = float(row[on]) / float(fold[on])
        if _pair_verdict(fold, row, on, t.fold_margin_pct / 100) is not Verdict.slower:
            continue
        message = (
            f"The batched call with a shared A (batch stride 0) takes {ratio:.2f}x the time of "
            f"the one {fold['m']}x{fold['n']}x{fold['k']} GEMM it folds into "
            f"({row['kernel_short']} against {fold['kernel_short']}), comparing {_time_words(on)}."
        )
        work = (
            "Fold the batch into one GEMM: reshape [batch, M, K] @ [K, N] to [batch*M, K] @ [K, N]."
        )
        severity = "high" if ratio >= t.high_ratio else "medium"
        found.append(
            _finding("broadcast-slower-than-folded", severity, rows.loc[[index]], message, work)
        )
    return found


def underfilled_grid(ctx: RuleContext) -> list[Finding]:
    """The dispatched kernel launches fewer CTAs than a share of the SMs although the problem's
    operands would give every SM work: most of the GPU idles (the single-SM gemv of #114911)."""
    t = ctx.thresholds
    rows = _dispatched(ctx.rows)
    if "sm_count" not in rows.columns or rows["sm_count"].isna().all():
        return []
    rows = rows[rows["sm_count"].notna()]
    rows = rows.assign(ctas=_ctas(rows))
    sms = rows["sm_count"].astype(float)
    item = rows["mode"].map(lambda mode: mode_element_bytes(str(mode))).astype(float)
    volume = (rows["m"] * rows["k"] + rows["k"] * rows["n"] + rows["m"] * rows["n"]).astype(float)
    operand_bytes = volume * rows["batch"].astype(float) * item
    took = pd.to_numeric(rows[_time_columns(rows)], errors="coerce").astype(float)
    under = (
        (rows["ctas"] < t.underfill_sm_fraction * sms)
        & (operand_bytes >= t.underfill_bytes_per_sm * sms)
        & (took >= t.underfill_min_ms)
    )
    found = []
    for group in _by_kernel(rows[under.fillna(False).astype(bool)]):
        first = group.iloc[0]
        low, high = int(group["ctas"].min()), int(group["ctas"].max())
        message = (
            f"{first['kernel_short']} launches {low}-{high} CTAs on a GPU of "
            f"{int(first['sm_count'])} SMs at {_size_list(group)}, where the "
            "operands would give every SM work: most of the GPU idles."
        )
        work = (
            "Pose the problem so that it fills the GPU (a single call instead of a batch of one, "
            "the transposed layout), or split K across calls and add the partial results."
        )
        found.append(_finding("underfilled-grid", "high", group, message, work))
    return found


def mode_element_bytes(mode: str) -> int:
    try:
        return mode_spec(mode).element_bytes
    except KeyError:
        return 4


def _ctas(rows: pd.DataFrame) -> pd.Series:
    """CTAs of each row's main launch: CUPTI's count, else the product of ncu's grid."""
    none = pd.Series(np.nan, index=rows.index)
    traced = pd.to_numeric(rows.get("traced_ctas", none), errors="coerce").astype(float)
    grid = rows["grid"].map(_grid_size) if "grid" in rows.columns else none
    return traced.fillna(grid.astype(float))


def _grid_size(grid: Any) -> float:
    try:
        x, y, z = (int(v) for v in str(grid).split("x"))
    except ValueError:
        return math.nan
    return float(x * y * z)


def _time_columns(rows: pd.DataFrame) -> str:
    """The time a rule over several cases compares: the kernels' where every row has it."""
    if "kernel_time_ms" in rows.columns and rows["kernel_time_ms"].notna().all() and len(rows):
        return "kernel_time_ms"
    return "time_ms"


def _time_words(column: str) -> str:
    return (
        "the kernels' time (CUPTI)"
        if column == "kernel_time_ms"
        else "the calls' time (CUDA events)"
    )


def _pair_verdict(fast: pd.Series, slow: pd.Series, column: str, margin: float) -> Verdict:
    """verdicts.judge of two cases of one run: the between-run floor of the time compared."""
    prefix = column.removesuffix("_ms")
    a, b = Timed.from_row(fast, prefix), Timed.from_row(slow, prefix)
    if a is None or b is None:
        return Verdict.same
    kind = noise.kernel_kind(str(slow["mode"])) if prefix == "kernel_time" else "call"
    return judge(a, b, noise.load().floor(b.median_ms, kind), margin).verdict


def _kernel_timed(rows: pd.DataFrame) -> pd.DataFrame:
    if "kernel_time_ms" not in rows.columns:
        return rows.iloc[0:0]
    return rows[~rows["is_loop"]].dropna(subset=["kernel_time_ms"])


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
    workaround a user can apply today. Kernel times only (CUPTI): across cases, the host's share
    of a call's time is noise that can invert any two small calls."""
    t = ctx.thresholds
    rows = _kernel_timed(ctx.rows)
    found = []
    for _, series in rows.groupby(MAP_SERIES, dropna=False, sort=False):
        if len(series) < 2:
            continue
        on = _time_columns(series)
        times = series[on].astype(float).to_numpy()
        dims = series[["m", "n", "k"]].astype(int).to_numpy()
        for i in range(len(series)):
            larger = (dims >= dims[i]).all(axis=1) & (dims > dims[i]).any(axis=1)
            faster = larger & (times < times[i])
            if not faster.any():
                continue
            j = int(np.argmin(np.where(faster, times, np.inf)))
            row, best = series.iloc[i], series.iloc[j]
            if _pair_verdict(best, row, on, t.inversion_margin_pct / 100) is not Verdict.slower:
                continue
            message = (
                f"{row['shape']} takes {times[i] / times[j]:.2f}x the time of the larger "
                f"{best['shape']} ({row['kernel_short']} against {best['kernel_short']}), "
                f"comparing {_time_words(on)}."
            )
            padded = f"{best['m']}x{best['n']}x{best['k']}"
            work = f"Pad the problem to {padded} (with zeros): it runs sooner."
            finding = _finding("size-inversion", "medium", series.iloc[[i]], message, work)
            # effect: the share of the time padding saves (a cliff's is the throughput lost)
            found.append(_compared(finding, best.name, 1 - times[j] / times[i]))
    return found


def dispatch_cliff(ctx: RuleContext) -> list[Finding]:
    """Between neighbouring grid points (consecutive square sizes, or consecutive values of one
    dimension with the other two fixed): where the dispatched kernel changes and throughput drops
    by at least `cliff_drop_pct` (kernel times only, as size-inversion)."""
    t = ctx.thresholds
    rows = _kernel_timed(ctx.rows)
    found = []
    for _, series in rows.groupby(MAP_SERIES, dropna=False, sort=False):
        on = _time_columns(series)
        dims = series[["m", "n", "k"]].astype(np.int64).to_numpy()
        flops = 2.0 * dims.prod(axis=1).astype(float) * series["batch"].astype(float).to_numpy()
        rate = flops / series[on].astype(float).to_numpy()
        kernels = series["kernel_short"].fillna("").astype(str).to_numpy()
        before, after = _neighbours(dims)
        drop = 1 - rate[after] / rate[before]
        cliff = (kernels[after] != kernels[before]) & (drop * 100 >= t.cliff_drop_pct)
        for b, a, lost in zip(before[cliff], after[cliff], drop[cliff], strict=True):
            first, then = series.iloc[b], series.iloc[a]
            message = (
                f"From {first['shape']} to {then['shape']} the kernel changes from "
                f"{first['kernel_short']} to {then['kernel_short']} and throughput drops by "
                f"{100 * lost:.0f} %, comparing {_time_words(on)}."
            )
            work = (
                f"Pad to a size that keeps {first['kernel_short']}, or take it through cuBLASLt "
                "if its heuristic lists it."
            )
            finding = _finding("dispatch-cliff", "medium", series.iloc[[a]], message, work)
            found.append(_compared(finding, first.name, lost))
    return found


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


def _compared(finding: Finding, row: Hashable, effect: float) -> Finding:
    """The finding with the row it was compared with (an index label of the prepared table)."""
    return replace(finding, compared=[int(cast(int, row))], effect=round(float(effect), 4))


RULES: list[Rule] = [
    no_escalation,
    legacy_kernel,
    low_utilization,
    reference_faster,
    batched_slower_than_loop,
    better_candidate,
    layout_penalty,
    broadcast_slower_than_folded,
    underfilled_grid,
    size_inversion,
    dispatch_cliff,
]


# ----- helpers ----------------------------------------------------------------------------------


def _dispatched(rows: pd.DataFrame) -> pd.DataFrame:
    """Profiled cuBLAS calls: rows with a kernel, loops excluded (they only carry a time)."""
    return rows[~rows["is_loop"] & rows["kernel_short"].notna()]


def _by_kernel(rows: pd.DataFrame) -> Iterator[pd.DataFrame]:
    """Groups of one series and one kernel, sizes ascending."""
    # dropna=False: a table from elsewhere may carry times but no kernel names.
    for _, group in rows.groupby([*SERIES, "kernel_short"], sort=True, dropna=False):
        yield group.sort_values("size")


def _kernel_runs(rows: pd.DataFrame, min_range: float = 1.0) -> Iterator[pd.DataFrame]:
    """Per series, the maximal runs of consecutive sizes that dispatch the same kernel, spanning
    at least `min_range` in linear size (a dense map has thousands of one-size runs)."""
    for _, series in rows.groupby(SERIES, sort=True):
        series = series.sort_values("size")
        kernels = series["kernel_short"].astype(object)
        run_id = (kernels != kernels.shift()).cumsum()
        sizes = series["size"].groupby(run_id)
        wide = sizes.transform("max") / sizes.transform("min") >= min_range
        for _, run in series[wide].groupby(run_id[wide], sort=False):
            yield run


def _finding(rule: str, severity: str, group: pd.DataFrame, message: str, work: str) -> Finding:
    first = group.iloc[0]
    return Finding(
        rule=rule,
        severity=severity,
        gpu_label=str(first["gpu_label"]),
        api=str(first["api"]),
        routine=str(first["routine"]),
        mode=str(first["mode"]),
        batch=int(first["batch"]),
        sizes=[str(s) for s in group["shape"]],
        kernel=_kernel_of(group),
        message=message,
        workaround=work,
        kernel_name="" if pd.isna(first["kernel"]) else str(first["kernel"]),
        rows=[int(i) for i in group.index],
        evidence=_evidence(group),
    )


def _kernel_of(group: pd.DataFrame) -> str:
    short = group["kernel_short"].iloc[0]
    return "" if pd.isna(short) else str(short)


def _evidence(group: pd.DataFrame) -> list[dict[str, Any]]:
    columns = [c for c in EVIDENCE_COLUMNS if c in group.columns]
    return [
        {str(column): plain(value) for column, value in record.items()}
        for record in group[columns].to_dict("records")
    ]


def plain(value: Any) -> Any:
    """A JSON-ready evidence value, floats rounded to 4 decimals (table.plain)."""
    return table_plain(value, EVIDENCE_DIGITS)


def _size_list(group: pd.DataFrame) -> str:
    shapes = list(group["shape"])
    return f"size {shapes[0]}" if len(shapes) == 1 else f"sizes {', '.join(shapes)}"


def _pct_range(values: pd.Series) -> str:
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:.0f} %" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f} %"


def _ratio_range(values: pd.Series) -> str:
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:.2f}x" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}x"
