"""What measuring the roofline costs a sweep, on a GPU: device.dram_bandwidth.measure_dram run
`--runs` times in a fresh process's first CUDA use (as a sweep's start makes it), each run's
bandwidth and seconds, against the 5 s budget of issue 26.

    python benchmarks/roofline_cost.py [--runs 3] [--json benchmarks/results/roofline_h100.json]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from cublas_audit.device.dram_bandwidth import measure_dram
from cublas_audit.observe import environment


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    env = environment.collect()
    collect_s = time.perf_counter() - started
    runs = [measure_dram(env.device_index or 0) for _ in range(args.runs)]
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu": env.gpu_name,
        "driver": env.driver_version,
        "environment_collect_s": round(collect_s, 3),
        "runs": runs,
        "worst_seconds": max(run["measure_seconds"] for run in runs),
        "target_seconds": 5.0,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
