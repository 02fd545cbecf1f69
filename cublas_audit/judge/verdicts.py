"""The one comparison behind every timing verdict: two timed distributions and a noise floor ->
FASTER, SLOWER, SAME or UNSURE, with the effect (B's median over A's) and its interval.

The interval has two parts. Within a run, the median of n timed calls is uncertain by about
1.2533 * sigma / sqrt(n), sigma taken robustly from the interquartile range (IQR / 1.349); the two
sides' uncertainties combine on the log scale at 99 % (z = 2.576). Between runs, the median itself
moves by up to the floor of the noise model at that time scale (cublas_audit.judge.noise), so the
interval is widened by it on both sides. Then:

- SLOWER: the observed change is a slowdown of at least `threshold`, the whole interval lies
  above 1, and, where both sides recorded their extremes, every call of B took longer than every
  call of A;
- FASTER: the same, the other way;
- UNSURE: the observed change is at least `threshold` either way, but the interval reaches 1:
  noise alone could have made it;
- SAME: the observed change is smaller than `threshold`.

The extremes matter where a kernel's time has two modes: a short FP32 kernel on the H100 takes
either of two times call to call (38 or 44 us), and a median of 5 calls lands on either, so the
median moved by up to 15 % between two runs of the same 10,000-problem map while the fastest and
slowest calls did not; the median's interval, which assumes one mode, called 2 of them slower,
and their calls overlapped. With the extremes asked to be apart too, no problem of that rerun
was slower or faster, either way (issue 28); cuBLAS 13.10's fp16 kernel at 1024, 10.6 % slower
than 13.1's over 200 calls each, still is (its fastest call is slower than 13.1's slowest).
A table without distributions (schema 1) is judged on the floor alone. Kernel changes are not
timing verdicts: the diff reports them exactly, always.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cublas_audit.table.dispatch import plain
from cublas_audit.vocabulary import Verdict as Verdict  # the comparison's words, re-exported

Z_99 = 2.576
# The standard error of a median is sqrt(pi / 2) ~ 1.2533 times that of a mean; sigma ~ IQR / 1.349.
MEDIAN_SE = 1.2533 / 1.349


@dataclass(frozen=True)
class Timed:
    """One side: its median, and where recorded, how many calls and their quartiles."""

    median_ms: float
    n: int | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None

    @property
    def log_se(self) -> float:
        """The standard error of log(median) within the run; 0 where no distribution is known."""
        if not self.n or self.q1_ms is None or self.q3_ms is None or self.median_ms <= 0:
            return 0.0
        return MEDIAN_SE * (self.q3_ms - self.q1_ms) / self.median_ms / math.sqrt(self.n)

    @classmethod
    def from_row(cls, row: Any, prefix: str = "time", suffix: str = "") -> Timed | None:
        """The side recorded in a table row (columns `<prefix>_ms`, `<prefix>_n`, ...)."""
        median = plain(row.get(f"{prefix}_ms{suffix}"))
        if median is None or not median > 0:
            return None
        n = plain(row.get(f"{prefix}_n{suffix}"))
        return cls(
            float(median),
            int(n) if n else None,
            plain(row.get(f"{prefix}_q1_ms{suffix}")),
            plain(row.get(f"{prefix}_q3_ms{suffix}")),
            plain(row.get(f"{prefix}_min_ms{suffix}")),
            plain(row.get(f"{prefix}_max_ms{suffix}")),
        )


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    ratio: float  # B's median / A's
    low: float  # the interval of the ratio, widened by the floor
    high: float
    floor: float

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1) * 100

    def describe(self) -> str:
        """'+12.3 % (99 % interval +4.1 .. +21.0 %, noise floor 5 %)'."""
        if math.isinf(self.floor):
            return f"{self.change_pct:+.1f} % (between runs, this time says nothing at this scale)"
        return (
            f"{self.change_pct:+.1f} % (interval {(self.low - 1) * 100:+.1f} .. "
            f"{(self.high - 1) * 100:+.1f} %, noise floor {self.floor * 100:.0f} %)"
        )


def judge(a: Timed, b: Timed, floor: float, threshold: float) -> Judgement:
    """B against A: the verdict and the interval (see the module's docstring)."""
    log_ratio = math.log(b.median_ms / a.median_ms)
    half = Z_99 * math.hypot(a.log_se, b.log_se) + math.log1p(floor)
    low, high = math.exp(log_ratio - half), math.exp(log_ratio + half)
    ratio = math.exp(log_ratio)
    band = 1 + threshold
    if ratio < band and ratio > 1 / band:
        verdict = Verdict.same
    elif ratio >= band:
        verdict = Verdict.slower if low > 1 and _apart(a, b) else Verdict.unsure
    else:
        verdict = Verdict.faster if high < 1 and _apart(b, a) else Verdict.unsure
    return Judgement(verdict, ratio, low, high, floor)


def _apart(fast: Timed, slow: Timed) -> bool:
    """Every call of `slow` took longer than every call of `fast`; True where either side's
    extremes are not recorded (the interval alone decides)."""
    if fast.max_ms is None or slow.min_ms is None:
        return True
    return slow.min_ms > fast.max_ms


def detectable_slowdown(floor: float, threshold: float, log_se: float = 0.0) -> float:
    """The smallest relative slowdown `judge` calls SLOWER at this floor (and within-run error)."""
    return max(1 + threshold, math.exp(Z_99 * math.sqrt(2) * log_se) * (1 + floor)) - 1
