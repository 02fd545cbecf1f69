"""The `Finding` record every rule returns, its severities and their order, and the helpers that
turn the judged rows of a prepared table into one: its evidence and the words its message cites.

No rule lives here (they are under judge/rules/): a report, a diff or a follow-up that only reads
findings needs nothing else.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, cast

import pandas as pd

from cublas_audit.table.dispatch import cell_records
from cublas_audit.table.dispatch import plain as table_plain
from cublas_audit.vocabulary import Severity, Verdict

SEVERITIES = tuple(Severity)
EVIDENCE_DIGITS = 4
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
    # the roofline (judge.roofline), where the GPU's figures are known
    "intensity",
    "bound_side",
    "bound_tflops",
    "roofline_pct",
)


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
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
    # Other rules' findings of this problem that the same root cause explains (the other api's
    # too), each its whole JSON record: judge.grouping makes one finding per cause.
    observations: list[dict[str, Any]] = field(default_factory=list)
    # What the finding is worth (judge.impact): the time its fix saves a call; with a PyTorch
    # trace, the model's side (called or not, calls and time a step, share of its GEMM time).
    impact: dict[str, Any] = field(default_factory=dict)
    # The timing verdict the rule's claim rests on: `slower` (beyond the noise floor), `unsure`
    # (within it: an info finding the sweep re-measures, a map's follow-up decides); None where
    # the rule judged no timing comparison (counters, a kernel's name).
    verdict: Verdict | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as `dataclasses.asdict` makes it, without its deep copy of every value
        (0.4 ms a finding: 40 s for a dense map's 90,000); the cells are plain scalars."""
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("sizes", "rows", "compared"):
            record[name] = list(record[name])
        record["evidence"] = [dict(item) for item in self.evidence]
        record["observations"] = [dict(item) for item in self.observations]
        record["impact"] = dict(self.impact)
        return record


def order(finding: Finding) -> tuple[int, float, str, str, str, str, int, str]:
    """The order findings are listed in: most severe first; within a severity, proof first (the
    share of time a measured alternative gives back, `effect`, largest first; an observation
    without a measured alternative has none), then by GPU, rule and call."""
    return (
        Severity(finding.severity).rank,  # a severity given as its text ranks as its member
        -finding.effect,
        finding.gpu_label,
        finding.rule,
        finding.api,
        finding.mode,
        finding.batch,
        finding.kernel,
    )


def of_group(
    rule: str,
    severity: Severity,
    group: pd.DataFrame,
    message: str,
    work: str,
    verdict: Verdict | None = None,
) -> Finding:
    """A finding on the rows of `group` (prepared rows of one call: its first names the call)."""
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
        kernel=kernel_of(group),
        message=message,
        workaround=work,
        kernel_name="" if pd.isna(first["kernel"]) else str(first["kernel"]),
        rows=[int(i) for i in group.index],
        evidence=evidence(group),
        verdict=verdict,
    )


def of_rows(
    rule: str,
    severity: Severity,
    rows: pd.DataFrame,
    messages: Sequence[str],
    works: Sequence[str],
    compared: Iterable[Hashable],
    effects: Iterable[float],
    verdict: Verdict | None = None,
) -> list[Finding]:
    """A finding on each row of `rows` alone, compared with the row `compared` names, as
    `with_compared(of_group(...))` makes it: the columns read once for all (a dense map has tens
    of thousands of findings, and a table row read one at a time costs a millisecond)."""
    named = ["gpu_label", "api", "routine", "mode", "batch", "shape", "kernel_short", "kernel"]
    records = cell_records(rows[named])
    proofs = evidence(rows)
    return [
        Finding(
            rule=rule,
            severity=severity,
            gpu_label=str(record["gpu_label"]),
            api=str(record["api"]),
            routine=str(record["routine"]),
            mode=str(record["mode"]),
            batch=int(record["batch"]),
            sizes=[str(record["shape"])],
            kernel=_text(record["kernel_short"]),
            message=message,
            workaround=work,
            kernel_name=_text(record["kernel"]),
            rows=[int(label)],
            evidence=[proof],
            compared=[int(cast(int, other))],
            effect=round(float(effect), 4),
            verdict=verdict,
        )
        for record, label, proof, message, work, other, effect in zip(
            records, rows.index, proofs, messages, works, compared, effects, strict=True
        )
    ]


def _text(value: Any) -> str:
    return "" if pd.isna(value) else str(value)


def with_compared(finding: Finding, row: Hashable, effect: float) -> Finding:
    """The finding with the row it was compared with (an index label of the prepared table)."""
    return replace(finding, compared=[int(cast(int, row))], effect=round(float(effect), 4))


def kernel_of(group: pd.DataFrame) -> str:
    short = group["kernel_short"].iloc[0]
    return "" if pd.isna(short) else str(short)


def evidence(group: pd.DataFrame) -> list[dict[str, Any]]:
    columns = [c for c in EVIDENCE_COLUMNS if c in group.columns]
    return [
        {column: plain(value) for column, value in record.items()}
        for record in cell_records(group[columns])
    ]


def plain(value: Any) -> Any:
    """A JSON-ready evidence value, floats rounded to 4 decimals (table.plain)."""
    return table_plain(value, EVIDENCE_DIGITS)


def size_list(group: pd.DataFrame) -> str:
    shapes = list(group["shape"])
    return f"size {shapes[0]}" if len(shapes) == 1 else f"sizes {', '.join(shapes)}"


def pct_range(values: pd.Series) -> str:
    """'12 %', '12-30 %' over the measured values; rows without counters (a PyTorch trace's, a
    run observed with CUPTI) have none, and say so instead of a number."""
    measured = values.dropna()
    if measured.empty:
        return "unmeasured (no counters)"
    lo, hi = float(measured.min()), float(measured.max())
    return f"{lo:.0f} %" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f} %"


def ratio_range(values: pd.Series) -> str:
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:.2f}x" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}x"
