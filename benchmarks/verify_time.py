"""How long `verify` takes to re-measure a fix file on this GPU (issue 31's verify time):

    python benchmarks/verify_time.py FIXFILE [--json OUT]

Prints the wall time of the whole verification (fix file read and checked, machine collected,
every fix rebuilt, two interleaved rounds, results against float64) and per fix, and each
fix's verdict; `--json` writes them (benchmarks/results/verify_time_h100.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from cublas_audit.jobs.verify import checked_input
from cublas_audit.run import verify_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fix_file", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    start = time.perf_counter()
    fixes = checked_input(args.fix_file)
    rows: list[dict[str, Any]] = []
    for fix in fixes.fixes:
        began = time.perf_counter()
        found = verify_rounds.verify_fix(fix)
        rows.append(
            {
                "fix": fix.id,
                "status": found.status,
                "speedup": found.speedup,
                "seconds": round(time.perf_counter() - began, 3),
            }
        )
        print(json.dumps(rows[-1]))
    result = {
        "fix_file": str(args.fix_file),
        "fixes": len(rows),
        "wall_s": round(time.perf_counter() - start, 2),
        "per_fix_s": round(sum(r["seconds"] for r in rows) / max(len(rows), 1), 3),
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
