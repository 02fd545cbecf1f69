"""Every number the findings and the diff judge by, in one place (docs/report.md lists them).

`report` and `diff` take `--threshold name=value` to override any of them; the defaults are set
from the article's published data and the H100 runs bundled under reports/.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from cublas_audit.errors import AuditError

# At most this many rows in one table, or items in one list, of a Markdown report: its size is
# bounded whatever its input's (a 1,000,000-row table's report.md was 285 MB). JSON stays whole.
# Here, below the reports, since the judge chooses within it (judge.stall_pairs).
LISTED_MAX = 200


@dataclass(frozen=True)
class Thresholds:
    # no-escalation: one kernel dispatched over at least this linear-size ratio (largest /
    # smallest size of the run), reaching at least `escalation_min_size`, with pipe utilization
    # below `escalation_max_pct` at every size from `escalation_min_size` up. The RTX 5090 stays
    # at 42 % over 256..8192 (32x); healthy GPUs run their large-size kernels at 73-82 %.
    escalation_min_range: float = 8.0
    escalation_min_size: float = 4096
    escalation_max_pct: float = 60.0
    # low-utilization: below this fraction of the best utilization the same table shows for the
    # GPU and mode, judged only where the call fills the GPU (m * n * batch output elements at
    # least `fill_min_elements`: 2048^2 is 256 tiles of 128x128, about twice an H100's SMs).
    low_util_fraction: float = 0.6
    fill_min_elements: float = 2048 * 2048
    # reference-faster / batched-slower-than-loop: time differences within this margin are noise
    # (medians of 20+ interleaved repetitions vary by a few % between runs).
    reference_margin_pct: float = 5.0
    loop_margin_pct: float = 5.0
    # A slowdown of at least this ratio makes those two findings high severity.
    high_ratio: float = 1.25
    # better-candidate: cuBLASLt's best heuristic candidate beats its default by at least this
    # much, in the audit round and again in a second, independent round. Three audits of the
    # default batched grid on the H100 put run-to-run spread of that ratio at 4.8 % at most
    # (benchmarks/results/candidates_speed_h100.json).
    candidate_gap_pct: float = 10.0
    # layout-penalty: the same problem, mode and call is at least this much slower in one layout
    # (transa, transb) than in the best one, beyond noise. On the H100, FP32 2048^3 batch 8 in
    # `tt` (xmma 64x64) takes 1.19x the time of `nt` (reports/h100/layouts/).
    layout_penalty_ratio: float = 1.3
    # broadcast-slower-than-folded: a batched call with a batch-stride-0 operand is slower than
    # the one GEMM it folds into by more than this (pytorch PR 161564: 32x on an older cuBLAS).
    fold_margin_pct: float = 10.0
    # underfilled-grid: the dispatched kernel launches fewer CTAs than this share of the GPU's
    # SMs, for a problem whose operands give every SM at least `underfill_bytes_per_sm` to read,
    # and takes at least `underfill_min_ms` (pytorch#114911: a K = 131072 gemv on one SM, 412 us
    # where the mm took 11.9 us; a 256^3 call on 16 CTAs for 8 us is not worth a finding).
    # The roofline (judge.roofline): a memory-bound call (arithmetic intensity below the GPU's
    # ridge point) moving at least this share of the GPU's DRAM bandwidth is near its bound, so
    # no utilization rule calls it slow (an fp32 LM head, 4x32000x2048, moves 69 % of the H100's
    # 3.35 TB/s at 13 % FMA pipe: a GEMV kernel is the right pick); one below it, taking at least
    # `memory_bound_min_ms`, is low-utilization on its bandwidth. Only calls that move at least
    # `memory_bound_min_bytes` are judged on DRAM bandwidth: smaller operands stay in L2 (50 MB on
    # an H100) between timed calls, and launch latency dominates them, so the DRAM roofline says
    # nothing about them (they are judged as before, against the best utilization).
    memory_bound_min_pct: float = 50.0
    memory_bound_min_ms: float = 0.05
    memory_bound_min_bytes: float = 128 * 2**20
    underfill_sm_fraction: float = 0.25
    underfill_bytes_per_sm: float = 4096
    underfill_min_ms: float = 0.05
    # size-inversion: a problem takes at least this much longer than one no smaller in any
    # dimension (the larger problem's kernel is the better pick; pad to it), beyond noise.
    inversion_margin_pct: float = 5.0
    # dispatch-cliff: between neighbouring sizes of a series the kernel changes and throughput
    # drops by at least this much (H100 FP32: 2048 -> 2112 from 50.6 to 41.5 TFLOP/s, 18 %).
    cliff_drop_pct: float = 15.0
    # diff: the smallest time change a verdict reports; whether a change this large is real is
    # the noise model's to say (cublas_audit.judge.verdicts), not this number's.
    diff_time_noise_pct: float = 5.0
    diff_util_noise_pts: float = 3.0
    # A trace audit (judge.impact): a finding worth less than this share of the trace's GEMM time
    # (the time its fix saves a step; a call the model never makes is worth nothing) is info (issue
    # 37: K=1 outer products of model traces took 0.1-0.7 % of it, 1.3-1.8 us a call, as medium).
    trace_worth_pct: float = 1.0


def names() -> list[str]:
    return [field.name for field in dataclasses.fields(Thresholds)]


def limits(name: str) -> tuple[float, float]:
    """The values a threshold may take: fractions 0..1, percentages 0..100, ratios at least 1,
    everything else (sizes, element counts, points) any finite number from 0."""
    if name.endswith("_fraction"):
        return 0.0, 1.0
    if name.endswith(("_pct", "_pts")):
        return 0.0, 100.0
    if name.endswith(("_ratio", "_range")):
        return 1.0, math.inf
    return 0.0, math.inf


def with_overrides(items: Iterable[str], base: Thresholds | None = None) -> Thresholds:
    """Applies `name=value` overrides; an unknown name or a non-number is a one-line error."""
    changes: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise AuditError(f"--threshold {item!r}: expected NAME=VALUE")
        if name not in names():
            raise AuditError(f"--threshold: unknown name {name!r} (known: {', '.join(names())})")
        try:
            number = float(value)
        except ValueError:
            raise AuditError(f"--threshold {name}: {value!r} is not a number") from None
        low, high = limits(name)
        if not (math.isfinite(number) and low <= number <= high):
            raise AuditError(
                f"--threshold {name}: must be a number from {low:g} to {high:g}, got {value!r}"
            )
        changes[name] = number
    return dataclasses.replace(base or Thresholds(), **changes)
