"""Device self-check of cublas_audit.lt: every mode, a batched and a single problem.

    python3 probes/lt_selfcheck.py [--limit 32]

For each (mode, problem) it lists the heuristic's candidates, runs the default algorithm and every
candidate, and compares each output with a float64 product of the same inputs. Prints one
PASS/FAIL line per check and exits non-zero when any failed; one failing check never stops the
others (its traceback is printed).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cublas_audit import lt

# (m, n, k, batch): the batched shape the issue measured, and a single call.
PROBLEMS = ((256, 256, 256, 8), (1024, 1024, 1024, 1))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=32)
    args = parser.parse_args(argv)
    lt.bindings()  # a missing nvmath is one clear line, not a traceback per check
    failures = 0
    for mode in lt.MODE_TYPES:
        for problem in PROBLEMS:
            try:
                failures += check(mode, *problem, limit=args.limit)
            except Exception:
                traceback.print_exc()
                print(f"FAIL {mode} {problem}: exception")
                failures += 1
    print("ALL PASS" if failures == 0 else f"{failures} FAILED")
    return 0 if failures == 0 else 1


def check(mode: str, m: int, n: int, k: int, batch: int, limit: int) -> int:
    """Failures among: the default, each candidate, and the default being candidate 0."""
    import cupy

    name = f"{mode} {m}x{n}x{k} b{batch}"
    a, b, c = lt.operands(mode, m, n, k, batch)
    ref = lt.reference(a, b)
    tolerance = lt.NORMWISE_TOLERANCE[mode]
    failures = 0
    with lt.LtGemm(mode, m, n, k, batch, a.data.ptr, b.data.ptr, c.data.ptr) as gemm:
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
            lt.poison(c, mode)
            gemm.run(cand)
            cupy.cuda.Device().synchronize()
            error = lt.normwise_error(c, ref)
            failures += report(f"{name} {label}", error <= tolerance, f"error {error:.3g}")
    return failures


def report(what: str, ok: bool, detail: str) -> int:
    print(f"{'PASS' if ok else 'FAIL'} {what} {detail}".rstrip())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
