"""Device self-check of cublas_audit.device.lt: every mode, a batched and a single problem.

    python -m tools.lt_selfcheck [--limit 32]

For each (mode, problem) it lists the heuristic's candidates, runs the default algorithm and every
candidate, and compares each output with a float64 product of the same inputs (the package's
operands and check, device.operands, at the mode's tolerance). Prints one PASS/FAIL line per check
and exits non-zero when any failed; one failing check never stops the others (its traceback is
printed).
"""

from __future__ import annotations

import argparse
import functools
import sys
import traceback

from cublas_audit.device import launchers, lt, operands
from cublas_audit.planning.cases import Case
from cublas_audit.planning.modes import MODE_NAMES

# (m, n, k, batch): the batched shape the issue measured, and a single call.
PROBLEMS = ((256, 256, 256, 8), (1024, 1024, 1024, 1))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=32)
    args = parser.parse_args(argv)
    lt.bindings()  # a missing nvmath is one clear line, not a traceback per check
    failures = 0
    for mode in MODE_NAMES:
        for problem in PROBLEMS:
            try:
                failures += check(Case("cublasLt", mode, *problem), limit=args.limit)
            except Exception:
                traceback.print_exc()
                print(f"FAIL {mode} {problem}: exception")
                failures += 1
    print("ALL PASS" if failures == 0 else f"{failures} FAILED")
    return 0 if failures == 0 else 1


def check(case: Case, limit: int) -> int:
    """Failures among: the default, each candidate, and the default being candidate 0."""
    name = f"{case.mode} {case.m}x{case.n}x{case.k} b{case.batch}"
    ops = operands.make_for(case)
    tolerance = operands.tolerance(case.mode)
    failures = 0
    with launchers.lt(case, ops) as gemm:
        candidates = gemm.heuristics(limit)
        print(f"{name}: {len(candidates)} candidates")
        for listed in candidates:
            print(f"    {listed.attributes()}")
        default = gemm.default()
        same = bool(candidates) and default.algo.tobytes() == candidates[0].algo.tobytes()
        failures += report(f"{name} default is candidate 0", same, "")
        runs: list[tuple[str, lt.LtCandidate | None]] = [("default", None)]
        runs += [(f"#{x.index}", x) for x in candidates]
        for label, cand in runs:
            error = operands.checked(functools.partial(gemm.run, cand), ops)
            failures += report(f"{name} {label}", error <= tolerance, f"error {error:.3g}")
    return failures


def report(what: str, ok: bool, detail: str) -> int:
    print(f"{'PASS' if ok else 'FAIL'} {what} {detail}".rstrip())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
