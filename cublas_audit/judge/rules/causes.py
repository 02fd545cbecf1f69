"""`unaligned-operand`: a root cause the tool can name. Hopper's fast tensor-core kernels (TMA
based) read rows of 16-byte multiples; a dimension or leading dimension that is not one leaves the
dispatcher the older, slower kernels. On the H100 (reports/h100/checks/20261125-074637-k140), bf16
1024x1024x140 batch 8 dispatches an sm80 `tensorop_s16816gemm` (0.0210 ms of kernel time); with K
padded to 144 (zeros add nothing) it dispatches `nvjet_tst` (0.0097 ms), 2.16x faster (1.31x on
the call's time, launch included); padding only ldb to 144 changes nothing, so the cause is K.

Fires on a tensor-core call with such a dimension where the table shows a cost: the same problem
with the cause removed measured in the same run, or a kernel of an older architecture than the
GPU's. The cause removed is each variant the sweep plans (planning.cases.
with_cause_removed_companions) or the table holds: padded (M, N, K rounded up, packed, in the
call's own layout), and, where the call's leading dimensions or batch strides are unaligned, the
same dimensions posed with every one aligned (the other layout, or padded leading dimensions).
The finding states each one's measured effect. Severity from proof: the best variant faster
beyond the noise model is high from `high_ratio` up, else medium; none faster is info, and no
measurement is info, saying what to measure. A row that is itself such an aligned variant of
another row, with no padded problem of its own, is stated in that row's finding, not in its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from cublas_audit.judge.finding import Finding, of_group, with_compared
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.rules.frame import RuleContext, call_of, dispatched
from cublas_audit.judge.rules.occupancy import ctas
from cublas_audit.judge.timed_rows import judged_time, pair_verdict, time_words
from cublas_audit.judge.verdicts import Verdict
from cublas_audit.observe.kernels import normalize
from cublas_audit.planning.cases import ALIGN_BYTES, misaligned_strides
from cublas_audit.planning.modes import MODES
from cublas_audit.vocabulary import Severity

SAME_PROBLEM = ["gpu_label", "api", "routine", "mode", "batch", "broadcast", "beta"]


def unaligned_operand(ctx: RuleContext) -> list[Finding]:
    t = ctx.thresholds
    rows = dispatched(ctx.rows)
    tensor = rows["mode"].map(lambda m: m in MODES and MODES[m].pipe == "tensor-pipe")
    rows = rows[tensor.astype(bool)]
    found = []
    for index, row in rows.iterrows():
        causes = unaligned(row)
        if not causes:
            continue
        same = _same_problem(rows, row)
        variants = _measured_variants(same, row)
        if not variants and _aligned_variant_of_another(same, row):
            continue  # its measurement is stated in that row's finding
        older = _older_kernel(row)
        if not variants and older is None:
            continue
        found.append(
            _finding(rows.loc[[index]], row, causes, variants, older, t.high_ratio, ctx.model)
        )
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


def _strides_aligned(row: pd.Series) -> bool | None:
    """Whether every leading dimension and batch stride cuBLAS is given (ldc and the packed
    ones included) is a 16-byte multiple; None where the row makes no call."""
    call = call_of(row)
    return None if call is None else not misaligned_strides(call)


def _same_problem(rows: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The rows of the run that pose the row's problem (any size or layout) to the same call."""
    # one mask, then one take: a filter a column took every column of the table each time
    same = np.ones(len(rows), dtype=bool)
    for column in SAME_PROBLEM:
        if column in rows.columns:
            same &= (rows[column].astype(str) == str(row[column])).to_numpy(dtype=bool)
    return rows[same]


@dataclass(frozen=True)
class _Variant:
    """A row of the same problem with the cause removed, and what removed it, in words."""

    row: pd.Series
    said: str  # 'padded to 1024x1024x144', 'in layout nt (every leading dimension ...)'
    layout: str  # the layout to store the operands in, where that is the fix; else ''


