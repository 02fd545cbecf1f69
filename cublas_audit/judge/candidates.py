"""The cuBLASLt heuristic audit's verdicts: is cuBLASLt's pick its fastest algorithm?

device.candidate_audit runs every candidate of the heuristic, checks and times it; the table it
writes is table.candidates_table's; this module judges a recorded candidates.csv anywhere: each
case's summary and the `better-candidate` findings. `left_on_table = t_default / t_best` says
how much the default leaves behind, on the case's timing basis (its kernels' time where every
timed candidate has one, else its calls'); a second, independent timing round of the default and
the best confirms or refutes a gap before it becomes a finding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.judge.timed_rows import ratio_verdict
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.table.candidates_table import PROBLEM_LAYOUT, basis_ms, problem_case
from cublas_audit.table.dispatch import plain
from cublas_audit.vocabulary import Severity

RULE = "better-candidate"
DEFAULT_THRESHOLD = Thresholds().candidate_gap_pct / 100

# What a case's summary reads: the rest of a candidate's columns would only be copied around.
_SUMMARY_COLUMNS = [
    "case_id", "mode", "m", "n", "k", "batch", *PROBLEM_LAYOUT, "candidate", "is_default",
    "status", "reason", "basis_ms", "timing_basis", "rank", "left_on_table",
    "confirm_left_on_table",
]  # fmt: skip


def case_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per case: its layout, counts, the default's rank, the best candidate, the times
    on the case's basis and both gap measurements. (Each case's few rows are summarized as plain
    records: a pandas filter per field of each case cost a fifth of a second per audit.)"""
    cases: dict[Any, list[dict[str, Any]]] = {}
    # basis_ms: each row's time on its case's basis, what the summary's times and best read
    for record in _records(frame.assign(basis_ms=basis_ms(frame)), _SUMMARY_COLUMNS):
        cases.setdefault(record["case_id"], []).append(record)
    return pd.DataFrame([_summarize(case_id, rows) for case_id, rows in cases.items()])


def _records(frame: pd.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in record.items()} for record in frame[columns].to_dict("records")]


def _summarize(case_id: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = rows[0]
    listed = [row for row in rows if pd.notna(row["candidate"])]
    default = [row for row in listed if pd.notna(row["is_default"]) and row["is_default"] == 1]
    best = _best(rows)
    return {
        "case_id": case_id,
        **{key: first[key] for key in ("mode", "m", "n", "k", "batch")},
        "layout": layout_words(first),
        "candidates": len(listed),
        "correct": sum(row["status"] == "ok" for row in listed),
        "default_candidate": default[0]["candidate"] if default else pd.NA,
        "default_rank": default[0]["rank"] if default else pd.NA,
        "default_ms": default[0]["basis_ms"] if default else pd.NA,
        "best_candidate": best["candidate"] if best is not None else pd.NA,
        "best_ms": best["basis_ms"] if best is not None else pd.NA,
        "timing_basis": first["timing_basis"],
        "left_on_table": first["left_on_table"],
        "confirm_left_on_table": first["confirm_left_on_table"],
        "status": "skipped" if not listed else "ok",
        "reason": first["reason"] if not listed else pd.NA,
    }


def _best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest correct candidate on the case's basis (ties: the heuristic's earlier one)."""
    timed = [row for row in rows if row["status"] == "ok" and pd.notna(row["basis_ms"])]
    if not timed:
        return None
    return min(timed, key=lambda row: (row["basis_ms"], row["candidate"]))


@dataclass(frozen=True)
class ScreenJudge:
    """What the audit's measuring child (device.candidate_audit.Screen) asks between rounds:
    whether a problem's first round shows a gap worth a confirmation round; its progress line."""

    threshold: float = DEFAULT_THRESHOLD

    def confirm(self, rows: pd.DataFrame) -> str | None:
        """The best candidate's key where it beats the default by at least the threshold in the
        first round (one problem's rows); None: no confirmation round."""
        summary = case_summary(rows).iloc[0]
        gap, best = plain(summary["left_on_table"]), plain(summary["best_candidate"])
        if gap is None or best is None or best == plain(summary["default_candidate"]):
            return None
        return str(best) if gap >= 1.0 + self.threshold else None

    def progress_line(self, case_id: str, rows: pd.DataFrame) -> str:
        summary = case_summary(rows).iloc[0]
        if summary["status"] == "skipped":
            return f"{case_id}: skipped ({summary['reason']})"
        basis = plain(summary["timing_basis"])
        return (
            f"{case_id} ({summary['layout']}): {summary['candidates']} candidates, "
            f"{summary['correct']} correct, default rank {plain(summary['default_rank'])}, "
            f"left on table {_three_decimals(summary['left_on_table'])}"
            + (f" on {basis} time" if basis else "")
        )


