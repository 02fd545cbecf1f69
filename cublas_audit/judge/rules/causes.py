"""`unaligned-operand`: a root cause the tool can name. Hopper's fast tensor-core kernels (TMA
based) read rows of 16-byte multiples; a dimension or leading dimension that is not one leaves the
dispatcher the older, slower kernels. On the H100 (reports/h100/checks/20261125-074637-k140), bf16
1024x1024x140 batch 8 dispatches an sm80 `tensorop_s16816gemm` (0.0210 ms of kernel time); with K
padded to 144 (zeros add nothing) it dispatches `nvjet_tst` (0.0097 ms), 2.16x faster (1.31x on
the call's time, launch included); padding only ldb to 144 changes nothing, so the cause is K.

Fires on a tensor-core call with such a dimension where the table shows a cost: the same problem
with the cause removed (K, M or N rounded up, or the leading dimensions aligned) measured in the
same run, or a kernel of an older architecture than the GPU's. Severity from proof: the measured
alternative faster beyond the noise model is high from `high_ratio` up, else medium; no
measurement is info, saying what to measure.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from cublas_audit.judge.finding import Finding, of_group
from cublas_audit.judge.rules.frame import RuleContext, dispatched
from cublas_audit.judge.rules.occupancy import ctas
from cublas_audit.judge.timed_rows import judged_time, pair_verdict, time_words
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.observe.kernels import normalize
from cublas_audit.planning.cases import ALIGN_BYTES
from cublas_audit.planning.modes import MODES

SAME_PROBLEM = ["gpu_label", "api", "routine", "mode", "batch", "broadcast", "beta"]


def unaligned_operand(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    rows = dispatched(ctx.rows)
    tensor = rows["mode"].map(lambda m: m in MODES and MODES[m].pipe == "tensor-pipe")
    found = []
    for index, row in rows[tensor.astype(bool)].iterrows():
        causes = unaligned(row)
        if not causes:
            continue
        fixed = _cause_removed(rows, row)
        older = _older_kernel(row)
        if fixed is None and older is None:
            continue
        found.append(_finding(rows.loc[[index]], row, causes, fixed, older, t.high_ratio))
    return found


def unaligned(row: pd.Series) -> list[str]:
    """The dimensions and leading dimensions whose bytes are no multiple of 16, in words."""
    item = MODES[str(row["mode"])].element_bytes
    per = ALIGN_BYTES // item
    causes = [
        f"{name.upper()} = {int(row[name])} is not a multiple of {per} {row['mode']} elements "
        f"({ALIGN_BYTES} bytes)"
        for name in ("k", "m", "n")
        if int(row[name]) * item % ALIGN_BYTES
    ]
    for name in ("lda", "ldb"):
        given = int(row.get(name) or 0) if pd.notna(row.get(name)) else 0
        if given and given * item % ALIGN_BYTES:
            causes.append(f"{name} = {given} is not a multiple of {per} elements")
    return causes


def _aligned(value: int, per: int) -> int:
    return -(-value // per) * per


def _cause_removed(rows: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The same problem in the same run with every dimension rounded up to a 16-byte multiple
    and no unaligned leading dimension: the cause removed, measured."""
    per = ALIGN_BYTES // MODES[str(row["mode"])].element_bytes
    same = rows
    for column in SAME_PROBLEM:
        if column in rows.columns:
            same = same[same[column].astype(str) == str(row[column])]
    target = {name: _aligned(int(row[name]), per) for name in ("m", "n", "k")}
    for name, value in target.items():
        same = same[same[name] == value]
    aligned = pd.Series([not unaligned(other) for _, other in same.iterrows()], index=same.index)
    same = same[aligned.astype(bool)]
    timed = same.dropna(subset=["time_ms"])
    return None if timed.empty else timed.iloc[0]