def _measured_variants(same: pd.DataFrame, row: pd.Series) -> list[_Variant]:
    """The cause removed, timed in the run: padded, then the aligned leading dimensions."""
    timed = same.dropna(subset=["time_ms"])
    padded = _padded(timed, row)
    found = [] if padded is None else [_Variant(padded, f"padded to {padded['shape']}", "")]
    return found + _aligned_variants(timed, row)


def _aligned(value: int, per: int) -> int:
    return -(-value // per) * per


def _padded(same: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The same problem in the call's layout with every dimension rounded up to a 16-byte
    multiple, leading dimensions and strides aligned: the cause removed, measured. Its layout is
    the row's: against another layout's the gain would be the layout's as well."""
    if not _unaligned_dims(row):
        return None  # nothing to pad: an unaligned lda / ldb is _aligned_variants' to state
    per = ALIGN_BYTES // MODES[str(row["mode"])].element_bytes
    same = same[(same["transa"] == row["transa"]) & (same["transb"] == row["transb"])]
    for name in ("m", "n", "k"):
        same = same[same[name] == _aligned(int(row[name]), per)]
    fixed = [other for _, other in same.iterrows() if _fully_aligned(other)]
    return fixed[0] if fixed else None


def _fully_aligned(row: pd.Series) -> bool:
    return not unaligned(row) and bool(_strides_aligned(row))


def _aligned_variants(same: pd.DataFrame, row: pd.Series) -> list[_Variant]:
    """Where the row's leading dimensions or batch strides are unaligned: the rows of the same
    dimensions with every one aligned (another layout, or padded leading dimensions)."""
    if _strides_aligned(row) is not False:
        return []
    still = [f"{name.upper()} still {int(row[name])}" for name in _unaligned_dims(row)]
    aligned = ", ".join(["every leading dimension 16-byte aligned", *still])
    found = []
    for _, other in _same_dimensions(same, row).iterrows():
        if _strides_aligned(other):
            posed, layout = _posed(other, row)
            said = f"{posed} ({aligned})"
            found.append(_Variant(other, said, layout))
    return found


def _unaligned_dims(row: pd.Series) -> list[str]:
    """'k', 'm', 'n' where that dimension's bytes are no multiple of 16 (unaligned's order)."""
    item = MODES[str(row["mode"])].element_bytes
    return [name for name in ("k", "m", "n") if int(row[name]) * item % ALIGN_BYTES]


def _posed(other: pd.Series, row: pd.Series) -> tuple[str, str]:
    """How `other` poses the row's problem, in words ('in layout nt', 'with ldb 144'), and its
    layout where that differs from the row's ('' where not)."""
    layout = f"{other['transa']}{other['transb']}"
    relaid = layout if layout != f"{row['transa']}{row['transb']}" else ""
    words = [f"in layout {relaid}"] if relaid else []
    words += [f"with {name} {int(other[name])}" for name in ("lda", "ldb") if int(other[name])]
    return " ".join(words) or "packed", relaid


def _aligned_variant_of_another(same: pd.DataFrame, row: pd.Series) -> bool:
    """Whether the row is the aligned variant of another row of its dimensions (its leading
    dimensions and strides aligned, the other's not): the other's finding states it."""
    if not _strides_aligned(row):
        return False
    others = _same_dimensions(same, row)
    return any(_strides_aligned(other) is False for _, other in others.iterrows())


def _same_dimensions(same: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    dims = (same["m"] == row["m"]) & (same["n"] == row["n"]) & (same["k"] == row["k"])
    found: pd.DataFrame = same[dims]
    return found


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


@dataclass(frozen=True)
class _Measured:
    """A variant against the flagged row: how much faster it runs, and whether beyond noise."""

    variant: _Variant
    ratio: float
    faster: bool
    words: str


def _measured(variant: _Variant, row: pd.Series, model: NoiseModel | None) -> _Measured:
    """The variant against the row on the time both traced (kernels', else the call's), judged by
    the audit's noise model (pair_verdict: the row confidently slower; None: the shipped one), in
    the finding's words."""
    fixed = variant.row
    pair = pd.DataFrame([fixed, row])
    on = judged_time(pair)
    took = "kernel_time_ms" if on == "kernel" else "time_ms"
    ratio = float(row[took]) / float(fixed[took])
    if pair_verdict(fixed, row, on, 0.0, model) is not Verdict.slower:
        words = f"{variant.said} it is no faster measurably ({ratio:.2f}x)"
        return _Measured(variant, ratio, False, words)
    words = (
        f"{variant.said} it runs {ratio:.2f}x faster on {fixed['kernel_short']} "
        f"(measured in this run, {time_words(on)}, beyond the noise floor)"
    )
    return _Measured(variant, ratio, True, words)


def _finding(
    group: pd.DataFrame,
    row: pd.Series,
    causes: list[str],
    variants: list[_Variant],
    older: str | None,
    high_ratio: float,
    model: NoiseModel | None = None,
) -> Finding:
    said = "; ".join(causes)
    kernel = f"{row['kernel_short']}" + (f" (an {older} kernel)" if older else "")
    if not variants:
        message = (
            f"{said}: cuBLAS dispatches {kernel} at {row['shape']}. Not measured with the cause "
            "removed: run the problem with the dimension rounded up (zero-padded) beside it."
        )
        return of_group("unaligned-operand", Severity.info, group, message, _work(None, row))
    measured = [_measured(variant, row, model) for variant in variants]
    effects = "; ".join(m.words for m in measured)
    message = f"{said}: cuBLAS dispatches {kernel} at {row['shape']}; {effects}."
    faster = [m for m in measured if m.faster]
    if not faster:
        return of_group("unaligned-operand", Severity.info, group, message, _work(None, row))
    best = max(faster, key=lambda m: m.ratio)  # the proof: the most the call gains
    severity = Severity.high if best.ratio >= high_ratio else Severity.medium
    finding = of_group("unaligned-operand", severity, group, message, _work(best.variant, row))
    # the share of the call's time the fix gives back (what the report ranks proof by), and the
    # row that proves it (what `fix` turns into a shape change)
    return with_compared(finding, best.variant.row.name, 1 - 1 / best.ratio)


def _padding(row: pd.Series) -> list[str]:
    """Each unaligned dimension and leading dimension of the row with the value it rounds up to
    ('K = 2073 up to 2080'): the row's own figures, in `unaligned`'s order."""
    per = ALIGN_BYTES // MODES[str(row["mode"])].element_bytes
    given = [(name, int(row[name])) for name in _unaligned_dims(row)]
    for name in ("lda", "ldb"):
        value = int(row[name]) if pd.notna(row.get(name)) else 0
        if value and value % per:
            given.append((name, value))
    return [
        f"{name.upper() if len(name) == 1 else name} = {value} up to {_aligned(value, per)}"
        for name, value in given
    ]


def _rounding(row: pd.Series) -> str:
    """'round K = 140 up to 144', with the slice to take where M or N grows."""
    steps = _padding(row)
    said = steps[0] if len(steps) == 1 else f"{', '.join(steps[:-1])} and {steps[-1]}"
    grown = any(name in _unaligned_dims(row) for name in ("m", "n"))
    sliced = f", then take the result's {int(row['m'])}x{int(row['n'])} slice" if grown else ""
    return f"round {said}{sliced}"


def _work(best: _Variant | None, row: pd.Series) -> str:
    """The workaround the best measured variant proves (its layout, else padding), in the row's
    own dimensions and values; padding where nothing was measured faster."""
    pad = f"to a multiple of {ALIGN_BYTES} bytes with zeros: {_rounding(row)}"
    if best is None or not best.layout:
        return (
            f"Pad {pad}. Zeros add nothing to the product, and the Hopper kernels become eligible."
        )
    return (
        f"Store the operands as layout {best.layout} expects (transpose once, outside the hot "
        f"loop): every leading dimension is then a 16-byte multiple. Or pad {pad}."
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