def _three_decimals(value: Any) -> str:
    value = plain(value)
    return "—" if value is None else f"{float(value):.3f}"


# Run-to-run spread of left_on_table, the ratio of two interleaved timings in one process: at most
# 4.75 % over three audits of the default batched grid on the H100
# (benchmarks/results/candidates_speed_h100.json, max_spread), with a margin. Interleaving makes
# this far smaller than the spread of one call's time between runs (cublas_audit.judge.noise).
INTERLEAVED_FLOOR = 0.06


def is_better(left_on_table: Any, confirm_left_on_table: Any, threshold: float) -> bool:
    """Both the audit round and the independent confirmation round call the default slower than
    the best candidate (verdicts.judge: a gap of at least `threshold` beyond the interleaved
    floor)."""
    rounds = (plain(left_on_table), plain(confirm_left_on_table))
    if any(ratio is None or not ratio > 0 for ratio in rounds):
        return False
    return all(
        ratio_verdict(float(ratio), INTERLEAVED_FLOOR, threshold) is Verdict.slower
        for ratio in rounds
    )


def rounds_hold(speedups: Sequence[float], threshold: float) -> bool:
    """A fix (or a pin) re-measured in interleaved rounds, each the default's time over the
    fixed call's: it holds where every round calls the default slower (verdicts.judge: beyond the
    interleaved floor and `threshold`), as is_better asks of the audit's two rounds."""
    return bool(speedups) and all(
        ratio_verdict(ratio, INTERLEAVED_FLOOR, threshold) is Verdict.slower for ratio in speedups
    )


def floor_words(threshold: float) -> str:
    """What a fix's rounds must beat, in words: '6% interleaved floor + 10%'."""
    return f"{INTERLEAVED_FLOOR:.0%} interleaved floor + {threshold:.0%}"


def find_better_candidates(
    frame: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD
) -> list[Finding]:
    """`better-candidate` findings: cases whose best candidate beats the default by >= threshold
    in the audit round and again in the confirmation round.

    Each finding's `rows` are the index labels of the default's and the best's rows in `frame`
    (the candidates table's: the rule `better-candidate` places it on the dispatch table's rows),
    `evidence` their records (role, case, configuration, times, both left_on_table measurements).
    """
    # The gaps repeat on every row of a case: judge each case on its first, slice only the flagged.
    frame = frame.assign(basis_ms=basis_ms(frame))
    firsts = frame.drop_duplicates("case_id")
    gaps = firsts[["case_id", "left_on_table", "confirm_left_on_table"]].itertuples(index=False)
    flagged = [case_id for case_id, left, confirm in gaps if is_better(left, confirm, threshold)]
    findings = []
    for case_id in flagged:
        rows = frame[frame["case_id"] == case_id]
        first = rows.iloc[0]
        default = rows[rows["is_default"] == 1].iloc[0]
        picked = _best(_records(rows, ["candidate", "status", "basis_ms"]))
        assert picked is not None  # a finite left_on_table implies a timed best
        best = rows[rows["candidate"] == picked["candidate"]].iloc[0]
        findings.append(_finding(first, default, best))
    return findings


def _finding(first: pd.Series, default: pd.Series, best: pd.Series) -> Finding:
    left = float(first["left_on_table"])
    confirm = float(first["confirm_left_on_table"])
    return Finding(
        rule=RULE,
        severity=Severity.medium,
        gpu_label=plain(first["gpu_label"]) or "",
        api="cublasLt",
        routine="cublasLtMatmul",
        mode=str(first["mode"]),
        batch=int(first["batch"]),
        sizes=[f"{first['m']}x{first['n']}x{first['k']}"],
        kernel=describe(default),
        message=(
            f"{problem_name(first)}: cuBLASLt's default algorithm ({describe(default)}) takes "
            f"{confirm:.2f}x the {first['timing_basis']} time of its heuristic's candidate "
            f"#{int(best['candidate'])} ({describe(best)}) when the two run alone, interleaved "
            f"(the screen of every candidate measured {left:.2f}x)"
        ),
        workaround=(
            f"Run candidate #{int(best['candidate'])}: take it from "
            "cublasLtMatmulAlgoGetHeuristic's list, or build it with cublasLtMatmulAlgoInit and "
            "cublasLtMatmulAlgoConfigSetAttribute (the repro below); nvmath-python's "
            "Matmul.autotune() finds it too."
        ),
        kernel_name="",
        rows=[plain(default.name), plain(best.name)],
        evidence=[_evidence(default, "default"), _evidence(best, "best")],
        compared=[],
        # the share of the default's time the best saves, by the pairwise round: the claim
        # (table.fix_file.Fix.claimed says why not the screen's)
        effect=round(1 - 1 / confirm, 4),
        observations=[],  # judge.grouping: a heuristic's ranking explains no other finding
        impact={},  # judge.impact weighs it (the time it saves a call; a trace's share)
        verdict=Verdict.slower,  # the default, in both rounds (is_better)
    )