def _older_kernel(row: pd.Series) -> str | None:
    """'sm80' where the dispatched kernel is of an older architecture than the GPU's (cc)."""
    arch = normalize(str(row.get("kernel_name") or "")).arch
    cc = str(row.get("cc") or "")
    if not arch.startswith("sm") or not cc:
        return None
    kernel_cc = int(arch[2:]) if arch[2:].isdigit() else None
    gpu_cc = int(float(cc) * 10) if cc.replace(".", "", 1).isdigit() else None
    if kernel_cc is None or gpu_cc is None or kernel_cc >= gpu_cc:
        return None
    return arch


def _finding(
    group: pd.DataFrame,
    row: pd.Series,
    causes: list[str],
    fixed: pd.Series | None,
    older: str | None,
    high_ratio: float,
) -> Finding:
    said = "; ".join(causes)
    kernel = f"{row['kernel_short']}" + (f" (an {older} kernel)" if older else "")
    if fixed is None:
        message = (
            f"{said}: cuBLAS dispatches {kernel} at {row['shape']}. Not measured with the cause "
            "removed: run the problem with the dimension rounded up (zero-padded) beside it."
        )
        return of_group("unaligned-operand", "info", group, message, _WORK)
    pair = pd.DataFrame([fixed, row])
    on = judged_time(pair)
    took = "kernel_time_ms" if on == "kernel" else "time_ms"
    ratio = float(row[took]) / float(fixed[took])
    verdict = pair_verdict(fixed, row, on, 0.0)
    if verdict is Verdict.slower:
        severity = "high" if ratio >= high_ratio else "medium"
        effect = (
            f"padded to {fixed['shape']} it runs {ratio:.2f}x faster on {fixed['kernel_short']} "
            f"(measured in this run, {time_words(on)}, beyond the noise floor)"
        )
    else:
        severity = "info"
        effect = f"padded to {fixed['shape']} it is no faster measurably ({ratio:.2f}x)"
    message = f"{said}: cuBLAS dispatches {kernel} at {row['shape']}; {effect}."
    finding = of_group("unaligned-operand", severity, group, message, _WORK)
    return finding if severity == "info" else _with_effect(finding, ratio)


def _with_effect(finding: Finding, ratio: float) -> Finding:
    """The share of the call's time the fix gives back: what the report ranks proof by."""
    return replace(finding, effect=round(1 - 1 / ratio, 4))


_WORK = (
    "Pad the dimension (or the leading dimension) to a multiple of 16 bytes with zeros, e.g. "
    "round K up to 144: the product is unchanged and the Hopper kernels become eligible."
)


def named_causes(group: pd.DataFrame) -> str:
    """What the table says about why a call is slow, for its largest case: a dimension no
    16-byte multiple (`unaligned`), a grid short of one wave or with a nearly empty last wave
    (CTAs against the GPU's SMs), and whether cuBLAS split K (a reduction kernel follows the
    GEMM). "" where the table shows none."""
    row = group.sort_values("size", kind="stable").iloc[-1]
    mode = MODES.get(str(row["mode"]))
    said = unaligned(row) if mode is not None and mode.pipe == "tensor-pipe" else []
    count = float(ctas(group.loc[[row.name]]).iloc[0])
    sms = float(row["sm_count"]) if "sm_count" in row and pd.notna(row["sm_count"]) else 0.0
    if count > 0 and sms > 0:
        waves = count / sms
        idle = 1 - (waves - int(waves))
        grid = f"its {int(count)} CTA{'s' if count != 1 else ''}"
        if waves < 1:
            said.append(f"{grid} fill {waves:.0%} of the {int(sms)} SMs")
        elif 0.5 <= idle < 1:
            said.append(
                f"{grid} are {waves:.2f} waves on {int(sms)} SMs: the last wave "
                f"leaves {idle:.0%} of them idle"
            )
    after = str(row.get("traced_kernels") or "").split(" + ")[1:]  # the launches after the GEMM
    if any("reduce" in name.lower() for name in after):
        said.append("cuBLAS split K (a reduction kernel follows the GEMM)")
    return "; ".join(said)
