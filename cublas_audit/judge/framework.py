"""A fix as the user's framework runs it (`verify --torch`), judged by the rule the cuBLASLt leg
uses: it holds only beyond the interleaved noise floor and the threshold, in every round.

The measuring half (run.torch_check) runs the pin's problem as PyTorch issues it, in processes
that alternate between TunableOp reading the fix's file and no TunableOp, operands cold; it returns
what each side launched and its kernel time per round. This module
decides what that means:

- `not applied`: TunableOp did not run the pin. torch 2.14 launched no kernel at all when the pin
  needed more workspace than it had (the output left as it was, no error); torch 2.15's source
  falls back to its default call without a word, so the pinned side runs torch's own kernel;
- `wrong result`: the pinned call's output differs from a float64 product;
- `another kernel`: a kernel that is neither the pin's nor torch's own;
- `holds` / `does not hold here`: the pin's kernel ran; the speedup over torch's own call,
  beyond the floor in every round or not. `agrees` says whether the median speedup lies within
  the floor of the fix's claim (table.fix_file.Fix.claimed).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from cublas_audit.judge.candidates import INTERLEAVED_FLOOR, floor_words, rounds_hold
from cublas_audit.judge.fixes import short_names
from cublas_audit.table.fix_file import Fix
from cublas_audit.vocabulary import Outcome

HOLDS, DOES_NOT_HOLD = Outcome.holds, Outcome.does_not_hold
NOT_APPLIED, ANOTHER_KERNEL, WRONG = "not applied", "another kernel", "wrong result"


@dataclass(frozen=True)
class FrameworkRun:
    """One side as the framework ran it: the GEMM kernels its calls launched (one call's, in
    order), its kernel time per call in each round (ms), and its result against float64."""

    kernels: tuple[str, ...]
    ms: tuple[float, ...]
    error: float | None
    correct: bool


@dataclass(frozen=True)
class FrameworkChecked:
    fix_id: str
    status: str
    line: str
    call: str = ""
    kernels: str = ""  # what the pinned side ran (short names)
    default_kernels: str = ""  # what torch ran on its own
    speedups: tuple[float, ...] = ()  # torch's own time over the pinned time, per round
    claimed: float | None = None
    agrees: bool | None = None  # the median speedup within the floor of the claim


def judge_framework(
    fix: Fix, call: str, pinned: FrameworkRun, plain: FrameworkRun, threshold: float
) -> FrameworkChecked:
    """The verdict on one pin as `call` (e.g. 'F.linear') ran it with and without TunableOp."""
    ran = short_names(" + ".join(pinned.kernels)) if pinned.kernels else ""
    own = short_names(" + ".join(plain.kernels)) if plain.kernels else ""
    wanted = fix.fixed.kernel.split(" + ")[0]

    def checked(
        status: str, line: str, speedups: tuple[float, ...] = (), agrees: bool | None = None
    ) -> FrameworkChecked:
        return FrameworkChecked(fix.id, status, line, call, ran, own, speedups, fix.claimed, agrees)

    if not pinned.kernels:
        why = "launched no kernel: TunableOp skipped the pin (too little workspace?)"
        return checked(NOT_APPLIED, f"{call} {why}; output left as it was")
    if not pinned.correct:
        why = f"result differs from a float64 product (error {pinned.error})"
        return checked(WRONG, f"{call} with the TunableOp file: {why}")
    if wanted and wanted not in ran:
        if ran == own:
            why = f"ran torch's own {ran}, not the pin's {wanted}: TunableOp fell back"
            return checked(NOT_APPLIED, f"{call} {why}")
        why = f"ran {ran}, neither the pin's {wanted} nor torch's own {own}"
        return checked(ANOTHER_KERNEL, f"{call} {why}")
    speedups = tuple(
        own_ms / pinned_ms for own_ms, pinned_ms in zip(plain.ms, pinned.ms, strict=True)
    )
    holds = rounds_hold(speedups, threshold)
    measured = statistics.median(speedups) if speedups else float("nan")
    agrees = abs(measured / fix.claimed - 1.0) <= INTERLEAVED_FLOOR
    rounds = ", ".join(f"{ratio:.2f}x" for ratio in speedups)
    claim = f"claimed {fix.claimed:.2f}x: {'within' if agrees else 'outside'} the floor"
    verdict = "" if holds else f"; not beyond the {floor_words(threshold)} in every round"
    line = f"{call} ran {ran} at {rounds} of torch's own {own} ({claim}){verdict}"
    return checked(HOLDS if holds else DOES_NOT_HOLD, line, speedups, agrees)