_EVIDENCE_COLUMNS = (
    "case_id",
    "m",
    "n",
    "k",
    "batch",
    *PROBLEM_LAYOUT,
    "candidate",
    "algo_id",
    "tile",
    "stages",
    "split_k",
    "reduction_scheme",
    "cta_swizzling",
    "cluster_shape",
    "custom_option",
    "inner_shape",
    "workspace_bytes",
    "time_ms",
    "confirm_time_ms",
    "kernel_ms",
    "kernel_confirm_ms",
    "kernels",
    "timing_basis",
    "left_on_table",
    "confirm_left_on_table",
)


def _evidence(row: pd.Series, role: str) -> dict[str, Any]:
    return {"role": role, **{key: plain(row[key]) for key in _EVIDENCE_COLUMNS}}


def describe(row: pd.Series) -> str:
    """'algo 55, tile 64x64, stages 8x3, split-K 1' (what a reader compares at a glance)."""
    parts = [f"algo {plain(row['algo_id'])}", f"tile {plain(row['tile'])}"]
    parts.append(f"stages {plain(row['stages'])}")
    parts.append(f"split-K {plain(row['split_k'])}")
    return ", ".join(parts)


def problem_name(row: Any) -> str:
    """'fp32 256x256x256 batch 8', then how the problem is posed where the row says and it is
    not packed nn ('tn lda4100 bias')."""
    name = f"{row['mode']} {row['m']}x{row['n']}x{row['k']} batch {row['batch']}"
    case = problem_case(row)
    return f"{name} {case.variant}" if case is not None and case.variant else name


# What a table recorded before layouts (candidates.csv version 1) says of a problem's layout.
LAYOUT_UNKNOWN = "layout unknown"


def layout_words(row: Any) -> str:
    """How the row's problem is posed: 'nn', 'tn lda4100 bias', or LAYOUT_UNKNOWN (a version-1
    row: timed as packed nn, whatever its sweep's case was)."""
    case = problem_case(row)
    if case is None:
        return LAYOUT_UNKNOWN
    return case.variant or case.layout


@dataclass(frozen=True)
class CandidateVerdicts:
    """A candidate audit judged once, at one threshold: the table, one summary row per case with
    whether it is `flagged` (both rounds beyond the threshold), each flagged case's finding (as
    find_better_candidates gives it) and its best candidate described. Reports render this."""

    frame: pd.DataFrame
    summary: pd.DataFrame
    flagged: list[Finding]
    threshold: float


def judge_candidates(
    frame: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD
) -> CandidateVerdicts:
    summary = case_summary(frame)
    flagged = [
        is_better(gap, confirmed, threshold)
        for gap, confirmed in zip(
            summary["left_on_table"], summary["confirm_left_on_table"], strict=True
        )
    ]
    # each case's best candidate, described: one merge, not a lookup per case
    columns = ["case_id", "candidate", "algo_id", "tile", "stages", "split_k"]
    # the best's key in the table's own type: a summary whose every case has no best (all
    # skipped, all wrong) holds only NA, which pandas will not merge with the table's integers
    keys = summary[["case_id", "best_candidate"]].astype(
        {"best_candidate": frame["candidate"].dtype}
    )
    best = keys.merge(
        frame[columns].drop_duplicates(["case_id", "candidate"]),
        left_on=["case_id", "best_candidate"],
        right_on=["case_id", "candidate"],
        how="left",
    )
    described = [describe(row) if pd.notna(row["candidate"]) else "" for _, row in best.iterrows()]
    summary = summary.assign(flagged=flagged, best_described=described)
    return CandidateVerdicts(frame, summary, find_better_candidates(frame, threshold), threshold)
